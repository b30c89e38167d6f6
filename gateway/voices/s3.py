"""Uploaded voices in S3-compatible object storage, shared by every gateway replica pointed at the bucket.

Layout: the local store's, as object keys: ``<PREFIX>/<owner, or "_public">/<sha256(name)[:32]>.safetensors``,
each object holding exactly the bytes ``gateway.voices.format.encode`` makes. The client is obstore (Rust's
object_store; no dependencies, 20 ms to import): it reads the standard AWS variables itself
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, and the rest of the
AWS credential chain). Its calls block, and the store is used from worker threads like the local one.

Atomic publish: a voice is one single-part PUT, which S3 makes visible whole or not at all, so an upload
cut by a crash leaves nothing, and a replacement swaps the whole object. There is no temp object.

Quotas (``max_voices``, ``max_bytes``) are counted from a LIST of the owner's objects, under a lock
object per owner (``<owner>/.lock``) taken with a create-only conditional PUT (``If-None-Match: *``), so
two replicas cannot both pass the count. A lock left by a crashed replica is taken over once it is
``LOCK_STALE_S`` old (by its Last-Modified, so replicas' clocks must agree within a second or so).
The holder keeps it fresh: a thread rewrites it every ``LOCK_STALE_S / LOCK_RENEWALS`` (a new body each
time, ``If-Match`` its last ETag, so a renewal never revives a lock taken over meanwhile), however long the
voice's PUT takes. The holder writes the voice only while its last renewal is recent enough that no
waiter can have found the lock stale; and if the lock was lost during the PUT (a store so slow that
renewals lag), it counts again under the lock and removes its new voice when the owner is then over a
limit, answering as if the count had refused it.

Every object is checked when read as an upload is (``gateway.voices.format``: header, text fields, the clip's
rate and length, finite values), and read at most ``MAX_FILE_BYTES`` far whatever its HEAD or GET said.

Caching: every read asks the store first (HEAD, or the LIST itself), and a cached header or clip is used
only while its ETag is the object's, so a delete or a re-upload made through another replica is seen on
the next use: no staleness beyond the store's own read-after-write consistency, at the cost of one HEAD
per use. Clips are cached up to ``CLIP_CACHE_BYTES``, least recently used first out.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import msgspec
import obstore
import safetensors.numpy
from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError
from obstore.store import S3Store
from safetensors import SafetensorError

from .format import (
    LOCK_NAME,
    MAX_FILE_BYTES,
    SUFFIX,
    BaseVoiceStore,
    Tensor,
    Unreadable,
    VoiceData,
    VoiceError,
    VoiceInfo,
    VoiceStoreUnavailable,
    check_payload,
    check_room,
    file_name_of,
    folder_name_of,
    header_info,
    to_float32,
    voice_data,
)

logger = logging.getLogger(__name__)

# A count plus one PUT of at most a few MB takes well under a second on a working store; after a crash,
# the owner's uploads wait this long at most.
LOCK_STALE_S = 5.0
LOCK_POLL_S = 0.02
# The holder renews its lock this many times per LOCK_STALE_S, and trusts it while its last renewal (from
# when it was sent) is younger than half LOCK_STALE_S: Last-Modified has whole seconds, so a waiter may see
# the lock up to a second older than it is.
LOCK_RENEWALS = 5
# Past this a lock that keeps being renewed means a store in trouble: fail the upload instead of hanging.
LOCK_WAIT_S = 3 * LOCK_STALE_S
# A header holds the metadata strings (name, consent, transcripts: a few KiB); one ranged GET of this
# much usually holds all of it, and a second one fetches the rest.
HEADER_PROBE_BYTES = 64 << 10
# 30 s at 24 kHz is 2.9 MB as float32: 64 MiB keeps the ~20 most recently spoken long voices in memory.
CLIP_CACHE_BYTES = 64 << 20
# A GET's body is read in pieces of this size, so a body past MAX_FILE_BYTES is refused within one piece.
READ_CHUNK_BYTES = 1 << 20
# Fail a request to a store that went away within seconds, not after object_store's 3-minute default.
_RETRY = {"max_retries": 2, "retry_timeout": timedelta(seconds=10)}
_CLIENT = {"allow_http": True, "connect_timeout": "5s", "timeout": "60s"}


class _Entry(msgspec.Struct, frozen=True):
    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]


def header_length(head: bytes) -> int:
    """Bytes from the object's start to the end of its safetensors header (8 + the JSON's length)."""
    if len(head) < 8:
        raise Unreadable("shorter than a safetensors header")
    (length,) = struct.unpack("<Q", head[:8])
    if length > MAX_FILE_BYTES:
        raise Unreadable(f"a header of {length} bytes")
    return 8 + int(length)


def parse_header(head: bytes, size: int) -> tuple[dict[str, str], dict[str, Tensor]]:
    """Metadata and tensor specs from the first ``header_length`` bytes of a ``size``-byte object.

    The tensors must fill the object exactly, as safetensors checks when it opens a file, so a torn or
    padded object is refused.
    """
    end = header_length(head)
    try:
        doc = msgspec.json.decode(head[8:end], type=dict[str, Any])
        meta = msgspec.convert(doc.pop("__metadata__", {}), dict[str, str])
        entries = {key: msgspec.convert(value, _Entry) for key, value in doc.items()}
    except msgspec.DecodeError as exc:  # ValidationError included
        raise Unreadable(f"bad header: {exc}") from exc
    data_end = max((e.data_offsets[1] for e in entries.values()), default=0)
    if end + data_end != size:
        raise Unreadable(f"header describes {end + data_end} bytes, the object has {size}")
    return meta, {key: Tensor(dtype=e.dtype, shape=e.shape) for key, e in entries.items()}


@contextlib.contextmanager
def reaching(location: str) -> Iterator[None]:
    """Turn the client's failures to reach the store (network, credentials, a 5xx) into one exception."""
    try:
        yield
    except BaseError as exc:
        raise VoiceStoreUnavailable(f"the voice store {location} failed: {exc}") from exc


class _Clip(msgspec.Struct, frozen=True):
    e_tag: str
    data: VoiceData
    nbytes: int


class S3VoiceStore(BaseVoiceStore):
    """One object per voice under ``s3://bucket/prefix``, partitioned by owner, shared across replicas."""

    def __init__(self, bucket: str, prefix: str, *, max_voices: int = 1000, max_bytes: int = 0) -> None:
        self.location = f"s3://{bucket}/{prefix}"
        self.max_voices = max_voices
        self.max_bytes = max_bytes
        self._s3 = S3Store(bucket, prefix=prefix or None, client_options=_CLIENT, retry_config=_RETRY)  # type: ignore[arg-type]
        self._headers: dict[str, tuple[str, VoiceInfo | None]] = {}
        self._clips: collections.OrderedDict[str, _Clip] = collections.OrderedDict()
        self._clip_bytes = 0
        self._lock = threading.Lock()

    def get(self, owner: str, name: str) -> VoiceData | None:
        """The voice with its payload (its name matched in any case), or None when absent or unreadable."""
        with reaching(self.location):
            found = self._existing(owner, name)
            if found is None:
                return None
            key, meta = found
            with self._lock:
                hit = self._clips.get(key)
                if hit is not None and hit.e_tag == meta["e_tag"]:
                    self._clips.move_to_end(key)
                    return hit.data
            try:
                if meta["size"] > MAX_FILE_BYTES:
                    raise Unreadable(f"{meta['size']} bytes is larger than any voice")
                e_tag, data = self._read(key)
                header, tensors = parse_header(data, len(data))
                info = header_info(
                    header, tensors, size=len(data), owner=owner, file_name=key.rsplit("/", 1)[1]
                )
                payload = to_float32(safetensors.numpy.load(data)[info.kind])
                check_payload(info.kind, payload)
            except FileNotFoundError:  # deleted since the HEAD
                return None
            except (Unreadable, SafetensorError) as exc:
                logger.warning("skipping unreadable voice object %s: %s", key, exc)
                return None
            payload.setflags(write=False)  # shared by every session that speaks it
            voice = voice_data(info, payload)
            self._remember(key, _Clip(e_tag=e_tag, data=voice, nbytes=payload.nbytes))
            return voice

    def _read(self, key: str) -> tuple[str, bytes]:
        """The object's ETag and bytes, read at most ``MAX_FILE_BYTES`` far: an object larger than the
        HEAD before said (replaced meanwhile, or a store that lies) is refused, not held whole."""
        result = obstore.get(self._s3, key)
        size = int(result.meta["size"])
        if size > MAX_FILE_BYTES:
            raise Unreadable(f"{size} bytes is larger than any voice")
        data = bytearray()
        for chunk in result.stream(min_chunk_size=READ_CHUNK_BYTES):
            data += chunk
            if len(data) > MAX_FILE_BYTES:
                raise Unreadable(f"over {MAX_FILE_BYTES} bytes, larger than any voice")
        return str(result.meta["e_tag"]), bytes(data)

    def info(self, owner: str, name: str) -> VoiceInfo | None:
        """The voice's metadata (its name matched in any case), or None when absent or unreadable."""
        with reaching(self.location):
            found = self._existing(owner, name)
            if found is None:
                return None
            key, meta = found
            return self._cached_info(key, str(meta["e_tag"]), int(meta["size"]), owner)

    def list(self, owner: str) -> list[VoiceInfo]:
        """The owner's readable voices, sorted by name."""
        with reaching(self.location):
            folder = folder_name_of(owner)
            infos: list[VoiceInfo] = []
            seen: set[str] = set()
            for meta in self._objects(folder):
                key = str(meta["path"])
                seen.add(key)
                info = self._cached_info(key, str(meta["e_tag"]), int(meta["size"]), owner)
                if info is not None:
                    infos.append(info)
            with self._lock:
                for key in [k for k in self._headers if k.startswith(folder + "/") and k not in seen]:
                    del self._headers[key]
            return sorted(infos, key=lambda info: info.name)

    def _write(self, owner: str, name: str, payload: bytes, quota: int) -> bool:
        """One PUT under the owner's lock object (``BaseVoiceStore.save``)."""
        with reaching(self.location):
            key, legacy = self._key(owner, name), self._key(owner, name, exact=True)
            with self._locked(folder_name_of(owner)) as lock:
                sizes = {str(m["path"]): int(m["size"]) for m in self._objects(folder_name_of(owner))}
                # The voice's own objects (its name, or as named before names ignored case) are replaced.
                replacing = key in sizes
                check_room(
                    sizes,
                    (key, legacy),
                    len(payload),
                    replacing=replacing,
                    max_voices=self.max_voices,
                    quota=quota,
                )
                if not lock.held():  # renewals lag: another replica may be counting without this voice
                    raise VoiceStoreUnavailable(f"the voice store's lock {lock.key} could not be kept")
                obstore.put(self._s3, key, payload, use_multipart=False)
                kept = lock.held()
                if legacy != key and legacy in sizes:  # the same voice, from a folder of an earlier version
                    obstore.delete(self._s3, legacy)
            self._forget(key)
            self._forget(legacy)
            if not kept and not replacing:
                self._count_again(owner, key, legacy, quota)
            return replacing

    def delete(self, owner: str, name: str) -> bool:
        """Remove a voice, its name matched in any case; False when there was none."""
        with reaching(self.location):
            found = self._existing(owner, name)
            if found is None:
                return False
            key, _ = found
            self._forget(key)
            obstore.delete(self._s3, key)
            return True

    def _count_again(self, owner: str, key: str, legacy: str, quota: int) -> None:
        """The lock was lost while ``key`` (a new voice) was written, so another replica may have counted
        without it: count again under the lock, and remove it if the owner is over a limit with it."""
        folder = folder_name_of(owner)
        logger.warning(
            "the voice store's lock %s/%s was lost during an upload: counting again", folder, LOCK_NAME
        )
        with self._locked(folder):
            sizes = {str(m["path"]): int(m["size"]) for m in self._objects(folder)}
            own, limit = sizes.get(key, 0), self.max_voices
            try:
                check_room(sizes, (key, legacy), own, replacing=False, max_voices=limit, quota=quota)
            except VoiceError:
                obstore.delete(self._s3, key)
                raise

    def _key(self, owner: str, name: str, *, exact: bool = False) -> str:
        return f"{folder_name_of(owner)}/{file_name_of(name, exact=exact)}"

    def _existing(self, owner: str, name: str) -> tuple[str, Any] | None:
        """The voice's key and ``ObjectMeta``: by its case-folded name, else as written before names ignored
        case (a folder of an earlier version copied up); None when neither exists."""
        keys = dict.fromkeys([self._key(owner, name), self._key(owner, name, exact=True)])
        for key in keys:
            try:
                return key, obstore.head(self._s3, key)
            except FileNotFoundError:
                self._forget(key)
        return None

    def _objects(self, folder: str) -> Iterator[Any]:
        """The voice objects in ``folder`` (not the lock), as obstore's ``ObjectMeta``."""
        for batch in obstore.list(self._s3, prefix=folder + "/"):
            for meta in batch:
                base = str(meta["path"]).rsplit("/", 1)[-1]
                if not base.startswith(".") and base.endswith(SUFFIX):
                    yield meta

    def _cached_info(self, key: str, e_tag: str, size: int, owner: str) -> VoiceInfo | None:
        with self._lock:
            hit = self._headers.get(key)
        if hit is not None and hit[0] == e_tag:
            return hit[1]
        info: VoiceInfo | None = None
        try:
            if size > MAX_FILE_BYTES:
                raise Unreadable(f"{size} bytes is larger than any voice")
            head = bytes(obstore.get_range(self._s3, key, start=0, end=min(size, HEADER_PROBE_BYTES)))
            end = header_length(head)
            if end > len(head):
                head = bytes(obstore.get_range(self._s3, key, start=0, end=min(end, size)))
            meta, tensors = parse_header(head, size)
            read = header_info(meta, tensors, size=size, owner=owner, file_name=key.rsplit("/", 1)[1])
            if tensors[read.kind].dtype == "F32":  # an embedding, or a clip of an earlier version
                data = head if len(head) == size else self._read(key)[1]
                check_payload(read.kind, to_float32(safetensors.numpy.load(data)[read.kind]))
            info = read
        except FileNotFoundError:  # deleted since the listing
            return None
        except (Unreadable, SafetensorError) as exc:
            logger.warning("skipping unreadable voice object %s: %s", key, exc)
        with self._lock:
            self._headers[key] = (e_tag, info)
        return info

    def _remember(self, key: str, clip: _Clip) -> None:
        if clip.nbytes > CLIP_CACHE_BYTES:
            return
        with self._lock:
            old = self._clips.pop(key, None)
            self._clip_bytes += clip.nbytes - (old.nbytes if old else 0)
            self._clips[key] = clip
            while self._clip_bytes > CLIP_CACHE_BYTES:
                _, evicted = self._clips.popitem(last=False)
                self._clip_bytes -= evicted.nbytes

    def _forget(self, key: str) -> None:
        with self._lock:
            self._headers.pop(key, None)
            old = self._clips.pop(key, None)
            if old is not None:
                self._clip_bytes -= old.nbytes

    @contextlib.contextmanager
    def _locked(self, folder: str) -> Iterator[_Lock]:
        """Serialise the count-then-write of saves across every replica sharing the bucket; the lock is
        renewed while the block runs (``_Lock``)."""
        key = f"{folder}/{LOCK_NAME}"
        token = uuid.uuid4().hex.encode()
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            sent = time.monotonic()
            e_tag = self._acquire(key, token)
            if e_tag is not None:
                break
            if time.monotonic() > deadline:
                raise VoiceStoreUnavailable(
                    f"the voice store's lock {key} stayed taken for {LOCK_WAIT_S:.0f} s"
                )
            time.sleep(LOCK_POLL_S)
        lock = _Lock(self._s3, key, token, e_tag, sent)
        try:
            yield lock
        finally:
            lock.release()

    def _acquire(self, key: str, token: bytes) -> str | None:
        """Take the lock (its ETag), or None while another replica holds it."""
        try:
            return str(obstore.put(self._s3, key, token, mode="create", use_multipart=False)["e_tag"])
        except (AlreadyExistsError, PreconditionError):
            pass
        try:
            held = obstore.head(self._s3, key)
        except FileNotFoundError:  # released meanwhile: try again at once
            return None
        if time.time() - held["last_modified"].timestamp() < LOCK_STALE_S:
            return None
        try:  # a crashed replica's lock: take it over, unless another waiter just did
            taken = obstore.put(self._s3, key, token, mode={"e_tag": held["e_tag"]}, use_multipart=False)
        except (AlreadyExistsError, PreconditionError, FileNotFoundError):
            return None
        logger.warning(
            "took over the voice store's lock %s, left %.0f s ago",
            key,
            time.time() - held["last_modified"].timestamp(),
        )
        return str(taken["e_tag"])


class _Lock:
    """A held lock object, rewritten by a thread every ``LOCK_STALE_S / LOCK_RENEWALS`` until released.

    Each renewal writes a new body (the token and a count: S3's ETag is the body's MD5, and a waiter
    takes a stale lock over ``If-Match`` the ETag it saw, so an unchanged body would let it) with
    ``If-Match`` the last ETag written, so a lock taken over meanwhile is never written again.
    """

    def __init__(self, s3: S3Store, key: str, token: bytes, e_tag: str, sent: float) -> None:
        self.key = key
        self._s3, self._token, self._e_tag = s3, token, e_tag
        self._renewed = sent  # when the last write of it was sent (monotonic)
        self._lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="voxgate-s3-lock", daemon=True)
        self._thread.start()

    def held(self) -> bool:
        """Whether it is surely still this holder's: no waiter can have found it stale yet."""
        return not self._lost and time.monotonic() - self._renewed < LOCK_STALE_S / 2

    def _renew(self) -> None:
        count = 0
        while not self._stop.wait(LOCK_STALE_S / LOCK_RENEWALS):
            count += 1
            sent = time.monotonic()
            body = self._token + b" %d" % count
            try:
                put = obstore.put(self._s3, self.key, body, mode={"e_tag": self._e_tag}, use_multipart=False)
            except (AlreadyExistsError, PreconditionError, FileNotFoundError):
                self._lost = True
                logger.warning("the voice store's lock %s was taken over while held", self.key)
                return
            except BaseError as exc:  # the store is failing: try again on the next beat
                logger.debug("renewing the voice store's lock %s failed: %s", self.key, exc)
                continue
            self._e_tag, self._renewed = str(put["e_tag"]), sent

    def release(self) -> None:
        """Stop renewing, and delete the lock unless it was taken over."""
        self._stop.set()
        self._thread.join()
        if self._lost:
            return
        with contextlib.suppress(FileNotFoundError):
            if obstore.head(self._s3, self.key)["e_tag"] == self._e_tag:  # not taken over meanwhile
                obstore.delete(self._s3, self.key)
