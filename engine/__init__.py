"""TTS engine adapters behind one interface (``engine.base.TTSEngine``), and their registry.

Each engine module declares its own settings Struct (``engine.options``) and a ``create(settings)``;
heavy imports (Piper's ONNX Runtime, vllm) happen only when an engine starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from engine import fake, piper, remote, vllm_omni
from engine.base import (
    AudioChunk,
    EngineError,
    SynthesisRequest,
    TTSEngine,
    UnknownVoice,
    UnsupportedOption,
    Voice,
)

S = TypeVar("S", bound=msgspec.Struct)


@dataclass(frozen=True)
class EngineEntry(Generic[S]):
    """An engine as ``--engine`` names it: its settings Struct and how to build it from them."""

    settings: type[S]
    create: Callable[[S], TTSEngine]

    def __call__(self, settings: msgspec.Struct | None = None) -> TTSEngine:
        """The engine, built from ``settings`` (an instance of ``self.settings``; None: the defaults)."""
        chosen = self.settings() if settings is None else settings
        if not isinstance(chosen, self.settings):
            raise TypeError(f"expected {self.settings.__name__}, got {type(chosen).__name__}")
        return self.create(chosen)


#: Engines by the name used in ``--engine``.
ENGINES: dict[str, EngineEntry[Any]] = {
    "piper": EngineEntry(piper.PiperSettings, piper.create),
    "remote": EngineEntry(remote.RemoteSettings, remote.create),
    "vllm-omni": EngineEntry(vllm_omni.VllmOmniSettings, vllm_omni.create),
    "fake": EngineEntry(fake.FakeSettings, fake.create),
}

__all__ = [
    "ENGINES",
    "AudioChunk",
    "EngineEntry",
    "EngineError",
    "SynthesisRequest",
    "TTSEngine",
    "UnknownVoice",
    "UnsupportedOption",
    "Voice",
]
