"""The voice file every backend stores (``gateway.voices.local``, ``.s3``), and what a store refuses.

A voice is one safetensors file, named ``<owner, or "_public" for the anonymous owner>/<sha256(name)[:32]>
.safetensors`` (``folder_name_of``, ``file_name_of``), so a voice name never becomes a path: a folder on disk,
a key prefix in a bucket. It holds one tensor, ``audio`` (a mono reference clip, 16-bit PCM: 30 s at 24 kHz
is 1.4 MB) or ``embedding`` (float32), and the voice's metadata as strings in the safetensors header
(``FORMAT``, name, owner, kind, consent, creation time, rate, and the optional texts). Clips stored as float32
by earlier versions still load; every clip is handed out as float32 (``to_float32``), at the rate it was
stored at.

``BaseVoiceStore.save`` is every backend's ``save`` up to the write (the owner's room: ``check_room``);
``encode`` makes the bytes every backend stores; ``header_info`` checks a header as every backend reads it,
as an upload is checked (``gateway.voices.clips``: text fields, the clip's rate and length, the embedding's
size), and ``check_payload`` the values of a float32 tensor, so a file that no upload could have left (copied
in by hand, from an older version, tampered with) is ``Unreadable``: never listed, served or exported.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
import unicodedata
from collections.abc import Collection, Mapping
from typing import Any, Literal, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt
import safetensors.numpy

from ..middleware.http import Rejected
from .clips import MAX_EMBEDDING_DIM, check_clip, check_embedding, check_finite, check_text
from .names import UnsafeName, normalize_name

FORMAT = "voxgate.voice/1"
SUFFIX = ".safetensors"
PUBLIC_DIR = "_public"
#: The lock of an owner's folder: a file the local store ``flock``s, an object the S3 store holds.
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
# A stored clip was resampled from what the upload's header said (1 to 30 s): allow its length this much.
RESAMPLED_SLACK_S = 0.01
# auth.owner_of yields 24 hex digits; anything else must never reach the file system.
_OWNER_RE = re.compile(r"[0-9a-f]{1,64}")

Kind = Literal["audio", "embedding"]
K = TypeVar("K")

logger = logging.getLogger(__name__)


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


class Unreadable(Exception):
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


class Tensor(msgspec.Struct, frozen=True):
    """A tensor as a safetensors header describes it: its dtype (``I16``, ``F32``) and shape."""

    dtype: str
    shape: tuple[int, ...]


def check_name(name: str) -> str:
    """``name`` in the form it is stored under (NFKC, ``gateway.voices.names``), or ``InvalidVoiceName``
    unless it can name a voice (and be a URL path segment)."""
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


def file_name_of(name: str, *, exact: bool = False) -> str:
    """The file (or object) name of voice ``name`` within its owner's folder.

    Voice names are case-insensitive, as in vllm-omni: the file is named after the case-folded name.
    ``exact`` gives the name of a file written before that rule, found as a fallback.
    """
    key = name if exact else unicodedata.normalize("NFKC", name).casefold()
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32] + SUFFIX


def folder_name_of(owner: str) -> str:
    """The folder (or key prefix) of ``owner``'s voices; ValueError for an id that is not lowercase hex."""
    if owner == "":
        return PUBLIC_DIR
    if not _OWNER_RE.fullmatch(owner):
        raise ValueError("owner ids are lowercase hex strings")
    return owner


def file_header(f: Any) -> tuple[dict[str, str], dict[str, Tensor]]:
    """Metadata and tensor specs of a file opened with safetensors' ``safe_open``.

    safetensors parses the header and checks that the file's length matches it, so a torn file never
    opens.
    """
    meta: dict[str, str] = f.metadata() or {}
    tensors = {}
    for key in f.keys():
        tensor = f.get_slice(key)
        tensors[key] = Tensor(dtype=tensor.get_dtype(), shape=tuple(tensor.get_shape()))
    return meta, tensors


def header_info(
    meta: dict[str, str], tensors: dict[str, Tensor], *, size: int, owner: str, file_name: str
) -> VoiceInfo:
    """Check that the header describes the voice this file should hold, and summarise it."""
    try:
        if meta["format"] != FORMAT:
            raise Unreadable(f"format {meta['format']!r} is not {FORMAT!r}")
        name, kind = meta["name"], meta["kind"]
        if meta["owner"] != owner or file_name not in (file_name_of(name), file_name_of(name, exact=True)):
            raise Unreadable("owner or name does not match the file's place")
        if kind not in ("audio", "embedding") or list(tensors) != [kind]:
            raise Unreadable(f"expected one {kind!r} tensor, found {sorted(tensors)}")
        dtypes = AUDIO_DTYPES if kind == "audio" else ("F32",)
        if tensors[kind].dtype not in dtypes or len(tensors[kind].shape) != 1:
            raise Unreadable(f"expected a vector of {' or '.join(dtypes)}, found {tensors[kind]}")
        (count,) = tensors[kind].shape
        sample_rate = int(meta.get("sample_rate", "0"))
        if count <= 0 or (kind == "audio" and sample_rate <= 0):
            raise Unreadable("empty tensor or missing sample rate")
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
        raise Unreadable(f"bad metadata: {exc!r}") from exc


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
            raise Unreadable(f"an embedding of {count} values, over the {MAX_EMBEDDING_DIM} allowed")
    except Rejected as exc:
        raise Unreadable(exc.message) from None


def check_payload(kind: str, values: npt.NDArray[np.float32]) -> None:
    """The checks of an upload on a stored voice's samples or values (finite), as ``Unreadable``; only a
    float32 tensor (a clip stored by an earlier version, an embedding) can fail them."""
    try:
        if kind == "audio":
            check_finite(values, kind)
        else:
            check_embedding(values, kind)
    except Rejected as exc:
        raise Unreadable(exc.message) from None


def _pcm16(audio: npt.NDArray[Any]) -> npt.NDArray[np.int16]:
    """Float samples as 16-bit PCM (``PCM16_SCALE``), clipped to its range."""
    scaled = np.asarray(audio, dtype=np.float32) * np.float32(PCM16_SCALE)
    np.rint(scaled, out=scaled)
    np.clip(scaled, -PCM16_SCALE, PCM16_SCALE - 1, out=scaled)
    pcm: npt.NDArray[np.int16] = scaled.astype(np.int16)
    return pcm


def to_float32(tensor: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
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

    ``name`` has passed ``check_name``. Raises ``ValueError`` as ``BaseVoiceStore.save`` documents.
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
    tensors: dict[str, Tensor] = {kind: Tensor(dtype=dtype, shape=tensor.shape)}
    try:  # what every read checks (``_check_as_uploaded``): a voice stored is a voice that can be read
        return payload, header_info(
            meta, tensors, size=len(payload), owner=owner, file_name=file_name_of(name)
        )
    except Unreadable as exc:
        raise ValueError(str(exc)) from None


def voice_data(info: VoiceInfo, payload: npt.NDArray[np.float32]) -> VoiceData:
    """A stored voice with its payload: ``audio`` or ``embedding``, as ``info.kind`` says."""
    if info.kind == "audio":
        return VoiceData(info=info, audio=payload)
    return VoiceData(info=info, embedding=payload)


def check_room(
    sizes: Mapping[K, int], own: Collection[K], needed: int, *, replacing: bool, max_voices: int, quota: int
) -> None:
    """Refuse a voice of ``needed`` bytes that its owner has no room for.

    Args:
        sizes: the owner's voice files (or objects) and their sizes, by key.
        own: the keys of this voice's own files (under its name, or as written before names ignored case),
            which it replaces and which do not count.
        needed: the voice's size in bytes.
        replacing: it replaces a voice of the owner's, so it takes no new place.
        max_voices: the owner's number of voices.
        quota: the owner's bytes of voice files; 0 for no cap.

    Raises:
        VoiceLimitReached: a new voice beside ``max_voices`` others.
        VoiceQuotaExceeded: the other voices and this one would pass ``quota``.
    """
    others = [size for key, size in sizes.items() if key not in own]
    if not replacing and len(others) >= max_voices:
        raise VoiceLimitReached(max_voices)
    if quota and sum(others) + needed > quota:
        raise VoiceQuotaExceeded(quota, sum(others), needed)


class BaseVoiceStore:
    """What every backend's ``save`` does before it writes: check the name, make the file's bytes
    (``encode``), choose the quota; a backend writes them with ``_write`` (``check_room`` under its lock)."""

    max_voices: int
    #: Bytes of voice files per owner; 0 for no cap. ``save`` may be given another.
    max_bytes: int

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
            VoiceStoreUnavailable: a shared store did not answer, or could not keep its lock.
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
        if self._write(owner, name, payload, self.max_bytes if max_bytes is None else max_bytes):
            logger.info("voice %r of owner %r replaced", name, owner or PUBLIC_DIR)
        return info

    def _write(self, owner: str, name: str, payload: bytes, quota: int) -> bool:
        """Store ``payload`` as the voice ``name`` of ``owner`` if ``check_room`` lets it, in place of the
        voice's files under any case of its name; True when it replaced one."""
        raise NotImplementedError
