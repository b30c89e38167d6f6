"""What an ElevenLabs request asks for (sans-I/O): its query, a REST body, and the session.config they make.

Every ElevenLabs route (the REST ``POST /v1/text-to-speech/{voice_id}`` family and both sockets) takes the
same query parameters (``parse_params``: ``output_format``, ``model_id``, ``seed``, ``inactivity_timeout``,
``apply_text_normalization``) and ``voice_settings``; a REST request also has a JSON body (``decode_body``)::

    {"text": "Hello there.", "model_id": "...", "seed": 7, "voice_settings": {"speed": 1.1},
     "apply_text_normalization": "auto", "pronunciation_dictionary_locators": [...]}

``session_config`` makes voxgate's ``session.config`` of them. A REST error is ElevenLabs'
``{"detail": {"status": code, "message": ...}}`` (``http_error``), its code ElevenLabs' own word where it
has one (``ERROR_CODES``, shared with the sockets' errors). A socket's messages are
``protocol.codecs.elevenlabs``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from ..audio import AudioFormat
from ..dictionaries import Locators
from ..errors import ErrorCode, ProtocolError, decoded, field_path
from ..messages import Pronunciation, SessionConfig
from ..normalize import TextNormalization

#: ElevenLabs' ``output_format`` values voxgate produces: our format, rate and bit rate (None: not compressed)
#: for each. Every one works on every route; the compressed ones come as one encoder stream per utterance
#: on the WebSockets, as one complete file per segment on REST.
OUTPUT_FORMATS: dict[str, tuple[AudioFormat, int, int | None]] = {
    **{f"pcm_{rate}": ("pcm", rate, None) for rate in (8000, 16000, 22050, 24000, 32000, 44100, 48000)},
    "ulaw_8000": ("mulaw", 8000, None),
    **{
        f"mp3_{rate}_{kbps}": ("mp3", rate, kbps * 1000)
        for rate, kbps in (
            (22050, 32),
            (24000, 48),
            (44100, 32),
            (44100, 64),
            (44100, 96),
            (44100, 128),
            (44100, 192),
        )
    },
    **{f"opus_48000_{kbps}": ("opus", 48000, kbps * 1000) for kbps in (32, 64, 96, 128, 192)},
}
#: ElevenLabs' default when ``output_format`` is left out.
DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"
#: ElevenLabs closes a socket that sent no text for this long (its documented default and maximum).
DEFAULT_INACTIVITY_TIMEOUT_S = 20
MAX_INACTIVITY_TIMEOUT_S = 180
#: ElevenLabs' own words for some of our error codes (an unknown voice, an idle socket, ...).
ERROR_CODES: dict[str, str] = {
    ErrorCode.VOICE_NOT_FOUND: "voice_not_found",
    ErrorCode.IDLE_TIMEOUT: "input_timeout_exceeded",
    ErrorCode.UNSUPPORTED_FORMAT: "invalid_output_format",
    ErrorCode.TOO_MANY_CONTEXTS: "max_active_conversations",
}


class VoiceSettings(msgspec.Struct, frozen=True, kw_only=True):
    """``voice_settings``: only ``speed`` changes what we make; the others are the voice's own (ignored)."""

    stability: float | None = None
    similarity_boost: float | None = None
    style: float | None = None
    use_speaker_boost: bool | None = None
    speed: float | None = None


class RequestBody(msgspec.Struct, frozen=True, kw_only=True):
    """The body of ``POST /v1/text-to-speech/{voice_id}`` (every route); the fields not named are ignored."""

    text: str
    model_id: str | None = None
    seed: int | None = None
    voice_settings: VoiceSettings | None = None
    #: ElevenLabs' ``auto`` / ``on`` / ``off``: voxgate's ``text_normalization`` (None: the query's).
    apply_text_normalization: TextNormalization | None = None
    #: Up to three of the caller's pronunciation dictionaries (``protocol.dictionaries``).
    pronunciation_dictionary_locators: Locators | None = None


_decode_body = msgspec.json.Decoder(RequestBody).decode
_encode = msgspec.json.Encoder().encode


def decode_body(data: bytes) -> RequestBody:
    """Decode the body of a REST request.

    Raises:
        ProtocolError: not JSON, nested past the interpreter's stack (``invalid_json``), or a field of the
            wrong type (``invalid_message``, with its path).
    """
    return decoded(_decode_body, data, " body")


@dataclass(frozen=True, slots=True)
class Params:
    """The query parameters that change what a stream makes; the others are accepted and ignored.

    Ignored the way ElevenLabs ignores what a model cannot do: ``language_code``, ``enable_logging``,
    ``enable_ssml_parsing``, ``auto_mode``, ``sync_alignment``, ``optimize_streaming_latency``,
    ``chunk_length_schedule`` (voxgate cuts at sentences itself). ``apply_text_normalization`` is
    voxgate's ``text_normalization``.
    """

    output_format: str = "pcm_24000"
    model_id: str | None = None
    seed: int | None = None
    inactivity_timeout_s: int = DEFAULT_INACTIVITY_TIMEOUT_S
    text_normalization: TextNormalization = "auto"

    @property
    def audio(self) -> tuple[AudioFormat, int]:
        """Our format and rate."""
        fmt, rate, _ = OUTPUT_FORMATS[self.output_format]
        return fmt, rate

    @property
    def bitrate(self) -> int | None:
        """A compressed format's bit rate in bit/s."""
        return OUTPUT_FORMATS[self.output_format][2]


def parse_params(query: Mapping[str, str]) -> Params:
    """Read a request's query parameters.

    Raises:
        ProtocolError: an ``output_format`` we cannot make (``unsupported_format``), or a
            malformed ``inactivity_timeout`` / ``seed`` / ``apply_text_normalization`` (``invalid_message``).
    """
    fmt = query.get("output_format", DEFAULT_OUTPUT_FORMAT)
    formats = sorted(OUTPUT_FORMATS)
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
    normalization = query.get("apply_text_normalization", "auto")
    if normalization not in _NORMALIZATIONS:
        message = f"apply_text_normalization must be one of {list(_NORMALIZATIONS)}, not {normalization!r}"
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, message, field="apply_text_normalization")
    return Params(fmt, query.get("model_id"), seed, timeout, _NORMALIZATIONS[normalization])


_NORMALIZATIONS: dict[str, TextNormalization] = {"auto": "auto", "on": "on", "off": "off"}


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
    text_normalization: TextNormalization | None = None,
    pronunciations: list[Pronunciation] | None = None,
) -> SessionConfig:
    """The ``session.config`` of a socket (or REST request): our voice named ``voice_id``, the query's format.

    Args:
        voice_id: the path's voice id: a voxgate voice name.
        params: the query parameters.
        settings: the first message's ``voice_settings`` (its ``speed`` is honoured, for the whole session).
        words: ask the engine for word timings (``word_timestamps``), which the alignment follows.
        whole_segments: one audio message per segment (REST, which sends each with its alignment); the
            sockets stream (False).
        text_normalization: a REST body's ``apply_text_normalization``, which wins over the query's.
        pronunciations: the entries of the request's pronunciation dictionaries.

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
        "bitrate": params.bitrate,
        "model": params.model_id,
        "seed": params.seed,
        "word_timestamps": words,
        "text_normalization": text_normalization or params.text_normalization,
        "pronunciations": pronunciations,
    }
    if settings is not None and settings.speed is not None:
        fields["speed"] = settings.speed
    try:
        return msgspec.convert(fields, SessionConfig)
    except msgspec.ValidationError as exc:
        path = field_path(exc)
        field = "$.voice_settings.speed" if path == "$.speed" else path
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, str(exc), field=field) from None


def http_error(err: ProtocolError) -> bytes:
    """A REST error body in ElevenLabs' shape: ``{"detail": {"status": code, "message": ...}}``."""
    return _encode({"detail": {"status": ERROR_CODES.get(err.code, err.code), "message": err.message}})
