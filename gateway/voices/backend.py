"""The voice store's interface, and the choice between its two backends.

Routes and the catalog hold a ``VoiceBackend`` and never learn where voices live: a local folder
(``gateway.voices.local.VoiceStore``, the default, shared by processes of one machine) or S3-compatible object
storage (``gateway.voices.s3.S3VoiceStore``, shared by a fleet, ``VOXGATE_VOICE_STORE=s3://BUCKET/PREFIX``).
Both store the same safetensors bytes (``gateway.voices.format.encode``) under the same keys, owner by owner.

Every method blocks (file or network I/O): call them from a worker thread, never on the event loop.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from ..settings import Settings
from .local import VoiceData, VoiceInfo, VoiceStore

S3_SCHEME = "s3://"


class VoiceBackend(Protocol):
    """Uploaded voices, partitioned by owner (``""`` is the anonymous owner)."""

    max_voices: int
    max_bytes: int

    def get(self, owner: str, name: str) -> VoiceData | None:
        """The voice with its payload (its name matched in any case), or None when absent or unreadable."""
        ...

    def info(self, owner: str, name: str) -> VoiceInfo | None:
        """The voice's metadata, or None when absent or unreadable."""
        ...

    def list(self, owner: str) -> list[VoiceInfo]:
        """The owner's readable voices, sorted by name."""
        ...

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
        """Store a voice atomically within the owner's ``max_voices`` and ``max_bytes`` (see VoiceStore)."""
        ...

    def delete(self, owner: str, name: str) -> bool:
        """Remove a voice, its name matched in any case; False when there was none."""
        ...


def parse_location(location: str) -> tuple[str, str]:
    """``s3://BUCKET/PREFIX`` as (bucket, prefix without slashes at its ends); ValueError otherwise."""
    if not location.startswith(S3_SCHEME):
        raise ValueError(f"voice_store must look like s3://BUCKET/PREFIX, not {location!r}")
    bucket, _, prefix = location[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise ValueError(f"voice_store {location!r} names no bucket")
    return bucket, prefix.strip("/")


def open_store(settings: Settings) -> VoiceBackend:
    """The backend ``settings`` ask for: S3 when ``voice_store`` is set, else the local ``voices_dir``."""
    if not settings.voice_store:
        return VoiceStore(
            settings.resolved_voices_dir(), max_voices=settings.max_voices, max_bytes=settings.max_voice_bytes
        )
    bucket, prefix = parse_location(settings.voice_store)
    try:
        from .s3 import S3VoiceStore
    except ImportError as exc:
        raise RuntimeError(
            "voice_store=s3://... needs the fleet extra: pip install 'voxgate[fleet]'"
        ) from exc
    return S3VoiceStore(bucket, prefix, max_voices=settings.max_voices, max_bytes=settings.max_voice_bytes)
