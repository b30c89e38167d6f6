"""Piper's inference unit is bounded: a long sentence runs in pieces, and a close stops the work soon."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from voxgate.engine import piper
from voxgate.engine.base import SynthesisRequest
from voxgate.engine.piper import PiperEngine
from voxgate.engine.piper_text import MAX_PIECE_PHONEMES, cuts, pieces

# Joe speaks about 18 phonemes a second; a piece of MAX_PIECE_PHONEMES is well under this.
MAX_PIECE_AUDIO_S = 15.0


def test_short_sentences_stay_whole() -> None:
    sentence = list("ðə ɡˈeɪtweɪ spˈiːks.")
    assert pieces(sentence) == [sentence]


def test_long_runs_are_cut_after_a_pause_else_between_words_else_anywhere() -> None:
    paused = list("aaaa, bbbb cccc dddd")
    assert pieces(paused, limit=12) == [list("aaaa, bbbb"), list("cccc dddd")]
    # The comma at 4 is in the first half of the window: a cut there leaves too short a piece.
    early = list("aa, bbbbbb cccccc")
    assert pieces(early, limit=12) == [list("aa, bbbbbb"), list("cccccc")]
    words = list("aaaa bbbb cccc dddd")
    assert pieces(words, limit=12) == [list("aaaa bbbb"), list("cccc dddd")]
    one_word = list("a" * 30)
    assert [len(p) for p in pieces(one_word, limit=12)] == [12, 12, 6]
    assert pieces(list("   "), limit=2) == []


def test_a_first_piece_wanted_sooner_is_cut_shorter_and_the_rest_as_before() -> None:
    run = list("aaaa bbbb, cccc dddd eeee ffff")
    assert cuts(run, limit=40) == [(0, run)]
    # The first window is 12: cut after the pause; the rest, 19 phonemes, fits the normal limit.
    assert cuts(run, limit=40, first=12) == [(0, list("aaaa bbbb,")), (11, list("cccc dddd eeee ffff"))]
    assert cuts(run, limit=10, first=40) == cuts(run, limit=10)  # never longer than the limit
    assert cuts(run, limit=40, first=40) == [(0, run)]


def test_every_piece_of_a_long_run_is_bounded() -> None:
    run = list(("ɡɹˈɪnɪŋ fˈeɪs " * 300).strip())
    cut = pieces(run)
    assert all(0 < len(p) <= MAX_PIECE_PHONEMES for p in cut)
    assert sum(len(p) for p in cut) + len(cut) - 1 == len(run)  # only the gaps at the cuts are gone


@pytest.mark.slow
def test_a_closed_stream_stops_after_the_piece_in_progress() -> None:
    async def scenario() -> None:
        engine = PiperEngine(threads=1, workers=1)  # one worker: the next request runs only once it is free
        await engine.start()
        try:
            stream = engine.synthesize(SynthesisRequest(text="😀" * 300, voice="joe", seed=1))
            first = await anext(stream)
            assert len(first.samples) / first.sample_rate <= MAX_PIECE_AUDIO_S  # not 80 s in one run
            runs_at_close = engine.runs
            await stream.aclose()
            after = [c async for c in engine.synthesize(SynthesisRequest(text="Hi.", voice="joe", seed=1))]
            assert sum(len(c.samples) for c in after) > 0
            # The worker was freed: besides "Hi.", at most the piece already in progress ran.
            assert engine.runs - runs_at_close <= 2
        finally:
            await engine.aclose()

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_run_alone_uses_the_wide_session_and_one_beside_another_does_not() -> None:
    async def scenario() -> tuple[int, int]:
        engine = PiperEngine(threads=1, workers=2, wide_threads=2)
        await engine.start()
        try:
            request = SynthesisRequest(text="Hello there.", voice="joe", seed=1)
            warm_up = engine.wide_runs
            alone = [c async for c in engine.synthesize(request)]
            wide_alone = engine.wide_runs - warm_up
            gate, busy = threading.Event(), threading.Event()

            def hold() -> None:
                engine._busy.count(+1)  # counted as an inference, as one running on the other worker is
                busy.set()
                gate.wait()
                engine._busy.count(-1)

            held = engine._workers.submit(0, hold)  # another inference in progress on the other worker
            assert await asyncio.to_thread(busy.wait, 30)
            beside = [c async for c in engine.synthesize(request)]
            gate.set()
            await asyncio.wrap_future(held)
            assert alone and beside
            return wide_alone, engine.wide_runs - warm_up
        finally:
            await engine.aclose()

    assert asyncio.run(scenario()) == (1, 1)


@pytest.mark.slow
def test_a_run_right_behind_one_still_tidying_up_uses_the_wide_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's housekeeping after its inference (giving memory back) does not make the next run narrow."""
    gate, trimming = threading.Event(), threading.Event()

    def slow_trim() -> None:
        trimming.set()
        gate.wait(30)

    async def scenario() -> int:
        engine = PiperEngine(threads=1, workers=2, wide_threads=2)
        await engine.start()
        monkeypatch.setattr(piper, "release_freed_memory", slow_trim)
        try:
            request = SynthesisRequest(text="Hello there.", voice="joe", seed=1)
            assert [c async for c in engine.synthesize(request)]
            assert await asyncio.to_thread(trimming.wait, 30)  # that job's worker is still tidying up
            before = engine.wide_runs
            assert [c async for c in engine.synthesize(request)]
            return engine.wide_runs - before
        finally:
            gate.set()
            await engine.aclose()

    assert asyncio.run(scenario()) == 1


@pytest.mark.slow
def test_a_sentence_spoken_in_pieces_times_every_word_once_in_order() -> None:
    text = " and ".join(["the river runs past the old town"] * 8) + "."  # one sentence, several pieces

    async def scenario() -> list[list[str]]:
        engine = PiperEngine(threads=1, workers=1)
        await engine.start()
        try:
            request = SynthesisRequest(text=text, voice="joe", seed=1, options={"word_timestamps": True})
            chunks = [c async for c in engine.synthesize(request)]
            assert all(w.start < len(c.samples) for c in chunks for w in c.words)
            return [[w.word for w in c.words] for c in chunks]
        finally:
            await engine.aclose()

    per_chunk = asyncio.run(scenario())
    assert len(per_chunk) > 1  # cut into pieces
    assert [w for chunk in per_chunk for w in chunk] == text.split()


def long_and_urgent(per_phoneme_s: float | None = None) -> list[str]:
    """Which segment each chunk came from: a long one due now, and a one-word one due a second later.

    One worker, held busy while both queue. ``per_phoneme_s`` overrides the engine's estimate of what
    a phoneme takes (which it then keeps updating from the runs it times).
    """
    long_text = " and ".join(["the river runs past the old town"] * 8) + "."  # one sentence, several pieces

    async def scenario() -> list[str]:
        engine = PiperEngine(threads=1, workers=1, wide_threads=1)  # one worker, no wide session
        await engine.start()
        if per_phoneme_s is not None:
            engine.per_phoneme_s = per_phoneme_s
        try:
            gate, busy = threading.Event(), threading.Event()

            def hold() -> None:
                busy.set()
                gate.wait(30)

            held = engine._workers.submit(-1.0, hold)  # the worker is busy while both segments queue
            assert await asyncio.to_thread(busy.wait, 30)
            now = time.monotonic()
            arrivals: list[str] = []

            async def read(name: str, request: SynthesisRequest) -> None:
                async for _ in engine.synthesize(request):
                    arrivals.append(name)

            long = asyncio.create_task(
                read("long", SynthesisRequest(text=long_text, voice="joe", seed=1, deadline=now))
            )
            urgent = asyncio.create_task(
                read("urgent", SynthesisRequest(text="Stop.", voice="joe", seed=1, deadline=now + 1.0))
            )
            for _ in range(3000):
                if engine._workers._queue.qsize() >= 2:
                    break
                await asyncio.sleep(0.01)
            gate.set()
            await asyncio.wrap_future(held)
            await asyncio.gather(long, urgent)
            return arrivals
        finally:
            await engine.aclose()

    return asyncio.run(scenario())


@pytest.mark.slow
def test_a_more_urgent_segment_runs_between_the_pieces_of_a_long_one() -> None:
    """Each piece is a job of its own: a long segment holds the worker for one piece, not for all.

    The long segment's second piece is due once its first piece's 5-6 s of audio have played, less what
    it takes (under a second here): after the short segment, due a second after the first.
    """
    arrivals = long_and_urgent()
    assert arrivals.count("long") > 2  # the long segment came in several pieces
    assert arrivals.index("urgent") == 1  # right after the long segment's first piece


@pytest.mark.slow
def test_a_piece_that_must_start_first_to_be_in_time_goes_first() -> None:
    """Least laxity: the queue orders a piece by its deadline less what it will take.

    Where each phoneme takes 0.2 s (a machine 30 times slower), the long segment's second piece (about
    100 phonemes, 20 s) must start at once to be done before its 5-6 s deadline: it goes before the
    short segment, due sooner but quick.
    """
    arrivals = long_and_urgent(per_phoneme_s=0.2)
    assert arrivals.count("long") > 2
    assert arrivals.index("urgent") >= 2  # after the long segment's second piece at least


def first_chunks(slack_s: float) -> tuple[list[float], int]:
    """The chunks (audio seconds) of a 12-word sentence that must start playing ``slack_s`` from now,
    after audio that is playing; and how many first pieces the engine cut short."""
    sentence = "Of words into speech while the model is still writing its answer."

    async def scenario() -> tuple[list[float], int]:
        engine = PiperEngine(threads=1, workers=1, wide_threads=1)
        await engine.start()
        try:
            due = time.monotonic() + slack_s
            request = SynthesisRequest(text=sentence, voice="joe", seed=1, deadline=due)
            got = [len(c.samples) / c.sample_rate async for c in engine.synthesize(request)]
            return got, engine.short_firsts
        finally:
            await engine.aclose()

    return asyncio.run(scenario())


@pytest.mark.slow
def test_a_segment_due_too_soon_for_its_first_piece_starts_with_a_shorter_one() -> None:
    """Due in 20 ms, after audio already playing: not even 4 words are in time, so the first piece is
    the shortest (about 4 words) and the sentence comes in two; due in a minute, whole, as always."""
    soon, short = first_chunks(0.02)
    later, none = first_chunks(60.0)
    assert (short, none) == (1, 0)
    assert len(later) == 1 and len(soon) == 2
    assert soon[0] < later[0] / 2  # about 4 of the 12 words
    assert sum(soon) == pytest.approx(later[0], abs=0.6)  # the same words, with a pause at the cut
