"""Gateway settings: the only place that reads the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

_PREFIX = "VOXGATE_"

#: OpenAI's and vllm-omni's voice names, which some clients insist on, spoken by the default voice.
DEFAULT_VOICE_ALIASES: dict[str, str] = {
    name: ""
    for name in (
        "alloy",
        "ash",
        "ballad",
        "coral",
        "echo",
        "fable",
        "nova",
        "onyx",
        "sage",
        "shimmer",
        "verse",
        "marin",
        "cedar",
        "vivian",
    )
}


def _default_voices_dir(env: Mapping[str, str]) -> str:
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return str(Path(cache) / "voxgate" / "voices")


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
    # Audio held for a client before synthesis pauses for it: a minute of speech, so a client reading
    # at playback pace never starves, while a long text does not pile up in memory.
    max_buffered_audio_s: float = 60.0
    # A write that makes no progress for this long means the client stopped reading: it is closed
    # (4001). Long enough for a congested mobile link, short enough to free the session soon.
    send_timeout_s: float = 15.0
    log_level: str = "info"
    voices_dir: str = ""
    # A cap keeps one key from filling the disk; 1000 clips of 30 s are about 2.6 GB at 22 kHz.
    max_voices: int = 1000
    api_keys: tuple[str, ...] = ()
    api_keys_file: str = ""
    allowed_origins: tuple[str, ...] = ()
    # Engine "remote": base URLs of vllm-omni (or any OpenAI-compatible) speech servers.
    upstreams: tuple[str, ...] = ()
    upstream_model: str = ""
    # Sent as "Authorization: Bearer" to every upstream (a gateway with API keys, or a vllm-omni --api-key).
    upstream_api_key: str = ""
    # No first byte within this time fails over to another upstream; no byte for this long mid-stream
    # is a stall. A TTS server on a warm GPU answers within a few hundred ms.
    upstream_connect_timeout_s: float = 5.0
    upstream_read_timeout_s: float = 30.0
    upstream_health_interval_s: float = 5.0
    # Consecutive failures that open an upstream's circuit, and how long it then stays out.
    upstream_breaker_failures: int = 3
    upstream_breaker_cooldown_s: float = 30.0
    # Engine "vllm-omni": the Qwen3-TTS checkpoint that AsyncOmni loads in this process, vllm-omni's
    # deploy YAML (a name under vllm_omni/deploy/ or a path), and how long each stage may take to start
    # (a cold start of the 0.6B model, weights plus CUDA graphs, took ~2.5 min; vllm-omni's default is 300 s).
    vllm_model: str = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
    vllm_deploy_config: str = "qwen3_tts.yaml"
    vllm_stage_init_timeout_s: float = 300.0
    # name -> voice; "" means the engine's default voice.
    voice_aliases: dict[str, str] = msgspec.field(default_factory=lambda: dict(DEFAULT_VOICE_ALIASES))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Build settings from ``VOXGATE_*`` variables, then apply explicit overrides (CLI flags).

        List settings take comma-separated values; ``VOXGATE_VOICE_ALIASES`` is a JSON object merged
        over the default alias table.
        """
        env = os.environ if environ is None else environ
        raw: dict[str, object] = {}
        for name in cls.__struct_fields__:
            value = env.get(_PREFIX + name.upper())
            if value is not None:
                raw[name] = value
        raw.update({k: v for k, v in overrides.items() if v is not None})
        for name in ("api_keys", "allowed_origins", "upstreams"):
            if isinstance(raw.get(name), str):
                raw[name] = [v.strip() for v in str(raw[name]).split(",") if v.strip()]
        if isinstance(raw.get("voice_aliases"), str):
            raw["voice_aliases"] = {**DEFAULT_VOICE_ALIASES, **msgspec.json.decode(str(raw["voice_aliases"]))}
        if not raw.get("voices_dir"):
            raw["voices_dir"] = _default_voices_dir(env)
        return msgspec.convert(raw, cls, strict=False)

    def resolved_voices_dir(self) -> Path:
        """``voices_dir``, or the default under the user's cache folder when it is empty."""
        return Path(self.voices_dir or _default_voices_dir(os.environ))

    def all_api_keys(self) -> tuple[str, ...]:
        """Keys from ``api_keys`` plus those in ``api_keys_file`` (one a line, ``#`` comments)."""
        keys = list(self.api_keys)
        if self.api_keys_file:
            for line in Path(self.api_keys_file).read_text(encoding="utf-8").splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    keys.append(line)
        return tuple(keys)


class ClientSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of the command-line client (``voxgate say`` / ``voxgate voices``)."""

    url: str = "http://127.0.0.1:8000"
    api_key: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> ClientSettings:
        """``VOXGATE_URL`` and ``VOXGATE_API_KEY``, then explicit overrides (CLI flags)."""
        env = os.environ if environ is None else environ
        raw: dict[str, object] = {
            name: env[_PREFIX + name.upper()]
            for name in cls.__struct_fields__
            if _PREFIX + name.upper() in env
        }
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return msgspec.convert(raw, cls, strict=False)
