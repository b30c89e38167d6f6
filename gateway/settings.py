"""Gateway settings: the only place that reads the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

_PREFIX = "VOXGATE_"


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything configurable; each field can be set as ``VOXGATE_<FIELD>`` or a CLI flag."""

    host: str = "127.0.0.1"
    port: int = 8000
    engine: str = "piper"
    # One intra-op thread per inference and two inferences at once use both cores of a small
    # machine without oversubscription (REFERENCE.md E: RTF 0.089 at 1 thread).
    piper_threads: int = 1
    piper_workers: int = 2
    # vllm-omni waits 10 s for the first config; 60 s idle tolerates pauses of a voice agent's turn.
    config_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    max_message_bytes: int = 128 * 1024
    max_config_bytes: int = 4 * 1024 * 1024
    # Audio waiting for a client that does not read: a minute of speech, then it is closed.
    max_buffered_audio_s: float = 60.0
    log_level: str = "info"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Build settings from ``VOXGATE_*`` variables, then apply explicit overrides (CLI flags)."""
        env = os.environ if environ is None else environ
        raw: dict[str, object] = {}
        for name in cls.__struct_fields__:
            value = env.get(_PREFIX + name.upper())
            if value is not None:
                raw[name] = value
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return msgspec.convert(raw, cls, strict=False)
