"""The codec (``protocol.codecs.base``) of Home Assistant's Wyoming protocol, and its framing.

Wyoming is a TCP stream of events. Each event is a JSON header line (``type``, ``data_length``,
``payload_length``; older peers put ``data`` in the header itself), then ``data_length`` bytes of JSON data
(merged over the header's), then ``payload_length`` bytes of payload (audio). ``Framer`` cuts the stream
into whole events, ``parse`` reads one, ``serialize`` writes one. The TCP shell (``gateway.routes.wyoming``)
hands each whole event to the WebSocket shell (``gateway.transport.socket``) as one message, and answers the
two
events that are no part of a session itself: ``describe`` (``info``: the TTS program and its voices) and
``ping`` (``pong``).

A session on one connection, as ``WyomingCodec`` translates it (wyoming 1.7's streaming, as Home Assistant
sends it)::

    client                                   server
    synthesize {text, voice} ───────────────▶ (session.config if the voice changed, input.text, input.done)
                   ◀───────────────────────── audio-start, audio-chunk..., audio-stop  (one for the text)
    synthesize-start {voice} ───────────────▶ (session.config if the voice changed)
    synthesize-chunk {text} (any number) ───▶ (input.text)
                   ◀───────────────────────── audio-start, audio-chunk..., audio-stop  (per segment, as
                                                                                      the chunks come)
    synthesize {text} (all of it again) ────▶ (nothing: it was spoken from the chunks)
    synthesize-stop ────────────────────────▶ (input.done)
                   ◀───────────────────────── synthesize-stopped (the last audio is out)
                   ◀───────────────────────── error {text, code}   (any time)

Audio is raw PCM, 16-bit little-endian mono (``width`` 2, ``channels`` 1) at the voice's own rate. Each
request is one utterance of the session; their answers follow in order. Events of other types are
ignored, as Wyoming asks of servers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import msgspec

from ..errors import MALFORMED_JSON, CloseCode, ErrorCode, ProtocolError
from ..messages import (
    AudioDone,
    AudioStart,
    ClientMessage,
    Error,
    InputDone,
    InputText,
    SessionConfig,
    SessionDone,
)
from ..output import Audio, Message
from .base import Codec, Inbound, Payload

#: The Wyoming version written in each header: 1.7 brought the streaming events this codec speaks.
VERSION = "1.7.0"
#: Events the transport answers itself, outside the session.
DESCRIBE, PING = "describe", "ping"
#: The audio's sample width in bytes and channel count (``pcm``: s16le mono).
WIDTH, CHANNELS = 2, 1


@dataclass(frozen=True, slots=True)
class Event:
    """One Wyoming event: its ``type``, its JSON ``data`` and its binary ``payload``."""

    type: str
    data: dict[str, object]
    payload: bytes = b""


def serialize(event: Event) -> bytes:
    """The bytes of ``event`` on the wire: header line, data, payload (as the ``wyoming`` package writes)."""
    data = msgspec.json.encode(event.data) if event.data else b""
    header: dict[str, object] = {"type": event.type, "version": VERSION}
    if data:
        header["data_length"] = len(data)
    if event.payload:
        header["payload_length"] = len(event.payload)
    return msgspec.json.encode(header) + b"\n" + data + event.payload


class _Lengths(msgspec.Struct, frozen=True):
    """What framing needs of a header line."""

    data_length: Annotated[int, msgspec.Meta(ge=0)] | None = None
    payload_length: Annotated[int, msgspec.Meta(ge=0)] | None = None


class _Header(msgspec.Struct, frozen=True):
    """The rest of a header line."""

    type: str
    data: dict[str, object] | None = None


def _lengths(line: bytes) -> tuple[int, int]:
    """The data and payload lengths a header line announces.

    Raises:
        ProtocolError: fatal: the line is not a JSON object with lengths, so the stream cannot be followed.
    """
    try:
        lengths = msgspec.json.decode(line, type=_Lengths)
    except MALFORMED_JSON as exc:  # msgspec's ValidationError among them
        raise _lost(ErrorCode.INVALID_JSON, f"not a Wyoming header line: {exc}") from None
    return lengths.data_length or 0, lengths.payload_length or 0


def _lost(code: ErrorCode, message: str) -> ProtocolError:
    """An error after which the stream's events cannot be told apart any more: the connection ends."""
    return ProtocolError(code, message, fatal=True, close_code=CloseCode.POLICY_VIOLATION)


class Framer:
    """Cuts a Wyoming byte stream into whole events, each at most ``max_event_bytes``.

    An event over the limit is left out (its header is handed on alone, and ``parse`` refuses it); a header
    line that is not JSON, or longer than the limit, is handed on as it is and ends the framing (``parse``
    refuses it, fatally): nothing after it can be trusted to start an event.

    Args:
        max_event_bytes: the largest event taken, header, data and payload together.
    """

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self._buffer = bytearray()
        self._size: int | None = None  # the current event's bytes, once its header line is in
        self._skip = 0  # bytes of an event over the limit still to leave out
        self._lost = False

    def feed(self, data: bytes) -> list[bytes]:
        """The whole events completed by ``data`` (possibly none), in order."""
        if self._lost:
            return []
        self._buffer += data
        events: list[bytes] = []
        while True:
            if self._skip:
                skipped = min(self._skip, len(self._buffer))
                del self._buffer[:skipped]
                self._skip -= skipped
                if self._skip:
                    return events
            if self._size is None:
                end = self._buffer.find(b"\n", 0, self.max_event_bytes)
                if end < 0:
                    if len(self._buffer) >= self.max_event_bytes:
                        events.append(self._give_up(self.max_event_bytes))
                    return events
                try:
                    data_length, payload_length = _lengths(bytes(self._buffer[:end]))
                except ProtocolError:
                    events.append(self._give_up(end + 1))
                    return events
                body = data_length + payload_length
                if end + 1 + body > self.max_event_bytes:
                    events.append(bytes(self._buffer[: end + 1]))
                    del self._buffer[: end + 1]
                    self._skip = body
                    continue
                self._size = end + 1 + body
            if len(self._buffer) < self._size:
                return events
            events.append(bytes(self._buffer[: self._size]))
            del self._buffer[: self._size]
            self._size = None

    def _give_up(self, size: int) -> bytes:
        event = bytes(self._buffer[:size])
        self._buffer.clear()
        self._lost = True
        return event


def parse(event: bytes, max_event_bytes: int) -> Event:
    """One whole event from ``Framer.feed``, at most ``max_event_bytes``.

    Raises:
        ProtocolError: fatal for a header line that is not JSON or is too long (the stream is lost);
            not fatal for an event over the limit (it was left out), data that is not a JSON object, or
            a header without a string ``type``.
    """
    end = event.find(b"\n")
    if end < 0:
        raise _lost(ErrorCode.MESSAGE_TOO_LARGE, f"no header line within {max_event_bytes} bytes")
    data_length, payload_length = _lengths(event[:end])
    size = end + 1 + data_length + payload_length
    if size > max_event_bytes:
        message = f"event of {size} bytes exceeds {max_event_bytes}; it was left out"
        raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, message)
    try:
        header = msgspec.json.decode(event[:end], type=_Header)
        data = header.data or {}
        if data_length:
            data = {
                **data,
                **msgspec.json.decode(event[end + 1 : end + 1 + data_length], type=dict[str, object]),
            }
    except msgspec.ValidationError as exc:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"invalid Wyoming event: {exc}") from None
    except MALFORMED_JSON as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"event data is not JSON: {exc}") from None
    return Event(header.type, data, event[end + 1 + data_length :])


# -- what the events' data hold (unknown fields are ignored) ---------------------------------------------


class _Voice(msgspec.Struct, frozen=True):
    """A requested voice: ``name`` is a voxgate voice; a ``language`` alone or a ``speaker`` picks none."""

    name: str | None = None
    language: str | None = None
    speaker: str | None = None


class _Synthesize(msgspec.Struct, frozen=True):
    text: str
    voice: _Voice | None = None


class _SynthesizeStart(msgspec.Struct, frozen=True):
    voice: _Voice | None = None


class _SynthesizeChunk(msgspec.Struct, frozen=True):
    text: str


class _SynthesizeStop(msgspec.Struct, frozen=True):
    pass


class _Ping(msgspec.Struct, frozen=True):
    text: str | None = None


_REQUESTS: dict[str, type[_Synthesize | _SynthesizeStart | _SynthesizeChunk | _SynthesizeStop]] = {
    "synthesize": _Synthesize,
    "synthesize-start": _SynthesizeStart,
    "synthesize-chunk": _SynthesizeChunk,
    "synthesize-stop": _SynthesizeStop,
}


@dataclass(slots=True)
class _Request:
    """One request (a ``synthesize``, or a stream from ``synthesize-start``): one utterance of the session."""

    streamed: bool
    voice_ok: bool = True  # False until a config it sent is adopted: a refused voice is not heard at all
    heard: bool = False  # a streamed chunk of text reached the session
    started: bool = False  # its audio-start went out (a one-shot answer has one)
    rate: int = 0


class WyomingCodec:
    """One Wyoming connection's session (see the module docstring).

    Args:
        max_event_bytes: the largest event taken (``message_too_large`` past it).
    """

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self._configured = False
        self._voice: str | None = None  # the voice of the config in force
        self._configuring: _Request | None = None  # the request whose config waits for ``adopt``
        self._stream: _Request | None = None  # the stream open (synthesize-start without its stop)
        self._queue: deque[_Request] = deque()  # requests whose utterance has produced nothing yet
        self._bound: dict[int, _Request] = {}  # utterance index -> its request

    def opening(self) -> list[ClientMessage]:
        """Nothing: a connection is configured by its first request (its voice)."""
        return []

    def decode(self, data: str | bytes) -> list[Inbound]:
        """The session messages of one whole event (``Framer``).

        Raises:
            ProtocolError: see ``parse``; and, not fatal, a request out of order (a chunk or stop
                outside a stream, a stream inside one) or with fields of the wrong type.
        """
        event = parse(data.encode() if isinstance(data, str) else data, self.max_event_bytes)
        kind = _REQUESTS.get(event.type)
        if kind is None:
            return []  # describe and ping are answered by the transport; anything else is not for us
        try:
            request = msgspec.convert(event.data, kind)
        except msgspec.ValidationError as exc:
            raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"invalid {event.type}: {exc}") from None
        stream = self._stream
        match request:
            case _Synthesize(text=text) if stream is not None:
                # Sent again whole after the chunks, for servers that do not stream: spoken if no chunk was.
                return self._text(stream, text) if not stream.heard else []
            case _Synthesize(text=text, voice=voice):
                # Its text goes in with its config: if the voice is refused, its audio is not written.
                said: list[Inbound] = [InputText(text=text)] if text else []
                return [*self._open(_Request(streamed=False), voice), *said, InputDone()]
            case _SynthesizeStart() if stream is not None:
                raise _out_of_order("synthesize-start inside a stream: send synthesize-stop first")
            case _SynthesizeStart(voice=voice):
                self._stream = _Request(streamed=True)
                return list(self._open(self._stream, voice))
            case _SynthesizeChunk() | _SynthesizeStop() if stream is None:
                raise _out_of_order(f"{event.type} outside a stream: send synthesize-start first")
            case _SynthesizeChunk(text=text):
                assert stream is not None
                return self._text(stream, text)
            case _:  # _SynthesizeStop
                self._stream = None
                return [InputDone()]

    def _open(self, request: _Request, voice: _Voice | None) -> list[Inbound]:
        """Queue ``request``; a config first if it names another voice than the one in force."""
        self._queue.append(request)
        name = voice.name if voice is not None else None
        if self._configured and name == self._voice:
            return []
        request.voice_ok = False
        self._configuring = request
        return [SessionConfig(voice=name, response_format="pcm", sample_rate="native")]

    def _text(self, stream: _Request, text: str) -> list[Inbound]:
        """A stream's text; none once its voice was refused (the config was applied before this event)."""
        if not stream.voice_ok or not text:
            return []
        stream.heard = True
        return [InputText(text=text)]

    def encode(self, output: Audio | Message) -> list[Payload]:
        """Audio as ``audio-chunk`` events; segments' starts and ends, a request's end, errors as events."""
        match output:
            case Audio(utterance=index, data=data):
                request = self._request(index)
                if not request.voice_ok:
                    return []
                return [serialize(Event("audio-chunk", _format(request.rate), data))]
            case Message(msg=AudioStart(utterance_index=index, sample_rate=rate)):
                request = self._request(index)
                request.rate = rate
                if not request.voice_ok or (request.started and not request.streamed):
                    return []
                request.started = True
                return [serialize(Event("audio-start", _format(rate)))]
            case Message(msg=AudioDone(utterance_index=index)):
                request = self._request(index)
                return [serialize(Event("audio-stop", {}))] if request.streamed and request.voice_ok else []
            case Message(msg=SessionDone(utterance_index=index)):
                request = self._request(index)
                del self._bound[index]
                return [serialize(Event("synthesize-stopped" if request.streamed else "audio-stop", {}))]
            case Message(msg=Error() as error):
                return [error_event(error)]
        return []  # the session's other messages have no Wyoming counterpart

    def _request(self, index: int) -> _Request:
        """The request of utterance ``index``: requests become utterances in order, so the first one not
        bound yet (a one-shot one if none is left: never, unless the session refused a request's end)."""
        request = self._bound.get(index)
        if request is None:
            request = self._bound[index] = self._queue.popleft() if self._queue else _Request(streamed=False)
        return request

    def check(self, config: SessionConfig, previous: SessionConfig | None) -> SessionConfig:
        """The config as the codec made it."""
        return config

    def adopt(self, config: SessionConfig) -> Codec:
        """This codec, now with ``config``'s voice in force: the request that asked for it is heard."""
        self._configured, self._voice = True, config.voice
        if self._configuring is not None:
            self._configuring.voice_ok = True
            self._configuring = None
        return self

    def dropped(self) -> None:
        """Nothing to do (no cancel on this wire)."""

    def close(self, error: ProtocolError | None) -> tuple[int, str | None]:
        """Wyoming has no close code: the shell only hangs up."""
        return (CloseCode.NORMAL if error is None else error.close_code), None


def _out_of_order(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_STATE, message, field="$.type")


def error_event(error: Error) -> bytes:
    """The ``error`` event of an ``error`` message: its ``message`` as ``text``, and its ``code``."""
    return serialize(Event("error", {"text": error.message, "code": error.code}))


def _format(rate: int) -> dict[str, object]:
    return {"rate": rate, "width": WIDTH, "channels": CHANNELS}


# -- the transport's own answers ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    """A voice as ``info`` lists it: its name, its engine and language (BCP 47), and a description."""

    name: str
    engine: str = ""
    language: str = ""
    description: str = ""


def info(voices: Sequence[VoiceInfo], version: str) -> bytes:
    """The ``info`` event that answers ``describe``: one TTS program, voxgate, with ``voices``, streaming.

    Languages are written as Wyoming's voices write them (``en_US``).
    """
    program = {
        **_artifact("voxgate", "voxgate", "voxgate: real-time speech from streamed text", version),
        "voices": [
            {
                **_artifact(v.name, v.engine or "voxgate", v.description or v.name, None),
                "languages": [v.language.replace("-", "_")] if v.language else [],
                "speakers": None,
            }
            for v in voices
        ],
        "supports_synthesize_streaming": True,
    }
    data: dict[str, object] = {name: [] for name in ("asr", "handle", "intent", "wake", "mic", "snd")}
    data["tts"] = [program]
    return serialize(Event("info", data))


def _artifact(name: str, by: str, description: str, version: str | None) -> dict[str, object]:
    return {
        "name": name,
        "attribution": {"name": by, "url": ""},
        "installed": True,
        "description": description,
        "version": version,
    }


def pong(event: Event) -> bytes:
    """The ``pong`` event that answers a ``ping``, with its ``text``."""
    try:
        text = msgspec.convert(event.data, _Ping).text
    except msgspec.ValidationError:
        text = None
    return serialize(Event("pong", {"text": text} if text is not None else {}))
