"""The sans-I/O session core: utterances in flight, their audio, the cancel rules, outputs and timings.

One ``Core`` per session, on every surface: the WebSocket connection and the REST speech route both
drive it. Client messages go in through ``receive_text`` / ``receive_bytes`` (WebSocket) or
``receive_message`` (REST, already decoded); the core's ``Session`` (``protocol.session``: states and
segmentation) turns them into events, which ``receive`` applies. The shell's engine work goes in
through ``segment_started`` / ``audio`` / ``segment_done``; typed outputs (``protocol.output``) come
out of ``data_to_send``, in the order they take effect. Time is an argument (``now``, in seconds of
one monotonic clock): the core never reads a clock, and never awaits. The one thing time alone
decides is the early cut of an utterance's first segment: ``next_deadline`` says when it is due and
the shell calls ``tick`` then (any message that comes in later fires it too). Flow control (a bounded
outbox, send timeouts) and timeouts are the shell's.

The rules it owns:

- An utterance's ``session.done`` comes after the ``audio.done`` of all its segments, and after the
  ``session.done`` of every earlier utterance; ``Finish`` (after ``session.close``) comes last.
- A cancel drops every utterance the client has not yet been told is done (``session.done`` not yet
  written): the core forgets them, so engine work that still reports on them produces nothing.
- An utterance is forgotten once its ``session.done`` is written (``sending``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from voxgate.protocol.audio import Samples
from voxgate.protocol.errors import ProtocolError
from voxgate.protocol.messages import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    ClientMessage,
    Error,
    InputCommitted,
    SessionConfig,
    SessionDone,
    WordTimestamp,
    WordTimestamps,
)
from voxgate.protocol.output import (
    Audio,
    Configure,
    Drop,
    Finish,
    Message,
    Output,
    OutputFormat,
    Report,
    Speak,
)
from voxgate.protocol.packer import AudioPacker
from voxgate.protocol.session import (
    CloseRequested,
    Committed,
    ConfigAccepted,
    Event,
    SegmentReady,
    Session,
    UtteranceCancelled,
    UtteranceEnded,
    UtteranceStarted,
)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


@dataclass(slots=True)
class _Segment:
    text: str
    ready_t: float
    counted: int = 0  # utterance samples already handed out as Audio
    started: bool = False  # synthesis began (its text left the session's backlog)
    first_sent_t: float | None = None
    synthesis_s: float = 0.0
    total_bytes: int = 0
    samples: int = 0
    error: bool = False
    start_ms: float = 0.0  # where its audio starts on the utterance clock
    engine_s: float = 0.0  # engine audio taken so far (the clock of the words that come with it)
    word_chunks: int = 0  # audio.chunk word messages sent


@dataclass(slots=True)
class _Utterance:
    index: int
    packer: AudioPacker
    streamed: bool
    first_text_t: float | None
    first_audio_t: float | None = None
    synthesis_s: float = 0.0
    segments: dict[int, _Segment] = field(default_factory=dict)
    total: int | None = None  # segments, once all the text is segmented
    done: int = 0  # segments whose audio is finished
    reported: bool = False  # session.done handed out


class Core:
    """The state of one session's speech, independent of the surface and its I/O.

    Args:
        fmt: the output format of the utterances that start before ``accept_config`` sets another.
        session: the text side (its limits and dialect); a default ``Session`` if omitted.
    """

    def __init__(self, fmt: OutputFormat, session: Session | None = None) -> None:
        self.session = session or Session()
        self._format = fmt
        self._utterances: dict[int, _Utterance] = {}
        self._out: list[Output] = []
        self._closing = False
        self._deadline: float | None = None  # when the eager first segment's text has waited enough
        self._parked = False  # the deadline passed but the text allowed no cut: wait for more text

    def next_deadline(self) -> float | None:
        """When the shell must call ``tick`` (on the clock of ``now``), or None when nothing is due."""
        return None if self._parked else self._deadline

    def tick(self, now: float) -> None:
        """Let time pass: once the eager first segment has waited its budget, cut it if the text allows.

        A segment that waited ``max_buffer_delay_ms`` since its first text arrived, with no sentence end,
        is cut at the best point available (``Segmenter.cut_early``); if none is, the cut waits for
        more text (``next_deadline`` is None until a message arrives).
        """
        if self._deadline is None or self._parked or now < self._deadline:
            return
        for event in self.session.cut_early():
            self.receive(event, now)
        if self.session.eager_pending:
            self._parked = True
        else:
            self._deadline = None

    def receive_text(self, data: str, now: float) -> None:
        """Take one text WebSocket message, received at ``now``.

        Raises:
            ProtocolError: the message is refused; ``fatal`` says whether the session must close.
        """
        self._apply(self.session.receive_text(data), now)

    def receive_bytes(self, data: bytes, now: float) -> None:
        """Take one binary WebSocket message (always refused: clients send JSON text).

        Raises:
            ProtocolError: always.
        """
        self._apply(self.session.receive_bytes(data), now)

    def receive_message(self, msg: ClientMessage, now: float) -> None:
        """Take one decoded client message, as a surface without JSON messages (REST) feeds its text.

        Raises:
            ProtocolError: the message is illegal in the session's state.
        """
        self._apply(self.session.receive(msg), now)

    def accept_config(self, config: SessionConfig, fmt: OutputFormat) -> None:
        """Adopt a config the shell checked (after ``Configure``): it applies from the next utterance."""
        self.session.accept_config(config)
        self._format = fmt

    def reject_config(self, error: ProtocolError) -> ProtocolError:
        """Turn the engines' refusal of a config into the error to report (fatal before the first one)."""
        return self.session.reject_config(error)

    @property
    def in_flight(self) -> tuple[int, ...]:
        """The utterances whose ``session.done`` has not been written yet."""
        return tuple(self._utterances)

    def receive(self, event: Event, now: float) -> None:
        """Apply a text-side event of ``protocol.session``; a ``ConfigAccepted`` becomes ``Configure``.

        Args:
            event: what the session's text side decided.
            now: the time it was received.
        """
        match event:
            case ConfigAccepted(config=config, ignored_fields=ignored):
                self._out.append(Configure(config, ignored))
            case UtteranceStarted(utterance_index=u):
                self._open(u, now)
            case SegmentReady(utterance_index=u, sentence_index=s, text=text):
                self._utterance(u).segments[s] = _Segment(text, now)
                self.session.backlog += len(text)
                self._out.append(Speak(u, s, text))
            case UtteranceEnded(utterance_index=u, total_sentences=n):
                self._utterance(u).total = n
                self._settle()
            case UtteranceCancelled(utterance_index=u):
                self.cancel(u)
            case Committed(commit_id=commit_id, utterance_index=u, sentence_index=s):
                self._out.append(
                    Message(InputCommitted(commit_id=commit_id, utterance_index=u, sentence_index=s))
                )
            case CloseRequested():  # pragma: no branch - the last kind of Event
                self._closing = True
                self._settle()

    def cancel(self, open_index: int | None = None) -> None:
        """Barge-in: drop every utterance in flight, and confirm with one ``audio.cancelled`` each.

        Args:
            open_index: the utterance the client had open, confirmed when nothing was in flight.
        """
        victims = tuple(self._utterances)
        for u in self._utterances.values():
            self.session.backlog -= sum(len(seg.text) for seg in u.segments.values() if not seg.started)
        self._utterances.clear()
        self._out.append(Drop(victims))
        for index in victims or (open_index,):
            self._out.append(Message(AudioCancelled(utterance_index=index)))

    def segment_started(self, utterance: int, sentence: int) -> None:
        """The engine is about to synthesize a segment (a ``Speak``): announces it with ``audio.start``."""
        u = self._utterances.get(utterance)
        if u is None:
            return  # cancelled
        seg = u.segments[sentence]
        seg.started = True
        self.session.backlog -= len(seg.text)
        start = seg.counted = u.packer.start_segment(sentence)
        seg.start_ms = start * 1000.0 / u.packer.sample_rate
        msg = AudioStart(
            utterance_index=utterance,
            sentence_index=sentence,
            sentence_text=seg.text,
            format=u.packer.fmt,
            sample_rate=u.packer.sample_rate,
            start_sample=start,
        )
        self._out.append(Message(msg, utterance, streamed=u.streamed))

    def audio(
        self,
        utterance: int,
        sentence: int,
        samples: Samples,
        sample_rate: int,
        words: Sequence[tuple[str, int, int]] = (),
    ) -> None:
        """Engine audio of a started segment, at the engine's ``sample_rate``.

        ``words`` are the timings of the words in it, ``(word, start, end)`` in samples from its first
        sample at ``sample_rate`` (``engine.base.WordTiming``): they go out as an ``audio.chunk`` before
        its frames, in milliseconds on the utterance's output clock.
        """
        u = self._utterances.get(utterance)
        if u is None:
            return
        seg = u.segments[sentence]
        if words:
            self._words(u, sentence, seg, len(samples), sample_rate, words)
        seg.engine_s += len(samples) / sample_rate
        self._frames(u, sentence, u.packer.push(samples, sample_rate))

    def segment_done(
        self, utterance: int, sentence: int, *, synthesis_s: float, error: ProtocolError | None = None
    ) -> None:
        """The engine finished a started segment, or failed on it (``error``; the next ones go on).

        Args:
            utterance: the segment's utterance.
            sentence: its index in the utterance.
            synthesis_s: the time the engine took to make its audio (waiting for a reader excluded).
            error: why it failed, reported after its ``audio.done`` (``error: true``).
        """
        u = self._utterances.get(utterance)
        if u is None:
            return
        seg, packer = u.segments[sentence], u.packer
        self._frames(u, sentence, packer.end_segment())
        seg.synthesis_s, seg.error = synthesis_s, error is not None
        seg.total_bytes, seg.samples = packer.segment_bytes, packer.segment_samples
        u.synthesis_s += synthesis_s
        self._out.append(Report(utterance, sentence))
        if error is not None:
            msg = Error(code=error.code, message=error.message, utterance_index=utterance, field=error.field)
            self._out.append(Message(msg, utterance))
        u.done += 1
        self._settle()

    def data_to_send(self) -> list[Output]:
        """The outputs produced since the last call, in order; the shell acts on each."""
        out, self._out = self._out, []
        return out

    def sending(self, output: Output, now: float) -> Output | None:
        """Call just before writing ``output``: stamps send times and fills in a ``Report``.

        Returns:
            What to write: ``output`` itself, a ``Message`` for a ``Report``, or None for a report
            on an utterance cancelled meanwhile.
        """
        match output:
            case Audio(utterance=index, sentence=sentence):
                u = self._utterances.get(index)
                if u is not None:
                    seg = u.segments[sentence]
                    seg.first_sent_t = now if seg.first_sent_t is None else seg.first_sent_t
                    u.first_audio_t = now if u.first_audio_t is None else u.first_audio_t
            case Report(utterance=index, sentence=None):
                u = self._utterances.pop(index, None)
                return None if u is None else Message(self._session_done(u), index)
            case Report(utterance=index, sentence=int(sentence)):
                u = self._utterances.get(index)
                return None if u is None else Message(self._audio_done(u, sentence), index)
        return output

    def _apply(self, events: list[Event], now: float) -> None:
        for event in events:
            self.receive(event, now)
        if not self.session.eager_pending:
            self._deadline = None
        elif self._deadline is None:
            self._deadline = now + self.session.max_buffer_delay_s
        self._parked = False
        self.tick(now)

    def _open(self, index: int, now: float | None) -> _Utterance:
        fmt = self._format
        packer = AudioPacker(
            index,
            fmt=fmt.fmt,
            sample_rate=fmt.sample_rate,
            frame_ms=fmt.frame_ms,
            frame_header=fmt.frame_header,
            stream_audio=fmt.streamed,
        )
        u = self._utterances[index] = _Utterance(index, packer, fmt.streamed, now)
        return u

    def _utterance(self, index: int) -> _Utterance:
        # input.done with no text ends an utterance that never started
        return self._utterances.get(index) or self._open(index, None)

    def _frames(self, u: _Utterance, sentence: int, frames: list[bytes]) -> None:
        seg, packer = u.segments[sentence], u.packer
        new_samples, seg.counted = packer.samples_sent - seg.counted, packer.samples_sent
        if frames:
            audio_s = new_samples / packer.sample_rate / len(frames)  # a whole segment when not streamed
            self._out.extend(Audio(frame, u.index, sentence, audio_s) for frame in frames)

    def _words(
        self,
        u: _Utterance,
        sentence: int,
        seg: _Segment,
        length: int,
        rate: int,
        words: Sequence[tuple[str, int, int]],
    ) -> None:
        # Resampling keeps time, so engine seconds into the segment are output seconds into it.
        base = seg.start_ms + seg.engine_s * 1000.0

        def ms(sample: int) -> float:
            return round(base + sample * 1000.0 / rate, 2)

        msg = WordTimestamps(
            utterance_index=u.index,
            sentence_index=sentence,
            chunk_id=seg.word_chunks,
            chunk_start_ms=ms(0),
            chunk_end_ms=ms(length),
            sample_rate=u.packer.sample_rate,
            timestamps=[WordTimestamp(word=w, start_ms=ms(start), end_ms=ms(end)) for w, start, end in words],
        )
        seg.word_chunks += 1
        self._out.append(Message(msg, u.index))

    def _settle(self) -> None:
        """Hand out the ``session.done`` of finished utterances in order, then ``Finish`` when closing."""
        for u in self._utterances.values():
            if u.reported:
                continue
            if u.total is None or u.done < u.total:
                return
            u.reported = True
            self._out.append(Report(u.index))
        if self._closing:
            self._closing = False
            self._out.append(Finish())

    def _audio_done(self, u: _Utterance, sentence: int) -> AudioDone:
        seg = u.segments[sentence]
        ready = seg.first_sent_t - seg.ready_t if seg.first_sent_t is not None else None
        return AudioDone(
            utterance_index=u.index,
            sentence_index=sentence,
            total_bytes=seg.total_bytes,
            duration_ms=round(seg.samples * 1000.0 / u.packer.sample_rate, 2),
            error=seg.error,
            text_to_first_audio_ms=_ms(ready),
            synthesis_ms=_ms(seg.synthesis_s) or 0.0,
        )

    def _session_done(self, u: _Utterance) -> SessionDone:
        first = None
        if u.first_audio_t is not None and u.first_text_t is not None:
            first = u.first_audio_t - u.first_text_t
        return SessionDone(
            utterance_index=u.index,
            total_sentences=u.total or 0,
            first_text_to_first_audio_ms=_ms(first),
            audio_ms=round(u.packer.samples_sent * 1000.0 / u.packer.sample_rate, 2),
            synthesis_ms=_ms(u.synthesis_s) or 0.0,
        )
