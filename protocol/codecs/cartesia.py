"""Cartesia's text-to-speech wire, mapped onto voxgate's session protocol (sans-I/O).

Cartesia's clients (the ``cartesia`` SDK, pipecat's ``CartesiaTTSService``, livekit-plugins-cartesia) speak
through voxgate unchanged. ``CartesiaSocket`` is the codec (``protocol.codecs.base``) of ``WS
/tts/websocket``:
one voxgate session per socket, each Cartesia context one of its contexts (docs/protocol.md §14).
``CartesiaSse`` is the body of ``POST /tts/sse``; ``POST /tts/bytes`` is ``protocol.codecs.vendor.RawAudio``.

Client -> server, one JSON text message each::

    {"context_id": "c1", "transcript": "Hello. ", "continue": true, "model_id": "sonic-3",
     "voice": {"mode": "id", "id": "..."}, "output_format": {"container": "raw", "encoding": "pcm_s16le",
     "sample_rate": 24000}, "add_timestamps": true, "max_buffer_delay_ms": 0, "language": "en"}
    {"context_id": "c1", "transcript": "", "flush": true, "continue": true}   speak what is buffered now
    {"context_id": "c1", "transcript": " ", "continue": false}                 end of the context's input
    {"context_id": "c1", "cancel": true}                                       stop the context now

Server -> client, every message with its ``context_id``::

    {"type": "chunk", "data": "<base64>", "done": false, "status_code": 206, "step_time": 0.0, ...}
    {"type": "timestamps", "word_timestamps": {"words": [...], "start": [s], "end": [s]}, ...}
    {"type": "flush_done", "flush_done": true, "flush_id": 1, "done": false, "status_code": 206, ...}
    {"type": "done", "done": true, "status_code": 200, ...}
    {"type": "error", "error": "...", "message": "...", "title": "...", "error_code": "...",
     "status_code": 400, "done": true, ...}

A context's settings (voice, ``output_format``, speed, language) are those of its first message; a first
message that needs other settings than the session's reconfigures the session (``session.config``), which
is possible only while no other context has text waiting: otherwise it is refused on its context.
"""

from __future__ import annotations

import base64
from collections import deque
from dataclasses import dataclass, field
from typing import Self

import msgspec

from ..audio import AudioFormat
from ..errors import FAILURES, ErrorCode, ProtocolError, decoded
from ..messages import (
    AudioDone,
    AudioStart,
    ClientMessage,
    ContextClose,
    ContextClosed,
    ContextId,
    Error,
    InputCancel,
    InputCommit,
    InputDone,
    InputText,
    ServerMessage,
    SessionConfig,
    SessionDone,
    WordTimestamp,
    WordTimestamps,
)
from ..output import Audio, Message
from .base import Inbound, Own, Payload
from .vendor import VoiceBook, alaw

#: Cartesia's encodings: the session's format for each (A-law is made from μ-law, ``protocol.codecs.vendor``).
ENCODINGS: dict[str, AudioFormat] = {
    "pcm_s16le": "pcm",
    "pcm_f32le": "f32",
    "pcm_mulaw": "mulaw",
    "pcm_alaw": "mulaw",
}
#: Cartesia's word speeds, as speed factors.
SPEEDS: dict[str, float] = {"slowest": 0.7, "slow": 0.85, "normal": 1.0, "fast": 1.15, "fastest": 1.3}
#: The context of a message that names none (Cartesia's clients always name one).
DEFAULT_CONTEXT = "cartesia"
#: Cartesia's statuses: a message of a generation still running, and its end.
PARTIAL, OK = 206, 200
_encode = msgspec.json.Encoder().encode
_CODES = frozenset(code.value for code in ErrorCode)


class VoiceObject(msgspec.Struct, frozen=True, kw_only=True):
    """``voice`` as an object: ``{"mode": "id", "id": ...}`` (pipecat, livekit) or ``{"id": ...}``."""

    id: str | None = None
    mode: str | None = None
    embedding: list[float] | None = None


class OutputFormatSpec(msgspec.Struct, frozen=True, kw_only=True):
    """``output_format``: ``container`` ``raw`` (``wav`` and ``mp3`` on ``/tts/bytes`` too)."""

    container: str = "raw"
    encoding: str | None = None
    sample_rate: int | None = None
    bit_rate: int | None = None


class GenerationConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``generation_config``: its ``speed`` is honoured; ``volume`` and ``emotion`` are the voice's own."""

    speed: float | None = None
    volume: float | None = None
    emotion: str | None = None


class Request(msgspec.Struct, frozen=True, kw_only=True, rename={"continue_": "continue"}):
    """One client message of the socket, or the body of ``/tts/bytes`` / ``/tts/sse``; unknown fields are
    ignored (``model_id`` names Cartesia's model: any is taken; ``pronunciation_dict_id``, ...)."""

    context_id: ContextId | None = None
    transcript: str | None = None
    continue_: bool = False
    flush: bool = False
    cancel: bool = False
    model_id: str | None = None
    voice: str | VoiceObject | None = None
    output_format: OutputFormatSpec | None = None
    add_timestamps: bool = False
    add_phoneme_timestamps: bool = False
    max_buffer_delay_ms: int | None = None
    speed: str | float | None = None
    language: str | None = None
    generation_config: GenerationConfig | None = None


_decode_request = msgspec.json.Decoder(Request).decode


def decode_request(data: str | bytes, what: str = "") -> Request:
    """Decode one client message or body.

    Raises:
        ProtocolError: not JSON (``invalid_json``), or a field of the wrong type (``invalid_message``).
    """
    return decoded(_decode_request, data, what)


@dataclass(frozen=True, slots=True)
class Settings:
    """What a context speaks with: the session's config follows these."""

    voice: str | None
    fmt: AudioFormat
    sample_rate: int
    to_alaw: bool
    speed: float
    language: str | None
    container: str = "raw"
    bitrate: int | None = None


def settings_of(req: Request, book: VoiceBook, *, rest: bool = False) -> Settings:
    """The settings a first message (or a body) asks for, checked before the session sees them.

    Raises:
        ProtocolError: an unknown voice (``voice_not_found``, naming the voices), an embedding, a format or
            speed voxgate cannot make (``unsupported_format``, ``invalid_message``).
    """
    voice = req.voice.id if isinstance(req.voice, VoiceObject) else req.voice
    if isinstance(req.voice, VoiceObject) and req.voice.mode not in (None, "id"):
        message = f"voice mode {req.voice.mode!r} is not available here; name a voice by its id"
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, message, field="$.voice.mode")
    book.check(voice, "$.voice")
    spec = req.output_format or OutputFormatSpec(encoding="pcm_s16le", sample_rate=24000)
    containers = ("raw", "wav", "mp3") if rest else ("raw",)
    if spec.container not in containers:
        message = (
            f"output_format.container {spec.container!r} is not available here; use one of {list(containers)}"
        )
        raise ProtocolError(ErrorCode.UNSUPPORTED_FORMAT, message, field="$.output_format.container")
    fmt: AudioFormat = "mp3"
    if spec.container != "mp3":
        encoding = spec.encoding or "pcm_s16le"
        if encoding not in ENCODINGS:
            message = (
                f"output_format.encoding {encoding!r} is not available here; use one of {sorted(ENCODINGS)}"
            )
            raise ProtocolError(ErrorCode.UNSUPPORTED_FORMAT, message, field="$.output_format.encoding")
        fmt = ENCODINGS[encoding]
    rate = spec.sample_rate or 24000
    if not 8000 <= rate <= 48000:
        message = f"output_format.sample_rate must be from 8000 to 48000 Hz, not {rate}"
        raise ProtocolError(ErrorCode.UNSUPPORTED_RATE, message, field="$.output_format.sample_rate")
    return Settings(
        voice,
        fmt,
        rate,
        spec.encoding == "pcm_alaw",
        _speed(req),
        req.language,
        spec.container,
        spec.bit_rate,
    )


def _speed(req: Request) -> float:
    """The speed factor: ``generation_config.speed``, else ``speed`` (a word, or a factor)."""
    if req.generation_config is not None and req.generation_config.speed is not None:
        value, where = req.generation_config.speed, "$.generation_config.speed"
    elif isinstance(req.speed, str):
        if req.speed not in SPEEDS:
            message = f"speed {req.speed!r} is not one of {list(SPEEDS)}"
            raise ProtocolError(ErrorCode.INVALID_MESSAGE, message, field="$.speed")
        return SPEEDS[req.speed]
    elif req.speed is not None:
        value, where = req.speed, "$.speed"
    else:
        return 1.0
    if not 0.25 <= value <= 4.0:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"speed {value} is out of range", field=where)
    return float(value)


def session_config(s: Settings, *, words: bool) -> SessionConfig:
    """The ``session.config`` of ``s``: stream each segment's audio as it is made."""
    return SessionConfig(
        voice=s.voice,
        response_format=s.fmt,
        sample_rate=s.sample_rate,
        speed=s.speed,
        language=s.language,
        stream_audio=True,
        bitrate=s.bitrate if s.fmt == "mp3" else None,
        word_timestamps=words,
    )


def timestamps(context: str | None, words: list[WordTimestamp], offset_ms: float) -> bytes:
    """A ``timestamps`` message: the words, their times in seconds from the context's start."""
    shape = {
        "words": [w.word for w in words],
        "start": [round((offset_ms + w.start_ms) / 1000.0, 3) for w in words],
        "end": [round((offset_ms + w.end_ms) / 1000.0, 3) for w in words],
    }
    return _shape("timestamps", context, done=False, status_code=PARTIAL, word_timestamps=shape)


def error_payload(code: str, message: str, context: str | None, *, done: bool = True) -> bytes:
    """An ``error`` message (and ``/tts/*``'s error body): Cartesia's fields, with voxgate's code."""
    status = FAILURES[ErrorCode(code)].http_status if code in _CODES else 500
    title = code.replace("_", " ")
    return _shape(
        "error",
        context,
        done=done,
        status_code=status,
        error=message,
        message=message,
        title=title,
        error_code=code,
    )


def _shape(kind: str, context: str | None, **fields: object) -> bytes:
    payload: dict[str, object] = {"type": kind, **fields}
    if context is not None:
        payload["context_id"] = context
    return _encode(payload)


@dataclass
class _Context:
    """One Cartesia context as this codec sees it: its settings, flushes and clock."""

    settings: Settings
    timestamps: bool
    commit: bool  # max_buffer_delay_ms 0: each transcript is spoken at once
    #: The ends of its utterances whose ``session.done`` has not come: a flush's id (None: the end of the
    #: context's input, ``continue: false``), and whether the context's input ends there too.
    ends: deque[tuple[int | None, bool]] = field(default_factory=deque)
    flush_count: int = 0
    done: bool = False  # its ``done`` went out: the session's context is closed at the next message
    utterance: int | None = None  # the utterance of the segment whose audio comes last
    base_ms: float = 0.0  # that utterance's start on the context's clock
    end_ms: float = 0.0  # the end of the context's audio so far


class CartesiaSocket(Own):
    """The codec of ``WS /tts/websocket`` (see the module docstring).

    Args:
        book: the voices messages may name, and which of them have their words timed.
        max_message_bytes: the largest client message taken (``message_too_large`` past it).
    """

    def __init__(self, book: VoiceBook, max_message_bytes: int) -> None:
        self.book, self.max_message_bytes = book, max_message_bytes
        self.current: Settings | None = None  # the settings of the session's config
        self.contexts: dict[str, _Context] = {}  # by id, until its end is rendered
        self._open: dict[str, _Context] = {}  # the contexts that take more text
        self._texting: set[str] = set()  # the contexts whose utterance has text (a config must wait)
        self._finished: list[str] = []  # contexts whose done went out: close them in the session
        #: The context whose config is being checked (adopt() says it was taken), with the settings before.
        self._pending: tuple[str, Settings | None] | None = None
        self._rejected: set[str] = (
            set()
        )  # contexts whose config the engines refused: nothing of them goes out
        self._cancels: list[str] = []  # those of them still to cancel in the session
        self._refused: list[tuple[str, str]] = []  # the messages refused, by context and code, to report
        self._last: str | None = None  # the context of the last message, for errors that name none
        self._speaking: str | None = None  # the context of the segment whose audio comes next
        self._start_ms = 0.0  # that segment's start on its utterance's clock

    def opening(self) -> list[ClientMessage]:
        """The default voice in 16-bit PCM at 24 kHz, until a context asks for more."""
        default = Settings(None, "pcm", 24000, False, 1.0, None)
        self.current = default
        return [session_config(default, words=self.book.times_words(None))]

    def decode(self, data: str | bytes) -> list[Inbound]:
        """The session messages one client message becomes.

        Raises:
            ProtocolError: the message is refused (never fatal): too large, not Cartesia's, or a context's
                first message whose settings are refused; reported on its context, if it named one.
        """
        size = len(data) if isinstance(data, bytes) or data.isascii() else len(data.encode())
        if size > self.max_message_bytes:
            message = f"message of {size} bytes exceeds {self.max_message_bytes}"
            raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, message)
        req = decode_request(data)
        context = req.context_id or DEFAULT_CONTEXT
        self._last = context
        # The contexts that ended since the last message close now: their ids are free for new ones.
        # A context whose config was refused is cancelled: its text went to the session after the config.
        finished, self._finished = self._finished, []
        cancels, self._cancels = self._cancels, []
        closes: list[Inbound] = [InputCancel(context_id=c) for c in cancels]
        closes += [ContextClose(context_id=c) for c in finished]
        try:
            return closes + self._receive(req, context)
        except ProtocolError as err:
            self._finished, self._cancels = finished, cancels
            err.context_id = context
            self._refused.append((context, err.code))  # its error says done: nothing of it follows
            raise

    def _receive(self, req: Request, context: str) -> list[Inbound]:
        if req.cancel:  # the session drops its audio and closes it: nothing more of it is rendered
            self._open.pop(context, None)
            self.contexts.pop(context, None)
            self._texting.discard(context)
            return [InputCancel(context_id=context)]
        out: list[Inbound] = []
        ctx = self._open.get(context)
        if ctx is None and context in self.contexts and not self.contexts[context].done:
            ctx = self._open[context] = self.contexts[context]  # more input before its done: it goes on
        if ctx is None:
            settings = settings_of(req, self.book)
            if settings != self.current:
                busy = sorted(self._texting - {context})
                if busy:
                    message = (
                        f"a context with other settings than those of context(s) {busy} waits for their "
                        "text to end (continue: false or flush); or open another socket"
                    )
                    raise ProtocolError(ErrorCode.INVALID_STATE, message, field="$.voice")
                out.append(session_config(settings, words=self.book.times_words(settings.voice)))
                self._pending, self.current = (context, self.current), settings
            commit = req.max_buffer_delay_ms == 0
            ctx = self._open[context] = self.contexts[context] = _Context(
                settings, req.add_timestamps, commit
            )
        if req.transcript:
            out.append(InputText(text=req.transcript, context_id=context))
            self._texting.add(context)
            if ctx.commit and req.transcript.strip():
                out.append(InputCommit(context_id=context))
        flush_id = None
        if req.flush:
            ctx.flush_count += 1
            flush_id = ctx.flush_count
        if req.flush or not req.continue_:
            # The input ends (a flush, or the context's end): the context stays open in the session, so
            # that a cancel still stops its audio; it is closed once its done went out.
            ctx.ends.append((flush_id, not req.continue_))
            out.append(InputDone(context_id=context))
            self._texting.discard(context)
        if not req.continue_:
            del self._open[context]
        return out

    def encode(self, output: Audio | Message) -> list[Payload]:
        """Audio as ``chunk`` messages of the context speaking; the session's messages as Cartesia's."""
        if isinstance(output, Audio):
            if self._speaking in self._rejected:
                return []
            ctx = self.contexts.get(self._speaking or "")
            data = alaw(output.data) if ctx is not None and ctx.settings.to_alaw else output.data
            audio = base64.b64encode(data).decode()
            chunk = _shape(
                "chunk", self._speaking, data=audio, done=False, status_code=PARTIAL, step_time=0.0
            )
            return [chunk.decode()]
        return [payload.decode() for payload in self.render(output.msg)]

    def render(self, msg: ServerMessage) -> list[bytes]:
        """Cartesia's messages for one server message of the session (most have none)."""
        wire = getattr(msg, "context_id", None)
        context = wire if isinstance(wire, str) else None
        ctx = self.contexts.get(context or "")
        if context in self._rejected:  # a refused context: its error said done
            if isinstance(msg, ContextClosed):
                self._rejected.discard(context)
            elif isinstance(msg, AudioStart):
                self._speaking = context
            return []
        match msg:
            case Error(code=code, message=message, fatal=False) if context is None and self._pending:
                return [self._refused_config(code, message)]
            case AudioStart(utterance_index=utterance, start_sample=start, sample_rate=rate):
                self._speaking, self._start_ms = context, start * 1000.0 / rate
                if ctx is not None and ctx.utterance != utterance:
                    ctx.utterance, ctx.base_ms = utterance, ctx.end_ms
            case AudioDone(duration_ms=duration_ms) if ctx is not None:
                ctx.end_ms = ctx.base_ms + self._start_ms + duration_ms
            case WordTimestamps(timestamps=words) if ctx is not None and ctx.timestamps and words:
                return [timestamps(context, words, ctx.base_ms)]
            case SessionDone() if ctx is not None and ctx.ends:
                return self._ended(context, ctx)
            case ContextClosed(reason="closed") if ctx is not None and ctx.done:
                del self.contexts[context or ""]  # closed after its done (a new one may have its id)
            case ContextClosed(reason="idle_timeout") if ctx is not None:
                del self.contexts[context or ""]
                self._open.pop(context or "", None)  # the next message naming it opens a new one
                self._texting.discard(context or "")
                return [] if ctx.done else [_shape("done", context, done=True, status_code=OK)]
            case Error(code=code, message=message, fatal=fatal):
                # A refused message's error ends what it asked for (done); one of a generation does not:
                # its context goes on to its own done.
                refused = (context or "", code) in self._refused
                if refused:
                    self._refused.remove((context or "", code))
                return [error_payload(code, message, context or self._last, done=fatal or refused)]
        return []

    def adopt(self, config: SessionConfig) -> Self:
        """The session took the config this codec sent last."""
        self._pending = None
        return self

    def _refused_config(self, code: str, message: str) -> bytes:
        """The engines refused the config of a context's first message: the session keeps the settings it
        had, and the context is cancelled (its text went after the config); its error says done."""
        assert self._pending is not None
        (context, previous), self._pending = self._pending, None
        self.current = previous
        self._open.pop(context, None)
        self.contexts.pop(context, None)
        self._texting.discard(context)
        self._rejected.add(context)
        self._cancels.append(context)
        return error_payload(code, message, context, done=True)

    def _ended(self, context: str | None, ctx: _Context) -> list[bytes]:
        """At an utterance's ``session.done``: its flush's ``flush_done``, and ``done`` at the input's end."""
        flush_id, last = ctx.ends.popleft()
        out = []
        if flush_id is not None:
            flushed = {"done": False, "flush_done": True, "flush_id": flush_id, "status_code": PARTIAL}
            out.append(_shape("flush_done", context, **flushed))
        if last and context not in self._open:
            ctx.done = True
            self._finished.append(str(context))
            out.append(_shape("done", context, done=True, status_code=OK))
        return out
