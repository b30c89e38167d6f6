"""Deepgram Aura's text-to-speech wire, mapped onto voxgate's session protocol (sans-I/O).

Deepgram's clients (the ``deepgram-sdk``, pipecat's ``DeepgramTTSService``, livekit-plugins-deepgram) speak
through voxgate unchanged. ``DeepgramSocket`` is the codec (``protocol.codecs.base``) of ``WS /v1/speak``: one
voxgate session per socket, in its default context (docs/protocol.md §15). ``POST /v1/speak`` answers
with ``protocol.codecs.vendor.RawAudio``. The query (``Params``) sets the voice (``model``) and the format.

Client -> server, one JSON text message each::

    {"type": "Speak", "text": "Hello. "}     input.text (speech starts before Flush: the segmenter cuts)
    {"type": "Flush"}                        input.done, answered by {"type": "Flushed", "sequence_id": n}
    {"type": "Clear"}                        input.cancel, answered by {"type": "Cleared", "sequence_id": n}
                                             with what the listener heard of the utterance playing:
                                             "text_spoken", "text_remaining" (as Deepgram plans for Flux)
    {"type": "Close"}                        session.close: the audio goes out, then close 1000

Server -> client: ``{"type": "Metadata", ...}`` first, binary audio, ``Flushed``, ``Cleared``, and
``{"type": "Warning", "description", "code"}`` for a refused message (the socket stays open); a fatal error
is ``{"type": "Error", "description", "err_code", "err_msg"}`` before the close.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from ..audio import AudioFormat
from ..errors import CloseCode, ErrorCode, ProtocolError, decoded
from ..messages import (
    AudioCancelled,
    ClientMessage,
    Error,
    InputCancel,
    InputDone,
    InputText,
    ServerMessage,
    ServerWarning,
    SessionClose,
    SessionConfig,
    SessionDone,
    SessionReady,
)
from ..output import Audio, Message
from .base import Inbound, Own, Payload
from .vendor import VoiceBook, alaw, wav_head

#: Deepgram's encodings: the session's format for each (A-law is made from μ-law, ``protocol.codecs.vendor``).
ENCODINGS: dict[str, AudioFormat] = {
    "linear16": "pcm",
    "mulaw": "mulaw",
    "alaw": "mulaw",
    "mp3": "mp3",
    "opus": "opus",
    "flac": "flac",
    "aac": "aac",
}
#: The encodings of the socket (raw audio only, as Deepgram's).
SOCKET_ENCODINGS = ("linear16", "mulaw", "alaw")
#: Each encoding's rate when the query names none (Deepgram's defaults).
DEFAULT_RATES = {"linear16": 24000, "mulaw": 8000, "alaw": 8000, "mp3": 22050, "opus": 48000, "flac": 48000}
DEFAULT_RATE = 22050
#: ``POST /v1/speak``'s encoding when the query names none (Deepgram's default).
DEFAULT_REST_ENCODING = "mp3"
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Params:
    """The query of ``/v1/speak``: the voice (``model``) and the audio; other parameters are ignored
    (``mip_opt_out``, ``callback``, ``tag``)."""

    model: str | None
    encoding: str
    sample_rate: int
    container: str
    bit_rate: int | None = None
    speed: float = 1.0

    @property
    def fmt(self) -> AudioFormat:
        """The session's format."""
        return ENCODINGS[self.encoding]

    @property
    def to_alaw(self) -> bool:
        """The session's μ-law goes out as A-law."""
        return self.encoding == "alaw"

    @property
    def media_type(self) -> str:
        """The answer's ``Content-Type``."""
        if self.container == "wav":
            return "audio/wav"
        return {
            "linear16": "audio/pcm",
            "mulaw": "audio/basic",
            "alaw": "audio/x-alaw-basic",
            "mp3": "audio/mpeg",
            "opus": "audio/ogg",
            "flac": "audio/flac",
            "aac": "audio/aac",
        }[self.encoding]

    def head(self) -> bytes:
        """The answer's first bytes: a WAV header in the ``wav`` container."""
        if self.container != "wav":
            return b""
        return wav_head({"linear16": "pcm"}.get(self.encoding, self.encoding), self.sample_rate)

    def config(self, *, streamed: bool = True) -> SessionConfig:
        """The session's ``session.config``."""
        return SessionConfig(
            voice=self.model,
            response_format=self.fmt,
            sample_rate=self.sample_rate,
            speed=self.speed,
            stream_audio=streamed,
            bitrate=self.bit_rate,
        )


def parse_params(query: Mapping[str, str], book: VoiceBook, *, socket: bool) -> Params:
    """Read the query of ``/v1/speak`` (the socket's or a REST request's).

    Raises:
        ProtocolError: an unknown voice (``voice_not_found``, naming the voices there are), or an encoding,
            container, rate, bit rate or speed voxgate cannot make here.
    """
    model = query.get("model") or None
    book.check(model, "model")
    encodings = SOCKET_ENCODINGS if socket else tuple(ENCODINGS)
    encoding = query.get("encoding") or ("linear16" if socket else DEFAULT_REST_ENCODING)
    if encoding not in encodings:
        message = f"encoding {encoding!r} is not available here; use one of {list(encodings)}"
        raise ProtocolError(ErrorCode.UNSUPPORTED_FORMAT, message, field="encoding")
    if socket:
        allowed: tuple[str, ...] = ("none",)
    elif encoding in SOCKET_ENCODINGS:
        allowed = ("wav", "none")
    else:
        allowed = ("ogg",) if encoding == "opus" else ("none",)
    container = query.get("container") or allowed[0]
    if container not in allowed:
        message = f"container {container!r} is not available for {encoding} here; use one of {list(allowed)}"
        raise ProtocolError(ErrorCode.UNSUPPORTED_FORMAT, message, field="container")
    rate = _number(query, "sample_rate", DEFAULT_RATES.get(encoding, DEFAULT_RATE), int)
    if not 8000 <= rate <= 48000:
        message = f"sample_rate must be from 8000 to 48000 Hz, not {rate}"
        raise ProtocolError(ErrorCode.UNSUPPORTED_RATE, message, field="sample_rate")
    bit_rate = _number(query, "bit_rate", 0, int) or None
    if bit_rate is not None and not 6000 <= bit_rate <= 320_000:
        message = f"bit_rate must be from 6000 to 320000 bit/s, not {bit_rate}"
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, message, field="bit_rate")
    speed = _number(query, "speed", 1.0, float)
    if not 0.25 <= speed <= 4.0:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"speed {speed} is out of range", field="speed")
    return Params(model, encoding, rate, container, bit_rate if ENCODINGS[encoding] != "pcm" else None, speed)


_N = TypeVar("_N", int, float)


def _number(query: Mapping[str, str], name: str, default: _N, kind: type[_N]) -> _N:
    value = query.get(name)
    if not value:
        return default
    try:
        return kind(value)
    except ValueError:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"{name} must be a number", field=name) from None


class Speak(msgspec.Struct, frozen=True, tag_field="type", tag="Speak"):
    text: str


class Flush(msgspec.Struct, frozen=True, tag_field="type", tag="Flush"):
    pass


class Clear(msgspec.Struct, frozen=True, tag_field="type", tag="Clear"):
    pass


class Close(msgspec.Struct, frozen=True, tag_field="type", tag="Close"):
    pass


DeepgramMessage = Speak | Flush | Clear | Close
_decode_message = msgspec.json.Decoder(DeepgramMessage).decode


def decode_message(data: str | bytes) -> DeepgramMessage:
    """Decode one client message.

    Raises:
        ProtocolError: not JSON, binary, an unknown ``type``, or a field of the wrong type.
    """
    if isinstance(data, bytes):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "send text messages: Speak, Flush, Clear or Close")
    try:
        msg: DeepgramMessage = decoded(_decode_message, data)
    except ProtocolError as err:
        if err.field == "$.type":
            message = f"unknown message type: use Speak, Flush, Clear or Close ({err.message})"
            raise ProtocolError(ErrorCode.UNKNOWN_TYPE, message, field=err.field) from None
        raise
    return msg


class SpeakBody(msgspec.Struct, frozen=True):
    """The body of ``POST /v1/speak``."""

    text: str


_decode_body = msgspec.json.Decoder(SpeakBody).decode


def decode_body(data: bytes) -> str:
    """The text of a REST body.

    Raises:
        ProtocolError: not JSON (``invalid_json``), or no ``text`` string (``invalid_message``).
    """
    return decoded(_decode_body, data, " body").text


def rest_error(err: ProtocolError, request_id: str) -> bytes:
    """A REST error body in Deepgram's shape."""
    return _encode({"err_code": err.code.upper(), "err_msg": err.message, "request_id": request_id})


class DeepgramSocket(Own):
    """The codec of ``WS /v1/speak`` (see the module docstring).

    Args:
        params: the socket's query.
        max_message_bytes: the largest client message taken (``message_too_large`` past it).
    """

    def __init__(self, params: Params, max_message_bytes: int) -> None:
        self.params, self.max_message_bytes = params, max_message_bytes
        self.flushes = 0  # Flush messages taken: the next one's sequence_id
        self._flushed: list[int] = []  # the sequence ids of flushes whose audio is still to end
        self._clears = 0  # Clear messages whose Cleared is still to go out
        self._described = False  # Metadata went out

    def opening(self) -> list[ClientMessage]:
        """The query's voice and format, streamed."""
        return [self.params.config()]

    def decode(self, data: str | bytes) -> list[Inbound]:
        """The session messages one client message becomes.

        Raises:
            ProtocolError: the message is refused (never fatal: a ``Warning``, the socket stays open).
        """
        size = len(data) if isinstance(data, bytes) or data.isascii() else len(data.encode())
        if size > self.max_message_bytes:
            message = f"message of {size} bytes exceeds {self.max_message_bytes}"
            raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, message)
        match decode_message(data):
            case Speak(text=text):
                return [InputText(text=text)] if text else []
            case Flush():
                self._flushed.append(self.flushes)
                self.flushes += 1
                return [InputDone()]
            case Clear():
                self._clears += 1
                return [InputCancel()]
        return [SessionClose()]

    def encode(self, output: Audio | Message) -> list[Payload]:
        """Audio as binary messages; the session's messages as Deepgram's (most have none)."""
        if isinstance(output, Audio):
            return [alaw(output.data) if self.params.to_alaw else output.data]
        return [payload.decode() for payload in self.render(output.msg)]

    def render(self, msg: ServerMessage) -> list[bytes]:
        """Deepgram's messages for one server message of the session."""
        match msg:
            case SessionReady(session_id=session) if not self._described:
                self._described = True
                metadata = {
                    "type": "Metadata",
                    "request_id": session,
                    "model_name": self.params.model or msg.config.voice,
                    "model_version": msg.config.engine,
                    "model_uuid": session,
                }
                return [_encode(metadata)]
            case SessionDone() if self._flushed:
                return [_encode({"type": "Flushed", "sequence_id": self._flushed.pop(0)})]
            case AudioCancelled():
                self._flushed.clear()  # their audio will not end: it was cleared
                if self._clears:
                    self._clears -= 1
                    cleared: dict[str, object] = {"type": "Cleared", "sequence_id": max(self.flushes - 1, 0)}
                    if msg.text_spoken is not msgspec.UNSET:  # what the listener heard (as Deepgram's Flux)
                        cleared.update(text_spoken=msg.text_spoken, text_remaining=msg.text_remaining)
                    return [_encode(cleared)]
            case ServerWarning(code=code, message=message):
                return [warning(code, message)]
            case Error(code=code, message=message, fatal=True):
                return [
                    _encode({"type": "Error", "description": message, "err_code": code, "err_msg": message})
                ]
            case Error(code=code, message=message):
                return [warning(code, message)]
        return []

    def close(self, error: ProtocolError | None) -> tuple[int, str | None]:
        """1000, or the fatal error's close code, with its code as the reason (as Deepgram's)."""
        if error is None:
            return int(CloseCode.NORMAL), None
        return int(error.close_code), str(error.code)


def warning(code: str, message: str) -> bytes:
    """A ``Warning``: the SDK's ``description`` and ``code``; ``warn_code`` and ``warn_msg`` as in Deepgram's
    docs."""
    return _encode(
        {"type": "Warning", "description": message, "code": code, "warn_code": code, "warn_msg": message}
    )
