"""vllm-omni's speaker folder, read into voxgate's voice store and written from it (``voxgate voices
import|export``).

vllm-omni 0.30 keeps each voice uploaded through its ``POST /v1/audio/voices`` as one safetensors file in a
flat folder, ``$SPEAKER_SAMPLES_DIR`` (default ``~/.cache/vllm-omni/speakers``), and rebuilds its voice list
from that folder's ``*.safetensors`` when it starts (serving_speech.py ``_restore_uploaded_speakers``; a
running server does not rescan it). A file holds one float32 tensor, ``audio`` (the clip as libsndfile
decoded it: at its own rate, one column per channel) or ``speaker_embedding`` (a vector), and the voice's
metadata as the header's strings: ``name``, ``voice_name_lower`` (the key it is found by),
``consent``, ``created_at`` (integer seconds: with the name, the key of its speaker cache),
``embedding_source`` (``audio`` or ``direct``), ``sample_rate``, ``ref_text``, ``speaker_description``,
``mime_type``, ``original_filename``, ``file_size``, ``embedding_dim``. The file's name,
``{name}_{consent}_{created_at}.safetensors`` with other characters than ``[A-Za-z0-9_.-]`` made ``_``,
is never read back: the header says whose voice it is.

Import takes each readable file through the checks of an upload (``gateway.voices.clips``: text fields of at
most
``MAX_TEXT_BYTES``, an embedding of at most ``MAX_UPLOAD_EMBEDDING_DIM`` finite values, a clip's rate,
channels and length before it is decoded, then ``decode_audio``: mono, 1 to 30 s, at most
``max_clip_rate_hz``) into ``VoiceBackend.save`` (the store's own format, local or S3); a file that fails
one is reported by its file name with the reason, and the import goes on with the next. Export
writes each stored voice as vllm-omni's upload would, atomically (a hidden temp file renamed), with
``created_at`` strictly increasing so no two exported voices share a cache key. A voice whose name is
already in the destination is skipped unless ``replace`` is given; a file that is not a voice is skipped
with the reason, never fatal.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt
import safetensors.numpy
import soundfile
from safetensors import SafetensorError, safe_open

from ..middleware.http import Rejected
from .backend import VoiceBackend
from .clips import (
    MAX_STORED_RATE,
    MAX_UPLOAD_EMBEDDING_DIM,
    check_clip,
    check_embedding,
    check_finite,
    check_text,
    decode_audio,
)
from .local import MAX_FILE_BYTES, VoiceData, write_atomic

SUFFIX = ".safetensors"
AUDIO_TENSOR = "audio"
EMBEDDING_TENSOR = "speaker_embedding"
# vllm-omni's ``_sanitize_filename``: what a file name piece keeps; each piece is cut short here so that
# name, consent and time stay under the 255 bytes a file name may have.
_UNSAFE = re.compile(r"[^a-zA-Z0-9_.\-]")
_PIECE_CHARS = 64
# vllm-omni writes float32; the other float widths numpy reads are taken too (bfloat16 and float8 it has not).
_DTYPES = ("F16", "F32", "F64")


class Moved(msgspec.Struct, frozen=True):
    """A voice imported or exported: its name and the file it came from or went to."""

    name: str
    file: str


class Skipped(msgspec.Struct, frozen=True):
    """A file or voice left out, and why."""

    what: str
    reason: str


class Report(msgspec.Struct, frozen=True):
    """What an import or export did."""

    moved: list[Moved]
    skipped: list[Skipped]


class FolderVoice(msgspec.Struct, frozen=True, kw_only=True):
    """One voice of a vllm-omni speaker folder, as its file holds it."""

    name: str
    consent: str
    audio: npt.NDArray[np.float32] | None = None
    sample_rate: int = 0
    embedding: npt.NDArray[np.float32] | None = None
    ref_text: str | None = None
    speaker_description: str | None = None


class _NotAVoice(Exception):
    """A file of the folder that vllm-omni would not restore as a voice, or voxgate cannot take."""


def _text(meta: dict[str, str], key: str) -> str | None:
    value = (meta.get(key) or "").strip()
    return value or None


def read_voice(path: Path) -> FolderVoice:
    """The voice in one file of a vllm-omni speaker folder, checked as an upload of it would be (the
    functions of ``gateway.voices.clips``: text fields, embedding, the clip's rate, channels, length and
    samples).

    Raises:
        _NotAVoice: unreadable, too large, no name, or neither an ``audio`` nor a ``speaker_embedding``,
            or a tensor of a type other than float.
        Rejected: what an upload of the voice would be refused for.
    """
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise _NotAVoice(f"larger than {MAX_FILE_BYTES} bytes")
        with safe_open(str(path), framework="numpy") as f:
            meta: dict[str, str] = dict(f.metadata() or {})
            keys = set(f.keys())
            tensor = AUDIO_TENSOR if AUDIO_TENSOR in keys else EMBEDDING_TENSOR
            if tensor not in keys:
                raise _NotAVoice(f"holds neither {AUDIO_TENSOR!r} nor {EMBEDDING_TENSOR!r}")
            dtype = f.get_slice(tensor).get_dtype()
            if dtype not in _DTYPES:
                raise _NotAVoice(f"its {tensor!r} is {dtype}, not a float tensor ({', '.join(_DTYPES)})")
            values = np.asarray(f.get_tensor(tensor), dtype=np.float32)
    except (SafetensorError, OSError) as exc:
        raise _NotAVoice(f"not a safetensors file: {exc}") from exc
    for key in ("name", "voice_name_lower", "consent", "ref_text", "speaker_description"):
        check_text(meta.get(key), key)
    # vllm-omni restores a file by ``voice_name_lower`` or ``name``; its original case is ``name``.
    name = _text(meta, "name") or _text(meta, "voice_name_lower")
    if name is None:
        raise _NotAVoice("no voice name in its metadata")
    consent = _text(meta, "consent")
    if consent is None:
        raise _NotAVoice("no consent recorded in its metadata")
    voice = FolderVoice(
        name=name,
        consent=consent,
        ref_text=_text(meta, "ref_text"),
        speaker_description=_text(meta, "speaker_description"),
    )
    if tensor == EMBEDDING_TENSOR:
        embedding = check_embedding(values.reshape(-1), EMBEDDING_TENSOR, MAX_UPLOAD_EMBEDDING_DIM)
        return msgspec.structs.replace(voice, embedding=embedding)
    try:
        rate = int(meta.get("sample_rate", "0"))
    except ValueError:
        rate = 0
    if rate <= 0:
        raise _NotAVoice("audio without a sample rate")
    if values.ndim not in (1, 2):
        raise _NotAVoice(f"audio of shape {values.shape}: one column per channel expected")
    check_clip(rate, 1 if values.ndim == 1 else values.shape[1], len(values), AUDIO_TENSOR)
    check_finite(values, AUDIO_TENSOR)
    return msgspec.structs.replace(voice, audio=values, sample_rate=rate)


def _canonical_audio(voice: FolderVoice, max_rate: int) -> tuple[npt.NDArray[np.float32], int]:
    """The clip as an upload of it would be stored (``clips.decode_audio``: mono, 1-30 s, rate capped)."""
    assert voice.audio is not None
    wav = io.BytesIO()
    # float32 WAV keeps the samples exactly; one column per channel, as vllm-omni stored them.
    soundfile.write(wav, voice.audio, voice.sample_rate, format="WAV", subtype="FLOAT")
    audio, rate, _ = decode_audio(wav.getbuffer(), "audio", max_rate)
    return audio, rate


def import_folder(
    folder: Path, store: VoiceBackend, owner: str, *, replace: bool = False, max_rate: int = MAX_STORED_RATE
) -> Report:
    """Every voice of vllm-omni's speaker ``folder`` saved in ``store`` as ``owner``'s (blocking I/O).

    A name the owner already has is skipped unless ``replace``; a file that is not a voice, or a voice
    an upload would refuse (name, length, limits), is skipped with the reason.

    Raises:
        FileNotFoundError: ``folder`` does not exist.
    """
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder {folder}")
    moved: list[Moved] = []
    skipped: list[Skipped] = []
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        try:
            voice = read_voice(path)
            if not replace and store.info(owner, voice.name) is not None:
                raise _NotAVoice(f"voice {voice.name!r} exists (replace it with --replace)")
            audio, rate = _canonical_audio(voice, max_rate) if voice.audio is not None else (None, 0)
            info = store.save(
                owner,
                voice.name,
                audio=audio,
                sample_rate=rate,
                embedding=voice.embedding,
                consent=voice.consent,
                ref_text=voice.ref_text,
                speaker_description=voice.speaker_description,
                mime_type="audio/wav" if audio is not None else None,
            )
        except Rejected as exc:
            skipped.append(Skipped(path.name, exc.message))
        except (_NotAVoice, ValueError) as exc:  # store.VoiceError: a name, the owner's count or bytes
            skipped.append(Skipped(path.name, str(exc)))
        else:
            moved.append(Moved(info.name, path.name))
    return Report(moved, skipped)


def _piece(text: str) -> str:
    return _UNSAFE.sub("_", os.path.basename(text))[:_PIECE_CHARS] or "file"


def _existing(folder: Path) -> dict[str, list[Path]]:
    """The files of ``folder`` by the voice name vllm-omni would restore them under (lower case)."""
    found: dict[str, list[Path]] = {}
    for path in folder.glob(f"*{SUFFIX}"):
        with contextlib.suppress(SafetensorError, OSError), safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            key = meta.get("voice_name_lower") or meta.get("name", "").lower()
            if key:
                found.setdefault(key, []).append(path)
    return found


def encode_voice(data: VoiceData, created_at: int) -> tuple[str, bytes]:
    """A stored voice as vllm-omni's upload writes it: the file's name and its safetensors bytes."""
    info = data.info
    filename = f"{_piece(info.name)}_{_piece(info.consent)}_{created_at}{SUFFIX}"
    meta: dict[str, str | None] = {
        "name": info.name,
        "voice_name_lower": info.name.lower(),
        "consent": info.consent,
        "created_at": str(created_at),
        "ref_text": info.ref_text,
        "speaker_description": info.speaker_description,
    }
    if data.audio is not None:
        tensors = {AUDIO_TENSOR: np.ascontiguousarray(data.audio, dtype=np.float32)}
        meta |= {
            "mime_type": "audio/wav",
            "original_filename": f"{_piece(info.name)}.wav",
            "file_size": str(info.file_size),
            "sample_rate": str(info.sample_rate),
            "embedding_source": "audio",
        }
    else:
        assert data.embedding is not None
        tensors = {EMBEDDING_TENSOR: np.ascontiguousarray(data.embedding, dtype=np.float32)}
        meta |= {
            "mime_type": "application/x-safetensors",
            "original_filename": filename,
            "embedding_source": "direct",
            "embedding_dim": str(len(data.embedding)),
        }
    header = {key: value for key, value in meta.items() if value is not None}
    return filename, safetensors.numpy.save(tensors, header)


def _stored(store: VoiceBackend, owner: str) -> Iterator[VoiceData | str]:
    """The owner's voices with their payload, or the name of one that could not be read."""
    for info in store.list(owner):
        data = store.get(owner, info.name)
        yield data if data is not None else info.name


def export_folder(store: VoiceBackend, owner: str, folder: Path, *, replace: bool = False) -> Report:
    """Every voice of ``owner`` in ``store`` written to ``folder`` as vllm-omni's speaker folder (blocking
    I/O; ``folder`` is created). A name the folder already holds is skipped unless ``replace``, which
    removes the older file once the new one is in place."""
    folder.mkdir(parents=True, exist_ok=True)
    existing = _existing(folder)
    moved: list[Moved] = []
    skipped: list[Skipped] = []
    last = 0
    for data in _stored(store, owner):
        if isinstance(data, str):
            skipped.append(Skipped(data, "unreadable in the store"))
            continue
        older = existing.get(data.info.name.lower(), [])
        if older and not replace:
            skipped.append(Skipped(data.info.name, f"{folder} has it (replace it with --replace)"))
            continue
        # vllm-omni gives each upload a later second than the last (``_next_upload_timestamp``).
        last = max(int(data.info.created_at), last + 1)
        filename, payload = encode_voice(data, last)
        path = folder / filename
        # The temp name does not end in .safetensors: a vllm-omni starting meanwhile never restores it.
        write_atomic(path, payload)
        for old in older:
            if old != path:
                old.unlink(missing_ok=True)
        moved.append(Moved(data.info.name, filename))
    return Report(moved, skipped)
