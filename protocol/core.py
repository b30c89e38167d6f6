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
- The listener clock (``protocol.listener``; docs/protocol.md §5): a segment waits for its sentence end,
  which sounds best, unless waiting would let the listener run dry; then it is cut in time.
- Sentence pauses (``protocol.pauses``). After a segment that ends a sentence, while the utterance's next
  audio is not made, silence is written as audio, just in time (the listener clock down to
  ``pauses.LEAD_S``), up to ``pauses.MAX_S``: the listener hears a speaker's pause, not a dropout. It ends
  the segment before it (whose ``audio.done`` waits for the next segment's start) or begins the next one.
- What the listener heard (``protocol.listener``; docs/protocol.md §8): each ``audio.cancelled`` says it.
  An utterance whose ``session.done`` is written is kept while its audio still plays, so that a cancel
  reports it too.
- Contexts (``protocol.contexts``): messages of a named context's utterances carry its ``context_id``
  and its frames its ``context_number``; ``context.closed`` follows its last ``session.done`` (a
  graceful close), or its ``audio.cancelled`` (a cancel, an idle timeout). A named context is idle
  once no message named it for ``context_idle_timeout_s`` and none of its audio is still being made
  or sent (the time counts from its last ``audio.done`` written, if later).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import listener, pauses, timings
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
    AudioStart,
    ClientMessage,
    CloseReason,
    ContextClosed,
    ContextOpened,
    Error,
    InputCommitted,
    SessionConfig,
)
from .output import Audio, Configure, Drop, Finish, Message, Output, OutputFormat, Report, Speak
from .pace import Pace
from .session import Session
from .utterances import InFlight, Segment, Utterance, letters


class Core:
    """The state of one session's speech, independent of the surface and its I/O.

    Args:
        fmt: the output format of the utterances that start before ``accept_config`` sets another.
        session: the text side (its limits and dialect); a default ``Session`` if omitted.
    """

    def __init__(self, fmt: OutputFormat, session: Session | None = None) -> None:
        self.session = session or Session()
        self._format = fmt
        # The utterances in flight, and the text they owe the engine: the core alone changes them, the
        # session asks (its caps: ``Session.queue``).
        self._flight = self.session.queue = InFlight()
        self._utterances = self._flight.utterances
        self._out: list[Output] = []
        self._closing = False
        # The session's table of contexts (``protocol.contexts``): it opens and ends them; the core keeps
        # their timers and removes each once closed.
        self._contexts = self.session.contexts
        #: This session's engine, as seen so far: time to first audio, audio per character.
        self.pace = Pace()
        self._clock = listener.Clock(self.pace, self._flight, self._contexts)

    def next_deadline(self) -> float | None:
        """When the shell must call ``tick`` (on the clock of ``now``), or None when nothing is due.

        Between two messages it moves later as audio is written (more audio ahead of the listener, an
        idle timeout pushed back). The engine's reports can move a timed cut's deadline a little earlier
        (a segment gave less audio than estimated, the engine turned out slower), by no more than the
        estimates' error, which ``MARGIN_S`` covers.
        """
        idle_s = self.session.limits.context_idle_timeout_s
        due = [t for c in self._contexts if (t := self._cut_at(c)) is not None]
        due += [t for c in self._contexts if (t := c.idle_at(idle_s)) is not None]
        due += [t for c in self._contexts if (t := listener.pause_due(c, self._flight)[0]) is not None]
        return min(due, default=None)

    def tick(self, now: float) -> None:
        """Let time pass: cut segments that waiting would make late, and close idle contexts.

        A first segment that waited ``max_buffer_delay_ms`` since its first text arrived, or a later one
        whose listener is about to run dry (``protocol.listener``), with no sentence end, is cut at the best
        point available (``Segmenter.cut_early``), and the text after it is looked at again at once; if no
        point is, the cut waits for more text (that deadline is gone until a message arrives). A named
        context idle for ``context_idle_timeout_s`` is closed (``context.closed``, reason ``idle_timeout``);
        one whose audio is still being made or sent is looked at again a timeout later.
        """
        for ctx in self._contexts:
            while (due := self._cut_at(ctx)) is not None and now >= due:
                events = self.session.cut_early(ctx.number)
                for event in events:
                    self.receive(event, now)
                ctx.parked = not events
            while (pause := listener.pause_due(ctx, self._flight))[0] is not None and now >= pause[0]:
                self._pause(ctx, pause[1], now)
        # Idle contexts close in the order their time ran out, however late the tick comes.
        idle_s = self.session.limits.context_idle_timeout_s
        idle = [(t, c) for c in self._contexts if (t := c.idle_at(idle_s)) is not None and now >= t]
        for _, ctx in sorted(idle, key=lambda pair: pair[0]):
            if self._flight.busy(ctx.number):
                ctx.active_t = now
            else:
                for event in self.session.expire(ctx.number):
                    self.receive(event, now)

    def receive_text(self, data: str, now: float) -> None:
        """Take one text WebSocket message, received at ``now``; a ``ProtocolError`` refuses it (``fatal``:
        the session must close)."""
        self._apply(self.session.receive_text(data), now)

    def receive_bytes(self, data: bytes, now: float) -> None:
        """Take one binary WebSocket message: always refused (``ProtocolError``), clients send JSON text."""
        self._apply(self.session.receive_bytes(data), now)

    def receive_message(self, msg: ClientMessage, now: float) -> None:
        """Take one decoded client message, as a surface without JSON messages (REST) feeds its text; a
        ``ProtocolError`` refuses one illegal in the session's state."""
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
                utterance.segments[s] = Segment.open(text, now, source or text, namer)
                utterance.counts.unsegmented -= letters(source or text)
                self._flight.backlog += len(text)
                self._out.append(Speak(u, s, text))
            case UtteranceEnded(utterance_index=u, total_sentences=n, context_number=c):
                ended = self._utterance(u, c)
                ended.counts.total = n
                if ended.pause.at is not None and ended.pause.at >= n - 1:  # nothing follows: no pause
                    ended.pause.at = None
                    self._release(ended)
                self._settle()
            case UtteranceCancelled(utterance_index=u):
                self.cancel(u, now)
            case Committed(commit_id=commit_id, utterance_index=u, sentence_index=s, context_number=c):
                cid = self._contexts.wire_id(c)
                msg = InputCommitted(commit_id=commit_id, utterance_index=u, sentence_index=s, context_id=cid)
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
        playing = [u for q in self._flight.playing.values() for u in q]
        self._flight.playing.clear()
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
        self._flight.backlog -= len(seg.text)
        if u.pause.held is not None:  # the sentence before it ends here; a pause may go on before its speech
            self._release(u)
            u.pause.at = sentence if u.pause.at is not None else None
        for other in [o for o in self._utterances.values() if o is not u and o.pause.held is not None]:
            other.pause.at = None  # another utterance speaks now: a segment's audio is never split
            self._release(other)
        start = seg.counted = u.packer.start_segment(sentence)
        seg.clock.start_ms = start * 1000.0 / u.packer.sample_rate
        msg = timings.audio_start(u, sentence, start)
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
        if u.pause.at == sentence:  # its speech: the pause before it is over
            u.pause.at = None
        if words:
            msg = timings.word_timestamps(u, sentence, len(samples), sample_rate, words)
            self._out.append(Message(msg, u.index))
        seg.clock.engine_s += len(samples) / sample_rate
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
        seg.times.synthesis_s, seg.error = synthesis_s, error is not None
        seg.finished = True
        self.pace.spoken(len(seg.text), packer.segment_samples / packer.sample_rate)
        u.times.synthesis_s += synthesis_s
        if (
            error is None
            and u.pause.on
            and seg.clock.made_s > 0
            and (u.counts.total is None or sentence < u.counts.total - 1)
            and pauses.ends_sentence(seg.text)
        ):  # a pause may follow: its audio.done waits for the next segment (``protocol.pauses``)
            u.pause.held = u.pause.at = sentence
            u.pause.paused_s = 0.0
            return
        self._end(u, sentence, error)

    def _end(self, u: Utterance, sentence: int, error: ProtocolError | None = None) -> None:
        """A segment's audio is all out (a pause's last frame with it): its ``audio.done``."""
        seg, packer = u.segments[sentence], u.packer
        self._frames(u, sentence, packer.end_segment())
        seg.total_bytes, seg.samples = packer.segment_bytes, packer.segment_samples
        self._out.append(Report(u.index, sentence))
        if error is not None:
            self._out.append(Message(Error.of(error, u.index, u.context_id), u.index, failure=error))
        u.counts.done += 1
        self._settle()

    def _release(self, u: Utterance) -> None:
        """End the segment held for a pause, if any."""
        if u.pause.held is not None:
            held, u.pause.held = u.pause.held, None
            self._end(u, held)

    def read(self, read_s: float, now: float) -> None:
        """A read receipt came at ``now``: the client had read the first ``read_s`` seconds of the audio
        written (all told, in the order written: ``gateway.session.receipts``) when it answered
        (``listener.Clock.read``)."""
        self._clock.read(read_s, now)

    def _pause(self, ctx: Context, u: Utterance | None, now: float) -> None:
        """Write a chunk of pause into ``u`` (``listener.pause``); none once the listener ran dry."""
        assert u is not None and u.pause.at is not None
        sentence, packer = u.pause.at, u.packer
        n, over = listener.pause(ctx, u, now)
        if n:
            self._frames(u, sentence, packer.push(np.zeros(n, dtype=np.float32), packer.sample_rate))
        if over:
            u.pause.at = None
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
                self._clock.written(index, sentence, audio_s, now)
            case Message(msg=AudioStart(utterance_index=index, sentence_index=int(sentence))):
                u = self._utterances.get(index)
                if u is not None:
                    u.segments[sentence].times.started_t = now
            case Report(utterance=index, sentence=None):
                u = self._utterances.get(index)
                if u is None:
                    return None
                self._flight.played(u, now)
                return Message(timings.session_done(u), index)
            case Report(utterance=index, sentence=int(sentence)):
                u = self._utterances.get(index)
                if u is None:
                    return None
                u.segments[sentence].reported = True
                if (ctx := self._contexts.get(u.context)) is not None:
                    ctx.active_t = max(ctx.active_t, now)
                return Message(timings.audio_done(u, sentence), index)
        return output

    def _apply(self, events: list[Event], now: float) -> None:
        for event in events:
            self.receive(event, now)
        session = self.session
        for index, text in session.take_received():  # text of an utterance just started or still open
            self._utterances[index].text.append(text)
            self._utterances[index].counts.unsegmented += letters(text)
        for ctx in self._contexts:
            if not (session.eager_pending_in(ctx.number) and session.first_pending_in(ctx.number)):
                ctx.deadline = None
            elif ctx.deadline is None:
                ctx.deadline = now + session.max_buffer_delay_s
            ctx.parked = False
        self.tick(now)

    def _cut_at(self, ctx: Context) -> float | None:
        return listener.cut_at(ctx, self.session, self._flight, self.pace)

    def _drop(self, context_id: str, number: int | None, now: float, *, confirm: bool) -> None:
        """Cancel one context's utterances; ``confirm``: answer even when there were none."""
        victims = () if number is None else tuple(self._flight.by_context.get(number, {}).values())
        # An idle timeout stops no audio: only a cancel reports what was heard of audio all written.
        playing = list(self._flight.playing.pop(-1 if number is None else number, ())) if confirm else []
        self._cancel(victims, playing, now, AudioCancelled(context_id=context_id) if confirm else None)

    def _cancel(
        self,
        victims: tuple[Utterance, ...],
        playing: list[Utterance],
        now: float | None,
        otherwise: AudioCancelled | None,
    ) -> None:
        """Drop ``victims`` and confirm each with ``audio.cancelled``, with those of ``playing`` still heard
        at ``now``; with none, send ``otherwise``."""
        self._flight.forget(victims)
        if victims or otherwise is not None:
            self._out.append(Drop(tuple(u.index for u in victims)))
        heard = [u for u in playing if now is not None and u.play_end is not None and u.play_end > now]
        told = sorted((*heard, *victims), key=lambda u: u.index)
        for u in told:
            self._out.append(Message(listener.cancelled(u, now, self.pace)))
        if not told and otherwise is not None:
            self._out.append(Message(otherwise))

    def _close(self, context_id: str, number: int | None, reason: CloseReason) -> None:
        if number is not None:
            self._contexts.remove(number)
            self._flight.playing.pop(number, None)
        msg = ContextClosed(context_id=context_id, context_number=number, reason=reason)
        self._out.append(Message(msg))

    def _open(self, index: int, now: float | None, context: int = 0) -> Utterance:
        ctx = self._contexts.get(context)
        config = self.session.config
        eager = config is None or config.segmentation()[1]
        u = Utterance.open(index, self._format, now, context, None if ctx is None else ctx.context_id, eager)
        self._flight.add(u)
        return u

    def _utterance(self, index: int, context: int = 0) -> Utterance:
        # input.done with no text ends an utterance that never started
        return self._utterances.get(index) or self._open(index, None, context)

    def _frames(self, u: Utterance, sentence: int, frames: list[bytes]) -> None:
        seg, packer = u.segments[sentence], u.packer
        if frames:  # audio a codec holds back is counted with the frames it comes out in
            new_samples, seg.counted = packer.samples_sent - seg.counted, packer.samples_sent
            audio_s = new_samples / packer.sample_rate / len(frames)  # a whole segment when not streamed
            seg.clock.made_s += new_samples / packer.sample_rate
            self._out.extend(Audio(frame, u.index, sentence, audio_s) for frame in frames)

    def _settle(self) -> None:
        """Hand out the ``session.done`` of finished utterances in order within each context, then the
        ``context.closed`` of contexts closing with nothing left, then ``Finish`` when closing."""
        finished = self._flight.finished()
        blocked = self._flight.unreported.keys()  # contexts with an utterance still speaking
        for u in finished:
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
