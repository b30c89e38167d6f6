"""TTS engine adapters behind one interface (``engine.base.TTSEngine``), and their registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from voxgate.engine.base import (
    AudioChunk,
    EngineError,
    SynthesisRequest,
    TTSEngine,
    UnknownVoice,
    UnsupportedOption,
    Voice,
)

if TYPE_CHECKING:
    from voxgate.gateway.settings import Settings


def _piper(settings: Settings) -> TTSEngine:
    from voxgate.engine.piper import PiperEngine

    return PiperEngine(threads=settings.piper_threads, workers=settings.piper_workers)


def _fake(settings: Settings) -> TTSEngine:
    from voxgate.engine.fake import FakeEngine

    return FakeEngine()


def _remote(settings: Settings) -> TTSEngine:
    from voxgate.engine.remote import RemoteEngine

    return RemoteEngine(
        list(settings.upstreams),
        model=settings.upstream_model,
        api_key=settings.upstream_api_key,
        connect_timeout_s=settings.upstream_connect_timeout_s,
        read_timeout_s=settings.upstream_read_timeout_s,
        health_interval_s=settings.upstream_health_interval_s,
        breaker_failures=settings.upstream_breaker_failures,
        breaker_cooldown_s=settings.upstream_breaker_cooldown_s,
    )


def _vllm_omni(settings: Settings) -> TTSEngine:
    from voxgate.engine.vllm_omni import VllmOmniEngine

    return VllmOmniEngine(
        model=settings.vllm_model,
        deploy_config=settings.vllm_deploy_config,
        stage_init_timeout_s=settings.vllm_stage_init_timeout_s,
    )


#: Engines by the name used in ``--engine``; heavy imports happen only in the chosen factory.
ENGINES: dict[str, Callable[[Settings], TTSEngine]] = {
    "piper": _piper,
    "remote": _remote,
    "vllm-omni": _vllm_omni,
    "fake": _fake,
}

__all__ = [
    "ENGINES",
    "AudioChunk",
    "EngineError",
    "SynthesisRequest",
    "TTSEngine",
    "UnknownVoice",
    "UnsupportedOption",
    "Voice",
]
