"""The sans-I/O session core: utterances in flight, their audio, the cancel rules, outputs and timings.

One ``Core`` per session, on every surface: the WebSocket connection and the REST speech route both
drive it. Client messages go in through ``receive_text`` / ``receive_bytes`` (WebSocket) or
``receive_message`` (REST, already decoded); the core's ``Session`` (``protocol.session``: states and
segmentation) turns them into events, which ``receive`` applies. The shell's engine work goes in
through ``segment_started`` / ``audio`` / ``segment_done``; typed outputs (``protocol.output``) come
out of ``data_to_send``, in the order they take effect. Time is an argument (``now``, in seconds of
one monotonic clock): the core never reads a clock, and never awaits. Two things time alone decides:
the cut of a segment before its sentence ends (timed cuts: the listener clock below), and the idle
timeout of a named context. ``next_deadline`` says when the next is due and the shell calls ``tick``
then (any message that comes in later fires it too). Flow control (a bounded outbox, send timeouts)
and the session's own timeouts are the shell's.

The rules it owns:

- An utterance's ``session.done`` comes after the ``audio.done`` of all its segments, and after the
  ``session.done`` of every earlier utterance of its context; ``Finish`` (after ``session.close``)
  comes last.
- A cancel drops every utterance (of its context, or of every context) the client has not yet been
  told is done (``session.done`` not yet written): the core forgets them, so engine work that still
  reports on them produces nothing. A cancel costs what it cancels: utterances are also indexed by
  context, so a cancel of one context never walks the others' (a flood of cancels stays linear).
- An utterance is forgotten once its ``session.done`` is written (``sending``).
- Every segment's audio, whatever the engine, starts and ends with a few milliseconds of fade
  (``protocol.joins``): no click where an engine's segment starts or stops mid-sound.
- The listener clock (timed cuts, ``eager_first_segment``; docs/protocol.md §5). A segment waits for its
  sentence end, which sounds best, unless waiting would let the listener run dry. The first segment of an
  utterance has its time budget, ``max_buffer_delay_ms`` from its first text. A later one is cut at the
  best boundary its text has (``Segmenter.cut_early``) once ``now`` reaches the listener's deadline: when
  the audio ahead of the listener runs out, less the engine's estimated time to the first audio of the
  text waiting (``protocol.pace``), less ``MARGIN_S``. The audio ahead is each context's audio written
  (``sending``) played in real time from its first frame (a gap restarts the clock), then the audio its
  open utterance's segments still owe: what the engine made and is not written yet, and, for segments
  not finished, at least ``Pace.audio_s`` of their text, from their estimated first audio on. Read receipts
  (``read``) refine it: audio the client had not read when it answered ends no sooner than the answer plus
  its length.
- Sentence pauses (``protocol.pauses``). After a segment that ends a sentence, while the utterance's next
  audio is not made, silence is written as audio, just in time (the listener clock down to
  ``pauses.LEAD_S``), up to ``pauses.MAX_S``: the listener hears a speaker's pause, not a dropout. It ends
  the segment before it (whose ``audio.done`` waits for the next segment's start) or begins the next one.
- What the listener heard (docs/protocol.md §8). Each ``audio.cancelled`` says how much of its
  utterance's audio the listener has heard on the listener clock (its audio written, played in real time
  after the context's audio written before it) and cuts the utterance's text, as the client sent it
  (``Session.received``), after the last word heard: by the engine's word timings when the config asked
  for them, else by each segment's audio spread over its characters; the normalizer's map (``WordNamer``'s
  ``origins``) turns a spoken position into the client's. An utterance whose ``session.done`` is written is
  kept while its audio still plays, so that a cancel reports it too.
- Contexts (``protocol.session``): messages of a named context's utterances carry its ``context_id``
  and its frames its ``context_number``; ``context.closed`` follows its last ``session.done`` (a
  graceful close), or its ``audio.cancelled`` (a cancel, an idle timeout). A named context is idle
  once no message named it for ``context_idle_timeout_s`` and none of its audio is still being made
  or sent (the time counts from its last ``audio.done`` written, if later).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from . import pauses
from .alignment import WordNamer
from .audio import Samples
from .contexts import Context
from .errors import ProtocolError
from .events import (
    CloseRequested,
    Committed,
    ConfigAccepted,
    ContextActive,
    ContextCancelled,
    ContextEnded,
    ContextStarted,
    Event,
    SegmentReady,
    UtteranceCancelled,
    UtteranceEnded,
    UtteranceStarted,
)
from .joins import Fader
from .messages import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    ClientMessage,
    CloseReason,
    ContextClosed,
    ContextOpened,
    Error,
    InputCommitted,
    SessionConfig,
    SessionDone,
    WordTimestamp,
    WordTimestamps,
    wire_context_id,
)
from .output import (
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
from .pace import AUDIO_SHARE, Pace
from .packer import AudioPacker
from .session import Session

#: Slack the listener keeps when a segment is cut to be in time: frames in flight, the client's jitter
#: buffer, the error of the engine estimate (``protocol.pace``): a cut this early costs nothing audible.
MARGIN_S = 0.15
#: Utterances kept per context, once written, while their audio still plays (``audio.cancelled`` reports
#: what was heard of them): more than a client buffers, for any reply but a flood of tiny ones.
_PLAYING = 32
#: Rounding of the sums of frame durations: audio this close to a segment's end counts as heard to it.
_SLACK_MS = 0.5


def _named(namer: WordNamer | None, words: list[tuple[str, float, float]]) -> list[WordTimestamp]:
    """The engine's timed words named in the client's text: the spoken words of one written word ("three
    dollars and fifty cents" for "$3.50", "five dollars." for "$5.") are one entry, from the first one's
    start to the last one's end."""
    out: list[WordTimestamp] = []
    for word, start, end in words:
        name = word if namer is None else namer.name(word)
        if out and not any(c.isalnum() for c in name):  # nothing of its own: the rest of the word before
            out[-1].word += name
            out[-1].end_ms = end
        else:
            out.append(WordTimestamp(word=name, start_ms=start, end_ms=end))
    return out


def _letters(text: str) -> int:
    """The characters of ``text`` that are not whitespace."""
    return len(text) - sum(ch.isspace() for ch in text)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


@dataclass(slots=True)
class _Segment:
    text: str
    ready_t: float
    source: str = ""  # the client's text it stands for (sentence_text)
    namer: WordNamer | None = None  # names its words in that text, where it differs from ``text``
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
    reported: bool = False  # its audio.done was written
    started_t: float | None = None  # its audio.start was written: the engine began it
    made_s: float = 0.0  # audio handed out (Audio outputs)
    sent_s: float = 0.0  # of which written
    finished: bool = False  # segment_done came
    fader: Fader | None = None  # its first and last milliseconds ramped (``protocol.joins``)
    rate: int = 0  # the engine's sample rate, from its first audio
    timed: list[tuple[int, float]] = field(default_factory=list)  # each word timed: its end in text, in ms
    timed_at: int = 0  # where in ``text`` the next timed word is looked for
    paused_s: float = 0.0  # sentence pause in its audio (``protocol.pauses``), after or before its speech
    lead_s: float = 0.0  # of a pause before its speech, what is not written yet (not its first audio)


@dataclass(slots=True)
class _Utterance:
    index: int
    packer: AudioPacker
    streamed: bool
    first_text_t: float | None
    context: int = 0  # its context's number
    context_id: str | None = None
    words: bool = False  # the config asked for word timings
    first_audio_t: float | None = None
    synthesis_s: float = 0.0
    segments: dict[int, _Segment] = field(default_factory=dict)
    total: int | None = None  # segments, once all the text is segmented
    done: int = 0  # segments whose audio is finished
    reported: bool = False  # session.done handed out
    text: list[str] = field(default_factory=list)  # the client's text, as sent (``Session.received``)
    sent_s: float = 0.0  # its audio written
    play_end: float | None = None  # when its audio written ends, played in real time after what went before
    pauses: bool = False  # a sentence end may be followed by a pause (streamed, timed cuts on)
    held: int | None = None  # a segment ended on a sentence, its audio.done held while a pause may follow
    pause_at: int | None = None  # the segment a pause goes into, until the next speech (``_pause_due``)
    paused_s: float = 0.0  # pause written at this sentence end
    unsegmented: int = 0  # characters (not spaces) of its text received and not yet in a segment


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
        # The same, by context number: a cancel of one context costs its utterances, not the session's.
        self._by_context: dict[int, dict[int, _Utterance]] = {}
        # Utterances whose session.done is not handed out yet, in order, by context: ``_settle`` looks at the
        # head of each, so an utterance ended behind a long one costs nothing until that one is done.
        self._unreported: dict[int, collections.deque[_Utterance]] = {}
        self._out: list[Output] = []
        self._closing = False
        # The session's table of contexts (``protocol.contexts``): it opens and ends them; the core keeps
        # their timers and removes each once closed.
        self._contexts = self.session.contexts
        # Utterances whose session.done is written while their audio still plays, by context: a cancel
        # reports what the listener heard of them too (the oldest go once heard, or past ``_PLAYING``).
        self._playing: dict[int, collections.deque[_Utterance]] = {}
        #: This session's engine, as seen so far: time to first audio, audio per character.
        self.pace = Pace()
        # Audio written, all told, and where the last run of one utterance's audio began in it (``read``).
        self._written_s = 0.0
        self._run: tuple[float, _Utterance | None] = (0.0, None)

    def next_deadline(self) -> float | None:
        """When the shell must call ``tick`` (on the clock of ``now``), or None when nothing is due.

        Between two messages it moves later as audio is written (more audio ahead of the listener, an
        idle timeout pushed back). The engine's reports can move a timed cut's deadline a little earlier
        (a segment gave less audio than estimated, the engine turned out slower), by no more than the
        estimates' error, which ``MARGIN_S`` covers.
        """
        due = [t for c in self._contexts if (t := self._cut_at(c)) is not None]
        due += [t for c in self._contexts if (t := self._idle_at(c)) is not None]
        due += [t for c in self._contexts if (t := self._pause_due(c)[0]) is not None]
        return min(due, default=None)

    def tick(self, now: float) -> None:
        """Let time pass: cut segments that waiting would make late, and close idle contexts.

        A first segment that waited ``max_buffer_delay_ms`` since its first text arrived, or a later one
        whose listener is about to run dry (the listener clock, in the module docstring), with no sentence
        end, is cut at the best point available (``Segmenter.cut_early``), and the text after it is looked
        at again at once; if no point is, the cut waits for more text (that deadline is gone until a
        message arrives). A named context idle for ``context_idle_timeout_s`` is closed
        (``context.closed``, reason ``idle_timeout``); one whose audio is still being made or sent is
        looked at again a timeout later.
        """
        for ctx in self._contexts:
            while (due := self._cut_at(ctx)) is not None and now >= due:
                events = self.session.cut_early(ctx.number)
                for event in events:
                    self.receive(event, now)
                ctx.parked = not events
            while (pause := self._pause_due(ctx))[0] is not None and now >= pause[0]:
                self._pause(ctx, pause[1], now)
        # Idle contexts close in the order their time ran out, however late the tick comes.
        idle = [(t, c) for c in self._contexts if (t := self._idle_at(c)) is not None and now >= t]
        for _, ctx in sorted(idle, key=lambda pair: pair[0]):
            if self._busy(ctx.number):
                ctx.active_t = now
            else:
                for event in self.session.expire(ctx.number):
                    self.receive(event, now)

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
            case UtteranceStarted(utterance_index=u, context_number=c):
                self._open(u, now, c)
            case SegmentReady(utterance_index=u, sentence_index=s, text=text, source=source, origins=origins):
                namer = WordNamer(text, source, origins) if source else None
                utterance = self._utterance(u)
                utterance.segments[s] = _Segment(text, now, source=source or text, namer=namer)
                utterance.unsegmented -= _letters(source or text)
                self.session.backlog += len(text)
                self._out.append(Speak(u, s, text))
            case UtteranceEnded(utterance_index=u, total_sentences=n, context_number=c):
                ended = self._utterance(u, c)
                ended.total = n
                if ended.pause_at is not None and ended.pause_at >= n - 1:  # nothing follows: no pause
                    ended.pause_at = None
                    self._release(ended)
                self._settle()
            case UtteranceCancelled(utterance_index=u):
                self.cancel(u, now)
            case Committed(commit_id=commit_id, utterance_index=u, sentence_index=s, context_number=c):
                msg = InputCommitted(
                    commit_id=commit_id, utterance_index=u, sentence_index=s, context_id=self._wire_id(c)
                )
                self._out.append(Message(msg))
            case ContextStarted(context_id=cid, context_number=c):
                self._contexts[c].active_t = now  # opened by the session
                self._out.append(Message(ContextOpened(context_id=cid, context_number=c)))
            case ContextActive(context_number=c):
                for ctx in self._contexts:
                    if c is None or ctx.number == c:
                        ctx.active_t = now
            case ContextCancelled(context_id=cid, context_number=c):
                self._drop(cid, c, now, confirm=True)
                if c is not None:
                    self._close(cid, c, "cancelled")
            case ContextEnded(context_id=cid, context_number=int(c), reason="closed") if c in self._contexts:
                self._contexts[c].closing = True
                self._settle()
            case ContextEnded(context_id=cid, context_number=c, reason=reason):
                self._drop(cid, c, now, confirm=False)
                self._close(cid, c, reason)
            case CloseRequested():  # pragma: no branch - the last kind of Event
                self._closing = True
                self._settle()

    def cancel(self, open_index: int | None = None, now: float | None = None) -> None:
        """Barge-in: drop every utterance in flight, and confirm with one ``audio.cancelled`` each.

        Each says what the listener heard of its utterance at ``now``; an utterance whose audio was all
        written but is still playing gets one too. The named contexts close too (``context.closed``,
        reason ``cancelled``), after the confirmations.

        Args:
            open_index: the utterance the client had open, confirmed when nothing was in flight.
            now: the time of the cancel (None: no utterance still playing is reported).
        """
        playing = [u for q in self._playing.values() for u in q]
        self._playing.clear()
        victims = tuple(self._utterances.values())
        self._cancel(victims, playing, now, AudioCancelled(utterance_index=open_index))
        for ctx in self._contexts:
            if ctx.context_id is not None:
                self._close(ctx.context_id, ctx.number, "cancelled")

    def segment_started(self, utterance: int, sentence: int) -> None:
        """The engine is about to synthesize a segment (a ``Speak``): announces it with ``audio.start``."""
        u = self._utterances.get(utterance)
        if u is None:
            return  # cancelled
        seg = u.segments[sentence]
        seg.started = True
        self.session.backlog -= len(seg.text)
        if u.held is not None:  # the sentence before it ends here; a pause may go on before its speech
            self._release(u)
            u.pause_at = sentence if u.pause_at is not None else None
        start = seg.counted = u.packer.start_segment(sentence)
        seg.start_ms = start * 1000.0 / u.packer.sample_rate
        msg = AudioStart(
            utterance_index=utterance,
            sentence_index=sentence,
            sentence_text=seg.source,  # the client's text (seg.text is what the engine says)
            format=u.packer.fmt,
            sample_rate=u.packer.sample_rate,
            start_sample=start,
            word_timestamps=True if u.words else msgspec.UNSET,
            context_id=wire_context_id(u.context_id),
        )
        self._out.append(Message(msg, utterance, streamed=u.streamed, frame_header=u.packer.frame_header))

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
        if u.pause_at == sentence:  # its speech: the pause before it is over
            u.pause_at = None
        if words:
            self._words(u, sentence, seg, len(samples), sample_rate, words)
        seg.engine_s += len(samples) / sample_rate
        if seg.fader is None:
            seg.fader, seg.rate = Fader(sample_rate), sample_rate
        self._frames(u, sentence, u.packer.push(seg.fader.push(samples), sample_rate))

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
        if seg.fader is not None:  # its last milliseconds, faded out
            self._frames(u, sentence, packer.push(seg.fader.end(), seg.rate))
        self._frames(u, sentence, packer.end_segment())
        seg.synthesis_s, seg.error = synthesis_s, error is not None
        seg.finished = True
        self.pace.spoken(len(seg.text), packer.segment_samples / packer.sample_rate)
        u.synthesis_s += synthesis_s
        if (
            error is None
            and u.pauses
            and seg.made_s > 0
            and (u.total is None or sentence < u.total - 1)
            and pauses.ends_sentence(seg.text)
        ):  # a pause may follow: its audio.done waits for the next segment (``protocol.pauses``)
            u.held = u.pause_at = sentence
            u.paused_s = 0.0
            return
        self._end(u, sentence, error)

    def _end(self, u: _Utterance, sentence: int, error: ProtocolError | None = None) -> None:
        """A segment's audio is all out (a pause's last frame with it): its ``audio.done``."""
        seg, packer = u.segments[sentence], u.packer
        self._frames(u, sentence, packer.end_segment())
        seg.total_bytes, seg.samples = packer.segment_bytes, packer.segment_samples
        self._out.append(Report(u.index, sentence))
        if error is not None:
            self._out.append(Message(Error.of(error, u.index, u.context_id), u.index, failure=error))
        u.done += 1
        self._settle()

    def _release(self, u: _Utterance) -> None:
        """End the segment held for a pause, if any."""
        if u.held is not None:
            held, u.held = u.held, None
            self._end(u, held)

    def read(self, read_s: float, now: float) -> None:
        """A read receipt came at ``now``: the client had read the first ``read_s`` seconds of the audio
        written (all told, in the order written: ``gateway.session.receipts``) when it answered.

        Its listener cannot play audio before reading it, so the audio written after ``read_s`` ends no
        sooner than ``now`` plus its length. Where all of it is one utterance's, that utterance's
        listener clock (and its context's) ends no sooner than that: a client that reads late (a slow
        network, a proxy's buffer) gets its timed cuts and pauses later, and ``played_ms`` does not count
        audio it had not even read.
        """
        start, u = self._run
        if u is None or read_s < start - 1e-9:
            return  # the audio unread is not one utterance's
        if self._utterances.get(u.index) is not u and u not in self._playing.get(u.context, ()):
            return  # cancelled: its listener stopped
        end = now + max(0.0, self._written_s - read_s)
        if u.play_end is not None and end > u.play_end:
            u.play_end = end
            ctx = self._contexts.get(u.context)
            if ctx is not None:  # pragma: no branch - a context outlives its utterances (``_close``)
                ctx.play_end = max(ctx.play_end or end, end)

    def _pause_due(self, ctx: Context) -> tuple[float | None, _Utterance | None]:
        """When a pause is next written in the context, and into which utterance (``protocol.pauses``)."""
        if ctx.play_end is not None:
            for u in self._by_context.get(ctx.number, {}).values():
                if u.pause_at is not None:
                    if any(seg.sent_s < seg.made_s - 1e-9 for seg in u.segments.values()):
                        break  # audio is ready to go out: no pause before it
                    return ctx.play_end - pauses.LEAD_S, u
        return None, None

    def _pause(self, ctx: Context, u: _Utterance | None, now: float) -> None:
        """Write a chunk of pause into ``u`` (``protocol.pauses``); none once the listener ran dry."""
        assert u is not None and u.pause_at is not None and ctx.play_end is not None
        sentence, packer = u.pause_at, u.packer
        seg, rate = u.segments[sentence], packer.sample_rate
        # Only while the text goes on (the next segment is cut, or text of it came): a client that sent a
        # sentence and waits hears no pause, and gets its audio.done once the sentence has nearly played.
        goes_on = sentence != u.held or sentence + 1 in u.segments or u.unsegmented > 0
        n = pauses.chunk_samples(rate, packer.frame_samples, u.paused_s) if goes_on else 0
        if n and now < ctx.play_end + pauses.LATE_S:
            seg.paused_s += n / rate
            u.paused_s += n / rate
            if sentence != u.held:  # before its speech: its words start after it
                seg.start_ms += n * 1000.0 / rate
                seg.lead_s += n / rate
            self._frames(u, sentence, packer.push(np.zeros(n, dtype=np.float32), rate))
        if not n or u.paused_s >= pauses.MAX_S - 1e-9 or now >= ctx.play_end + pauses.LATE_S:
            u.pause_at = None
            self._release(u)

    def report(self, utterance: int, error: ProtocolError) -> None:
        """A non-fatal error about an utterance in flight (``audio_truncated``): an ``error`` message now.

        Nothing is said of an utterance already cancelled or finished.
        """
        u = self._utterances.get(utterance)
        if u is None:
            return
        self._out.append(Message(Error.of(error, utterance, u.context_id), utterance, failure=error))

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
            case Audio(utterance=index, sentence=sentence, audio_s=audio_s):
                u = self._utterances.get(index)
                if u is None or self._run[1] is not u:
                    self._run = (self._written_s, u)
                self._written_s += audio_s
                if u is not None:
                    seg = u.segments[sentence]
                    if seg.lead_s > 1e-9:  # a pause before its speech
                        seg.lead_s -= audio_s
                    elif seg.first_sent_t is None:
                        seg.first_sent_t = now
                        if seg.started_t is not None:
                            self.pace.first_audio(len(seg.text), now - seg.started_t)
                    seg.sent_s += audio_s
                    u.sent_s += audio_s
                    u.first_audio_t = now if u.first_audio_t is None else u.first_audio_t
                    if (ctx := self._contexts.get(u.context)) is not None:
                        ctx.play_end = max(now, ctx.play_end or now) + audio_s
                    u.play_end = max(now, u.play_end or now) + audio_s if ctx is None else ctx.play_end
            case Message(msg=AudioStart(utterance_index=index, sentence_index=int(sentence))):
                u = self._utterances.get(index)
                if u is not None:
                    u.segments[sentence].started_t = now
            case Report(utterance=index, sentence=None):
                u = self._utterances.get(index)
                if u is None:
                    return None
                self._remove(u)
                if u.play_end is not None and u.play_end > now:  # still heard: a cancel reports it
                    playing = self._playing.setdefault(u.context, collections.deque(maxlen=_PLAYING))
                    while playing and playing[0].play_end is not None and playing[0].play_end <= now:
                        playing.popleft()
                    playing.append(u)
                return Message(self._session_done(u), index)
            case Report(utterance=index, sentence=int(sentence)):
                u = self._utterances.get(index)
                if u is None:
                    return None
                u.segments[sentence].reported = True
                if (ctx := self._contexts.get(u.context)) is not None:
                    ctx.active_t = max(ctx.active_t, now)
                return Message(self._audio_done(u, sentence), index)
        return output

    def _apply(self, events: list[Event], now: float) -> None:
        for event in events:
            self.receive(event, now)
        session = self.session
        for index, text in session.received:  # text of an utterance just started or still open
            self._utterances[index].text.append(text)
            self._utterances[index].unsegmented += _letters(text)
        session.received.clear()
        for ctx in self._contexts:
            if not (session.eager_pending_in(ctx.number) and session.first_pending_in(ctx.number)):
                ctx.deadline = None
            elif ctx.deadline is None:
                ctx.deadline = now + session.max_buffer_delay_s
            ctx.parked = False
        self.tick(now)

    def _cut_at(self, ctx: Context) -> float | None:
        """When the context's buffered text must be cut, if timed cuts apply to it."""
        if ctx.parked or not self.session.eager_pending_in(ctx.number):
            return None
        if self.session.first_pending_in(ctx.number):
            return ctx.deadline
        index, text = self.session.pending_in(ctx.number)
        u = self._utterances.get(-1 if index is None else index)
        if u is None:  # pragma: no cover - a later segment's utterance has segments, so it is in flight
            return None
        return self._runs_dry(ctx, u) - self.pace.first_audio_s(len(text)) - MARGIN_S

    def _runs_dry(self, ctx: Context, u: _Utterance) -> float:
        """When the listener of ``u`` hears its last audio, from the audio written and still owed."""
        pace = self.pace
        end = ctx.play_end if u.first_audio_t is not None else None
        for seg in u.segments.values():
            if seg.finished and seg.sent_s >= seg.made_s:
                continue  # all of it written: in play_end
            owed = seg.made_s if seg.finished else max(seg.made_s, seg.paused_s + pace.audio_s(len(seg.text)))
            if seg.first_sent_t is None:  # it begins once the engine gives its first audio
                begin = seg.ready_t if seg.started_t is None else seg.started_t
                begin += pace.first_audio_s(len(seg.text))
                end = begin if end is None else max(end, begin)
            end = (seg.ready_t if end is None else end) + max(0.0, owed - seg.sent_s)
        return max(seg.ready_t for seg in u.segments.values()) if end is None else end

    def _idle_at(self, ctx: Context) -> float | None:
        limit = self.session.context_idle_timeout_s
        if ctx.context_id is None or ctx.closing or limit <= 0:
            return None
        return ctx.active_t + limit

    def _busy(self, context: int) -> bool:
        """Whether audio of the context is still being made or sent (an ``audio.done`` not yet written)."""
        utterances = self._by_context.get(context, {}).values()
        return any(not seg.reported for u in utterances for seg in u.segments.values())

    def _wire_id(self, context: int) -> str | msgspec.UnsetType:
        ctx = self._contexts.get(context)
        return wire_context_id(None if ctx is None else ctx.context_id)

    def _forget(self, victims: tuple[_Utterance, ...]) -> None:
        for u in victims:
            self.session.backlog -= sum(len(seg.text) for seg in u.segments.values() if not seg.started)
            self._remove(u)
            # A cancel takes every utterance of its contexts (``_drop``) or of all (``cancel``).
            self._unreported.pop(u.context, None)

    def _remove(self, u: _Utterance) -> None:
        del self._utterances[u.index]
        self.session.in_flight = len(self._utterances)
        group = self._by_context[u.context]
        del group[u.index]
        if not group:
            del self._by_context[u.context]

    def _drop(self, context_id: str, number: int | None, now: float, *, confirm: bool) -> None:
        """Cancel one context's utterances; ``confirm``: answer even when there were none."""
        victims = () if number is None else tuple(self._by_context.get(number, {}).values())
        # An idle timeout stops no audio: only a cancel reports what was heard of audio all written.
        playing = list(self._playing.pop(-1 if number is None else number, ())) if confirm else []
        self._cancel(victims, playing, now, AudioCancelled(context_id=context_id) if confirm else None)

    def _cancel(
        self,
        victims: tuple[_Utterance, ...],
        playing: list[_Utterance],
        now: float | None,
        otherwise: AudioCancelled | None,
    ) -> None:
        """Drop ``victims`` and confirm each with ``audio.cancelled``, with those of ``playing`` still heard
        at ``now``; with none, send ``otherwise``."""
        self._forget(victims)
        if victims or otherwise is not None:
            self._out.append(Drop(tuple(u.index for u in victims)))
        heard = [u for u in playing if now is not None and u.play_end is not None and u.play_end > now]
        told = sorted((*heard, *victims), key=lambda u: u.index)
        for u in told:
            self._out.append(Message(self._cancelled(u, now)))
        if not told and otherwise is not None:
            self._out.append(Message(otherwise))

    def _cancelled(self, u: _Utterance, now: float | None) -> AudioCancelled:
        """The ``audio.cancelled`` of ``u``: what its listener heard of it by ``now`` (None: nothing)."""
        ahead = 0.0 if now is None or u.play_end is None else min(u.sent_s, max(0.0, u.play_end - now))
        played_ms = (u.sent_s - ahead) * 1000.0 if now is not None else 0.0
        text = "".join(u.text)
        cut = self._spoken_cut(u, text, played_ms)
        return AudioCancelled(
            utterance_index=u.index,
            context_id=wire_context_id(u.context_id),
            played_ms=round(played_ms, 2),
            text_spoken=text[:cut],
            text_remaining=text[cut:],
            text_spoken_source="words" if u.words else "estimate",
        )

    def _spoken_cut(self, u: _Utterance, text: str, played_ms: float) -> int:
        """Where in the client's ``text`` of ``u`` the words heard in ``played_ms`` end.

        Segments heard whole count to their last character; in the one being heard, the last word that
        ended (from the engine's word timings, else the share of its audio played, spread over its
        characters, back to the end of a whole word). A word heard takes the characters stuck to it in
        the client's text (punctuation, markup: up to the next whitespace).
        """
        cut = cursor = 0
        for seg in (u.segments[s] for s in sorted(u.segments)):
            at = text.find(seg.source, cursor)
            heard_ms = played_ms - seg.start_ms
            if at < 0 or not seg.started or heard_ms <= 0:
                break
            cursor = at + len(seg.source)
            speech_s = seg.made_s - seg.paused_s
            if seg.finished and heard_ms >= speech_s * 1000.0 - _SLACK_MS:
                cut = cursor
                continue
            n = len(seg.text)
            if u.words:
                k = max((end for end, end_ms in seg.timed if end_ms <= played_ms), default=0)
            else:
                length_s = speech_s if seg.finished else max(speech_s, self.pace.audio_s(n) / AUDIO_SHARE)
                k = min(n, int(n * (heard_ms + _SLACK_MS) / (length_s * 1000.0)))
                if k < n and not seg.text[k].isspace():  # that word is not over: back to the one before
                    k = max(0, seg.text.rfind(" ", 0, k))
                k = len(seg.text[:k].rstrip())
            if k:
                cut = at + (k if seg.namer is None else seg.namer.origins[k - 1] + 1)
            break
        while 0 < cut < len(text) and not text[cut].isspace():
            cut += 1
        return cut

    def _close(self, context_id: str, number: int | None, reason: CloseReason) -> None:
        if number is not None:
            self._contexts.remove(number)
            self._playing.pop(number, None)
        msg = ContextClosed(context_id=context_id, context_number=number, reason=reason)
        self._out.append(Message(msg))

    def _open(self, index: int, now: float | None, context: int = 0) -> _Utterance:
        fmt = self._format
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
        ctx = self._contexts.get(context)
        cid = None if ctx is None else ctx.context_id
        u = self._utterances[index] = _Utterance(
            index, packer, fmt.streamed, now, context, cid, fmt.word_timestamps
        )
        config = self.session.config
        u.pauses = fmt.streamed and (config is None or config.segmentation()[1])
        self.session.in_flight = len(self._utterances)
        self._by_context.setdefault(context, {})[index] = u
        self._unreported.setdefault(context, collections.deque()).append(u)
        return u

    def _utterance(self, index: int, context: int = 0) -> _Utterance:
        # input.done with no text ends an utterance that never started
        return self._utterances.get(index) or self._open(index, None, context)

    def _frames(self, u: _Utterance, sentence: int, frames: list[bytes]) -> None:
        seg, packer = u.segments[sentence], u.packer
        if frames:  # audio a codec holds back is counted with the frames it comes out in
            new_samples, seg.counted = packer.samples_sent - seg.counted, packer.samples_sent
            audio_s = new_samples / packer.sample_rate / len(frames)  # a whole segment when not streamed
            seg.made_s += new_samples / packer.sample_rate
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
            timestamps=_named(seg.namer, [(w, ms(start), ms(end)) for w, start, end in words]),
            context_id=wire_context_id(u.context_id),
        )
        seg.word_chunks += 1
        self._out.append(Message(msg, u.index))
        folded = seg.text.lower() if len(seg.text.lower()) == len(seg.text) else seg.text
        for w, _, end in words:  # where each word ends in the segment's text, for ``_spoken_cut``
            at = folded.find(w.lower(), seg.timed_at) if w else -1
            if at >= 0:
                seg.timed_at = at + len(w)
                seg.timed.append((seg.timed_at, base + end * 1000.0 / rate))

    def _settle(self) -> None:
        """Hand out the ``session.done`` of finished utterances in order within each context, then the
        ``context.closed`` of contexts closing with nothing left, then ``Finish`` when closing."""
        finished: list[_Utterance] = []
        for context, queue in list(self._unreported.items()):
            while queue and queue[0].total is not None and queue[0].done >= queue[0].total:
                finished.append(queue.popleft())
            if not queue:
                del self._unreported[context]
        blocked = self._unreported.keys()  # contexts with an utterance still speaking
        for u in sorted(finished, key=lambda u: u.index):  # across contexts, in the order they opened
            u.reported = True
            if u.segments and (tail := u.packer.finish()):  # a compressed stream's end
                last = max(u.segments)
                self._frames(u, last, tail)  # with the audio the codec still held
            self._out.append(Report(u.index))
        for ctx in self._contexts:
            if ctx.closing and ctx.number not in blocked:
                self._close(str(ctx.context_id), ctx.number, "closed")
        if self._closing and not blocked:
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
            context_id=wire_context_id(u.context_id),
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
            context_id=wire_context_id(u.context_id),
        )
