"""Sentence pauses on the fake clock: silence written after a sentence while the next audio is not there.

The driver is ``test_listener_clock.Run`` (words at a steady rate, a serial engine of known latency, a
real-time listener); here it also keeps what was written, in order, so the pause's frames can be found
(the fake engine's audio is never zero; a pause is all zeros).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from voxgate.protocol import pauses
from voxgate.protocol.core import Core
from voxgate.protocol.messages import AudioCancelled, AudioDone, AudioStart, InputDone, WordTimestamps
from voxgate.protocol.output import Audio, Configure, Message, Output, OutputFormat, Report, Speak
from voxgate.protocol.session import Session

from .test_listener_clock import LONG_SECOND, PCM, RATE, SECONDS_PER_CHAR, Run

FRAME_S = PCM.frame_ms / 1000


class Written(Run):
    """A ``Run`` that keeps every output written, with its time."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.written: list[tuple[float, Output]] = []
        sending = self.core.sending

        def keep(output: Output, now: float) -> Output | None:
            written = sending(output, now)
            if written is not None:
                self.written.append((now, written))
            return written

        self.core.sending = keep  # type: ignore[method-assign]

    def pause_frames(self) -> list[tuple[float, int]]:
        """The frames of silence written: (time, sentence)."""
        return [
            (t, out.sentence)
            for t, out in self.written
            if isinstance(out, Audio) and not np.frombuffer(out.data, dtype="<i2").any()
        ]

    def paused_s(self) -> float:
        return len(self.pause_frames()) * FRAME_S


@pytest.mark.parametrize("jitter_s", [0.15, 0.0])
@pytest.mark.parametrize("first", ["Sure!", "Yes.", "Okay."])
def test_a_one_word_sentence_then_slow_text_gets_a_sentence_pause_not_a_gap(
    first: str, jitter_s: float
) -> None:
    # At 6 words a second, the words "I can definitely help" (the shortest cut that leaves no word alone)
    # are all there 0.67 s after the reply began: the one-word sentence's audio has played out by then.
    run = Written(6, jitter_s=jitter_s)
    spoken = run.speak(first + " " + LONG_SECOND)
    assert spoken[:2] == [first, "I can"]
    assert run.gaps == []  # a listener without a jitter buffer too
    frames = run.pause_frames()
    assert 0.1 <= run.paused_s() <= pauses.MAX_S  # a speaker's pause after a sentence
    # In order: the sentence's speech, its pause, its audio.done; the next audio.start, the rest of the
    # pause, its speech. Written just in time, never before the sentence's audio had nearly played.
    kinds = "".join(_kind(out) for _, out in run.written)
    order = re.match(r"<s+(p+)><(p*)s", kinds)
    assert order is not None, kinds
    assert [len(order[1]), len(order[2])] == [sum(s == k for _, s in frames) for k in (0, 1)]
    first_audio = next(t for t, out in run.written if isinstance(out, Audio))
    assert frames[0][0] == pytest.approx(
        first_audio + len(first) * SECONDS_PER_CHAR - pauses.LEAD_S, abs=0.01
    )


def _kind(out: Output) -> str:
    """``s`` speech, ``p`` pause (100 ms frames), ``<`` audio.start, ``>`` audio.done, ``.`` anything else."""
    if isinstance(out, Audio):
        return "s" if np.frombuffer(out.data, dtype="<i2").any() else "p"
    if isinstance(out, Message) and isinstance(out.msg, AudioDone):
        return ">"
    if isinstance(out, Message) and isinstance(out.msg, AudioStart):
        return "<"
    return "."


@pytest.mark.parametrize("words_per_s", [12, 25])
def test_text_that_arrives_in_time_gets_no_pause(words_per_s: int) -> None:
    run = Written(words_per_s)
    run.speak("Sure! " + LONG_SECOND)
    assert run.gaps == [] and run.pause_frames() == []


def test_the_first_audio_is_never_delayed() -> None:
    slow, fast = Written(6), Written(25)
    slow.speak("Sure! " + LONG_SECOND)
    fast.speak("Sure! " + LONG_SECOND)
    first = [next(t for t, out in run.written if isinstance(out, Audio)) for run in (slow, fast)]
    assert slow.paused_s() > 0 and fast.paused_s() == 0
    # The first segment's rule is unchanged: its audio comes when its text and the engine allow.
    assert first[0] == pytest.approx(1 / 6 + 0.15) and first[1] == pytest.approx(1 / 25 + 0.15)


def test_no_pause_inside_a_sentence() -> None:
    # No sentence end at all: the cuts are timed, and a late segment is a gap, never a pause in a phrase.
    run = Written(3, latency_s=1.0)
    run.speak("so the thing to remember here is that the gateway does not wait for the end of a sentence")
    assert run.pause_frames() == []
    assert run.gaps  # the text is too slow for the engine: silence, as before


def test_the_pause_is_capped_and_a_longer_wait_stays_a_gap() -> None:
    run = Written(6, latency_s=1.5)  # an engine far slower than the text
    run.speak("Sure! " + LONG_SECOND)
    assert pauses.MAX_S - FRAME_S < run.paused_s() <= pauses.MAX_S
    assert run.gaps  # the rest of the wait: the pause does not hide it


def test_no_pause_without_timed_cuts() -> None:
    run = Written(6, config=', "eager_first_segment": false')
    run.speak("Sure! " + LONG_SECOND)
    assert run.pause_frames() == [] and run.gaps


def test_the_last_sentence_gets_no_pause_and_its_audio_done_is_not_held() -> None:
    run = Written(6)
    assert run.speak("Sure! Thanks.") == ["Sure!", "Thanks."]
    assert run.pause_frames() == []
    # "Sure!" was held for a pause until "Thanks." started; "Thanks." ends the utterance.
    done = [out.msg for _, out in run.written if isinstance(out, Message) and isinstance(out.msg, AudioDone)]
    assert [d.sentence_index for d in done] == [0, 1]


def _held(text: str) -> Core:
    """A core whose first segment, "Sure!", is spoken and its audio (0.5 s) written at 0.2."""
    core = Written(6).core
    core.receive_text(f'{{"type": "input.text", "text": "{text}"}}', 0.0)
    assert [o.text for o in core.data_to_send() if isinstance(o, Speak)] == ["Sure!"]
    core.segment_started(0, 0)
    core.audio(0, 0, np.full(RATE // 2, 0.25, dtype=np.float32), RATE)
    core.segment_done(0, 0, synthesis_s=0.1)
    out = core.data_to_send()
    for output in out:
        core.sending(output, 0.2)
    assert "AudioDone" not in _names(out)  # held: a pause may follow
    return core


def _names(out: list[Output]) -> list[str]:
    """The messages among ``out``; an ``audio.done`` is still a ``Report`` until it is written."""
    return [
        type(o.msg).__name__ if isinstance(o, Message) else "AudioDone"
        for o in out
        if isinstance(o, Message) or (isinstance(o, Report) and o.sentence is not None)
    ]


def test_a_sentence_held_for_a_pause_ends_before_the_next_one_starts() -> None:
    core = _held("Sure! Go")
    core.receive_text('{"type": "input.text", "text": " on."}', 0.3)
    core.receive_message(InputDone(), 0.3)
    assert [o.text for o in core.data_to_send() if isinstance(o, Speak)] == ["Go on."]
    core.segment_started(0, 1)
    assert _names(core.data_to_send()) == ["AudioDone", "AudioStart"]


def test_a_sentence_held_for_a_pause_that_ends_the_utterance_ends_at_once() -> None:
    core = _held("Sure! ...")
    core.receive_message(InputDone(), 0.3)  # nothing speakable follows "Sure!": no pause
    assert _names(core.data_to_send()) == ["AudioDone"]
    assert core.next_deadline() is None


def test_a_sentence_with_no_text_after_it_gets_no_pause() -> None:
    # A client that sends a sentence and waits (a turn, a commit) hears no pause: its audio.done comes when
    # the sentence has nearly played, for a pause could have followed it until then.
    core = Written(6).core
    core.receive_text('{"type": "input.text", "text": "Sure! "}', 0.0)
    core.data_to_send()
    core.segment_started(0, 0)
    core.audio(0, 0, np.full(RATE // 2, 0.25, dtype=np.float32), RATE)
    core.segment_done(0, 0, synthesis_s=0.1)
    out = core.data_to_send()
    assert _names(out) == ["AudioStart"]
    for output in out:
        core.sending(output, 0.2)
    assert core.next_deadline() == pytest.approx(0.2 + 0.5 - pauses.LEAD_S)
    core.tick(0.2 + 0.5 - pauses.LEAD_S)
    assert _names(core.data_to_send()) == ["AudioDone"]  # and no audio: no pause
    assert core.next_deadline() is None


def test_a_pause_is_not_written_once_the_listener_ran_dry() -> None:
    core = _held("Sure! ...")
    cut = core.next_deadline()
    assert cut is not None
    core.tick(cut)  # "..." allows no timed cut: it waits for more text, and the pause's deadline is next
    assert core.data_to_send() == []
    assert core.next_deadline() == pytest.approx(0.2 + 0.5 - pauses.LEAD_S)  # just in time
    core.tick(0.2 + 0.5 + pauses.LATE_S + 0.01)  # the shell woke far too late: silence now only delays
    out = core.data_to_send()
    assert not any(isinstance(o, Audio) for o in out)
    assert _names(out) == ["AudioDone"]  # released, with no pause
    assert core.next_deadline() is None


def test_a_pause_waits_for_audio_not_yet_written_and_the_words_after_it_start_later() -> None:
    core = Written(6).core
    core.receive_text('{"type": "input.text", "text": "Sure! ..."}', 0.0)
    core.data_to_send()
    core.segment_started(0, 0)
    core.audio(0, 0, np.full(RATE // 2, 0.25, dtype=np.float32), RATE)
    core.segment_done(0, 0, synthesis_s=0.1)
    pending = core.data_to_send()
    core.sending(pending[0], 0.2)  # audio.start; its audio is not written yet
    core.tick(10.0)  # audio waits to go out: no pause before it
    assert core.data_to_send() == []
    for output in pending[1:]:
        core.sending(output, 0.2)
    core.tick(0.2 + 0.5 - pauses.LEAD_S)  # just in time: a chunk of pause, the end of "Sure!"
    (pause,) = core.data_to_send()
    assert isinstance(pause, Audio) and pause.sentence == 0 and not any(pause.data)
    core.sending(pause, 0.66)
    core.receive_text('{"type": "input.text", "text": " I can go now and"}', 0.66)
    assert [o.text for o in core.data_to_send() if isinstance(o, Speak)] == ["... I can go"]
    core.segment_started(0, 1)
    for output in core.data_to_send():  # the held audio.done, then the next audio.start
        core.sending(output, 0.67)
    core.tick(0.2 + 0.5 + FRAME_S - pauses.LEAD_S)  # its speech is late: the pause goes on, before it
    (head,) = core.data_to_send()
    assert isinstance(head, Audio) and head.sentence == 1 and not any(head.data)
    core.sending(head, 0.76)
    core.audio(0, 1, np.full(RATE // 4, 0.25, dtype=np.float32), RATE, words=[("I", 0, 800)])
    out = core.data_to_send()
    (chunk,) = [o.msg for o in out if isinstance(o, Message)]
    # Its words count from after the pause: 0.5 s of "Sure!" and 0.2 s of pause.
    assert isinstance(chunk, WordTimestamps) and chunk.timestamps[0].start_ms == pytest.approx(700.0)
    for output in out:
        core.sending(output, 0.8)
    assert core.pace.first_audio_s(8) < 0.5  # its first audio came 0.13 s after its start, not the pause's
    # A cancel now: the listener heard "Sure!" and some of the pause, and none of "I can go".
    core.cancel(now=0.2 + 0.5 + 0.15)
    cancelled = [
        o.msg for o in core.data_to_send() if isinstance(o, Message) and isinstance(o.msg, AudioCancelled)
    ]
    assert [c.text_spoken for c in cancelled] == ["Sure!"]


def test_a_pause_needs_a_sentence_end() -> None:
    assert pauses.ends_sentence("Sure!") and pauses.ends_sentence('He said "yes."')
    assert not pauses.ends_sentence("I can") and not pauses.ends_sentence("")
    assert pauses.chunk_samples(8000, 800, 0.0) == 800  # rounded up to a whole 100 ms frame
    assert pauses.chunk_samples(8000, 80, 0.0) == 160  # 20 ms: two 10 ms frames
    assert pauses.chunk_samples(8000, 800, pauses.MAX_S) == 0


def test_no_pause_where_the_audio_is_not_streamed() -> None:
    core = Core(OutputFormat("pcm", RATE, frame_ms=100, streamed=False))
    core.receive_text('{"type": "session.config"}', 0.0)
    (configure,) = core.data_to_send()
    assert isinstance(configure, Configure)
    core.accept_config(configure.config, OutputFormat("pcm", RATE, frame_ms=100, streamed=False))
    core.receive_text('{"type": "input.text", "text": "Sure! "}', 0.0)
    core.data_to_send()
    core.segment_started(0, 0)
    core.audio(0, 0, np.full(RATE // 2, 0.25, dtype=np.float32), RATE)
    core.segment_done(0, 0, synthesis_s=0.1)
    assert "AudioDone" in _names(core.data_to_send())  # one file a segment: nothing can follow it


def test_another_context_s_segment_ends_a_held_sentence_before_it_starts() -> None:
    """A sentence held for a pause (its utterance open) ends, with its ``audio.done``, before a segment of
    another utterance starts: on the wire a segment's audio runs from its ``audio.start`` to its
    ``audio.done`` unbroken, which the codecs that name the segment of each frame by the last
    ``audio.start`` (ElevenLabs') rely on."""
    core = Core(PCM, Session())
    core.receive_text(json.dumps({"type": "session.config"}), 0.0)
    (configure,) = core.data_to_send()
    assert isinstance(configure, Configure)
    core.accept_config(configure.config, PCM)
    for context, words in (("a", "First one. "), ("b", "Second one. ")):
        core.receive_text(json.dumps({"type": "input.text", "text": words, "context_id": context}), 0.0)
    speaks = [o for o in core.data_to_send() if isinstance(o, Speak)]
    assert [(s.utterance, s.text) for s in speaks] == [(0, "First one."), (1, "Second one.")]
    core.segment_started(0, 0)
    core.audio(0, 0, np.full(RATE // 2, 0.25, dtype=np.float32), RATE)
    core.segment_done(0, 0, synthesis_s=0.1)
    held = [o.msg for o in core.data_to_send() if isinstance(o, Message)]
    assert [type(m) for m in held] == [AudioStart]  # its audio.done waits: a pause may follow
    core.segment_started(1, 0)
    out = [core.sending(o, 0.2) for o in core.data_to_send()]
    msgs = [o.msg for o in out if isinstance(o, Message)]
    assert [(type(m), m.utterance_index) for m in msgs] == [(AudioDone, 0), (AudioStart, 1)]  # type: ignore[union-attr]
