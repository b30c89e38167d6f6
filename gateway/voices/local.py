"""Persistent voice store: one safetensors file per voice, safe to share between gateway processes.

Layout: ``<directory>/<owner, or "_public" for the anonymous owner>/<sha256(name)[:32]>.safetensors``,
so a voice name never becomes a path; the file and its checks are ``gateway.voices.format``'s, shared with
the S3 backend.

Each owner has at most ``max_voices`` voices, and at most ``max_bytes`` bytes of voice files when set.

Writes are atomic: a hidden temp file in the same folder is written, fsynced and renamed over the
final name, then the folder is fsynced, so a crash leaves the old voice or the new one, never a torn
file. Reads always go to disk, so an upload or a delete made through another process is seen at once;
parsed headers are cached by (inode, size, mtime, ctime). A file that does not parse is skipped with
a warning and never raises out of ``list``, ``info`` or ``get``.

Every file is checked when it is read as an upload is checked (``gateway.voices.format.header_info``: text
fields, the clip's rate and length, the embedding's size, finite values), so a file that no upload could have
left (copied in by hand, from an older version, tampered with) is skipped the same way: never listed, served
or exported.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from safetensors import SafetensorError, safe_open

from .format import (
    FORMAT,
    LOCK_NAME,
    MAX_FILE_BYTES,
    PUBLIC_DIR,
    SUFFIX,
    BaseVoiceStore,
    InvalidVoiceName,
    Unreadable,
    VoiceData,
    VoiceInfo,
    VoiceLimitReached,
    VoiceQuotaExceeded,
    VoiceStoreUnavailable,
    check_name,
    check_payload,
    check_room,
    encode,
    file_header,
    file_name_of,
    folder_name_of,
    header_info,
    to_float32,
    voice_data,
)

# The format's names callers have always taken from the default backend.
__all__ = [
    "FORMAT",
    "MAX_FILE_BYTES",
    "PUBLIC_DIR",
    "SUFFIX",
    "InvalidVoiceName",
    "VoiceData",
    "VoiceInfo",
    "VoiceLimitReached",
    "VoiceQuotaExceeded",
    "VoiceStore",
    "VoiceStoreUnavailable",
    "check_name",
    "encode",
    "write_atomic",
]

logger = logging.getLogger(__name__)

TEMP_SUFFIX = ".tmp"
# Far longer than any write takes, so a younger temp file may still belong to a live writer.
STALE_TEMP_S = 60.0


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


def _read_info(path: Path, *, size: int, owner: str) -> VoiceInfo:
    """The voice file's summary, checked as an upload is: its header, and a float32 tensor's values (an
    embedding, or a clip stored by an earlier version; 16-bit PCM is always finite, and is not read)."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta, tensors = file_header(f)
            info = header_info(meta, tensors, size=size, owner=owner, file_name=path.name)
            if tensors[info.kind].dtype == "F32":
                check_payload(info.kind, f.get_tensor(info.kind))
            return info
    except SafetensorError as exc:
        raise Unreadable(f"bad header: {exc}") from exc


class VoiceStore(BaseVoiceStore):
    """One safetensors file per voice under ``directory``, partitioned by owner.

    All methods do blocking file I/O: call them from a worker thread (``run_in_threadpool``).
    Creating a store creates ``directory`` and removes temp files left by crashed writers.
    """

    def __init__(self, directory: Path, *, max_voices: int = 1000, max_bytes: int = 0) -> None:
        self.directory = directory
        self.max_voices = max_voices
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
                raise Unreadable(f"{size} bytes is larger than any voice")
            with safe_open(str(path), framework="numpy") as f:
                meta, tensors = file_header(f)
                info = header_info(meta, tensors, size=size, owner=owner, file_name=path.name)
                payload = to_float32(f.get_tensor(info.kind))
            check_payload(info.kind, payload)
        except FileNotFoundError:
            return None
        except (Unreadable, SafetensorError, OSError) as exc:
            logger.warning("skipping unreadable voice file %s: %s", path, exc)
            return None
        return voice_data(info, payload)

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
        folder = self.directory / folder_name_of(owner)
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

    def _write(self, owner: str, name: str, payload: bytes, quota: int) -> bool:
        """A temp file renamed over the voice's, under the owner's folder lock (``BaseVoiceStore.save``)."""
        folder = self._folder(owner, create=True)
        path, legacy = folder / file_name_of(name), folder / file_name_of(name, exact=True)
        with folder_lock(folder):
            sizes = self._sizes(folder)
            # The voice's own files (under its name, or as written before names ignored case) are replaced.
            replacing = path in sizes
            check_room(
                sizes,
                (path, legacy),
                len(payload),
                replacing=replacing,
                max_voices=self.max_voices,
                quota=quota,
            )
            if legacy != path and legacy in sizes:
                legacy.unlink()  # the same voice, stored before names were case-insensitive
            write_atomic(path, payload)
        return replacing

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
        folder = self.directory / folder_name_of(owner)
        if create and not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            _fsync_dir(self.directory)
        return folder

    def _path(self, owner: str, name: str) -> Path:
        return self._folder(owner) / file_name_of(name)

    def _existing(self, owner: str, name: str) -> Path:
        """The voice's file: by its case-folded name, else as written before names ignored case."""
        path = self._path(owner, name)
        legacy = path.with_name(file_name_of(name, exact=True))
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
                raise Unreadable(f"{stat.st_size} bytes is larger than any voice")
            info = _read_info(path, size=stat.st_size, owner=owner)
        except FileNotFoundError:
            return None
        except (Unreadable, OSError) as exc:
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


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Serialise a count-then-write in an owner's folder (a voice's save, a pronunciation dictionary's) across
    threads and processes sharing it: an exclusive ``flock`` on its ``LOCK_NAME`` file."""
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
