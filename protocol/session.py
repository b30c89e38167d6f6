"""The session state machine: decoded client messages in, events out; server messages in, payloads out.

No I/O and no clock: the gateway feeds whole WebSocket messages to ``receive_text`` /
``receive_bytes``, acts on the returned events, and writes what ``send`` returns.

States and the messages that move between them (anything else is an error)::

    AWAITING_CONFIG --session.config--> READY
    READY   --session.config--> READY        READY   --input.text--> SPEAKING
    READY   --input.done-----> READY         SPEAKING --input.text--> SPEAKING
    READY   --input.cancel---> READY         SPEAKING --input.done / input.cancel--> READY
    READY   --input.commit---> READY         SPEAKING --input.commit--> SPEAKING
    READY | SPEAKING --session.close--> CLOSED

``input.cancel`` is one of voxgate's extensions: a session that did not opt in refuses it as an
unknown type, as vllm-omni does.
"""

from __future__ import annotations

import enum

import msgspec

from voxgate.protocol.dialect import render
from voxgate.protocol.errors import CloseCode, ErrorCode, ProtocolError, field_path
from voxgate.protocol.messages import (
    CLIENT_TYPES,
    DEFAULT_MAX_BUFFER_DELAY_MS,
    ClientMessage,
    InputCancel,
    InputCommit,
    InputDone,
    InputText,
    ServerMessage,
    SessionClose,
    SessionConfig,
)
from voxgate.protocol.segmenter import Segmenter

# vllm-omni's limits: a config may carry reference audio inline, other messages are small.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_MESSAGE_BYTES = 128 * 1024

_decode_client = msgspec.json.Decoder(ClientMessage).decode
_decode_any = msgspec.json.Decoder().decode
_CONFIG_FIELDS: frozenset[str] = frozenset(SessionConfig.__struct_fields__) | {"type"}
# msgspec names an unknown or missing top-level field without a path; client messages are flat.


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
    (State.READY, SessionClose): State.CLOSED,
    (State.SPEAKING, SessionClose): State.CLOSED,
}


class Event(msgspec.Struct, frozen=True):
    """Base of what the session tells the gateway to do."""


class ConfigAccepted(Event, frozen=True):
    """A config passed validation; the gateway checks it against the engine, then answers session.ready."""

    config: SessionConfig
    ignored_fields: tuple[str, ...] = ()


class SegmentReady(Event, frozen=True):
    """A segment of text is complete and can be synthesized."""

    utterance_index: int
    sentence_index: int
    text: str


class UtteranceStarted(Event, frozen=True):
    """The first text of an utterance arrived."""

    utterance_index: int


class UtteranceEnded(Event, frozen=True):
    """All text of the utterance is segmented (after ``input.done`` or ``session.close``)."""

    utterance_index: int
    total_sentences: int


class UtteranceCancelled(Event, frozen=True):
    """Barge-in: stop everything in flight. ``utterance_index`` is the open utterance, if any."""

    utterance_index: int | None


class Committed(Event, frozen=True):
    """``input.commit`` cut the buffered text; ``sentence_index`` is its segment, None if no text."""

    commit_id: str | None
    utterance_index: int
    sentence_index: int | None


class CloseRequested(Event, frozen=True):
    """The client asked to close once the last utterance has played out."""


class Session:
    """Protocol state of one WebSocket connection.

    Args:
        max_config_bytes: largest accepted ``session.config`` message.
        max_message_bytes: largest accepted message of any other type.
        max_pending_text_chars: most text not yet handed to the engine (buffered here, or in segments not
            started yet: ``backlog``, kept by the ``Core``) an ``input.text`` may bring it to; 0 for no cap.
        extensions: the client opted in to voxgate's extensions (``protocol.dialect``).
    """

    def __init__(
        self,
        *,
        max_config_bytes: int = MAX_CONFIG_BYTES,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_pending_text_chars: int = 0,
        extensions: bool = True,
    ) -> None:
        self.extensions = extensions
        self.state = State.AWAITING_CONFIG
        self.config: SessionConfig | None = None
        self.max_config_bytes = max_config_bytes
        self.max_message_bytes = max_message_bytes
        self.max_pending_text_chars = max_pending_text_chars
        #: Characters of segments handed out whose synthesis has not started (the ``Core`` keeps it).
        self.backlog = 0
        self.utterance_index = 0
        self._sentences = 0
        self._segmenter = Segmenter()
        self.max_buffer_delay_s = DEFAULT_MAX_BUFFER_DELAY_MS / 1000.0

    @property
    def eager_pending(self) -> bool:
        """Whether text of the open utterance's eager first segment waits (``cut_early`` may cut it)."""
        return self._segmenter.eager_pending

    def cut_early(self) -> list[Event]:
        """Cut the open utterance's eager first segment now, if the text allows (``Segmenter.cut_early``).

        The core calls it once the segment's text has waited ``max_buffer_delay_s``.
        """
        return self._segments(self._segmenter.cut_early())

    @property
    def configured(self) -> bool:
        """Whether a config has been accepted (errors are no longer fatal)."""
        return self.config is not None

    def receive_text(self, data: str) -> list[Event]:
        """Take one text WebSocket message.

        Raises:
            ProtocolError: the message is refused; ``fatal`` says whether the session must close.
        """
        msg = self._decode(data)
        ignored = _unknown_fields(data) if isinstance(msg, SessionConfig) else ()
        return self.receive(msg, ignored_fields=ignored)

    def receive(self, msg: ClientMessage, *, ignored_fields: tuple[str, ...] = ()) -> list[Event]:
        """Take one decoded client message: how a surface without JSON messages (REST) feeds its text.

        Args:
            msg: the message.
            ignored_fields: for a ``session.config``, the unknown fields it came with.

        Raises:
            ProtocolError: the message is illegal in the current state.
        """
        if isinstance(msg, InputCancel) and not self.extensions:
            raise self._error(
                ErrorCode.UNKNOWN_TYPE,
                "unknown message type: 'input.cancel' (a voxgate extension)",
                field="$.type",
            )
        key = (self.state, type(msg))
        if key not in _TRANSITIONS:
            raise self._illegal(msg)
        events: list[Event] = []
        match msg:
            case SessionConfig():
                events.append(ConfigAccepted(msg, ignored_fields))
            case InputText(text=text):
                if not text:
                    return []  # an empty text is a keep-alive, as in ElevenLabs' protocol
                self._check_backlog(text)
                if self.state is State.READY:
                    events.append(UtteranceStarted(self.utterance_index))
                events.extend(self._segments(self._segmenter.push(text)))
            case InputDone():
                events.extend(self._end_utterance())
            case InputCommit(commit_id=commit_id):
                texts = self._segmenter.commit()
                events.extend(self._segments(texts))
                last = self._sentences - 1 if texts else None
                events.append(Committed(commit_id, self.utterance_index, last))
            case InputCancel():
                open_index = self.utterance_index if self.state is State.SPEAKING else None
                self._segmenter.reset()
                if open_index is not None:
                    self._next_utterance()
                events.append(UtteranceCancelled(open_index))
            case SessionClose():  # pragma: no branch - the _TRANSITIONS check lets only these five through
                if self.state is State.SPEAKING:
                    events.extend(self._end_utterance())
                events.append(CloseRequested())
        self.state = _TRANSITIONS[key]
        return events

    def receive_bytes(self, data: bytes) -> list[Event]:
        """Take one binary WebSocket message: clients send no binary data, so it is always refused."""
        raise self._error(
            ErrorCode.BINARY_NOT_ACCEPTED, "binary messages are not accepted; send JSON text frames"
        )

    def accept_config(self, config: SessionConfig) -> None:
        """Adopt a config once the gateway has checked it against the engine (after ``ConfigAccepted``)."""
        self.config = config
        granularity, eager = config.segmentation()
        self._segmenter = Segmenter(granularity, eager_first=eager)
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
        ``protocol.dialect.render``).
        """
        return render(msg, extensions=self.extensions, streamed=streamed)

    def _check_backlog(self, text: str) -> None:
        cap = self.max_pending_text_chars
        pending = self.backlog + len(self._segmenter.pending)
        if cap and pending + len(text) > cap:
            raise self._error(
                ErrorCode.TEXT_BACKLOG_FULL,
                f"{pending} characters are waiting to be spoken; {len(text)} more would pass the "
                f"limit of {cap}: send it once the audio has caught up",
            )

    def _segments(self, texts: list[str]) -> list[Event]:
        out: list[Event] = []
        for text in texts:
            out.append(SegmentReady(self.utterance_index, self._sentences, text))
            self._sentences += 1
        return out

    def _end_utterance(self) -> list[Event]:
        events = self._segments(self._segmenter.flush())
        events.append(UtteranceEnded(self.utterance_index, self._sentences))
        self._next_utterance()
        return events

    def _next_utterance(self) -> None:
        self.utterance_index += 1
        self._sentences = 0

    def _decode(self, data: str) -> ClientMessage:
        size = len(data) if data.isascii() else len(data.encode())
        if size > self.max_config_bytes:
            raise self._error(
                ErrorCode.MESSAGE_TOO_LARGE, f"message of {size} bytes exceeds {self.max_config_bytes}"
            )
        try:
            msg = _decode_client(data)
        except msgspec.ValidationError as exc:
            raise self._classify(data, exc) from None
        except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
            raise self._error(ErrorCode.INVALID_JSON, f"invalid JSON: {exc}") from None
        if not isinstance(msg, SessionConfig) and size > self.max_message_bytes:
            raise self._error(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"{msg.__struct_config__.tag} message of {size} bytes exceeds {self.max_message_bytes}",
            )
        return msg

    def _classify(self, data: str, exc: msgspec.ValidationError) -> ProtocolError:
        try:
            raw = _decode_any(data)
        except (msgspec.DecodeError, RecursionError) as err:
            # The typed decoder stops at the first schema error, before it reaches malformed JSON after it.
            return self._error(ErrorCode.INVALID_JSON, f"invalid JSON: {err}")
        if not isinstance(raw, dict):
            return self._error(ErrorCode.NOT_AN_OBJECT, "messages must be JSON objects")
        kind = raw.get("type")
        if not isinstance(kind, str) or kind not in CLIENT_TYPES:
            return self._error(ErrorCode.UNKNOWN_TYPE, f"unknown message type: {kind!r}", field="$.type")
        field = field_path(exc)
        code = ErrorCode.INVALID_MESSAGE
        return self._error(code, f"invalid {kind}: {exc}", field=field)

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
    ) -> ProtocolError:
        return ProtocolError(code, message, fatal=not self.configured, field=field)


def _unknown_fields(data: str) -> tuple[str, ...]:
    """The top-level fields of a ``session.config`` that the schema does not know (they are ignored)."""
    raw = _decode_any(data)
    return tuple(sorted(k for k in raw if k not in _CONFIG_FIELDS)) if isinstance(raw, dict) else ()
