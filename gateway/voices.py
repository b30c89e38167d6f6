"""REST voice routes: upload, list, inspect and delete the caller's cloned voices (vllm-omni's fields).

``POST /v1/audio/voices`` takes ``multipart/form-data`` (or, for embeddings, urlencoded) with
``name`` and ``consent``, then ``audio_sample`` (a wav, flac, ogg/opus or mp3 file of 1 to 30 s) or
``speaker_embedding`` (a JSON list of numbers), with optional ``ref_text`` and ``speaker_description``.
The body is parsed while it streams in, and reading stops at the first part over its limit.

Every failure is an OpenAI-style ``{"error": {"message", "type", "param", "code"}}``:

====  ==================================================================================
400   invalid_multipart, invalid_form, too_many_fields, duplicate_field, missing_name,
      invalid_name, missing_consent, missing_voice_source, ambiguous_voice_source,
      invalid_field, invalid_embedding, empty_embedding, embedding_too_long,
      embedding_not_finite, invalid_audio, invalid_duration (and client_disconnected, which
      nobody reads: the client left mid-body)
404   voice_not_found
409   voice_limit_reached (the key holds ``max_voices`` voices: retrying will not help
      until one is deleted, which is a conflict with the current state, not a rate limit);
      name_taken (a built-in voice has that name, and sessions would speak it instead)
413   request_too_large, audio_too_large, field_too_large
415   unsupported_content_type, unsupported_audio (soundfile cannot decode the sample)
====  ==================================================================================
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qsl

import msgspec
import numpy as np
import numpy.typing as npt
import soundfile
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from voxgate.engine.base import Voice, VoiceReference
from voxgate.gateway.http import api_error
from voxgate.gateway.store import InvalidVoiceName, VoiceInfo, VoiceLimitReached, VoiceStore, check_name

logger = logging.getLogger(__name__)

# vllm-omni's limit for a reference clip.
MAX_AUDIO_BYTES = 10 * 1024 * 1024
# 8192 numbers written out in full by json.dumps take about 200 KiB.
MAX_EMBEDDING_BYTES = 256 * 1024
# Names, consent records and transcripts of 30 s of speech are far shorter.
MAX_TEXT_BYTES = 16 * 1024
# The audio, the other fields and the multipart framing around them.
MAX_BODY_BYTES = MAX_AUDIO_BYTES + 1024 * 1024
# A rejected body is read and dropped up to this much so the client gets its answer: closing with
# unread data makes the kernel reset the connection, which clients report instead of the 413.
MAX_DRAIN_BYTES = 64 * 1024 * 1024
# An urlencoded form holds no audio; percent-encoding at most triples an embedding's JSON.
MAX_URLENCODED_BYTES = 1024 * 1024
MAX_FIELDS = 16
MAX_EMBEDDING_DIM = 8192  # vllm-omni's bound on speaker_embedding
MIN_DURATION_S = 1.0  # shorter clips carry too little of a voice to clone
MAX_DURATION_S = 30.0  # cloning models condition on a few seconds; longer only costs memory
MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 192000
MAX_CHANNELS = 8
_PART_LIMITS = {"audio_sample": MAX_AUDIO_BYTES, "speaker_embedding": MAX_EMBEDDING_BYTES}
_MIME_TYPES = {"WAV": "audio/wav", "FLAC": "audio/flac", "OGG": "audio/ogg", "MP3": "audio/mpeg"}


class Rejected(Exception):
    """A client error, answered with ``api_error``."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param


class Catalog(Protocol):
    """What the voice list needs to know about the engines (``request.state.catalog``)."""

    async def builtin_voices(self) -> list[Voice]: ...

    def cloning_engines(self) -> list[str]: ...


@dataclass
class Part:
    """One form field as received: its bytes and, for files, the name and type the client gave."""

    data: bytearray = field(default_factory=bytearray)
    filename: str | None = None
    content_type: str | None = None


class _MultipartForm:
    """Feeds python-multipart's streaming parser and keeps every part within its limit."""

    def __init__(self, boundary: bytes) -> None:
        self.parts: dict[str, Part] = {}
        self._headers: dict[bytes, bytes] = {}
        self._field = self._value = b""
        self._current: tuple[str, Part] | None = None
        self._done = False
        try:
            self._parser = MultipartParser(
                boundary,
                {
                    "on_header_field": self._on_header_field,
                    "on_header_value": self._on_header_value,
                    "on_header_end": self._on_header_end,
                    "on_headers_finished": self._on_headers_finished,
                    "on_part_data": self._on_part_data,
                    "on_end": self._on_end,
                },
            )
        except FormParserError as exc:
            raise Rejected(400, "invalid_multipart", f"bad multipart boundary: {exc}") from exc

    def feed(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except FormParserError as exc:
            raise Rejected(400, "invalid_multipart", f"malformed multipart body: {exc}") from exc

    def finish(self) -> dict[str, Part]:
        if not self._done:
            raise Rejected(400, "invalid_multipart", "multipart body ends before its closing boundary")
        return self.parts

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _on_header_end(self) -> None:
        self._headers[self._field.lower()] = self._value
        self._field = self._value = b""

    def _on_headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition"))
        content_type = self._headers.get(b"content-type")
        self._headers = {}
        if b"name" not in options:
            raise Rejected(400, "invalid_multipart", "a multipart part has no name in Content-Disposition")
        name = options[b"name"].decode("utf-8", "replace")
        filename = options[b"filename"].decode("utf-8", "replace") if b"filename" in options else None
        part = Part(filename=filename, content_type=content_type.decode("latin-1") if content_type else None)
        _add_part(self.parts, name, part)
        self._current = (name, part)

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        assert self._current is not None, "python-multipart sends data only after headers"
        name, part = self._current
        part.data += data[start:end]
        _check_size(name, part)

    def _on_end(self) -> None:
        self._done = True


class _UrlencodedForm:
    """An urlencoded body, small by nature: kept whole, then parsed."""

    def __init__(self) -> None:
        self._body = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._body += chunk
        if len(self._body) > MAX_URLENCODED_BYTES:
            message = f"an urlencoded form is at most {MAX_URLENCODED_BYTES} bytes; send audio as multipart"
            raise Rejected(413, "request_too_large", message)

    def finish(self) -> dict[str, Part]:
        parts: dict[str, Part] = {}
        try:
            pairs = parse_qsl(self._body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
        except (UnicodeDecodeError, ValueError) as exc:
            raise Rejected(400, "invalid_form", f"malformed urlencoded body: {exc}") from exc
        for name, value in pairs:
            part = Part(data=bytearray(value.encode()))
            _add_part(parts, name, part)
            _check_size(name, part)
        return parts


def _check_size(name: str, part: Part) -> None:
    limit = _PART_LIMITS.get(name, MAX_TEXT_BYTES)
    if len(part.data) > limit:
        code = "audio_too_large" if name == "audio_sample" else "field_too_large"
        raise Rejected(413, code, f"{name} is larger than {limit} bytes", name)


def _add_part(parts: dict[str, Part], name: str, part: Part) -> None:
    if name in parts:
        raise Rejected(400, "duplicate_field", f"{name} is given more than once", name)
    if len(parts) >= MAX_FIELDS:
        raise Rejected(400, "too_many_fields", f"a voice upload has at most {MAX_FIELDS} fields")
    parts[name] = part


async def read_form(content_type: str, chunks: AsyncIterator[bytes]) -> dict[str, Part]:
    """Parse a form body while it streams in, raising ``Rejected`` as soon as it breaks a limit."""
    mime, options = parse_options_header(content_type)
    form: _MultipartForm | _UrlencodedForm
    if mime == b"multipart/form-data":
        if not options.get(b"boundary"):
            raise Rejected(400, "invalid_multipart", "multipart Content-Type without a boundary")
        form = _MultipartForm(options[b"boundary"])
    elif mime == b"application/x-www-form-urlencoded":
        form = _UrlencodedForm()
    else:
        raise Rejected(415, "unsupported_content_type", "send the voice as multipart/form-data")
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > MAX_BODY_BYTES:
            raise Rejected(413, "request_too_large", f"a voice upload is at most {MAX_BODY_BYTES} bytes")
        form.feed(chunk)
    return form.finish()


def _text(parts: dict[str, Part], name: str) -> str | None:
    part = parts.get(name)
    if part is None:
        return None
    try:
        return part.data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejected(400, "invalid_field", f"{name} is not UTF-8 text", name) from exc


def parse_embedding(text: str) -> npt.NDArray[np.float32]:
    """A speaker embedding from its JSON text: a non-empty list of at most 8192 finite numbers."""
    param = "speaker_embedding"
    try:
        values = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise Rejected(400, "invalid_embedding", "speaker_embedding is not valid JSON", param) from exc
    if not isinstance(values, list) or any(
        isinstance(v, bool) or not isinstance(v, int | float) for v in values
    ):
        raise Rejected(400, "invalid_embedding", "speaker_embedding must be a JSON list of numbers", param)
    if not values:
        raise Rejected(400, "empty_embedding", "speaker_embedding is empty", param)
    if len(values) > MAX_EMBEDDING_DIM:
        raise Rejected(
            400, "embedding_too_long", f"speaker_embedding has over {MAX_EMBEDDING_DIM} values", param
        )
    try:
        with np.errstate(over="ignore"):
            embedding = np.asarray(values, dtype=np.float64).astype(np.float32)
    except OverflowError:  # an integer beyond float64
        embedding = np.array([np.inf], dtype=np.float32)
    if not np.isfinite(embedding).all():
        raise Rejected(400, "embedding_not_finite", "speaker_embedding has NaN or infinite values", param)
    return embedding


def decode_audio(
    data: bytes | bytearray, param: str = "audio_sample"
) -> tuple[npt.NDArray[np.float32], int, str]:
    """Mono float32 samples, sample rate and MIME type of a wav, flac, ogg/opus or mp3 clip."""
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as f:
            rate, channels, fmt = f.samplerate, f.channels, f.format
            if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE or not 1 <= channels <= MAX_CHANNELS:
                raise Rejected(
                    400, "invalid_audio", f"unsupported audio: {rate} Hz, {channels} channels", param
                )
            # Reading one frame past the limit bounds the memory a long (or lying) file can take.
            frames = f.read(frames=int(MAX_DURATION_S * rate) + 1, dtype="float32", always_2d=True)
    except (soundfile.SoundFileError, ValueError, EOFError) as exc:
        message = f"{param} could not be decoded as wav, flac, ogg/opus or mp3"
        raise Rejected(415, "unsupported_audio", message, param) from exc
    samples = frames.mean(axis=1, dtype=np.float32) if frames.shape[1] > 1 else frames[:, 0].copy()
    duration_s = len(samples) / rate
    if not MIN_DURATION_S <= duration_s <= MAX_DURATION_S:
        message = f"{param} must be {MIN_DURATION_S:g} to {MAX_DURATION_S:g} s long"
        raise Rejected(400, "invalid_duration", message, param)
    if not np.isfinite(samples).all():
        raise Rejected(400, "invalid_audio", f"{param} has NaN or infinite samples", param)
    return samples, rate, _MIME_TYPES.get(fmt, f"audio/x-{fmt.lower()}")


def inline_reference(ref_audio: str, ref_text: str | None) -> VoiceReference:
    """A one-request voice from ``ref_audio`` (a ``data:`` URL or bare base64 of a clip) and its transcript.

    The gateway never fetches URLs (it may have no network, and fetching on a client's behalf is an
    SSRF risk): upload the clip as a voice, or send it inline.

    Raises:
        Rejected: the value is not base64 of a decodable clip of 1 to 30 s.
    """
    header, _, payload = ref_audio.partition(",") if ref_audio.startswith("data:") else ("", "", ref_audio)
    if header and not header.endswith(";base64"):
        raise Rejected(400, "invalid_ref_audio", "a ref_audio data URL must be base64 encoded", "ref_audio")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        message = (
            "ref_audio must be a data: URL or base64 of a wav, flac, ogg or mp3 clip (URLs are not fetched)"
        )
        raise Rejected(400, "invalid_ref_audio", message, "ref_audio") from None
    if len(data) > MAX_AUDIO_BYTES:
        raise Rejected(413, "audio_too_large", f"ref_audio is over {MAX_AUDIO_BYTES} bytes", "ref_audio")
    audio, rate, _ = decode_audio(data, "ref_audio")
    return VoiceReference(name="ref_audio", audio=audio, sample_rate=rate, ref_text=ref_text)


class _Upload(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    consent: str
    audio: bytearray | None
    embedding: npt.NDArray[np.float32] | None
    ref_text: str | None
    speaker_description: str | None


def _check_form(parts: dict[str, Part]) -> _Upload:
    """The checks that need no decoding, in the order a client would fix them."""
    name = _text(parts, "name")
    if name is None:
        raise Rejected(400, "missing_name", "name is required", "name")
    try:
        name = check_name(name)  # NFKC, refused characters (gateway.names)
    except InvalidVoiceName as exc:
        raise Rejected(400, "invalid_name", str(exc), "name") from exc
    consent = _text(parts, "consent")
    if not consent or not consent.strip():
        raise Rejected(400, "missing_consent", "consent is required: record the speaker's consent", "consent")
    # A browser form sends an empty file part when no file was chosen.
    audio = parts.get("audio_sample")
    embedding_text = _text(parts, "speaker_embedding")
    has_audio, has_embedding = bool(audio and audio.data), bool(embedding_text)
    if has_audio and has_embedding:
        message = "give either audio_sample or speaker_embedding, not both"
        raise Rejected(400, "ambiguous_voice_source", message, "speaker_embedding")
    if not has_audio and not has_embedding:
        raise Rejected(400, "missing_voice_source", "give audio_sample or speaker_embedding", "audio_sample")
    return _Upload(
        name=name,
        consent=consent,
        audio=audio.data if audio and has_audio else None,
        embedding=parse_embedding(embedding_text) if embedding_text else None,
        ref_text=_text(parts, "ref_text") or None,
        speaker_description=_text(parts, "speaker_description") or None,
    )


def _voice_json(info: VoiceInfo, engines: list[str]) -> dict[str, object]:
    return {**msgspec.to_builtins(info), "engines": engines, "requires": "cloning"}


def _builtin_json(voices: list[Voice]) -> list[dict[str, object]]:
    """Built-in voices merged by name, each with the engines that speak it; they need nothing more."""
    merged: dict[str, dict[str, object]] = {}
    for v in voices:
        entry = merged.setdefault(
            v.name,
            {
                "name": v.name,
                "kind": "builtin",
                "engines": [],
                "language": v.language,
                "description": v.description,
                "sample_rate": v.sample_rate,
                "requires": None,
            },
        )
        engines = entry["engines"]
        assert isinstance(engines, list)
        engines.append(v.engine)
    return list(merged.values())


def _catalog(request: Request) -> Catalog | None:
    catalog: Catalog | None = getattr(request.state, "catalog", None)
    return catalog


def _owner(request: Request) -> str:
    owner: str = getattr(request.state, "owner", "")
    return owner


def _check_length(headers: Headers) -> None:
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise Rejected(413, "request_too_large", f"a voice upload is at most {MAX_BODY_BYTES} bytes")


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    drained = 0
    try:
        async for chunk in chunks:
            drained += len(chunk)
            if drained > MAX_DRAIN_BYTES:
                return
    except ClientDisconnect:
        return


async def upload_voice(request: Request) -> JSONResponse:
    """Store (or replace) one of the caller's voices from a reference clip or a speaker embedding."""
    store: VoiceStore = request.state.voices
    chunks = request.stream()
    try:
        _check_length(request.headers)
        upload = _check_form(await read_form(request.headers.get("content-type", ""), chunks))
        catalog = _catalog(request)
        builtin = await catalog.builtin_voices() if catalog else []
        if any(v.name.casefold() == upload.name.casefold() for v in builtin):
            # Sessions would speak the built-in voice, so an upload under its name could never be used.
            raise Rejected(
                409, "name_taken", f"{upload.name!r} is a built-in voice; choose another name", "name"
            )
        audio, rate, mime = None, 0, None
        if upload.audio is not None:
            audio, rate, mime = await run_in_threadpool(decode_audio, upload.audio)
        info = await run_in_threadpool(
            store.save,
            _owner(request),
            upload.name,
            audio=audio,
            sample_rate=rate,
            embedding=upload.embedding,
            consent=upload.consent,
            ref_text=upload.ref_text,
            speaker_description=upload.speaker_description,
            mime_type=mime,
        )
    except Rejected as exc:
        await _drain(chunks)
        return api_error(exc.status, exc.message, code=exc.code, param=exc.param)
    except VoiceLimitReached as exc:
        return api_error(409, str(exc), code="voice_limit_reached", param="name")
    except ClientDisconnect:
        logger.debug("client left during a voice upload")
        return api_error(400, "the request body was cut short", code="client_disconnected")
    finally:
        await chunks.aclose()
    return JSONResponse(
        {"success": True, "voice": _voice_json(info, catalog.cloning_engines() if catalog else [])}
    )


async def list_voices(request: Request) -> JSONResponse:
    """The built-in voices' names and the caller's uploaded voices."""
    store: VoiceStore = request.state.voices
    catalog = _catalog(request)
    builtin = await catalog.builtin_voices() if catalog else []
    engines = catalog.cloning_engines() if catalog else []
    uploaded = await run_in_threadpool(store.list, _owner(request))
    # ``voices`` stays a list of names, as vllm-omni's clients expect; the details sit beside it.
    return JSONResponse(
        {
            "voices": list(dict.fromkeys(v.name for v in builtin)),
            "voice_details": _builtin_json(builtin),
            "uploaded_voices": [_voice_json(info, engines) for info in uploaded],
        }
    )


async def voice_details(request: Request) -> JSONResponse:
    """One of the caller's uploaded voices."""
    store: VoiceStore = request.state.voices
    name: str = request.path_params["name"]
    info = await run_in_threadpool(store.info, _owner(request), name)
    catalog = _catalog(request)
    if info is None:
        builtin = [
            d for d in _builtin_json(await catalog.builtin_voices() if catalog else []) if d["name"] == name
        ]
        if builtin:
            return JSONResponse(builtin[0])
        return api_error(404, f"voice {name!r} not found", code="voice_not_found", param="name")
    return JSONResponse(_voice_json(info, catalog.cloning_engines() if catalog else []))


async def delete_voice(request: Request) -> JSONResponse:
    """Delete one of the caller's uploaded voices."""
    store: VoiceStore = request.state.voices
    name: str = request.path_params["name"]
    if not await run_in_threadpool(store.delete, _owner(request), name):
        return api_error(404, f"voice {name!r} not found", code="voice_not_found", param="name")
    return JSONResponse({"success": True, "message": f"Voice '{name}' deleted successfully"})


routes = [
    Route("/v1/audio/voices", list_voices, methods=["GET"]),
    Route("/v1/audio/voices", upload_voice, methods=["POST"]),
    Route("/v1/audio/voices/{name}", voice_details, methods=["GET"]),
    Route("/v1/audio/voices/{name}", delete_voice, methods=["DELETE"]),
]
