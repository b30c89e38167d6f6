"""The listener clock on a fake clock: text streamed word by word, an engine of known pace, a listener.

``Run`` is a discrete-event driver of one ``Core``: words arrive at a steady rate, the shell ticks at
``next_deadline``, a serial engine gives each segment's audio ``latency_s`` after it starts, and the
listener plays the audio written in real time from its first frame, behind a ``jitter_s`` buffer (as a
real player does; the core does not count on it). A gap is audio that comes after the listener has
heard everything before it.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable

import numpy as np
import pytest
from voxgate.protocol.core import Core
from voxgate.protocol.messages import InputDone
from voxgate.protocol.output import Audio, Configure, OutputFormat, Speak
from voxgate.protocol.pace import Pace

RATE = 8000
PCM = OutputFormat("pcm", RATE, frame_ms=100)
SECONDS_PER_CHAR = 0.066  # about Piper's joe: 15 characters a second


class Run:
    """One utterance streamed at ``words_per_s`` into a core whose engine takes ``latency_s`` per segment."""

    def __init__(
        self, words_per_s: float, latency_s: float = 0.15, config: str = "", jitter_s: float = 0.15
    ) -> None:
        self.core = Core(PCM)
        self.core.receive_text(f'{{"type": "session.config"{config}}}', 0.0)
        (configure,) = self.core.data_to_send()
        assert isinstance(configure, Configure)
        self.core.accept_config(configure.config, PCM)
        self.words_per_s = words_per_s
        self.latency_s = latency_s
        self.jitter_s = jitter_s
        self.now = 0.0
        self.busy = 0.0  # when the engine is free
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.order = itertools.count()
        self.speaks: list[tuple[float, str]] = []
        self.play_end: float | None = None
        self.gaps: list[float] = []

    def at(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (t, next(self.order), action))

    def speak(self, text: str, at_once: str = "") -> list[str]:
        """Stream ``text`` a word at a time after ``at_once``, which arrives whole at 0; the segments."""
        if at_once:
            self.at(0.0, lambda: self._text(at_once))
        words = text.split(" ")
        for n, word in enumerate(words):
            fragment = word if n == 0 and not at_once else " " + word
            self.at((n + bool(at_once)) / self.words_per_s, functools.partial(self._text, fragment))
        self.at((len(words) + bool(at_once)) / self.words_per_s, lambda: self._done())
        while self.events or self.core.next_deadline() is not None:
            due = self.core.next_deadline()
            if due is not None and (not self.events or due < self.events[0][0]):
                self.now = max(self.now, due)
                self.core.tick(self.now)
            else:
                self.now, _, action = heapq.heappop(self.events)
                action()
            self._drain()
        return [text for _, text in self.speaks]

    def _text(self, fragment: str) -> None:
        self.core.receive_text(f'{{"type": "input.text", "text": "{fragment}"}}', self.now)

    def _done(self) -> None:
        self.core.receive_message(InputDone(), self.now)

    def _drain(self) -> None:
        for output in self.core.data_to_send():
            if isinstance(output, Speak):
                self.speaks.append((self.now, output.text))
                start = max(self.now, self.busy)
                self.busy = start + self.latency_s
                self.at(start, functools.partial(self._start, output))
                continue
            written = self.core.sending(output, self.now)
            if isinstance(written, Audio) and written.audio_s > 0:
                heard = self.now + self.jitter_s
                if self.play_end is not None and heard > self.play_end + 1e-9:
                    self.gaps.append(heard - self.play_end)
                self.play_end = max(heard, self.play_end or heard) + written.audio_s

    def _start(self, speak: Speak) -> None:
        self.core.segment_started(speak.utterance, speak.sentence)
        self.at(self.now + self.latency_s, lambda: self._synthesized(speak))

    def _synthesized(self, speak: Speak) -> None:
        samples = np.full(round(len(speak.text) * SECONDS_PER_CHAR * RATE), 0.25, dtype=np.float32)
        self.core.audio(speak.utterance, speak.sentence, samples, RATE)
        self.core.segment_done(speak.utterance, speak.sentence, synthesis_s=self.latency_s)


LONG_SECOND = (
    "I can definitely help you reschedule that appointment, and I will check the calendar for an open "
    "slot early next week before I confirm anything with you."
)


# At 6 words a second "Sure!" (0.33 s here) cannot bridge the 0.5 s until "I can definitely help" has
# arrived (the shortest cut that leaves no word alone): that gap is the text's, not the cut rule's.
@pytest.mark.parametrize("words_per_s", [12, 25])
def test_a_short_first_sentence_then_a_long_one_is_cut_in_time_never_leaving_a_word_alone(
    words_per_s: int,
) -> None:
    run = Run(words_per_s)
    spoken = run.speak("Sure! " + LONG_SECOND)
    assert spoken[0] == "Sure!" and len(spoken) > 2  # the second sentence was cut to be in time
    assert " ".join(spoken) == "Sure! " + LONG_SECOND  # every word, in order
    assert all(len(text.split()) >= 2 for text in spoken[1:])  # never one word alone
    assert run.gaps == []  # the listener never ran dry


FIRST = "Hello, and thanks for calling us today!"


@pytest.mark.parametrize("words_per_s", [6, 12])
def test_a_short_first_sentence_then_a_long_one_is_cut_at_a_clause_in_time(words_per_s: int) -> None:
    run = Run(words_per_s)
    spoken = run.speak(FIRST + " " + LONG_SECOND)
    assert spoken[:2] == [FIRST, "I can definitely help you reschedule that appointment,"]
    assert run.gaps == []
    # Cut once waiting longer would cost the listener: after the clause came (words 17 and 18, "and I",
    # came at 17/rate), long before the sentence's end (word 34).
    assert 17 / words_per_s <= run.speaks[1][0] < 34 / words_per_s


def test_a_long_sentence_that_arrives_in_time_is_not_cut() -> None:
    run = Run(25)  # its last word comes 1 s after the first: before the first sentence has played
    assert run.speak(FIRST + " " + LONG_SECOND) == [FIRST, LONG_SECOND]
    assert run.gaps == []


def test_a_sentence_that_arrives_before_the_listener_runs_low_is_not_cut() -> None:
    first = "The weather today will be mostly sunny with a high of seventy two degrees and a light breeze."
    second = "Tomorrow looks wetter, so keep an umbrella close, and check the forecast again tonight."
    run = Run(6)
    assert run.speak(second, at_once=first) == [first, second]
    assert run.gaps == []


def test_without_timed_cuts_later_segments_wait_for_their_sentence_end() -> None:
    run = Run(6, config=', "split_granularity": "sentence"')  # vllm-omni's mode: no timed cuts
    assert run.speak("Sure! " + LONG_SECOND) == ["Sure!", LONG_SECOND]
    assert run.gaps  # and the listener hears the silence the rule avoids


def test_the_engine_pace_is_learned_from_what_it_did() -> None:
    pace = Pace()
    prior = pace.first_audio_s(100)
    assert prior == pytest.approx(0.5)  # the conservative prior: 0.1 s + 4 ms a character
    for chars in (20, 60, 100, 150) * 5:
        pace.first_audio(chars, 0.15)  # a remote engine: its first chunk costs the same for any text
    assert pace.first_audio_s(10) == pytest.approx(0.15, abs=0.03)
    assert pace.first_audio_s(300) == pytest.approx(0.15, abs=0.03)
    pace.first_audio(60, 0.55)  # a burst of load: 0.4 s late
    assert pace.first_audio_s(60) > 0.5  # what it may take again, for a while
    for _ in range(40):
        pace.first_audio(60, 0.15)
    assert pace.first_audio_s(60) == pytest.approx(0.15, abs=0.03)  # forgotten once it is over
    assert pace.audio_s(100) == pytest.approx(100 * 0.06 * 0.9)
    pace.spoken(100, 7.0)
    pace.spoken(0, 1.0)  # nothing to learn from
    assert 100 * 0.06 * 0.9 < pace.audio_s(100) < 100 * 0.07 * 0.9


def test_audio_without_its_start_written_and_a_start_after_a_cancel_teach_nothing() -> None:
    core = Run(6).core
    core.receive_text('{"type": "input.text", "text": "Hello there. And"}', 0.0)
    assert [o.text for o in core.data_to_send() if isinstance(o, Speak)] == ["Hello there."]
    core.segment_started(0, 0)
    start, *_ = core.data_to_send()
    core.audio(0, 0, np.full(1600, 0.25, dtype=np.float32), RATE)
    prior = core.pace.first_audio_s(12)
    for output in core.data_to_send():
        core.sending(output, 1.0)  # its audio.start was never written: no latency to learn
    assert core.pace.first_audio_s(12) == prior
    core.cancel()
    assert core.sending(start, 2.0) is start  # written after the cancel: nothing to stamp
