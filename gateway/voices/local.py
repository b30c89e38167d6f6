"""Persistent voice store: one safetensors file per voice, safe to share between gateway processes.

Layout: ``<directory>/<owner, or "_public" for the anonymous owner>/<sha256(name)[:32]>.safetensors``,
so a voice name never becomes a path. Each file holds one tensor, ``audio`` (a mono reference clip,
16-bit PCM: 30 s at 24 kHz is 1.4 MB) or ``embedding`` (float32), and the voice's metadata as strings in
the safetensors header. Clips stored as float32 by earlier versions still load; every clip is handed out
as float32, at the rate it was stored at.

Each owner has at most ``max_voices`` voices, and at most ``max_bytes`` bytes of voice files when set.

Writes are atomic: a hidden temp file in the same folder is written, fsynced and renamed over the
final name, then the folder is fsynced, so a crash leaves the old voice or the new one, never a torn
file. Reads always go to disk, so an upload or a delete made through another process is seen at once;
parsed headers are cached by (inode, size, mtime, ctime). A file that does not parse is skipped with
a warning and never raises out of ``list``, ``info`` or ``get``.

Every file is checked when it is read as an upload is checked (``gateway.voices.clips``: text fields, the
clip's
rate and length, the embedding's size, finite values), so a file that no upload could have left (copied
in by hand, from an older version, tampered with) is skipped the same way: never listed, served or
exported.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import tempfile
import threading
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np
import numpy.typing as npt
import safetensors.numpy
from safetensors import SafetensorError, safe_open

from ..middleware.http import Rejected
from .clips import MAX_EMBEDDING_DIM, check_clip, check_embedding, check_finite, check_text
from .names import UnsafeName, normalize_name

logger = logging.getLogger(__name__)

FORMAT = "voxgate.voice/1"
SUFFIX = ".safetensors"
PUBLIC_DIR = "_public"
TEMP_SUFFIX = ".tmp"
LOCK_NAME = ".lock"
# Long enough for a descriptive name, short enough to fit one line of a voice picker.
MAX_NAME_CHARS = 64
# 30 s of audio at 192 kHz is 23 MB as float32 (as earlier versions stored it); a bigger file is not one
# we wrote.
MAX_FILE_BYTES = 64 << 20
# 16-bit PCM as libsndfile reads it: sample / 32768, so a 16-bit source clip is stored exactly.
PCM16_SCALE = 32768.0
# Tensor dtypes a clip may be stored as: 16-bit PCM, or float32 as earlier versions wrote.
AUDIO_DTYPES = ("I16", "F32")
# Far longer than any write takes, so a younger temp file may still belong to a live writer.
STALE_TEMP_S = 60.0
# A stored clip was resampled from what the upload's header said (1 to 30 s): allow its length this much.
RESAMPLED_SLACK_S = 0.01
# auth.owner_of yields 24 hex digits; anything else must never reach the file system.
_OWNER_RE = re.compile(r"[0-9a-f]{1,64}")

Kind = Literal["audio", "embedding"]


class VoiceError(ValueError):
    """A voice cannot be stored as asked."""


class InvalidVoiceName(VoiceError):
    """The name is empty, too long, or has characters that cannot appear in a URL path segment."""


class VoiceLimitReached(VoiceError):
    """The owner already has ``limit`` voices; replacing one of them is still allowed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"voice limit reached: at most {limit} voices per API key; delete one first")


class VoiceQuotaExceeded(VoiceError):
    """Storing the voice would take the owner's voice files over ``limit`` bytes."""

    def __init__(self, limit: int, used: int, needed: int) -> None:
        self.limit, self.used, self.needed = limit, used, needed
        super().__init__(
            f"voice storage quota reached: this voice needs {needed} bytes, {used} of {limit} bytes per API "
            "key are in use; delete a voice first"
        )


class VoiceStoreUnavailable(Exception):
    """A shared store (S3) did not answer, or refused the gateway's credentials: try again later."""


class _Unreadable(Exception):
    """A file in the store that is not a voice we wrote (torn, foreign or hand-edited)."""


class VoiceInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Metadata of a stored voice, as listed to its owner (never a server path)."""

    name: str
    consent: str
    created_at: float
    kind: str  # "audio" (a reference clip) or "embedding"
    sample_rate: int = 0
    duration_s: float = 0.0
    embedding_dim: int = 0
    ref_text: str | None = None
    speaker_description: str | None = None
    mime_type: str | None = None
    file_size: int = 0


class VoiceData(msgspec.Struct, frozen=True, kw_only=True):
    """A stored voice with its payload: float32 mono ``audio`` at ``info.sample_rate``, or ``embedding``.

    ``audio`` is float32 whatever the file holds (16-bit PCM, or float32 from earlier versions)."""

    info: VoiceInfo
    audio: npt.NDArray[np.float32] | None = None
    embedding: npt.NDArray[np.float32] | None = None


class _Tensor(msgspec.Struct, frozen=True):
    dtype: str
    shape: tuple[int, ...]


def check_name(name: str) -> str:
    """``name`` in the form it is stored under (NFKC, ``gateway.voices.names``), or ``InvalidVoiceName``
    unless it
    can name a voice (and be a URL path segment)."""
    try:
        name = normalize_name(name)
    except UnsafeName as exc:
        raise InvalidVoiceName(str(exc)) from None
    if not name or len(name) > MAX_NAME_CHARS:
        raise InvalidVoiceName(f"name must be 1 to {MAX_NAME_CHARS} characters")
    if name in (".", ".."):
        raise InvalidVoiceName("name must not be '.' or '..'")
    if any(c in "/\\" for c in name):  # control characters are refused by normalize_name
        raise InvalidVoiceName("name must not contain '/' or '\\'")
    return name


def _file_name(name: str, *, exact: bool = False) -> str:
    # Voice names are case-insensitive, as in vllm-omni: the file is named after the case-folded name.
    # ``exact`` gives the name of a file written before that rule, found as a fallback.
    key = name if exact else unicodedata.normalize("NFKC", name).casefold()
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32] + SUFFIX


def _folder_name(owner: str) -> str:
    if owner == "":
        return PUBLIC_DIR
    if not _OWNER_RE.fullmatch(owner):
        raise ValueError("owner ids are lowercase hex strings")
    return owner


def write_atomic(path: Path, payload: bytes) -> None:
    """Write ``path`` whole or not at all: a temp file beside it (named ``.stem.*.tmp``, so nothing that
    lists ``*.safetensors`` sees it half written), synced, then renamed over it, and the folder synced."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _header(f: Any) -> tuple[dict[str, str], dict[str, _Tensor]]:
    """Metadata and tensor specs of a file opened with safetensors' ``safe_open``.

    safetensors parses the header and checks that the file's length matches it, so a torn file never
    opens.
    """
    meta: dict[str, str] = f.metadata() or {}
    tensors = {}
    for key in f.keys():
        tensor = f.get_slice(key)
        tensors[key] = _Tensor(dtype=tensor.get_dtype(), shape=tuple(tensor.get_shape()))
    return meta, tensors


def _read_info(path: Path, *, size: int, owner: str) -> VoiceInfo:
    """The voice file's summary, checked as an upload is: its header, and a float32 tensor's values (an
    embedding, or a clip stored by an earlier version; 16-bit PCM is always finite, and is not read)."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta, tensors = _header(f)
            info = _info(meta, tensors, size=size, owner=owner, file_name=path.name)
            if tensors[info.kind].dtype == "F32":
                check_payload(info.kind, f.get_tensor(info.kind))
            return info
    except SafetensorError as exc:
        raise _Unreadable(f"bad header: {exc}") from exc


def _info(
    meta: dict[str, str], tensors: dict[str, _Tensor], *, size: int, owner: str, file_name: str
) -> VoiceInfo:
    """Check that the header describes the voice this file should hold, and summarise it."""
    try:
        if meta["format"] != FORMAT:
            raise _Unreadable(f"format {meta['format']!r} is not {FORMAT!r}")
        name, kind = meta["name"], meta["kind"]
        if meta["owner"] != owner or file_name not in (_file_name(name), _file_name(name, exact=True)):
            raise _Unreadable("owner or name does not match the file's place")
        if kind not in ("audio", "embedding") or list(tensors) != [kind]:
            raise _Unreadable(f"expected one {kind!r} tensor, found {sorted(tensors)}")
        dtypes = AUDIO_DTYPES if kind == "audio" else ("F32",)
        if tensors[kind].dtype not in dtypes or len(tensors[kind].shape) != 1:
            raise _Unreadable(f"expected a vector of {' or '.join(dtypes)}, found {tensors[kind]}")
        (count,) = tensors[kind].shape
        sample_rate = int(meta.get("sample_rate", "0"))
        if count <= 0 or (kind == "audio" and sample_rate <= 0):
            raise _Unreadable("empty tensor or missing sample rate")
        _check_as_uploaded(meta, kind, count, sample_rate)
        return VoiceInfo(
            name=name,
            consent=meta["consent"],
            created_at=float(meta["created_at"]),
            kind=kind,
            sample_rate=sample_rate,
            duration_s=count / sample_rate if kind == "audio" else 0.0,
            embedding_dim=count if kind == "embedding" else 0,
            ref_text=meta.get("ref_text"),
            speaker_description=meta.get("speaker_description"),
            mime_type=meta.get("mime_type"),
            file_size=size,
        )
    except (KeyError, ValueError) as exc:
        raise _Unreadable(f"bad metadata: {exc!r}") from exc


def _check_as_uploaded(meta: dict[str, str], kind: str, count: int, sample_rate: int) -> None:
    """What an upload checks (``gateway.voices.clips``) that the header tells: text fields, the clip's rate
    and
    length, the embedding's size. A file that fails is not a voice we wrote (a foreign or tampered file)."""
    try:
        for key in ("name", "consent", "ref_text", "speaker_description", "mime_type"):
            check_text(meta.get(key), key)
        if kind == "audio":
            check_clip(sample_rate, 1, count, kind, slack_s=RESAMPLED_SLACK_S)
        elif count > MAX_EMBEDDING_DIM:  # a request's bound: uploads (4096) were once held to it
            raise _Unreadable(f"an embedding of {count} values, over the {MAX_EMBEDDING_DIM} allowed")
    except Rejected as exc:
        raise _Unreadable(exc.message) from None


def check_payload(kind: str, values: npt.NDArray[np.float32]) -> None:
    """The checks of an upload on a stored voice's samples or values (finite), as ``_Unreadable``; only a
    float32 tensor (a clip stored by an earlier version, an embedding) can fail them."""
    try:
        if kind == "audio":
            check_finite(values, kind)
        else:
            check_embedding(values, kind)
    except Rejected as exc:
        raise _Unreadable(exc.message) from None


def _pcm16(audio: npt.NDArray[Any]) -> npt.NDArray[np.int16]:
    """Float samples as 16-bit PCM (``PCM16_SCALE``), clipped to its range."""
    scaled = np.asarray(audio, dtype=np.float32) * np.float32(PCM16_SCALE)
    np.rint(scaled, out=scaled)
    np.clip(scaled, -PCM16_SCALE, PCM16_SCALE - 1, out=scaled)
    pcm: npt.NDArray[np.int16] = scaled.astype(np.int16)
    return pcm


def _float32(tensor: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """A stored tensor as float32: 16-bit PCM scaled back (exactly), float32 as it is."""
    if tensor.dtype == np.int16:
        scaled: npt.NDArray[np.float32] = np.multiply(tensor, np.float32(1 / PCM16_SCALE), dtype=np.float32)
        return scaled
    return np.asarray(tensor, dtype=np.float32)


def encode(
    owner: str,
    name: str,
    *,
    audio: npt.NDArray[np.float32] | None,
    sample_rate: int,
    embedding: npt.NDArray[np.float32] | None,
    consent: str,
    ref_text: str | None,
    speaker_description: str | None,
    mime_type: str | None,
) -> tuple[bytes, VoiceInfo]:
    """The safetensors bytes of a voice and what they describe; every backend stores exactly these bytes.

    ``name`` has passed ``check_name``. Raises ``ValueError`` as ``VoiceStore.save`` documents.
    """
    if (audio is None) == (embedding is None):
        raise ValueError("give exactly one of audio and embedding")
    kind: Kind = "audio" if audio is not None else "embedding"
    values = np.asarray(audio if audio is not None else embedding)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"{kind} must be a non-empty 1-D array")
    if not np.isfinite(values).all():
        raise ValueError(f"{kind} has NaN or infinite values")
    if kind == "audio" and sample_rate <= 0:
        raise ValueError("audio needs a positive sample rate")
    tensor = _pcm16(values) if kind == "audio" else np.ascontiguousarray(values, dtype=np.float32)
    meta = {
        "format": FORMAT,
        "name": name,
        "owner": owner,
        "kind": kind,
        "consent": consent,
        "created_at": repr(time.time()),
        "sample_rate": str(sample_rate if kind == "audio" else 0),
    }
    optional = {"ref_text": ref_text, "speaker_description": speaker_description, "mime_type": mime_type}
    meta.update({key: value for key, value in optional.items() if value is not None})
    payload = safetensors.numpy.save({kind: tensor}, meta)
    dtype = "I16" if kind == "audio" else "F32"
    tensors: dict[str, _Tensor] = {kind: _Tensor(dtype=dtype, shape=tensor.shape)}
    try:  # what every read checks (``_check_as_uploaded``): a voice stored is a voice that can be read
        return payload, _info(meta, tensors, size=len(payload), owner=owner, file_name=_file_name(name))
    except _Unreadable as exc:
        raise ValueError(str(exc)) from None


class VoiceStore:
    """One safetensors file per voice under ``directory``, partitioned by owner.

    All methods do blocking file I/O: call them from a worker thread (``run_in_threadpool``).
    Creating a store creates ``directory`` and removes temp files left by crashed writers.
    """

    def __init__(self, directory: Path, *, max_voices: int = 1000, max_bytes: int = 0) -> None:
        self.directory = directory
        self.max_voices = max_voices
        #: Bytes of voice files per owner; 0 for no cap. ``save`` may be given another.
        self.max_bytes = max_bytes
        self._cache: dict[Path, tuple[tuple[int, int, int, int], VoiceInfo | None]] = {}
        self._cache_lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        self.remove_stale_temp_files()

    def get(self, owner: str, name: str) -> VoiceData | None:
        """The voice with its payload (its name matched in any case), or None when absent or unreadable."""
        path = self._existing(owner, name)
        try:
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                raise _Unreadable(f"{size} bytes is larger than any voice")
            with safe_open(str(path), framework="numpy") as f:
                meta, tensors = _header(f)
                info = _info(meta, tensors, size=size, owner=owner, file_name=path.name)
                payload = _float32(f.get_tensor(info.kind))
            check_payload(info.kind, payload)
        except FileNotFoundError:
            return None
        except (_Unreadable, SafetensorError, OSError) as exc:
            logger.warning("skipping unreadable voice file %s: %s", path, exc)
            return None
        if info.kind == "audio":
            return VoiceData(info=info, audio=payload)
        return VoiceData(info=info, embedding=payload)

    def info(self, owner: str, name: str) -> VoiceInfo | None:
        """The voice's metadata (its name matched in any case), or None when absent or unreadable."""
        path = self._existing(owner, name)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        return self._cached_info(path, stat, owner)

    def list(self, owner: str) -> list[VoiceInfo]:
        """The owner's readable voices, sorted by name."""
        folder = self.directory / _folder_name(owner)
        infos: list[VoiceInfo] = []
        seen: set[Path] = set()
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if entry.name.startswith(".") or not entry.name.endswith(SUFFIX):
                continue
            path = Path(entry.path)
            seen.add(path)
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # deleted by another process since the scan
                continue
            info = self._cached_info(path, stat, owner)
            if info is not None:
                infos.append(info)
        with self._cache_lock:
            for path in [p for p in self._cache if p.parent == folder and p not in seen]:
                del self._cache[path]
        return sorted(infos, key=lambda info: info.name)

    def save(
        self,
        owner: str,
        name: str,
        *,
        audio: npt.NDArray[np.float32] | None = None,
        sample_rate: int = 0,
        embedding: npt.NDArray[np.float32] | None = None,
        consent: str,
        ref_text: str | None = None,
        speaker_description: str | None = None,
        mime_type: str | None = None,
        max_bytes: int | None = None,
    ) -> VoiceInfo:
        """Store a voice atomically, replacing one of the same name in any case.

        ``audio`` (float32 in [-1, 1], clipped beyond) is stored as 16-bit PCM. ``max_bytes`` replaces
        the store's own ``max_bytes`` for this call (0: no cap).

        Raises:
            InvalidVoiceName: see ``check_name``.
            VoiceLimitReached: the owner has ``max_voices`` voices and ``name`` is not one of them.
            VoiceQuotaExceeded: the owner's other voice files and this one would pass ``max_bytes``.
            ValueError: not exactly one of ``audio`` and ``embedding``, an empty one, one with NaN or
                infinite values, no sample rate, or what an upload refuses (``gateway.voices.clips``: a clip
                outside 1 to 30 s or 8 to 192 kHz, an embedding of over 8192 values, a text field of
                over 16 KiB).
        """
        name = check_name(name)
        payload, info = encode(
            owner,
            name,
            audio=audio,
            sample_rate=sample_rate,
            embedding=embedding,
            consent=consent,
            ref_text=ref_text,
            speaker_description=speaker_description,
            mime_type=mime_type,
        )
        folder = self._folder(owner, create=True)
        path = folder / _file_name(name)
        quota = self.max_bytes if max_bytes is None else max_bytes
        with self._locked(folder):
            legacy = folder / _file_name(name, exact=True)
            sizes = self._sizes(folder)
            # The voice's own files (under its name, or as written before names ignored case) are replaced.
            others = [size for p, size in sizes.items() if p not in (path, legacy)]
            replacing = path in sizes
            if not replacing and len(others) >= self.max_voices:
                raise VoiceLimitReached(self.max_voices)
            if quota and sum(others) + len(payload) > quota:
                raise VoiceQuotaExceeded(quota, sum(others), len(payload))
            if legacy != path and legacy in sizes:
                legacy.unlink()  # the same voice, stored before names were case-insensitive
            write_atomic(path, payload)
        if replacing:
            logger.info("voice %r of owner %r replaced", name, owner or PUBLIC_DIR)
        return info

    def delete(self, owner: str, name: str) -> bool:
        """Remove a voice, its name matched in any case; False when there was none."""
        path = self._existing(owner, name)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        _fsync_dir(path.parent)
        with self._cache_lock:
            self._cache.pop(path, None)
        return True

    def remove_stale_temp_files(self) -> int:
        """Delete temp files that crashed writers left over a minute ago; returns how many."""
        removed = 0
        cutoff = time.time() - STALE_TEMP_S
        for folder in self.directory.iterdir():
            if not folder.is_dir() or folder.is_symlink():
                continue
            for path in folder.glob(f".*{TEMP_SUFFIX}"):
                with contextlib.suppress(FileNotFoundError):
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
        if removed:
            logger.info("removed %d stale temp files from %s", removed, self.directory)
        return removed

    def _folder(self, owner: str, *, create: bool = False) -> Path:
        folder = self.directory / _folder_name(owner)
        if create and not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            _fsync_dir(self.directory)
        return folder

    def _path(self, owner: str, name: str) -> Path:
        return self._folder(owner) / _file_name(name)

    def _existing(self, owner: str, name: str) -> Path:
        """The voice's file: by its case-folded name, else as written before names ignored case."""
        path = self._path(owner, name)
        legacy = path.with_name(_file_name(name, exact=True))
        return legacy if legacy != path and not path.exists() and legacy.exists() else path

    def _cached_info(self, path: Path, stat: os.stat_result, owner: str) -> VoiceInfo | None:
        key = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        with self._cache_lock:
            hit = self._cache.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        info: VoiceInfo | None = None
        try:
            if stat.st_size > MAX_FILE_BYTES:
                raise _Unreadable(f"{stat.st_size} bytes is larger than any voice")
            info = _read_info(path, size=stat.st_size, owner=owner)
        except FileNotFoundError:
            return None
        except (_Unreadable, OSError) as exc:
            logger.warning("skipping unreadable voice file %s: %s", path, exc)
        with self._cache_lock:
            self._cache[path] = (key, info)
        return info

    @staticmethod
    def _sizes(folder: Path) -> dict[Path, int]:
        """The size of each voice file in ``folder`` (a file deleted meanwhile is left out)."""
        sizes: dict[Path, int] = {}
        for entry in os.scandir(folder):
            if entry.name.startswith(".") or not entry.name.endswith(SUFFIX):
                continue
            with contextlib.suppress(FileNotFoundError):
                sizes[Path(entry.path)] = entry.stat(follow_symlinks=False).st_size
        return sizes

    @staticmethod
    @contextlib.contextmanager
    def _locked(folder: Path) -> Iterator[None]:
        """Serialise the count-then-write of saves across threads and processes sharing the folder."""
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
