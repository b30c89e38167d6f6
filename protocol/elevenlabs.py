"""ElevenLabs' text-to-speech wire shapes, mapped onto voxgate's session protocol (sans-I/O).

ElevenLabs clients (pipecat's ``ElevenLabsTTSService``, livekit-plugins-elevenlabs, the ``elevenlabs``
SDK) speak through voxgate unchanged: this module turns their messages into voxgate client messages
(``protocol.messages``) for one session per context, and that session's server messages back into
theirs. The gateway (``gateway/elevenlabs.py``) moves the bytes; docs/agents.md has the wire rules.

Client -> server, one JSON text message each (every field optional)::

    {"text": " ", "voice_settings": {...}, "generation_config": {...}, "context_id": "c1"}  first one
    {"text": "Hello there. ", "try_trigger_generation": true, "flush": false}                text
    {"text": ""}                       stream-input: end of input; multi-stream-input: keep-alive
    {"context_id": "c1", "flush": true}                  speak what is buffered now
    {"context_id": "c1", "close_context": true}          end of the context's input
    {"close_socket": true}                               end of every context, then close

Server -> client::

    {"audio": "<base64>", "isFinal": null, "alignment": {...}, "normalizedAlignment": {...},
     "contextId": "c1"}                                  one per segment; contextId on multi only
    {"isFinal": true, "contextId": "c1"}                 after a context's last audio
    {"message": "...", "error": "<code>", "code": 1008}  an error (contextId when it is a context's)

Alignment times are milliseconds relative to the start of the message's own audio (``Alignment`` in the
SDK); the REST ``with-timestamps`` shapes use seconds from the start of the response.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from voxgate.protocol.audio import BYTES_PER_SAMPLE, AudioFormat
from voxgate.protocol.errors import FAILURES, CloseCode, ErrorCode, ProtocolError, field_path
from voxgate.protocol.messages import (
    AudioStart,
    ClientMessage,
    Error,
    InputCommit,
    InputDone,
    InputText,
    ServerMessage,
    SessionClose,
    SessionConfig,
    WordTimestamp,
    WordTimestamps,
)

#: ElevenLabs' ``output_format`` values voxgate produces: our format and rate for each.
OUTPUT_FORMATS: dict[str, tuple[AudioFormat, int]] = {
    **{f"pcm_{rate}": ("pcm", rate) for rate in (8000, 16000, 22050, 24000, 32000, 44100, 48000)},
    "ulaw_8000": ("mulaw", 8000),
}
#: ElevenLabs' mp3 formats, by rate (the bitrate is the encoder's choice). Only the REST routes make them,
#: each segment encoded whole; the WebSockets refuse them.
MP3_FORMATS: dict[str, int] = {
    f"mp3_{rate}_{kbps}": rate
    for rate, kbps in (
        (22050, 32),
        (24000, 48),
        (44100, 32),
        (44100, 64),
        (44100, 96),
        (44100, 128),
        (44100, 192),
    )
}
#: ElevenLabs' default when ``output_format`` is left out.
DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"
#: ElevenLabs closes a socket that sent no text for this long (its documented default and maximum).
DEFAULT_INACTIVITY_TIMEOUT_S = 20
MAX_INACTIVITY_TIMEOUT_S = 180
#: ElevenLabs' own word for an unknown voice, and for an idle socket.
_CODES: dict[str, str] = {
    ErrorCode.VOICE_NOT_FOUND: "voice_not_found",
    ErrorCode.IDLE_TIMEOUT: "input_timeout_exceeded",
    ErrorCode.UNSUPPORTED_FORMAT: "invalid_output_format",
}


#: The close code of each error code (``protocol.errors.FAILURES``), by the code's string.
_CLOSE_CODES: dict[str, CloseCode] = {str(code): failure.close_code for code, failure in FAILURES.items()}


def close_code(code: int) -> int:
    """The close code an ElevenLabs client gets: ours, but 1008 for a timeout (ElevenLabs' own choice)."""
    return int(CloseCode.POLICY_VIOLATION) if code == CloseCode.TIMEOUT else code


class VoiceSettings(msgspec.Struct, frozen=True, kw_only=True):
    """``voice_settings``: only ``speed`` changes what we make; the others are the voice's own (ignored)."""

    stability: float | None = None
    similarity_boost: float | None = None
    style: float | None = None
    use_speaker_boost: bool | None = None
    speed: float | None = None


class Inbound(msgspec.Struct, frozen=True, kw_only=True):
    """One client message of ``stream-input`` / ``multi-stream-input``; unknown fields are ignored."""

    text: str | None = None
    context_id: str | None = None
    flush: bool = False
    try_trigger_generation: bool | None = None
    close_context: bool = False
    close_socket: bool = False
    voice_settings: VoiceSettings | None = None


_decode_inbound = msgspec.json.Decoder(Inbound).decode
_decode_server = msgspec.json.Decoder(ServerMessage).decode
_encode = msgspec.json.Encoder().encode


def decode_inbound(data: str | bytes) -> Inbound:
    """Decode one client message.

    Raises:
        ProtocolError: not JSON, or a field of the wrong type (``invalid_message``, with its path).
    """
    try:
        return _decode_inbound(data)
    except msgspec.ValidationError as exc:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, str(exc), field=field_path(exc)) from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"invalid JSON: {exc}") from None


@dataclass(frozen=True, slots=True)
class Params:
    """The query parameters that change what a stream makes; the others are accepted and ignored.

    Ignored the way ElevenLabs ignores what a model cannot do: ``language_code``, ``enable_logging``,
    ``enable_ssml_parsing``, ``apply_text_normalization``, ``auto_mode``, ``sync_alignment``,
    ``optimize_streaming_latency``, ``chunk_length_schedule`` (voxgate cuts at sentences itself).
    """

    output_format: str = "pcm_24000"
    model_id: str | None = None
    seed: int | None = None
    inactivity_timeout_s: int = DEFAULT_INACTIVITY_TIMEOUT_S

    @property
    def audio(self) -> tuple[AudioFormat, int]:
        """Our format and rate (``f32`` for mp3, which the REST route encodes)."""
        return OUTPUT_FORMATS.get(self.output_format) or ("f32", MP3_FORMATS[self.output_format])

    @property
    def mp3(self) -> bool:
        """An mp3 format: the shell encodes each segment's ``f32`` audio."""
        return self.output_format in MP3_FORMATS


def parse_params(query: Mapping[str, str], *, mp3: bool = False) -> Params:
    """Read a request's query parameters; ``mp3``: the route can encode mp3 (REST).

    Raises:
        ProtocolError: an ``output_format`` we cannot make (``unsupported_format``), or a
            malformed ``inactivity_timeout`` / ``seed`` (``invalid_message``).
    """
    fmt = query.get("output_format", DEFAULT_OUTPUT_FORMAT)
    formats = sorted(OUTPUT_FORMATS) + (sorted(MP3_FORMATS) if mp3 else [])
    if fmt not in formats:
        message = f"output_format {fmt!r} is not available here; use one of {formats}"
        raise ProtocolError(ErrorCode.UNSUPPORTED_FORMAT, message, field="output_format")
    timeout = _int(query, "inactivity_timeout", DEFAULT_INACTIVITY_TIMEOUT_S)
    if timeout is None or not 1 <= timeout <= MAX_INACTIVITY_TIMEOUT_S:
        message = f"inactivity_timeout must be a whole number of seconds from 1 to {MAX_INACTIVITY_TIMEOUT_S}"
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, message, field="inactivity_timeout")
    seed = _int(query, "seed", None)
    if seed is None and query.get("seed") is not None:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "seed must be an integer", field="seed")
    return Params(fmt, query.get("model_id"), seed, timeout)


def _int(query: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = query.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        return None


def session_config(
    voice_id: str,
    params: Params,
    settings: VoiceSettings | None = None,
    *,
    words: bool = False,
    whole_segments: bool = True,
) -> SessionConfig:
    """The ``session.config`` of one context: our voice named ``voice_id``, the query's format.

    Args:
        voice_id: the path's voice id: a voxgate voice name.
        params: the query parameters.
        settings: the context's ``voice_settings`` (its ``speed`` is honoured).
        words: ask the engine for word timings (``word_timestamps``), which the alignment follows.
        whole_segments: one audio message per segment, so the alignment of each spans exactly its audio.

    Raises:
        ProtocolError: a ``speed`` out of range (``invalid_message``).
    """
    fmt, rate = params.audio
    fields: dict[str, object] = {
        "type": "session.config",
        "voice": voice_id,
        "response_format": fmt,
        "sample_rate": rate,
        "stream_audio": not whole_segments,
        "model": params.model_id,
        "seed": params.seed,
        "word_timestamps": words,
    }
    if settings is not None and settings.speed is not None:
        fields["speed"] = settings.speed
    try:
        return msgspec.convert(fields, SessionConfig)
    except msgspec.ValidationError as exc:
        path = field_path(exc)
        field = "$.voice_settings.speed" if path == "$.speed" else path
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, str(exc), field=field) from None


class Alignment(msgspec.Struct, frozen=True):
    """Character timings of one audio message, in ms from the start of that message's audio."""

    chars: list[str]
    charStartTimesMs: list[int]  # noqa: N815 - ElevenLabs' field names
    charDurationsMs: list[int]  # noqa: N815


def spread_alignment(text: str, duration_ms: float) -> Alignment:
    """The alignment of a segment's ``text`` over its audio, each character getting an equal share.

    For engines that do not time words (``word_alignment`` otherwise): ``text`` is the segment as spoken,
    plus the space that separates it from the next one (clients complete a word at a space).
    """
    chars = list(text)
    n = len(chars)
    edges = [round(i * duration_ms / n) for i in range(n + 1)] if n else [0]
    return Alignment(chars, edges[:-1], [b - a for a, b in zip(edges, edges[1:], strict=False)])


def word_alignment(words: list[WordTimestamp], offset_ms: float, duration_ms: float) -> Alignment:
    """The alignment of a segment from the engine's word timings: each word's characters, and the space
    after it, share the word's time evenly.

    Args:
        words: the segment's words, in order, on the utterance's clock.
        offset_ms: where the segment's audio starts on that clock.
        duration_ms: the segment's audio; the last word's space reaches its end, so that a client adding
            up each message's span (pipecat) stays on the audio's clock.
    """
    chars: list[str] = []
    starts: list[int] = []
    durations: list[int] = []
    for n, word in enumerate(words):
        start = min(max(word.start_ms - offset_ms, 0.0), duration_ms)
        end = duration_ms if n == len(words) - 1 else min(max(word.end_ms - offset_ms, start), duration_ms)
        text = word.word + " "
        edges = [round(start + i * (end - start) / len(text)) for i in range(len(text) + 1)]
        chars += text
        starts += edges[:-1]
        durations += [b - a for a, b in zip(edges, edges[1:], strict=False)]
    return Alignment(chars, starts, durations)


class Context:
    """One ElevenLabs context (the only one on ``stream-input``) over one voxgate session.

    ``receive`` maps the client's messages to the session's; ``render`` maps the session's server
    messages and audio back; ``finish`` says what to send when the session ends.

    Args:
        voice_id: the voice of the path.
        params: the query parameters.
        context_id: the client's id, None on ``stream-input`` (whose messages carry no ``contextId``).
        multi: ``multi-stream-input``: an empty text is a keep-alive, not the end.
        words: the engine times words: ask for them, and align characters with them.
    """

    def __init__(
        self,
        voice_id: str,
        params: Params,
        context_id: str | None = None,
        *,
        multi: bool,
        words: bool = False,
    ) -> None:
        self.voice_id, self.params, self.context_id, self.multi = voice_id, params, context_id, multi
        self.words = words
        self._timed: list[WordTimestamp] = []  # the words of the segment whose audio comes next
        self._start_ms = 0.0  # where that segment starts on its utterance's clock
        self.configured = False
        self.ended = False  # the client's input ended: what follows is ignored
        self._text = ""  # the segment whose audio comes next
        self._format, self._rate = params.audio

    def receive(self, msg: Inbound) -> list[ClientMessage]:
        """The session messages one client message becomes (none once the context's input ended).

        Raises:
            ProtocolError: its ``voice_settings`` are out of range (first message only).
        """
        if self.ended:
            return []
        out: list[ClientMessage] = []
        if not self.configured:
            out.append(session_config(self.voice_id, self.params, msg.voice_settings, words=self.words))
            self.configured = True
        if msg.text or (msg.text == "" and self.multi):
            out.append(InputText(text=msg.text))
        if msg.flush:
            out.append(InputCommit())
        if msg.close_context or msg.close_socket or (msg.text == "" and not self.multi):
            out += [InputDone(), SessionClose()]
            self.ended = True
        return out

    def render(self, data: str | bytes) -> list[bytes]:
        """The client messages for one message of the session (binary: a whole segment's audio)."""
        if isinstance(data, bytes):
            return [self.audio_message(*self.segment(data))]
        error = self.observe(data)
        return [] if error is None else [self._shape(ws_error(error.code, error.message))]

    def observe(self, text: str) -> Error | None:
        """Take one JSON message of the session: notes each segment's text, hands back its errors."""
        try:
            msg = _decode_server(text)
        except msgspec.ValidationError:
            return None  # a server message this dialect has no counterpart for
        match msg:
            case AudioStart(sentence_text=sentence, format=fmt, sample_rate=rate, start_sample=start):
                self._text, self._format, self._rate = sentence, fmt, rate
                self._start_ms, self._timed = start * 1000.0 / rate, []
            case WordTimestamps(timestamps=timed):
                self._timed += timed
            case Error():
                return msg
        return None

    def segment(self, data: bytes) -> tuple[bytes, Alignment]:
        """A segment's audio and its alignment (the audio follows the ``audio.start`` seen last)."""
        duration_ms = len(data) / BYTES_PER_SAMPLE[self._format] / self._rate * 1000.0
        if self._timed:
            return data, word_alignment(self._timed, self._start_ms, duration_ms)
        return data, spread_alignment(self._text + " ", duration_ms)

    def audio_message(self, data: bytes, alignment: Alignment) -> bytes:
        """One audio message: base64 audio with its alignment (also as ``normalizedAlignment``)."""
        shape = msgspec.to_builtins(alignment)
        payload: dict[str, object] = {
            "audio": base64.b64encode(data).decode(),
            "isFinal": None,
            "normalizedAlignment": shape,
            "alignment": shape,
        }
        return self._shape(payload)

    def finish(self, normal: bool) -> list[bytes]:
        """What to send when the session ends: ``isFinal`` after a normal end (an error was sent already)."""
        return [self._shape({"isFinal": True})] if normal else []

    def error(self, err: ProtocolError) -> bytes:
        """An error of this context in ElevenLabs' shape."""
        return self._shape(ws_error(err.code, err.message))

    def _shape(self, payload: dict[str, object]) -> bytes:
        if self.multi:
            payload["contextId"] = self.context_id
        return _encode(payload)


def ws_error(code: str, message: str) -> dict[str, object]:
    """A WebSocket error in ElevenLabs' shape: ``message``, ``error`` (its code), ``code`` (close code).

    ``code`` is a voxgate error code; one the error table lacks gets 1011 (internal error).
    """
    close = close_code(_CLOSE_CODES.get(code, CloseCode.INTERNAL_ERROR))
    return {"message": message, "error": _CODES.get(code, code), "code": close}


def http_error(err: ProtocolError) -> bytes:
    """A REST error body in ElevenLabs' shape: ``{"detail": {"status": code, "message": ...}}``."""
    return _encode({"detail": {"status": _CODES.get(err.code, err.code), "message": err.message}})


class SecondsAlignment(msgspec.Struct, frozen=True):
    """The REST ``with-timestamps`` alignment: characters with start and end times in seconds."""

    characters: list[str]
    character_start_times_seconds: list[float]
    character_end_times_seconds: list[float]


def seconds_alignment(alignment: Alignment, offset_ms: float) -> SecondsAlignment:
    """``alignment`` in the REST shape, its times moved by ``offset_ms`` (where its audio starts)."""
    starts = [round((offset_ms + t) / 1000.0, 3) for t in alignment.charStartTimesMs]
    ends = [
        round((offset_ms + t + d) / 1000.0, 3)
        for t, d in zip(alignment.charStartTimesMs, alignment.charDurationsMs, strict=True)
    ]
    return SecondsAlignment(alignment.chars, starts, ends)
