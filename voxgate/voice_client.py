"""``voxgate voices``: the REST voice routes of a running gateway (list, upload, delete), as a client.

Settings, URLs and errors are ``voxgate.client``'s; every failure is a ``ClientError`` whose message is
meant for a person.
"""

from __future__ import annotations

import json
import mimetypes
from pathlib import Path
from typing import BinaryIO, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from .client import (
    HTTP_TIMEOUT_S,
    VOICES_PATH,
    ClientError,
    ClientSettings,
    _auth_headers,
    _refused,
    http_url,
)

_T = TypeVar("_T")


class _ErrorDetail(msgspec.Struct):
    message: str = ""


class _ErrorBody(msgspec.Struct):
    error: _ErrorDetail


class _NamedVoice(msgspec.Struct):
    name: str


class UploadedVoice(msgspec.Struct, kw_only=True):
    """The fields of an uploaded voice that ``voices list`` shows (others are ignored)."""

    name: str
    kind: str = ""
    sample_rate: int = 0
    duration_s: float = 0.0
    embedding_dim: int = 0
    ref_text: str | None = None
    speaker_description: str | None = None

    def details(self) -> str:
        if self.kind == "embedding":
            what = f"embedding of {self.embedding_dim} values"
        else:
            what = f"{self.kind or 'audio'}, {self.duration_s:.1f} s at {self.sample_rate} Hz"
        extra = [
            f"{label}: {text!r}"
            for label, text in (("description", self.speaker_description), ("ref_text", self.ref_text))
            if text
        ]
        return "; ".join([what, *extra])


class VoiceList(msgspec.Struct):
    """``GET /v1/audio/voices``: ``voices`` names every voice a request may use, uploaded ones too (as
    vllm-omni lists them); ``voice_details`` holds the built-in ones (older gateways lack it)."""

    voices: list[str | _NamedVoice] = msgspec.field(default_factory=list)
    voice_details: list[_NamedVoice] | None = None
    uploaded_voices: list[UploadedVoice] = msgspec.field(default_factory=list)

    def builtin(self) -> list[str]:
        """The built-in voices' names: ``voice_details``, else ``voices`` less the uploaded names."""
        if self.voice_details is not None:
            return [v.name for v in self.voice_details]
        uploaded = {v.name.casefold() for v in self.uploaded_voices}
        names = (v if isinstance(v, str) else v.name for v in self.voices)
        return [n for n in names if n.casefold() not in uploaded]


class UploadWarning(msgspec.Struct):
    """The upload answer's ``warning``: the voice is stored, but something about it needs the user."""

    code: str = ""
    message: str = ""


class _Uploaded(msgspec.Struct):
    voice: UploadedVoice
    warning: UploadWarning | None = None


class _Deleted(msgspec.Struct):
    message: str = ""


def _request(settings: ClientSettings, method: str, path: str, **kwargs: object) -> httpx.Response:
    """Send one request; an error status becomes a ``ClientError`` carrying the gateway's message."""
    url = http_url(settings.url, path)
    try:
        with httpx.Client(headers=_auth_headers(settings), timeout=HTTP_TIMEOUT_S) as http:
            response = http.request(method, url, **kwargs)  # type: ignore[arg-type]
    except httpx.TransportError as exc:
        raise ClientError(f"cannot reach {url}: {exc}") from exc
    if response.is_error:
        try:
            detail = msgspec.json.decode(response.content, type=_ErrorBody).error.message
        except msgspec.MsgspecError:
            detail = f"{method} {url} failed: {response.reason_phrase}"
        raise ClientError(
            _refused(response.status_code, detail) if response.status_code in (401, 403) else detail
        )
    return response


def _decode(response: httpx.Response, kind: type[_T]) -> _T:
    try:
        return msgspec.json.decode(response.content, type=kind)
    except msgspec.MsgspecError as exc:
        raise ClientError(f"unexpected answer from {response.request.url}: {exc}") from exc


def list_voices(settings: ClientSettings) -> tuple[VoiceList, bytes]:
    """The built-in and uploaded voices, decoded and as the raw JSON body."""
    response = _request(settings, "GET", VOICES_PATH)
    return _decode(response, VoiceList), response.content


def voice_table(voices: VoiceList) -> str:
    """``voices list`` as an aligned table: name, type, details."""
    rows = [("NAME", "TYPE", "DETAILS")]
    rows += [(name, "built-in", "") for name in voices.builtin()]
    rows += [(v.name, "uploaded", v.details()) for v in voices.uploaded_voices]
    width = [max(len(row[i]) for row in rows) for i in range(2)]
    return "\n".join(f"{n:<{width[0]}}  {t:<{width[1]}}  {d}".rstrip() for n, t, d in rows)


def upload_voice(
    settings: ClientSettings,
    name: str,
    *,
    consent: str,
    audio: str | None = None,
    embedding: str | None = None,
    ref_text: str | None = None,
    description: str | None = None,
) -> tuple[UploadedVoice, UploadWarning | None]:
    """Upload a voice from an audio file or a JSON embedding file (exactly one of them); returns the voice
    and the gateway's warning about it, if any (no engine there can speak it: ``voice_requires_cloning``)."""
    if (audio is None) == (embedding is None):
        raise ClientError("give an audio file or --embedding FILE.json, not both")
    form = {"name": name, "consent": consent}
    form |= {k: v for k, v in (("ref_text", ref_text), ("speaker_description", description)) if v}
    try:
        if embedding is not None:
            text = Path(embedding).read_text(encoding="utf-8")
            _check_json(embedding, text)
            parts: dict[str, tuple[str | None, str | BinaryIO, str]] = {
                "speaker_embedding": (None, text, "application/json")
            }
            response = _request(settings, "POST", VOICES_PATH, data=form, files=parts)
        else:
            assert audio is not None
            mime = mimetypes.guess_type(audio)[0] or "application/octet-stream"
            with open(audio, "rb") as f:
                parts = {"audio_sample": (Path(audio).name, f, mime)}
                response = _request(settings, "POST", VOICES_PATH, data=form, files=parts)
    except (OSError, UnicodeDecodeError) as exc:
        raise ClientError(f"cannot read {embedding if audio is None else audio}: {exc}") from exc
    uploaded = _decode(response, _Uploaded)
    return uploaded.voice, uploaded.warning


def _check_json(path: str, text: str) -> None:
    """Report a broken embedding file here, before anything is sent."""
    try:
        json.loads(text)
    except ValueError as exc:
        raise ClientError(f"{path} is not valid JSON: {exc}") from exc


def delete_voice(settings: ClientSettings, name: str) -> str:
    """Delete one of the caller's uploaded voices; returns the gateway's confirmation."""
    response = _request(settings, "DELETE", f"{VOICES_PATH}/{quote(name, safe='')}")
    return _decode(response, _Deleted).message or f"voice {name!r} deleted"
