"""The utterances of one session's core: their records, and the set of those in flight.

``InFlight`` holds the utterances whose ``session.done`` is not written yet, by index, by context and in
their order of report, those written but still playing, and the text they still owe the engine
(``backlog``). The core (``protocol.core``) alone changes it; the session (``protocol.session``) asks it
for what its caps count (``Session.queue``: ``max_pending_text_chars``, ``max_in_flight``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from .alignment import WordNamer
from .joins import Fader
from .output import OutputFormat
from .packer import AudioPacker

#: Utterances kept per context, once written, while their audio still plays (``audio.cancelled`` reports
#: what was heard of them): more than a client buffers, for any reply but a flood of tiny ones.
PLAYING = 32


def letters(text: str) -> int:
    """The characters of ``text`` that are not whitespace (``UtteranceCounts.unsegmented`` counts them)."""
    return len(text) - sum(ch.isspace() for ch in text)


@dataclass(slots=True)
class SegmentTimes:
    """When a segment's steps came, on the session's clock (``Segment.times``)."""

    ready_t: float  # handed to the engine
    started_t: float | None = None  # its audio.start was written: the engine began it
    first_sent_t: float | None = None  # its first audio (not a pause's) was written
    synthesis_s: float = 0.0  # the engine's time on it


@dataclass(slots=True)
class SegmentClock:
    """Where a segment's audio stands on the utterance clock, in seconds unless named (``Segment.clock``)."""

    start_ms: float = 0.0  # where its audio starts on the utterance clock
    engine_s: float = 0.0  # engine audio taken so far (the clock of the words that come with it)
    made_s: float = 0.0  # audio handed out (Audio outputs)
    sent_s: float = 0.0  # of which written


@dataclass(slots=True)
class SegmentPause:
    """The sentence pause in a segment's audio (``protocol.pauses``; ``Segment.pause``)."""

    paused_s: float = 0.0  # pause in its audio, after or before its speech
    lead_s: float = 0.0  # of a pause before its speech, what is not written yet (not its first audio)


@dataclass(slots=True)
class SegmentWords:
    """How a segment's words are named in the client's text and timed (``Segment.words``)."""

    source: str = ""  # the client's text it stands for (sentence_text)
    namer: WordNamer | None = None  # names its words in that text, where it differs from the segment's text
    timed: list[tuple[int, float]] = field(default_factory=list)  # each word timed: its end in text, in ms
    timed_at: int = 0  # where in the segment's text the next timed word is looked for
    chunks: int = 0  # audio.chunk word messages sent


@dataclass(slots=True)
class Segment:
    """One segment of an utterance: its text, the engine's work on it, its audio made and written."""

    text: str
    times: SegmentTimes
    words: SegmentWords
    clock: SegmentClock = field(default_factory=SegmentClock)
    pause: SegmentPause = field(default_factory=SegmentPause)
    counted: int = 0  # utterance samples already handed out as Audio
    started: bool = False  # synthesis began (its text left the session's backlog)
    total_bytes: int = 0
    samples: int = 0
    error: bool = False
    reported: bool = False  # its audio.done was written
    finished: bool = False  # segment_done came
    fader: Fader | None = None  # its first and last milliseconds ramped (``protocol.joins``)
    rate: int = 0  # the engine's sample rate, from its first audio

    @classmethod
    def open(cls, text: str, now: float, source: str, namer: WordNamer | None) -> Segment:
        """A segment of ``text`` handed to the engine at ``now``, standing for ``source`` (named by
        ``namer`` where it differs)."""
        return cls(text, SegmentTimes(now), SegmentWords(source, namer))


@dataclass(slots=True)
class UtteranceTimes:
    """When an utterance's text and audio came, on the session's clock (``Utterance.times``)."""

    first_text_t: float | None  # its first text (None: it has none)
    first_audio_t: float | None = None  # its first audio written
    synthesis_s: float = 0.0  # the engine's time on its segments


@dataclass(slots=True)
class UtterancePause:
    """An utterance's sentence pause (``protocol.pauses``; ``Utterance.pause``)."""

    on: bool = False  # a sentence end may be followed by a pause (streamed, timed cuts on)
    held: int | None = None  # a segment ended on a sentence, its audio.done held while a pause may follow
    at: int | None = None  # the segment a pause goes into, until the next speech (``Core._pause_due``)
    paused_s: float = 0.0  # pause written at this sentence end


@dataclass(slots=True)
class UtteranceCounts:
    """How far an utterance's text and segments have come (``Utterance.counts``)."""

    total: int | None = None  # segments, once all the text is segmented
    done: int = 0  # segments whose audio is finished
    unsegmented: int = 0  # characters (not spaces) of its text received and not yet in a segment


@dataclass(slots=True)
class Utterance:
    """One utterance in flight: its segments, its audio packer, its timings and its listener clock."""

    index: int
    packer: AudioPacker
    streamed: bool
    times: UtteranceTimes
    context: int = 0  # its context's number
    context_id: str | None = None
    words: bool = False  # the config asked for word timings
    segments: dict[int, Segment] = field(default_factory=dict)
    counts: UtteranceCounts = field(default_factory=UtteranceCounts)
    pause: UtterancePause = field(default_factory=UtterancePause)
    reported: bool = False  # session.done handed out
    text: list[str] = field(default_factory=list)  # the client's text, as sent (``Session.take_received``)
    sent_s: float = 0.0  # its audio written
    play_end: float | None = None  # when its audio written ends, played in real time after what went before

    @classmethod
    def open(
        cls,
        index: int,
        fmt: OutputFormat,
        now: float | None,
        context: int,
        context_id: str | None,
        eager: bool,
    ) -> Utterance:
        """A new utterance in ``fmt``, its first text at ``now`` (None: it has none); ``eager``: timed cuts
        are on, so sentence pauses are too (in a streamed format)."""
        packer = AudioPacker(
            index,
            fmt=fmt.fmt,
            sample_rate=fmt.sample_rate,
            frame_ms=fmt.frame_ms,
            frame_header=fmt.frame_header,
            stream_audio=fmt.streamed,
            context_number=context,
            bitrate=fmt.bitrate,
        )
        times, pause = UtteranceTimes(now), UtterancePause(on=fmt.streamed and eager)
        return cls(index, packer, fmt.streamed, times, context, context_id, fmt.word_timestamps, pause=pause)


class InFlight:
    """The utterances of a session whose ``session.done`` is not written yet, and what they still owe."""

    def __init__(self) -> None:
        self.utterances: dict[int, Utterance] = {}
        # The same, by context number: a cancel of one context costs its utterances, not the session's.
        self.by_context: dict[int, dict[int, Utterance]] = {}
        # Utterances whose session.done is not handed out yet, in order, by context: ``finished`` looks at
        # the head of each, so an utterance ended behind a long one costs nothing until that one is done.
        self.unreported: dict[int, collections.deque[Utterance]] = {}
        # Utterances whose session.done is written while their audio still plays, by context: a cancel
        # reports what the listener heard of them too (the oldest go once heard, or past ``PLAYING``).
        self.playing: dict[int, collections.deque[Utterance]] = {}
        #: Characters of segments handed out whose synthesis has not started: the text the utterances still
        #: owe the engine.
        self.backlog = 0

    @property
    def in_flight(self) -> int:
        """Utterances whose ``session.done`` is not written yet."""
        return len(self.utterances)

    def add(self, u: Utterance) -> None:
        """A new utterance, last in its context's order of report."""
        self.utterances[u.index] = u
        self.by_context.setdefault(u.context, {})[u.index] = u
        self.unreported.setdefault(u.context, collections.deque()).append(u)

    def remove(self, u: Utterance) -> None:
        """Its ``session.done`` is written, or it is cancelled."""
        del self.utterances[u.index]
        group = self.by_context[u.context]
        del group[u.index]
        if not group:
            del self.by_context[u.context]

    def forget(self, victims: tuple[Utterance, ...]) -> None:
        """Cancelled: every utterance of their contexts (``Core._drop``) or of all (``Core.cancel``)."""
        for u in victims:
            self.backlog -= sum(len(seg.text) for seg in u.segments.values() if not seg.started)
            self.remove(u)
            self.unreported.pop(u.context, None)

    def busy(self, context: int) -> bool:
        """Whether audio of the context is still being made or sent (an ``audio.done`` not yet written)."""
        utterances = self.by_context.get(context, {}).values()
        return any(not seg.reported for u in utterances for seg in u.segments.values())

    def finished(self) -> list[Utterance]:
        """The utterances whose ``session.done`` may go out now: all their audio is done, and every earlier
        one of their context's is reported; across contexts in the order they opened."""
        finished: list[Utterance] = []
        for context, queue in list(self.unreported.items()):
            while (
                queue and queue[0].counts.total is not None and queue[0].counts.done >= queue[0].counts.total
            ):
                finished.append(queue.popleft())
            if not queue:
                del self.unreported[context]
        return sorted(finished, key=lambda u: u.index)

    def played(self, u: Utterance, now: float) -> None:
        """``u``'s ``session.done`` is written at ``now``: kept while its audio still plays (a cancel reports
        it), and the utterances of its context heard to their end by now are let go."""
        self.remove(u)
        if u.play_end is not None and u.play_end > now:  # still heard: a cancel reports it
            playing = self.playing.setdefault(u.context, collections.deque(maxlen=PLAYING))
            while playing and playing[0].play_end is not None and playing[0].play_end <= now:
                playing.popleft()
            playing.append(u)
