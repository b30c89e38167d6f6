"""REST voice routes: upload, list, inspect and delete the caller's cloned voices (vllm-omni's fields).

``POST /v1/audio/voices`` takes ``multipart/form-data`` (or, for embeddings, urlencoded) with
``name`` and ``consent``, then ``audio_sample`` (a wav, flac, ogg/opus or mp3 file of 1 to 30 s) or
``speaker_embedding`` (a JSON list of at most 4096 numbers, vllm-omni's bound), with optional ``ref_text``
and ``speaker_description``.
The body is parsed while it streams in, and reading stops at the first part over its limit. The clip's
rate, channels and length are checked from its header before it is decoded; it is then decoded block by
block and stored in its canonical form: mono, at most 24 kHz (``max_clip_rate_hz``), 16-bit PCM
(``gateway.voices.clips``, ``gateway.voices.local``).

An upload that no engine here can speak is stored all the same, and its answer carries a ``warning``
(``voice_requires_cloning``) that says so and how to serve it.

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
      voice_quota_exceeded (the key's voice files and this one would pass ``max_voice_bytes``:
      the same kind of conflict, which the caller resolves by deleting voices; 507 would blame
      the server, and 413 is about the size of this request, which was within its limits);
      name_taken (a built-in voice has that name, and sessions would speak it instead)
413   request_too_large, audio_too_large, field_too_large
415   unsupported_content_type, unsupported_audio (soundfile cannot decode the sample)
503   voice_store_unavailable (``voice_store`` is S3 and it did not answer; ``Retry-After: 5``)
====  ==================================================================================
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Protocol

import msgspec
import numpy as np
import numpy.typing as npt
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ...engine.base import Voice
from ...protocol.errors import ErrorCode
from ..middleware.http import Rejected, api_error
from ..voices.backend import VoiceBackend
from ..voices.clips import (
    MAX_AUDIO_BYTES,
    MAX_STORED_RATE,
    check_embedding,
    decode_audio,
    decoding,
    parse_embedding,
)
from ..voices.clips import MAX_TEXT_BYTES as MAX_TEXT_BYTES
from ..voices.clips import MAX_UPLOAD_EMBEDDING_DIM as MAX_UPLOAD_EMBEDDING_DIM
from ..voices.local import (
    InvalidVoiceName,
    VoiceInfo,
    VoiceLimitReached,
    VoiceQuotaExceeded,
    VoiceStoreUnavailable,
    check_name,
)
from .multipart import FormLimits, Part, read_form, text_field

logger = logging.getLogger(__name__)

# The shared store (S3) usually comes back within seconds, and a client that retries sooner only adds load.
STORE_RETRY_AFTER_S = 5
# 8192 numbers written out in full by json.dumps take about 200 KiB.
MAX_EMBEDDING_BYTES = 256 * 1024
# The audio, the other fields and the multipart framing around them.
MAX_BODY_BYTES = MAX_AUDIO_BYTES + 1024 * 1024
# A rejected body is read and dropped up to this much so the client gets its answer: closing with
# unread data makes the kernel reset the connection, which clients report instead of the 413.
MAX_DRAIN_BYTES = 64 * 1024 * 1024
# An urlencoded form holds no audio; percent-encoding at most triples an embedding's JSON.
MAX_URLENCODED_BYTES = 1024 * 1024
LIMITS = FormLimits(
    what="voice upload",
    body_bytes=MAX_BODY_BYTES,
    parts={"audio_sample": MAX_AUDIO_BYTES, "speaker_embedding": MAX_EMBEDDING_BYTES},
    text_bytes=MAX_TEXT_BYTES,
    urlencoded_bytes=MAX_URLENCODED_BYTES,
    fields=16,
    too_large_codes={"audio_sample": ErrorCode.AUDIO_TOO_LARGE},
)


#: The upload answer's ``warning`` when no engine here clones: the voice is stored (another gateway on the
#: same store may speak it), but every use on this one is refused with ``voice_requires_cloning``.
NO_CLONING_WARNING = (
    "stored, but no engine of this gateway can clone voices, so using it here is refused "
    "(voice_requires_cloning): serve it with a cloning engine, e.g. --engine remote in front of a vllm-omni "
    'server with a Qwen3-TTS Base model (docs/deploy.md, "Cloning voices")'
)


class Catalog(Protocol):
    """What the voice list needs to know about the engines (``request.state.catalog``)."""

    #: The highest rate a clip is kept at (``max_clip_rate_hz``), for uploads as for inline clips.
    clip_rate_hz: int

    async def builtin_voices(self) -> list[Voice]: ...

    def cloning_engines(self) -> list[str]: ...


class _Upload(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    consent: str
    audio: bytearray | None
    embedding: npt.NDArray[np.float32] | None
    ref_text: str | None
    speaker_description: str | None


def _check_form(parts: dict[str, Part]) -> _Upload:
    """The checks that need no decoding, in the order a client would fix them."""
    name = text_field(parts, "name")
    if name is None:
        raise Rejected(ErrorCode.MISSING_NAME, "name is required", "name")
    try:
        name = check_name(name)  # NFKC, refused characters (gateway.voices.names)
    except InvalidVoiceName as exc:
        raise Rejected(ErrorCode.INVALID_NAME, str(exc), "name") from exc
    consent = text_field(parts, "consent")
    if not consent or not consent.strip():
        raise Rejected(
            ErrorCode.MISSING_CONSENT, "consent is required: record the speaker's consent", "consent"
        )
    # A browser form sends an empty file part when no file was chosen.
    audio = parts.get("audio_sample")
    embedding_text = text_field(parts, "speaker_embedding")
    has_audio, has_embedding = bool(audio and audio.data), bool(embedding_text)
    if has_audio and has_embedding:
        message = "give either audio_sample or speaker_embedding, not both"
        raise Rejected(ErrorCode.AMBIGUOUS_VOICE_SOURCE, message, "speaker_embedding")
    if not has_audio and not has_embedding:
        raise Rejected(
            ErrorCode.MISSING_VOICE_SOURCE, "give audio_sample or speaker_embedding", "audio_sample"
        )
    embedding = parse_embedding(embedding_text) if embedding_text else None
    if embedding is not None:
        check_embedding(embedding, max_dim=MAX_UPLOAD_EMBEDDING_DIM)
    return _Upload(
        name=name,
        consent=consent,
        audio=audio.data if audio and has_audio else None,
        embedding=embedding,
        ref_text=text_field(parts, "ref_text") or None,
        speaker_description=text_field(parts, "speaker_description") or None,
    )


def _save(store: VoiceBackend, owner: str, upload: _Upload, max_rate: int) -> VoiceInfo:
    """Decode the clip (if any) at most at ``max_rate`` and store the voice; run on a decode thread
    (``clips.decoding``), so a clip's decoded samples and its voice file are made and dropped there, and
    uploads wait their turn."""
    clip = upload.audio
    audio, rate, mime = decode_audio(clip, max_rate=max_rate) if clip is not None else (None, 0, None)
    return store.save(
        owner,
        upload.name,
        audio=audio,
        sample_rate=rate,
        embedding=upload.embedding,
        consent=upload.consent,
        ref_text=upload.ref_text,
        speaker_description=upload.speaker_description,
        mime_type=mime,
    )


def _voice_json(info: VoiceInfo, engines: list[str]) -> dict[str, object]:
    # vllm-omni's ``embedding_source``: "audio" for a reference clip, "direct" for an uploaded embedding.
    source = "audio" if info.kind == "audio" else "direct"
    return {
        **msgspec.to_builtins(info),
        "embedding_source": source,
        "engines": engines,
        "requires": "cloning",
    }


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
        raise Rejected(ErrorCode.REQUEST_TOO_LARGE, f"a voice upload is at most {MAX_BODY_BYTES} bytes")


def _unavailable(exc: VoiceStoreUnavailable) -> JSONResponse:
    """503 for a shared store that did not answer; the details (its address) go to the log, not the client."""
    logger.error("%s", exc)
    response = api_error(
        503,
        "the voice store is unavailable; try again shortly",
        code=ErrorCode.VOICE_STORE_UNAVAILABLE,
        kind="server_error",
    )
    response.headers["Retry-After"] = str(STORE_RETRY_AFTER_S)
    return response


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
    store: VoiceBackend = request.state.voices
    chunks = request.stream()
    try:
        _check_length(request.headers)
        upload = _check_form(await read_form(request.headers.get("content-type", ""), chunks, LIMITS))
        catalog = _catalog(request)
        builtin = await catalog.builtin_voices() if catalog else []
        if any(v.name.casefold() == upload.name.casefold() for v in builtin):
            # Sessions would speak the built-in voice, so an upload under its name could never be used.
            raise Rejected(
                ErrorCode.NAME_TAKEN, f"{upload.name!r} is a built-in voice; choose another name", "name"
            )
        max_rate = catalog.clip_rate_hz if catalog else MAX_STORED_RATE
        info = await decoding(_save, store, _owner(request), upload, max_rate)
    except Rejected as exc:
        await _drain(chunks)
        return api_error(exc.status, exc.message, code=exc.code, param=exc.param)
    except VoiceLimitReached as exc:
        return api_error(409, str(exc), code=ErrorCode.VOICE_LIMIT_REACHED, param="name")
    except VoiceQuotaExceeded as exc:
        return api_error(409, str(exc), code=ErrorCode.VOICE_QUOTA_EXCEEDED, param="audio_sample")
    except VoiceStoreUnavailable as exc:
        return _unavailable(exc)
    except ClientDisconnect:
        logger.debug("client left during a voice upload")
        return api_error(400, "the request body was cut short", code=ErrorCode.CLIENT_DISCONNECTED)
    finally:
        await chunks.aclose()
    engines = catalog.cloning_engines() if catalog else []
    answer: dict[str, object] = {"success": True, "voice": _voice_json(info, engines)}
    if not engines:
        answer["warning"] = {"code": ErrorCode.VOICE_REQUIRES_CLONING, "message": NO_CLONING_WARNING}
    return JSONResponse(answer)


async def list_voices(request: Request) -> JSONResponse:
    """The built-in voices' names and the caller's uploaded voices, and the engines that can clone."""
    store: VoiceBackend = request.state.voices
    catalog = _catalog(request)
    builtin = await catalog.builtin_voices() if catalog else []
    engines = catalog.cloning_engines() if catalog else []
    try:
        uploaded = await run_in_threadpool(store.list, _owner(request))
    except VoiceStoreUnavailable as exc:
        return _unavailable(exc)
    # ``voices`` stays a list of names, as vllm-omni's clients expect, uploaded ones too (vllm-omni lists
    # every name a request may use there); the details sit beside it.
    # ``cloning_engines`` (empty: no engine here can speak an uploaded voice) lets a page say so up front.
    return JSONResponse(
        {
            "voices": list(dict.fromkeys([*(v.name for v in builtin), *(info.name for info in uploaded)])),
            "voice_details": _builtin_json(builtin),
            "uploaded_voices": [_voice_json(info, engines) for info in uploaded],
            "cloning_engines": engines,
        }
    )


async def voice_details(request: Request) -> JSONResponse:
    """One of the caller's uploaded voices."""
    store: VoiceBackend = request.state.voices
    name: str = request.path_params["name"]
    try:
        info = await run_in_threadpool(store.info, _owner(request), name)
    except VoiceStoreUnavailable as exc:
        return _unavailable(exc)
    catalog = _catalog(request)
    if info is None:
        builtin = [
            d for d in _builtin_json(await catalog.builtin_voices() if catalog else []) if d["name"] == name
        ]
        if builtin:
            return JSONResponse(builtin[0])
        return api_error(404, f"voice {name!r} not found", code=ErrorCode.VOICE_NOT_FOUND, param="name")
    return JSONResponse(_voice_json(info, catalog.cloning_engines() if catalog else []))


async def delete_voice(request: Request) -> JSONResponse:
    """Delete one of the caller's uploaded voices."""
    store: VoiceBackend = request.state.voices
    name: str = request.path_params["name"]
    try:
        deleted = await run_in_threadpool(store.delete, _owner(request), name)
    except VoiceStoreUnavailable as exc:
        return _unavailable(exc)
    if not deleted:
        return api_error(404, f"voice {name!r} not found", code=ErrorCode.VOICE_NOT_FOUND, param="name")
    return JSONResponse({"success": True, "message": f"Voice '{name}' deleted successfully"})


routes = [
    Route("/v1/audio/voices", list_voices, methods=["GET"]),
    Route("/v1/audio/voices", upload_voice, methods=["POST"]),
    Route("/v1/audio/voices/{name}", voice_details, methods=["GET"]),
    Route("/v1/audio/voices/{name}", delete_voice, methods=["DELETE"]),
]
