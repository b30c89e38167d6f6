"""Persistent voice store (skeleton: being implemented)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt


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
    """A stored voice with its payload: float32 mono ``audio`` at ``info.sample_rate``, or ``embedding``."""

    info: VoiceInfo
    audio: npt.NDArray[np.float32] | None = None
    embedding: npt.NDArray[np.float32] | None = None


class VoiceStore:
    """One safetensors file per voice under ``directory``, partitioned by owner."""

    def __init__(self, directory: Path, *, max_voices: int = 1000) -> None:
        self.directory = directory
        self.max_voices = max_voices

    def get(self, owner: str, name: str) -> VoiceData | None:
        return None

    def list(self, owner: str) -> list[VoiceInfo]:
        return []
