"""ElevenLabs' pronunciation dictionaries, stored per API key beside the voices, on both voice-store backends.

Layout: a folder (or key prefix) ``pronunciation-dictionaries`` inside the owner's voice folder, one JSON
record a dictionary (``protocol.dictionaries.encode``), named by its id:

    <voices_dir or s3://BUCKET/PREFIX>/<owner, or "_public">/pronunciation-dictionaries/<id>.json

so every replica on one S3 prefix (or every process on one folder) sees the same dictionaries, and the voice
stores, which look only at ``*.safetensors`` directly in the owner's folder, never see them. An id is 20 hex
digits the server made (``protocol.dictionaries.new_id``): any other id names nothing and never reaches a
path or a key.

Each owner has at most ``max_dictionaries`` dictionaries and ``max_bytes`` bytes of records (0: no cap),
counted under a lock per owner, as the voices are: a ``fcntl`` lock file in the folder, or on S3 the voice
store's lock object (``gateway.voices.s3``: create-only PUT, renewed while held), at
``<owner>/pronunciation-dictionaries/.lock``. Writes are whole: a temp file renamed over the record, or
one single-part PUT. A record that does not decode, or that names another owner or id than its place, is
skipped with a warning (never served).

Every method blocks (file or network I/O): call them from a worker thread.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ...protocol.dictionaries import Dictionary, decode, encode, is_id
from ..settings import Settings
from .format import VoiceStoreUnavailable, folder_name_of
from .local import folder_lock, write_atomic

if TYPE_CHECKING:
    from .backend import VoiceBackend
    from .s3 import S3VoiceStore

logger = logging.getLogger(__name__)

SUBFOLDER = "pronunciation-dictionaries"
SUFFIX = ".json"
#: A record of 256 entries is tens of KiB; anything much larger is not one this server wrote.
MAX_RECORD_BYTES = 4 << 20


class DictionaryLimitReached(Exception):
    """The owner already has ``limit`` dictionaries."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"pronunciation dictionary limit reached: at most {limit} per API key; delete one first"
        )


class DictionaryQuotaExceeded(Exception):
    """Storing the dictionary would take the owner's records over ``limit`` bytes."""

    def __init__(self, limit: int, used: int, needed: int) -> None:
        self.limit, self.used, self.needed = limit, used, needed
        super().__init__(
            f"pronunciation dictionary storage quota reached: this one needs {needed} bytes, {used} of "
            f"{limit} bytes per API key are in use; delete one first"
        )


class DictionaryBackend(Protocol):
    """Pronunciation dictionaries, partitioned by owner (``""`` is the anonymous owner)."""

    max_dictionaries: int
    max_bytes: int

    def get(self, owner: str, dictionary_id: str) -> Dictionary | None:
        """The owner's dictionary of that id, or None (absent, unreadable, or an id we never make)."""
        ...

    def list(self, owner: str) -> list[Dictionary]:
        """The owner's readable dictionaries, in no particular order."""
        ...

    def add(self, dictionary: Dictionary) -> None:
        """Store a new dictionary of ``dictionary.owner`` within the owner's caps.

        Raises:
            DictionaryLimitReached, DictionaryQuotaExceeded: the caps.
        """
        ...

    def modify(
        self, owner: str, dictionary_id: str, change: Callable[[Dictionary], Dictionary]
    ) -> Dictionary | None:
        """Replace a stored dictionary by ``change`` of it (renamed, archived, new rules), read and written
        under the owner's lock so that two changes never lose one; None when there is none.

        Raises:
            DictionaryQuotaExceeded: the changed record would take the owner past ``max_bytes``.
            Exception: what ``change`` raises (nothing is written).
        """
        ...

    def delete(self, owner: str, dictionary_id: str) -> bool:
        """Remove a dictionary; False when there was none."""
        ...


def _check_caps(sizes: dict[str, int], own: str, payload: int, limit: int, quota: int) -> None:
    """Refuse a new record of ``payload`` bytes beside ``sizes`` (by key; ``own`` is the record's)."""
    others = [size for key, size in sizes.items() if key != own]
    if own not in sizes and len(others) >= limit:
        raise DictionaryLimitReached(limit)
    if quota and sum(others) + payload > quota:
        raise DictionaryQuotaExceeded(quota, sum(others), payload)


class LocalDictionaries:
    """One JSON file per dictionary under each owner's voice folder in ``directory``."""

    def __init__(self, directory: Path, *, max_dictionaries: int = 100, max_bytes: int = 0) -> None:
        self.directory = directory
        self.max_dictionaries = max_dictionaries
        self.max_bytes = max_bytes
        # Decoded records by path, while the file's (inode, size, mtime, ctime) are the same: a socket reads
        # its key's dictionaries as it opens, and most keys' rarely change.
        self._cache: dict[Path, tuple[tuple[int, int, int, int], Dictionary]] = {}

    def get(self, owner: str, dictionary_id: str) -> Dictionary | None:
        if not is_id(dictionary_id):
            return None
        return self._read(self._folder(owner) / f"{dictionary_id}{SUFFIX}", owner, dictionary_id)

    def list(self, owner: str) -> list[Dictionary]:
        found: builtins.list[Dictionary] = []
        for path in self._paths(self._folder(owner)):
            dictionary = self._read(path, owner, path.stem)
            if dictionary is not None:
                found.append(dictionary)
        return found

    def add(self, dictionary: Dictionary) -> None:
        payload = encode(dictionary)
        folder = self._folder(dictionary.owner)
        folder.mkdir(parents=True, exist_ok=True)
        with folder_lock(folder):
            name = f"{dictionary.id}{SUFFIX}"
            _check_caps(self._sizes(folder), name, len(payload), self.max_dictionaries, self.max_bytes)
            write_atomic(folder / name, payload)

    def modify(
        self, owner: str, dictionary_id: str, change: Callable[[Dictionary], Dictionary]
    ) -> Dictionary | None:
        folder = self._folder(owner)
        if not is_id(dictionary_id) or not folder.is_dir():
            return None
        with folder_lock(folder):
            path = folder / f"{dictionary_id}{SUFFIX}"
            current = self._read(path, owner, dictionary_id)
            if current is None:
                return None
            changed = change(current)
            payload = encode(changed)
            _check_caps(self._sizes(folder), path.name, len(payload), self.max_dictionaries, self.max_bytes)
            write_atomic(path, payload)
        return changed

    def delete(self, owner: str, dictionary_id: str) -> bool:
        if not is_id(dictionary_id):
            return False
        path = self._folder(owner) / f"{dictionary_id}{SUFFIX}"
        self._cache.pop(path, None)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def _folder(self, owner: str) -> Path:
        return self.directory / folder_name_of(owner) / SUBFOLDER

    def _sizes(self, folder: Path) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for path in self._paths(folder):
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile (deletes take no lock)
                sizes[path.name] = path.stat().st_size
        return sizes

    @staticmethod
    def _paths(folder: Path) -> builtins.list[Path]:
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return []
        return [
            Path(e.path)
            for e in entries
            if e.name.endswith(SUFFIX) and not e.name.startswith(".") and is_id(e.name[: -len(SUFFIX)])
        ]

    def _read(self, path: Path, owner: str, dictionary_id: str) -> Dictionary | None:
        try:
            with path.open("rb") as f:
                stat = os.fstat(f.fileno())
                key = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
                hit = self._cache.get(path)
                if hit is not None and hit[0] == key:
                    return hit[1]
                data = f.read(MAX_RECORD_BYTES + 1)
            if len(data) > MAX_RECORD_BYTES:
                raise ValueError(f"over {MAX_RECORD_BYTES} bytes")
            found = decode(data, owner, dictionary_id)
        except FileNotFoundError:
            self._cache.pop(path, None)
            return None
        except (ValueError, OSError) as exc:
            logger.warning("skipping unreadable pronunciation dictionary %s: %s", path, exc)
            return None
        self._cache[path] = (key, found)
        return found


class S3Dictionaries:
    """One object per dictionary beside the voices of an ``S3VoiceStore``, on its client and its locks.

    Reads ask the store each time (a HEAD, or the LIST), and a decoded record is reused only while its ETag
    is the object's, so an upload or delete through another replica is seen on the next use.
    """

    def __init__(self, voices: S3VoiceStore, *, max_dictionaries: int = 100, max_bytes: int = 0) -> None:
        self.voices = voices
        self.max_dictionaries = max_dictionaries
        self.max_bytes = max_bytes
        self._cache: dict[str, tuple[str, Dictionary]] = {}

    def get(self, owner: str, dictionary_id: str) -> Dictionary | None:
        import obstore

        if not is_id(dictionary_id):
            return None
        key = self._key(owner, dictionary_id)
        with self._reaching():
            try:
                meta = obstore.head(self.voices._s3, key)
            except FileNotFoundError:
                self._cache.pop(key, None)
                return None
            return self._read(key, str(meta["e_tag"]), owner, dictionary_id)

    def list(self, owner: str) -> list[Dictionary]:
        found: builtins.list[Dictionary] = []
        with self._reaching():
            for meta in self._objects(owner):
                key = str(meta["path"])
                dictionary_id = key.rsplit("/", 1)[1][: -len(SUFFIX)]
                dictionary = self._read(key, str(meta["e_tag"]), owner, dictionary_id)
                if dictionary is not None:
                    found.append(dictionary)
        return found

    def add(self, dictionary: Dictionary) -> None:
        import obstore

        payload = encode(dictionary)
        key = self._key(dictionary.owner, dictionary.id)
        with self._reaching(), self.voices._locked(self._folder(dictionary.owner)) as lock:
            sizes = {str(m["path"]): int(m["size"]) for m in self._objects(dictionary.owner)}
            _check_caps(sizes, key, len(payload), self.max_dictionaries, self.max_bytes)
            if not lock.held():  # renewals lag: another replica may be counting without this one
                raise VoiceStoreUnavailable(f"the voice store's lock {lock.key} could not be kept")
            obstore.put(self.voices._s3, key, payload, use_multipart=False)

    def modify(
        self, owner: str, dictionary_id: str, change: Callable[[Dictionary], Dictionary]
    ) -> Dictionary | None:
        import obstore

        if not is_id(dictionary_id):
            return None
        key = self._key(owner, dictionary_id)
        with self._reaching(), self.voices._locked(self._folder(owner)) as lock:
            try:
                meta = obstore.head(self.voices._s3, key)
            except FileNotFoundError:
                return None
            current = self._read(key, str(meta["e_tag"]), owner, dictionary_id)
            if current is None:
                return None
            changed = change(current)
            payload = encode(changed)
            sizes = {str(m["path"]): int(m["size"]) for m in self._objects(owner)}
            _check_caps(sizes, key, len(payload), self.max_dictionaries, self.max_bytes)
            if not lock.held():
                raise VoiceStoreUnavailable(f"the voice store's lock {lock.key} could not be kept")
            obstore.put(self.voices._s3, key, payload, use_multipart=False)
        return changed

    def delete(self, owner: str, dictionary_id: str) -> bool:
        import obstore

        if not is_id(dictionary_id):
            return False
        key = self._key(owner, dictionary_id)
        self._cache.pop(key, None)
        with self._reaching():
            try:
                obstore.head(self.voices._s3, key)
            except FileNotFoundError:
                return False
            obstore.delete(self.voices._s3, key)
        return True

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        from .s3 import reaching

        with reaching(self.voices.location):
            yield

    @staticmethod
    def _folder(owner: str) -> str:
        return f"{folder_name_of(owner)}/{SUBFOLDER}"

    def _key(self, owner: str, dictionary_id: str) -> str:
        return f"{self._folder(owner)}/{dictionary_id}{SUFFIX}"

    def _objects(self, owner: str) -> Iterator[Any]:
        import obstore

        for batch in obstore.list(self.voices._s3, prefix=self._folder(owner) + "/"):
            for meta in batch:
                base = str(meta["path"]).rsplit("/", 1)[-1]
                if base.endswith(SUFFIX) and not base.startswith(".") and is_id(base[: -len(SUFFIX)]):
                    yield meta

    def _read(self, key: str, e_tag: str, owner: str, dictionary_id: str) -> Dictionary | None:
        import obstore

        hit = self._cache.get(key)
        if hit is not None and hit[0] == e_tag:
            return hit[1]
        try:
            result = obstore.get(self.voices._s3, key)
            if int(result.meta["size"]) > MAX_RECORD_BYTES:
                raise ValueError(f"over {MAX_RECORD_BYTES} bytes")
            dictionary = decode(bytes(result.bytes()), owner, dictionary_id)
        except FileNotFoundError:  # deleted since the HEAD or the LIST
            return None
        except ValueError as exc:
            logger.warning("skipping unreadable pronunciation dictionary %s: %s", key, exc)
            return None
        self._cache[str(key)] = (str(result.meta["e_tag"]), dictionary)
        return dictionary


def open_dictionaries(settings: Settings, voices: VoiceBackend) -> DictionaryBackend:
    """The dictionaries beside ``voices``: on S3 when ``voice_store`` is set, else in ``voices_dir``."""
    caps = {
        "max_dictionaries": settings.max_pronunciation_dictionaries,
        "max_bytes": settings.max_pronunciation_dictionary_bytes,
    }
    if not settings.voice_store:
        return LocalDictionaries(settings.resolved_voices_dir(), **caps)
    from .s3 import S3VoiceStore

    assert isinstance(voices, S3VoiceStore)  # open_store made it from the same settings
    return S3Dictionaries(voices, **caps)
