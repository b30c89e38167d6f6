"""Piper's phoneme durations mapped back to the input's words (``engine.piper_words``)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from piper.const import BOS, EOS, PAD
from piper.phonemize_espeak import EspeakPhonemizer
from voxgate.engine.base import WordTiming
from voxgate.engine.piper_words import Group, Timeline, letters, phoneme_samples, plan, timings

_ESPEAK = EspeakPhonemizer()


def espeak(text: str) -> list[list[str]]:
    """What Piper's joe voice speaks for ``text``: phoneme symbols per espeak sentence."""
    return _ESPEAK.phonemize("en-us", text)


def alone(word: str) -> str:
    return " ".join("".join(s) for s in espeak(word))


def words_of(text: str) -> list[list[str]]:
    return [[w for g in groups for w in g.words] for groups in plan(text, espeak(text), alone)]


def flat(text: str) -> list[str]:
    return [w for sentence in words_of(text) for w in sentence]


@pytest.mark.parametrize(
    "text",
    [
        "It costs $3.50 on 5/12, Dr. Smith said.",  # currency, a date, an abbreviation that ends a sentence
        "In 1999 there were 1,234,567 people and 42 dogs.",  # numbers espeak reads as many words
        "Call 555-1234 at 3:15 p.m. on Jan. 5th; Mr. O'Neil & co. paid €1,000,000.",
        "The U.S.A. grew 50% in the 1990s, e.g. by #1 products.",
        "Hello 😀 world, 🤷 okay?",  # emoji espeak names ("grinning face")
        "the the the cat sat on the the mat",  # repeated words
        "Wait... what?! No -- really.",  # punctuation runs, a dash espeak does not voice
    ],
)
def test_the_inputs_words_come_back_in_order(text: str) -> None:
    unvoiced = {"--"}
    assert flat(text) == [w for w in text.split() if w not in unvoiced]


def test_words_belong_to_the_espeak_sentence_that_speaks_them() -> None:
    # espeak ends a sentence after "Dr.": its audio is a chunk of its own, and so are its words.
    assert words_of("It costs $3.50 on 5/12, Dr. Smith said.") == [
        ["It", "costs", "$3.50", "on", "5/12,", "Dr."],
        ["Smith", "said."],
    ]


def test_letters_drop_stress_length_punctuation_and_spaces() -> None:
    assert letters("ɪt kˈɔsts, dˈɑːlɚ.") == "ɪtkɔstsdɑlɚ"


def test_a_word_espeak_merges_into_its_neighbour_shares_its_time() -> None:
    # Alone, "ab" and "cd" are spoken; in context espeak said them as one word "abcd".
    groups = plan("ab cd ef", [list("abcd ef")], lambda w: w)
    assert groups == [[Group(("ab", "cd"), (2, 2), 0), Group(("ef",), (2,), 5)]]
    samples = [10, *[5] * 7, 10]  # BOS, a b c d ␠ e f, EOS
    assert timings(groups[0], samples) == (
        WordTiming("ab", 10, 22),  # the two share the run up to where "ef" starts, by their lengths
        WordTiming("cd", 22, 35),
        WordTiming("ef", 35, 55),
    )


def test_a_merged_first_word_joins_the_next_owner() -> None:
    # "x" is spoken alone but nothing in context matches it: it shares the first owner's time.
    assert plan("x abc", [list("abc")], lambda w: w) == [[Group(("x", "abc"), (1, 3), 0)]]


def test_extra_spoken_words_go_to_the_word_that_said_them() -> None:
    # espeak reads "2" as "two hundred thousand": three spoken words for one input word.
    spoken = list("tu hʌndɹɪd θaʊzənd dɔɡz")
    phonemize = {"2": "tu hʌndɹɪd θaʊzənd", "dogs": "dɔɡz"}.__getitem__
    assert plan("2 dogs", [spoken], phonemize) == [
        [Group(("2",), (len("tuhʌndɹɪdθaʊzənd"),), 0), Group(("dogs",), (4,), 19)]
    ]


def test_more_spoken_words_than_the_text_allows_all_go_to_the_last_word() -> None:
    spoken = list("a b c d e f g h")
    assert plan("a", [spoken], lambda w: w) == [[Group(("a",), (1,), 0)]]


def test_unvoiced_words_and_empty_inputs_give_no_groups() -> None:
    assert plan("-- ...", [list(".")], lambda w: "") == [[]]
    assert plan("", [], lambda w: w) == []
    assert plan("hi", [[]], lambda w: w) == [[]]


def test_phoneme_samples_follow_piper_ids_and_add_up() -> None:
    id_map: dict[str, Sequence[int]] = {BOS: [1], EOS: [2], PAD: [0], "a": [5], "b": [6, 7]}
    # ids: ^ _ a _ b b _ (ʔ skipped) $
    per_id = [3, 1, 4, 1, 5, 9, 2, 6]
    assert phoneme_samples(["a", "b", "ʔ"], id_map, per_id) == [4, 5, 16, 0, 6]
    assert sum(phoneme_samples(["a", "b", "ʔ"], id_map, per_id)) == sum(per_id)


def test_timings_of_a_piece_of_a_sentence() -> None:
    groups = [Group(("one",), (3,), 0), Group(("two",), (3,), 4), Group(("six",), (3,), 8)]
    # The piece holds phonemes 4..7 ("two "): only "two" is timed in it, from its own BOS.
    assert timings(groups, [7, 1, 1, 1, 1, 9], first=4) == (WordTiming("two", 7, 20),)
    assert timings(groups, [2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 5]) == (
        WordTiming("one", 2, 6),
        WordTiming("two", 6, 10),
        WordTiming("six", 10, 18),
    )


def test_real_piper_timings_tile_the_sentence_audio() -> None:
    text = "It costs $3.50 on 5/12, Dr. Smith said."
    sentences = espeak(text)
    for phonemes, groups in zip(sentences, plan(text, sentences, alone), strict=True):
        samples = [256] * (len(phonemes) + 2)
        got = timings(groups, samples)
        assert got[0].start == 256 and got[-1].end == sum(samples)
        assert all(a.end == b.start and a.start < a.end for a, b in zip(got, got[1:], strict=False))


def test_piper_accepts_word_timestamps_and_refuses_them_by_name_without_onnx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from voxgate.engine import piper
    from voxgate.engine.base import UnsupportedOption

    engine = piper.PiperEngine()
    engine.check("joe", {"word_timestamps": True})
    monkeypatch.setattr(piper, "ALIGNABLE", False)
    engine.check("joe", {"word_timestamps": False})
    with pytest.raises(UnsupportedOption, match="word_timestamps.*onnx"):
        engine.check("joe", {"word_timestamps": True})


# A hash, a URL and a code, each read as many spoken words, longer than one synthesis piece
# (``MAX_PIECE_PHONEMES``): issue 18 #10, the attack that cut ElevenLabs answers off with ``engine_error``.
LONG_TOKENS = (
    "The hash is "
    + "a3f9" * 40
    + " and the link is https://example.com/"
    + "/".join("abcdefghijklmnop")
    + " then code "
    + "A1B2C3" * 12
    + " done."
)


def test_a_word_spanning_pieces_gets_one_timing_covering_them() -> None:
    # Piece 0 holds phonemes 0..5 ("ab cd"+"e"), piece 1 starts at 7; "cdefg" runs from 3 into piece 1.
    groups = [Group(("ab",), (2,), 0), Group(("cdefg",), (5,), 3), Group(("hi",), (2,), 10)]
    timeline = Timeline(groups, [0, 7])
    # ^ a b ␠ c d e $: "ab" is released at once; "cdefg" is held from its onset (25) until it ends.
    assert timeline.piece([10, 5, 5, 5, 5, 5, 5, 10]) == (25, (WordTiming("ab", 10, 25),))
    # ^ f g ␠ h i $ (phonemes 7..11): "cdefg" ends where "hi" starts, after 25 held samples and 25 new.
    assert timeline.piece([10, 5, 5, 5, 5, 5, 10]) == (
        25 + 45,
        (WordTiming("cdefg", 0, 25 + 25), WordTiming("hi", 25 + 25, 25 + 45)),
    )


def test_a_word_running_to_the_end_of_the_sentence_ends_with_its_last_piece() -> None:
    timeline = Timeline([Group(("abcdef",), (6,), 0)], [0, 3, 6])
    assert timeline.piece([4, 1, 1, 1, 2]) == (0, ())  # all held: no word starts before it
    assert timeline.piece([4, 1, 1, 1, 2]) == (0, ())  # a piece inside the word: still held
    assert timeline.piece([4, 1, 1, 1, 2]) == (27, (WordTiming("abcdef", 4, 27),))


def test_pieces_without_words_are_released_whole() -> None:
    assert Timeline([], [0, 5]).piece([1, 2, 3]) == (6, ())
    assert timings([Group(("x",), (1,), 9)], [1, 2, 3]) == ()


@pytest.mark.slow
def test_piper_times_words_longer_than_a_piece_and_says_all_of_them() -> None:
    import asyncio

    from voxgate.engine.base import AudioChunk, SynthesisRequest
    from voxgate.engine.piper import PiperEngine
    from voxgate.engine.piper_text import MAX_PIECE_PHONEMES, cuts

    assert any(len(cuts(s)) > 1 for s in espeak(LONG_TOKENS))  # the attack: words across pieces
    assert max(len(s) for s in espeak(LONG_TOKENS)) > 2 * MAX_PIECE_PHONEMES

    async def speak(words: bool) -> list[AudioChunk]:
        engine = PiperEngine(threads=1, workers=1)
        await engine.start()
        try:
            options: dict[str, object] = {"word_timestamps": words}
            request = SynthesisRequest(text=LONG_TOKENS, voice="joe", seed=1, options=options)
            return [c async for c in engine.synthesize(request)]
        finally:
            await engine.aclose()

    timed, plain = asyncio.run(speak(True)), asyncio.run(speak(False))
    # All the audio comes: as much as without word timings.
    assert sum(len(c.samples) for c in timed) == pytest.approx(sum(len(c.samples) for c in plain), rel=0.01)
    # Every input word once, in order (an ElevenLabs alignment spells the text from them), each timed
    # inside its chunk, the chunks' words tiling the audio from the first onset on.
    at = 0
    clock: list[WordTiming] = []
    for chunk in timed:
        assert all(0 <= w.start < w.end <= len(chunk.samples) for w in chunk.words), chunk.words
        clock += [WordTiming(w.word, at + w.start, at + w.end) for w in chunk.words]
        at += len(chunk.samples)
    assert " ".join(w.word for w in clock) == " ".join(LONG_TOKENS.split())
    assert all(a.end <= b.start for a, b in zip(clock, clock[1:], strict=False))
    assert clock[-1].end == at
    # The hash (about 10 s of speech) is timed over all of it, not over the piece it starts in.
    hash_word = next(w for w in clock if w.word.startswith("a3f9"))
    assert (hash_word.end - hash_word.start) / timed[0].sample_rate > 5.0


@pytest.mark.slow
def test_an_elevenlabs_client_on_piper_hears_long_tokens_to_the_end_spelled_in_its_alignment() -> None:
    # The attack on a real server: ElevenLabs always asks for word timings; before, the first word longer
    # than a piece ended the segment with ``engine_error`` after a few seconds of its audio.
    import base64
    import json

    from websockets.sync.client import connect

    from tests.conftest import TIMEOUT_S, recv_until, send, serve_engine, session

    with serve_engine(None, engine="piper", piper_workers=1) as address:
        url = f"ws://{address}/v1/text-to-speech/joe/stream-input?output_format=pcm_16000&seed=1"
        messages: list[dict[str, object]] = []
        with connect(url, open_timeout=TIMEOUT_S, max_size=None) as ws:
            for text in (" ", LONG_TOKENS + " ", ""):
                ws.send(json.dumps({"text": text}))
            for item in ws:  # to the close that ends the input
                messages.append(json.loads(item))
        with session(address, response_format="pcm", sample_rate=16000, seed=1) as plain:
            send(plain, type="input.text", text=LONG_TOKENS)
            send(plain, type="input.done")
            without_timings = recv_until(plain, "session.done", timeout=10 * TIMEOUT_S)

    assert [m for m in messages if "error" in m] == []
    audio = [m for m in messages if m.get("audio")]
    heard = sum(len(base64.b64decode(str(m["audio"]))) for m in audio)
    # All of it, as without timings (within a frame or two: a run on more threads may round a phoneme's
    # duration the other way).
    assert heard == pytest.approx(sum(len(f) for f in without_timings.frames()), rel=0.01)
    alignments = [m["alignment"] for m in messages if m.get("alignment")]  # null on audio not aligned yet
    chars = "".join(c for a in alignments for c in a["chars"])  # type: ignore[index]
    assert chars.split() == LONG_TOKENS.split()  # every character, none invented
    for a in alignments:
        starts: list[int] = a["charStartTimesMs"]  # type: ignore[index]
        assert starts == sorted(starts)
