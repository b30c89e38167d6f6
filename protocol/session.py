"""The session state machine: client messages in, events out; server messages in, payloads out.

No I/O and no clock. Its driver is the session core (``protocol.core.Core``), on every surface: the core
feeds it whole WebSocket messages (``receive_text`` / ``receive_bytes``) or messages already decoded
(``receive``, the REST route's), and applies the events it returns; the shell writes what ``send``
returns.

States and the messages that move between them (anything else is an error; ``_TRANSITIONS``)::

    AWAITING_CONFIG --session.config--> READY
    READY   --session.config--> READY        READY   --input.text--> SPEAKING (an empty text: READY)
    READY   --input.done-----> READY         SPEAKING --input.text--> SPEAKING
    READY   --input.cancel---> READY         SPEAKING --input.done / input.cancel--> READY (*)
    READY   --input.commit---> READY         SPEAKING --input.commit--> SPEAKING
    READY   --keepalive / context.close--> READY
    SPEAKING --keepalive / context.close--> SPEAKING (*)
    READY | SPEAKING --session.close--> CLOSED

    (*) once no context has an utterance open: the session is SPEAKING while any context has one
    (``_settle_state``), so an ``input.done`` of one context, or its ``context.close`` or ``input.cancel``,
    leaves it SPEAKING while another context still speaks.

``input.cancel``, ``keepalive`` and ``context.close`` are voxgate's extensions: a session that did not
opt in refuses them as unknown types, as vllm-omni does, and ignores ``context_id`` (vllm-omni ignores
unknown fields).

Contexts: one stream of utterances per context, the default one and up to ``max_contexts`` named ones, in
the table the core shares (``protocol.contexts``, which says when they open and close).
"""

from __future__ import annotations

import enum
from typing import Protocol

from . import pronounce
from .codecs.openai import speakable
from .codecs.stream import render
from .config import DEFAULT_MAX_BUFFER_DELAY_MS
from .contexts import Context, Contexts
from .decoding import decode, unknown_fields
from .errors import CloseCode, ErrorCode, ProtocolError
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
from .limits import SessionLimits
from .messages import (
    ClientMessage,
    ContextClose,
    InputCancel,
    InputCommit,
    InputDone,
    InputText,
    Keepalive,
    ServerMessage,
    SessionClose,
    SessionConfig,
)
from .normalize import Normalizer
from .segmenter import Granularity, Segmenter

# vllm-omni's limits: a config may carry reference audio inline, other messages are small.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_MESSAGE_BYTES = 128 * 1024
#: Named contexts open at once when a session names no cap: ElevenLabs allows 5; a few more leave room
#: for contexts a barge-in has closed while the client already opens the next ones.
MAX_CONTEXTS = 8
#: Utterances a session may have queued at once (far more than any turn-taking client sends ahead).
MAX_IN_FLIGHT = 256


class Queue(Protocol):
    """The engine work a session's core holds (``protocol.utterances.InFlight``): the core alone counts it."""

    @property
    def backlog(self) -> int: ...  # characters of segments handed out whose synthesis has not started

    @property
    def in_flight(self) -> int: ...  # utterances whose session.done is not written yet


class State(enum.Enum):
    """Where the session is in its life."""

    AWAITING_CONFIG = enum.auto()
    READY = enum.auto()
    SPEAKING = enum.auto()
    CLOSED = enum.auto()


_TRANSITIONS: dict[tuple[State, type[ClientMessage]], State] = {
    (State.AWAITING_CONFIG, SessionConfig): State.READY,
    (State.READY, SessionConfig): State.READY,
    (State.READY, InputText): State.SPEAKING,
    (State.SPEAKING, InputText): State.SPEAKING,
    (State.READY, InputDone): State.READY,
    (State.SPEAKING, InputDone): State.READY,
    (State.READY, InputCancel): State.READY,
    (State.SPEAKING, InputCancel): State.READY,
    (State.READY, InputCommit): State.READY,
    (State.SPEAKING, InputCommit): State.SPEAKING,
    (State.READY, Keepalive): State.READY,
    (State.SPEAKING, Keepalive): State.SPEAKING,
    (State.READY, ContextClose): State.READY,
    (State.SPEAKING, ContextClose): State.SPEAKING,
    (State.READY, SessionClose): State.CLOSED,
    (State.SPEAKING, SessionClose): State.CLOSED,
}
# Refused as unknown types in vllm-omni's dialect, which has none of them.
_EXTENSIONS = (InputCancel, Keepalive, ContextClose)


class Session:
    """Protocol state of one WebSocket connection.

    Args:
        extensions: the client opted in to voxgate's extensions (``protocol.codecs.stream``).
        max_config_bytes, max_message_bytes, max_pending_text_chars, max_contexts, context_idle_timeout_s,
            max_in_flight: its caps, kept as ``limits`` (``protocol.limits.SessionLimits``: what each holds).
    """

    def __init__(
        self,
        *,
        max_config_bytes: int = MAX_CONFIG_BYTES,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_pending_text_chars: int = 0,
        extensions: bool = True,
        max_contexts: int = MAX_CONTEXTS,
        context_idle_timeout_s: float = 0.0,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.extensions = extensions
        self.state = State.AWAITING_CONFIG
        self.config: SessionConfig | None = None
        self.limits = SessionLimits(
            max_config_bytes,
            max_message_bytes,
            max_pending_text_chars,
            max_contexts,
            context_idle_timeout_s,
            max_in_flight,
        )
        #: The engine work the core holds, which the caps count: the core sets it (``InFlight``).
        self.queue: Queue | None = None
        #: The index the next utterance will take, in whichever context it starts.
        self.utterance_index = 0
        self._segmentation: tuple[Granularity, bool] = ("sentence", True)
        #: The session's contexts: it opens and ends them, the core times and removes them.
        self.contexts = Contexts()
        self.max_buffer_delay_s = DEFAULT_MAX_BUFFER_DELAY_MS / 1000.0
        self._refusal: ProtocolError | None = None  # ``refuse_new``: new utterances get this error
        #: Whether ``text_normalization`` ``auto`` writes numbers out, for an engine whose front end
        #: misreads them (Piper's espeak): the host sets it from the engine; ``on`` always does.
        self.expand_numbers = False
        #: Whether the engine says a pronunciation's ``ipa`` from its phonemes (``TTSEngine.ipa_symbols``):
        #: the normalizer then keeps those words as written; the host sets it from the engine.
        self.takes_ipa = False
        # The client's text of each input.text taken, as sent, with its utterance (``take_received``).
        self._received: list[tuple[int, str]] = []

    @property
    def backlog(self) -> int:
        """Characters of segments handed out whose synthesis has not started (the core's count)."""
        return 0 if self.queue is None else self.queue.backlog

    @property
    def in_flight(self) -> int:
        """Utterances whose ``session.done`` is not out yet (the core's count)."""
        return 0 if self.queue is None else self.queue.in_flight

    @property
    def _default(self) -> Context:
        """The default context."""
        return self.contexts.default

    @property
    def _segmenter(self) -> Segmenter:
        """The default context's segmenter."""
        return self._default.segmenter

    @property
    def eager_pending(self) -> bool:
        """Whether text that ``cut_early`` may cut waits in an open utterance, in any context."""
        return any(stream.segmenter.eager_pending for stream in self.contexts.texts())

    def eager_pending_in(self, context_number: int) -> bool:
        """Whether text of the context's open utterance waits that ``cut_early`` may cut (timed cuts on)."""
        stream = self.contexts.text_of(context_number)
        return stream is not None and stream.segmenter.eager_pending

    def first_pending_in(self, context_number: int) -> bool:
        """Whether the context's buffered text is its open utterance's first segment (none cut yet)."""
        stream = self.contexts.text_of(context_number)
        return stream is not None and stream.segmenter.first_pending

    def pending_in(self, context_number: int) -> tuple[int | None, str]:
        """The context's open utterance (None: none) and its text not yet cut into a segment."""
        stream = self.contexts.text_of(context_number)
        return (None, "") if stream is None else (stream.utterance, stream.segmenter.pending)

    def cut_early(self, context_number: int = 0) -> list[Event]:
        """Cut the context's buffered segment now, if the text allows (``Segmenter.cut_early``).

        The core calls it once waiting longer would cost the listener: a first segment whose text has
        waited ``max_buffer_delay_s``, a later one when its listener's audio is about to run out.
        """
        stream = self.contexts.text_of(context_number)
        return [] if stream is None else self._segments(stream, stream.segmenter.cut_early())

    def expire(self, context_number: int) -> list[Event]:
        """Close a named context that was idle too long (the core decides when): its text is dropped.

        Returns:
            ``ContextEnded`` with reason ``idle_timeout``, or nothing if the context is not open.
        """
        stream = self.contexts.text_of(context_number)
        if stream is None or stream.context_id is None:
            return []
        self.contexts.end(stream.context_id)
        self._settle_state()
        return [ContextEnded(stream.context_id, stream.number, "idle_timeout")]

    @property
    def configured(self) -> bool:
        """Whether a config has been accepted (errors are no longer fatal)."""
        return self.config is not None

    def receive_text(self, data: str) -> list[Event]:
        """Take one text WebSocket message.

        Raises:
            ProtocolError: the message is refused; ``fatal`` says whether the session must close.
        """
        msg = decode(
            data,
            max_config_bytes=self.limits.max_config_bytes,
            max_message_bytes=self.limits.max_message_bytes,
            fatal=not self.configured,
        )
        ignored = unknown_fields(data) if isinstance(msg, SessionConfig) else ()
        return self.receive(msg, ignored_fields=ignored)

    def receive(self, msg: ClientMessage, *, ignored_fields: tuple[str, ...] = ()) -> list[Event]:
        """Take one decoded client message: how a surface without JSON messages (REST) feeds its text.

        Args:
            msg: the message.
            ignored_fields: for a ``session.config``, the unknown fields it came with.

        Raises:
            ProtocolError: the message is illegal in the current state.
        """
        if isinstance(msg, _EXTENSIONS) and not self.extensions:
            tag = msg.__struct_config__.tag
            raise self._error(
                ErrorCode.UNKNOWN_TYPE,
                f"unknown message type: {tag!r} (a voxgate extension)",
                field="$.type",
            )
        key = (self.state, type(msg))
        if key not in _TRANSITIONS:
            raise self._illegal(msg)
        # vllm-omni's dialect ignores unknown fields, context_id among them.
        cid = getattr(msg, "context_id", None) if self.extensions else None
        events: list[Event] = []
        match msg:
            case SessionConfig():
                events.append(ConfigAccepted(msg, ignored_fields))
            case InputText(text=text):
                if text:
                    self._check_admitted(cid)
                    self._check_backlog(text, cid)
                stream = self._stream(cid, events)
                if not text:
                    return events  # an empty text is a keep-alive, as in ElevenLabs' protocol
                if stream.utterance is None:
                    stream.utterance, stream.sentences = self._next_index(), 0
                    events.append(UtteranceStarted(stream.utterance, stream.number))
                events.extend(self._segments(stream, stream.segmenter.push(stream.normalizer.feed(text))))
                self._received.append((stream.utterance, text))
            case InputDone():
                self._check_admitted(cid)
                events.extend(self._end_utterance(self._stream(cid, events)))
            case InputCommit(commit_id=commit_id):
                stream = self._stream(cid, events)
                texts = stream.segmenter.push(stream.normalizer.commit()) + stream.segmenter.commit()
                events.extend(self._segments(stream, texts))
                last = stream.sentences - 1 if texts else None
                index = self.utterance_index if stream.utterance is None else stream.utterance
                events.append(Committed(commit_id, index, last, stream.number))
            case InputCancel():
                events.extend(self._cancel(cid))
            case Keepalive():
                if cid is None:
                    events.append(ContextActive(None))
                else:
                    self._stream(cid, events)
            case ContextClose():
                closing = self.contexts.end(msg.context_id)
                if closing is not None and closing.utterance is not None:
                    events.extend(self._end_utterance(closing))
                events.append(ContextEnded(msg.context_id, None if closing is None else closing.number))
            case SessionClose():  # pragma: no branch - the _TRANSITIONS check lets only these through
                for stream in sorted(self.contexts.texts(), key=_open_index):
                    if stream.utterance is not None:
                        events.extend(self._end_utterance(stream))
                for stream in self.contexts.end_all():
                    events.append(ContextEnded(str(stream.context_id), stream.number))
                events.append(CloseRequested())
        self.state = _TRANSITIONS[key]
        self._settle_state()
        return events

    def take_received(self) -> list[tuple[int, str]]:
        """The client's text of each ``input.text`` since the last call, as sent, with its utterance: the
        core keeps it (the listener's ``text_spoken`` names the client's own characters)."""
        received, self._received = self._received, []
        return received

    def receive_bytes(self, data: bytes) -> list[Event]:
        """Take one binary WebSocket message: clients send no binary data, so it is always refused."""
        raise self._error(
            ErrorCode.BINARY_NOT_ACCEPTED, "binary messages are not accepted; send JSON text frames"
        )

    def accept_config(self, config: SessionConfig) -> None:
        """Adopt a config once the gateway has checked it against the engine (after ``ConfigAccepted``)."""
        self.config = config
        self._segmentation = config.segmentation()
        # Accepted only while no utterance is open: every segmenter is empty.
        for stream in self.contexts.texts():
            stream.segmenter, stream.normalizer = self._new_segmenter(), self._new_normalizer()
        self.max_buffer_delay_s = config.max_buffer_delay_ms / 1000.0

    def reject_config(self, error: ProtocolError) -> ProtocolError:
        """Turn an engine's refusal of a config into the error to report (fatal before the first config)."""
        if self.config is None:
            self.state = State.AWAITING_CONFIG
            error.fatal = True
            error.close_code = CloseCode.POLICY_VIOLATION
        return error

    def send(self, msg: ServerMessage, *, streamed: bool = True) -> str:
        """Encode a server message as the text of a WebSocket message, in this session's dialect.

        ``streamed`` says, for ``audio.start``, whether its audio goes out in frames (see
        ``protocol.codecs.stream.render``).
        """
        return render(msg, extensions=self.extensions, streamed=streamed)

    def refuse_new(self, error: ProtocolError) -> None:
        """From now on, refuse with ``error`` (non-fatal) every message that would start an utterance;
        those already open go on to their end (the server drains)."""
        self._refusal = error

    def _check_admitted(self, context_id: str | None) -> None:
        """Refuse a message that would start an utterance while draining, or past ``max_in_flight``."""
        stream = self._default if context_id is None else self.contexts.named(context_id)
        if stream is not None and stream.utterance is not None:
            return  # it goes to an utterance already open
        if self._refusal is not None:
            raise self._error(self._refusal.code, self._refusal.message, context_id=context_id)
        if self.in_flight >= self.limits.max_in_flight:
            raise self._error(
                ErrorCode.TEXT_BACKLOG_FULL,
                f"{self.in_flight} utterances are waiting to be spoken, the most a session may queue: "
                "send the next once one is done",
                context_id=context_id,
            )

    def _check_backlog(self, text: str, context_id: str | None) -> None:
        cap = self.limits.max_pending_text_chars
        pending = self.backlog + sum(
            len(stream.segmenter.pending) + len(stream.normalizer.pending) for stream in self.contexts.texts()
        )
        if cap and pending + len(text) > cap:
            raise self._error(
                ErrorCode.TEXT_BACKLOG_FULL,
                f"{pending} characters are waiting to be spoken; {len(text)} more would pass the "
                f"limit of {cap}: send it once the audio has caught up",
                context_id=context_id,
            )

    def _new_segmenter(self) -> Segmenter:
        granularity, eager = self._segmentation
        return Segmenter(granularity, eager_first=eager)

    def _new_normalizer(self) -> Normalizer:
        config = self.config
        assert config is not None  # a context opens, and a config is accepted, only once configured
        return Normalizer(
            config.text_normalization,
            expand_numbers=self.expand_numbers,
            aliases=pronounce.aliases(config.pronunciations, phonemes=self.takes_ipa),
            keep_emoji=config.keep_emoji,
        )

    def _stream(self, context_id: str | None, events: list[Event]) -> Context:
        """The context a message names, opened if new (past the cap: refused, nothing changed)."""
        if context_id is None:
            return self._default
        stream = self.contexts.named(context_id)
        if stream is not None:
            events.append(ContextActive(stream.number))
            return stream
        if self.contexts.open_count >= self.limits.max_contexts:
            raise self._error(
                ErrorCode.TOO_MANY_CONTEXTS,
                f"{self.contexts.open_count} contexts are open, the most this session allows; close one "
                "(context.close or input.cancel with its context_id) before opening another",
                context_id=context_id,
            )
        stream = self.contexts.open(context_id, self._new_segmenter(), self._new_normalizer())
        events.append(ContextStarted(context_id, stream.number))
        return stream

    def _cancel(self, context_id: str | None) -> list[Event]:
        if context_id is not None:
            closed = self.contexts.end(context_id)
            return [ContextCancelled(context_id, None if closed is None else closed.number)]
        opened = [s.utterance for s in self.contexts.texts() if s.utterance is not None]
        for stream in self.contexts.texts():
            stream.segmenter.reset()
            stream.normalizer.reset()
            stream.utterance = None
        self.contexts.end_all()
        return [UtteranceCancelled(min(opened, default=None))]

    def _segments(self, stream: Context, texts: list[str]) -> list[Event]:
        out: list[Event] = []
        # A segment with nothing to say (emoji, "...") goes to no engine: REST refuses such a text
        # (``empty_input``); here it may be part of a longer text, so it is dropped (``speakable``).
        for text in filter(speakable, texts):
            assert stream.utterance is not None  # text is buffered only in an open utterance
            source, origins = stream.normalizer.source(text)
            named = (source, tuple(origins)) if source != text else ("", ())
            out.append(SegmentReady(stream.utterance, stream.sentences, text, *named))
            stream.sentences += 1
        return out

    def _end_utterance(self, stream: Context) -> list[Event]:
        if stream.utterance is None:  # input.done with no text: an empty utterance
            stream.utterance, stream.sentences = self._next_index(), 0
        texts = stream.segmenter.push(stream.normalizer.flush()) + stream.segmenter.flush()
        events = self._segments(stream, texts)
        events.append(UtteranceEnded(stream.utterance, stream.sentences, stream.number))
        stream.utterance = None
        return events

    def _next_index(self) -> int:
        self.utterance_index += 1
        return self.utterance_index - 1

    def _settle_state(self) -> None:
        """SPEAKING while any context has an utterance open, READY otherwise."""
        if self.state in (State.READY, State.SPEAKING):
            speaking = any(stream.utterance is not None for stream in self.contexts.texts())
            self.state = State.SPEAKING if speaking else State.READY

    def _illegal(self, msg: ClientMessage) -> ProtocolError:
        kind = msg.__struct_config__.tag
        if self.state is State.AWAITING_CONFIG:
            return self._error(ErrorCode.CONFIG_REQUIRED, f"send session.config before {kind}")
        if self.state is State.SPEAKING:
            return self._error(ErrorCode.INVALID_STATE, f"{kind} during an utterance: send input.done first")
        return self._error(ErrorCode.INVALID_STATE, f"{kind} after session.close")

    def _error(
        self,
        code: ErrorCode,
        message: str,
        *,
        field: str | None = None,
        context_id: str | None = None,
    ) -> ProtocolError:
        return ProtocolError(code, message, fatal=not self.configured, field=field, context_id=context_id)


def _open_index(stream: Context) -> int:
    return -1 if stream.utterance is None else stream.utterance
