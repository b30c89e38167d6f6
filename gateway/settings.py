"""Server settings: the gateway's own fields composed with the settings each engine declares.

The only place the server reads the environment (but for the S3 client of ``voice_store``, which reads
the standard ``AWS_*`` variables itself, as every AWS client does). ``options()`` lists every setting
once; the ``voxgate serve`` flags (``voxgate.cli``) and the README's configuration table (``python -m
voxgate.gateway.settings``) are generated from it.
"""

from __future__ import annotations

import functools
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec

from ..engine import ENGINES
from ..engine.options import Option, option, options_of

S = TypeVar("S", bound=msgspec.Struct)

#: OpenAI's and vllm-omni's voice names, and Cartesia's and Deepgram's clients' default voices, which
#: some clients insist on, spoken by the default voice.
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
        # The default voices of Cartesia's and Deepgram's clients (livekit's, pipecat's, the SDKs').
        "f786b574-daa5-4673-aa0c-cbe3e8534c02",
        "aura-2-helena-en",
        "aura-2-andromeda-en",
        "aura-2-thalia-en",
        "aura-asteria-en",
    )
}


def _default_voices_dir(env: Mapping[str, str]) -> str:
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return str(Path(cache) / "voxgate" / "voices")


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything configurable: the gateway's own fields and, under ``engines``, each engine's settings.

    Each setting is read from ``VOXGATE_<NAME>``; those declared with a flag are also ``voxgate serve``
    flags. ``options()`` lists them all, gateway first, then engine by engine.
    """

    host: Annotated[str, option("address to listen on", flag=True)] = "127.0.0.1"
    port: Annotated[int, option("port to listen on", flag=True)] = 8000
    # Home Assistant's protocol has no authentication: it listens on loopback unless its address names a host.
    wyoming: Annotated[
        str,
        option(
            "`HOST:PORT` (or `PORT`, on loopback) to also serve Home Assistant's Wyoming protocol on (TCP); "
            "it has no authentication, so the API keys do not apply to it; empty for none",
            flag=True,
        ),
    ] = ""
    engine: Annotated[
        str,
        option(
            "engine(s), comma-separated, the first is the default: `piper`, `remote`, `vllm-omni` "
            "(`fake` is a test tone)",
            flag=True,
        ),
    ] = "piper"
    # vllm-omni waits 10 s for the first config; 60 s idle tolerates pauses of a voice agent's turn.
    config_timeout_s: Annotated[float, option("seconds a client has to send `session.config`", flag=True)] = (
        10.0
    )
    idle_timeout_s: Annotated[
        float, option("seconds without a message or audio that close the session (4008)", flag=True)
    ] = 60.0
    max_message_bytes: Annotated[int, option("largest client message other than `session.config`")] = (
        128 * 1024
    )
    max_config_bytes: Annotated[int, option("largest `session.config`")] = 4 * 1024 * 1024
    # Audio held for a client before synthesis pauses for it: a minute of speech, so a client reading
    # at playback pace never starves, while a long text does not pile up in memory.
    max_buffered_audio_s: Annotated[
        float,
        option("seconds of audio held for a client before synthesis pauses until it reads", flag=True),
    ] = 60.0
    # Messages other than audio (errors, acks, timings) held for a client before its messages stop being
    # read (TCP pushes back; one that reads nothing is then closed, 4001): far more than the engine's own
    # messages for a minute of audio, far less than a flood of refusals (gateway/session/outbox.py).
    max_buffered_messages: Annotated[
        int,
        option("messages other than audio held for a client before the server stops reading its messages"),
    ] = 1024
    max_buffered_message_bytes: Annotated[
        int,
        option("bytes (as JSON) of messages other than audio held for a client, likewise"),
    ] = 1024 * 1024
    # A ping in the audio stream unanswered for this long (gateway/session/receipts.py), or a write that
    # makes no
    # progress for this long with no pong meanwhile, means the client stopped reading: it is closed (4001).
    # Long enough for a congested mobile link, short enough to free the session soon.
    send_timeout_s: Annotated[
        float,
        option(
            "seconds a client may show no reading (no pong to the pings in its audio) before it is closed "
            "(4001)",
            flag=True,
        ),
    ] = 15.0
    # uvicorn's keepalive, for a connection with nothing in flight: its defaults. While audio is in flight the
    # read receipts watch the client instead (gateway/session/receipts.py): a client reading at playback pace
    # 30 s
    # behind answers a keepalive ping 30 s late, and must not be closed for it.
    ws_ping_interval_s: Annotated[
        float,
        option(
            "seconds between keepalive pings to a WebSocket with nothing in flight; 0 for none", flag=True
        ),
    ] = 20.0
    ws_ping_timeout_s: Annotated[
        float,
        option(
            "seconds a keepalive ping may go unanswered before the connection is closed (1011)", flag=True
        ),
    ] = 20.0
    # Off: speech does not compress (PCM and u-law gain a few percent, Opus nothing), while deflate costs
    # about 30% more server CPU and a compressor's memory per session. Browsers offer it on every
    # WebSocket. (A client that stops reading is caught with it too: gateway/session/receipts.py.)
    ws_compression: Annotated[
        bool,
        option(
            "accept permessage-deflate when a client offers it (`true`/`false`); audio does not compress",
            flag=True,
            shown="`false`",
        ),
    ] = False
    # Below Kubernetes' default grace period of 30 s, with room for the closes that follow.
    drain_timeout_s: Annotated[
        float,
        option(
            "seconds a drain (on SIGTERM) lets sessions finish before it closes the rest "
            "(1001 `server_shutdown`)",
            flag=True,
        ),
    ] = 20.0
    max_sessions: Annotated[
        int, option("sessions (WebSockets and speech requests) per process, 0 for no cap (503)", flag=True)
    ] = 512
    max_sessions_per_key: Annotated[
        int, option("sessions per API key when keys are set, 0 for no cap (429)", flag=True)
    ] = 64
    # About 20 minutes of speech: more than any reader keeps ahead, far less than a flood.
    max_pending_text_chars: Annotated[
        int,
        option("unsynthesized text a session may hold; more is refused (`text_backlog_full`)", flag=True),
    ] = 20_000
    # vllm-omni's defaults (``--tts-max-instructions-length``, ``tts_batch_max_items``), so a client that
    # works against one works against the other.
    max_instructions_chars: Annotated[
        int, option("characters `instructions` may have; more is refused (400 `invalid_message`)")
    ] = 500
    max_batch_items: Annotated[
        int, option("items a `POST /v1/audio/speech/batch` may hold; more is refused (400)")
    ] = 32
    # Speech is about 15 characters a second (0.07 s each); 0.3 s a character plus 10 s leaves room for
    # numbers and symbols read out in words (300 emoji are 80 s), while an engine that runs away (a
    # model that never stops) is cut at a few times the text's length.
    max_segment_audio_base_s: Annotated[
        float,
        option(
            "seconds of audio any segment may have; with the next, the cap on a segment's audio "
            "(divided by `speed`): more is cut (`audio_truncated`)",
            flag=True,
        ),
    ] = 10.0
    max_segment_audio_per_char_s: Annotated[
        float, option("seconds of audio a segment may have per character of its text", flag=True)
    ] = 0.3
    # Per API key (per client address without keys), REST routes under /v1/ only: sessions have caps.
    rate_limit_per_s: Annotated[
        float,
        option(
            "REST requests (`/v1/` routes) per second per API key, or per client address without keys; "
            "0 for no limit (429 `rate_limited`)",
            flag=True,
        ),
    ] = 10.0
    rate_limit_burst: Annotated[
        int, option("REST requests a key (or address) may make at once, above the rate", flag=True)
    ] = 50
    # Unset: each process counts alone (a fleet of N allows N times each cap). Set: the caps hold fleet-wide,
    # falling back to per process while Redis is down (gateway/middleware/shared_limits.py).
    redis_url: Annotated[
        str,
        option(
            "`redis://HOST:PORT/DB` shared by every replica: `max_sessions_per_key` and the rate limit hold "
            "across them (per process while Redis is down); empty for per process",
            shown="none",
        ),
    ] = ""
    # A replica killed without a goodbye (SIGKILL, a lost node) holds its key's places this long: short
    # enough to be under Kubernetes' 30 s, long enough that a few missed renewals (every third of it) do
    # not drop a live session's place.
    redis_lease_s: Annotated[
        float,
        option(
            "seconds a session's place in Redis lasts unrenewed: how long a dead replica's sessions count"
        ),
    ] = 10.0
    # A client that trickles its request headers (slowloris) holds a connection: cut it after this.
    header_timeout_s: Annotated[
        float,
        option(
            "seconds a client has to send a request's headers, from its connection or its first byte "
            "(408), 0 for no limit",
            flag=True,
        ),
    ] = 10.0
    # uvicorn bounds no head under httptools (a 50 MB header was read whole): 4 times the 16 KiB h11 allows.
    max_header_bytes: Annotated[
        int,
        option(
            "bytes a request's line and headers may have; more is refused (431 `header_too_large`) and the "
            "connection closed",
            flag=True,
            shown="65536 (64 KiB)",
        ),
    ] = 64 * 1024
    # uvicorn trusts X-Forwarded-For from 127.0.0.1 by default: any local client (or a proxy that passes the
    # header through) would pick its own address, and with it its rate-limit bucket. Nothing is trusted
    # unless named.
    trusted_proxies: Annotated[
        tuple[str, ...],
        option(
            "addresses or networks (CIDR) of proxies whose `X-Forwarded-For` / `X-Forwarded-Proto` give the "
            "client's address and scheme (rate limits, logs); `*` trusts any peer, only for a gateway no "
            "client reaches directly",
            flag="--trusted-proxy",
            repeat=True,
            shown="none",
        ),
    ] = ()
    # ElevenLabs allows 5 per socket; a few more leave room for contexts a barge-in is still closing.
    max_contexts: Annotated[
        int,
        option(
            "named contexts (`context_id`) a WebSocket session may have open at once; more is refused "
            "(`too_many_contexts`), 0 refuses every named context",
        ),
    ] = 8
    # ElevenLabs' context timeout: long enough for an agent's pause between turns.
    context_idle_timeout_s: Annotated[
        float,
        option(
            "seconds a named context may go without a message (or `keepalive`) once its audio is out, "
            "before it is closed (`context.closed`, `idle_timeout`); 0 for never",
        ),
    ] = 20.0
    log_level: Annotated[str, option("`debug`, `info`, `warning`, `error`", flag=True)] = "info"
    voices_dir: Annotated[
        str, option("where uploaded voices are stored", flag=True, shown="`~/.cache/voxgate/voices`")
    ] = ""
    # Replicas on different machines share voices through object storage instead of a shared file system.
    voice_store: Annotated[
        str,
        option(
            "`s3://BUCKET/PREFIX` keeps uploaded voices in S3-compatible object storage (endpoint and "
            "credentials from `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, "
            "`AWS_REGION`; needs the `fleet` extra) instead of `voices_dir`; empty for the local folder",
            shown="empty",
        ),
    ] = ""
    max_clip_rate_hz: Annotated[
        int,
        option(
            "the highest rate a reference clip (an upload, an imported voice or an inline `ref_audio`) is "
            "kept at; higher ones are resampled down. 8000-48000: 44100 or 48000 for a Fish Speech or "
            "VoxCPM2 upstream, whose codecs run at those rates (a 30 s clip is then 2.9 MB stored)"
        ),
    ] = 24000
    # A cap on the count keeps listings short; the disk is capped by max_voice_bytes.
    max_voices: Annotated[int, option("uploaded voices allowed per API key", flag=True)] = 1000
    # A clip is stored as mono 16-bit PCM at most at 24 kHz: 30 s is 1.4 MB, 10 s 0.3-0.5 MB, so 256 MiB
    # holds 180 clips of the longest kind, or 500-800 of 10 s.
    max_voice_bytes: Annotated[
        int,
        option(
            "disk bytes of uploaded voices allowed per API key, 0 for no cap (409 `voice_quota_exceeded`)",
            shown="268435456 (256 MiB)",
        ),
    ] = 256 << 20
    # ElevenLabs' pronunciation dictionaries, kept beside the voices: a PLS file of 256 words is stored as
    # a record of 10-40 KiB.
    max_pronunciation_dictionaries: Annotated[
        int,
        option(
            "pronunciation dictionaries allowed per API key (409 `pronunciation_dictionary_limit_reached`)"
        ),
    ] = 100
    max_pronunciation_dictionary_bytes: Annotated[
        int,
        option(
            "bytes of stored pronunciation dictionaries allowed per API key, 0 for no cap "
            "(409 `pronunciation_dictionary_quota_exceeded`)",
            shown="16777216 (16 MiB)",
        ),
    ] = 16 << 20
    api_keys: Annotated[
        tuple[str, ...],
        option(
            "API keys, comma-separated; when any key is set (here or in the keys file), every route under "
            "`/v1/` needs one (`/healthz`, `/health`, `/readyz` and the demo page do not): "
            "`Authorization: Bearer KEY`, or for browsers `?api_key=KEY` or the WebSocket subprotocols "
            "`voxgate, voxgate.key.KEY`",
            shown="none",
        ),
    ] = ()
    metrics_public: Annotated[
        bool,
        option(
            "`GET /metrics` (Prometheus) needs no key; `false` puts it behind the API keys like `/v1/` "
            "(no effect when no key is set)",
            shown="`true`",
        ),
    ] = True
    api_keys_file: Annotated[str, option("file of API keys, one a line (`#` comments)", flag=True)] = ""
    allowed_origins: Annotated[
        tuple[str, ...],
        option(
            "browser origins allowed to open WebSockets and to call REST routes that change state (the "
            "request's `Host` is never trusted: DNS rebinding)",
            flag="--allowed-origin",
            repeat=True,
            shown="loopback origins, and `http(s)://HOST:PORT` when bound to a specific host",
        ),
    ] = ()
    # name -> voice; "" means the engine's default voice.
    voice_aliases: Annotated[
        dict[str, str],
        option(
            'JSON object of extra voice aliases (name → voice, `""` for the default voice), merged over the '
            "defaults; names match in any case",
            shown="OpenAI/vllm-omni names → default voice",
        ),
    ] = msgspec.field(default_factory=lambda: dict(DEFAULT_VOICE_ALIASES))
    #: Each engine's settings by engine name: an instance of ``engine.ENGINES[name].settings``.
    engines: dict[str, Any] = msgspec.field(
        default_factory=lambda: {n: e.settings() for n, e in ENGINES.items()}
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Build settings from ``VOXGATE_*`` variables, then apply explicit overrides (CLI flags).

        Settings of every engine are given flat, by their own names (``upstreams=...``). List settings
        take comma-separated values; ``VOXGATE_VOICE_ALIASES`` is a JSON object merged over the default
        alias table.
        """
        env = os.environ if environ is None else environ
        raw: dict[str, object] = {}
        for opt in options():
            value = env.get(opt.env)
            if value is not None:
                raw[opt.name] = value
        unknown = set(overrides) - {opt.name for opt in options()}
        if unknown:
            raise TypeError(f"unknown setting(s) {sorted(unknown)}")
        raw.update({k: v for k, v in overrides.items() if v is not None})
        for opt in options():
            if isinstance(raw.get(opt.name), str) and typing.get_origin(opt.type) is tuple:
                raw[opt.name] = [v.strip() for v in str(raw[opt.name]).split(",") if v.strip()]
        if isinstance(raw.get("voice_aliases"), str):
            raw["voice_aliases"] = {**DEFAULT_VOICE_ALIASES, **msgspec.json.decode(str(raw["voice_aliases"]))}
        if not raw.get("voices_dir"):
            raw["voices_dir"] = _default_voices_dir(env)
        engines = {
            name: msgspec.convert(_fields(raw, entry.settings), entry.settings, strict=False)
            for name, entry in ENGINES.items()
        }
        gateway = msgspec.convert({**_fields(raw, cls), "engines": {}}, cls, strict=False)
        return msgspec.structs.replace(gateway, engines=engines)

    def engine_settings(self, name: str) -> msgspec.Struct:
        """The settings of engine ``name``, its defaults where none were given."""
        found: msgspec.Struct | None = self.engines.get(name)
        return found if found is not None else ENGINES[name].settings()

    def of(self, kind: type[S]) -> S:
        """The one engine's settings of type ``kind`` (``settings.of(RemoteSettings).upstreams``)."""
        for found in self.engines.values():
            if isinstance(found, kind):
                return found
        return kind()

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


def _fields(raw: Mapping[str, object], kind: type[msgspec.Struct]) -> dict[str, object]:
    return {k: v for k, v in raw.items() if k in kind.__struct_fields__ and k != "engines"}


@functools.cache
def options() -> tuple[Option, ...]:
    """Every declared setting, the gateway's then each engine's: the CLI and the docs are built from these."""
    found = options_of(Settings)
    for name, entry in ENGINES.items():
        found += options_of(entry.settings, group=name)
    return tuple(found)


def markdown_table() -> str:
    """The README's configuration table (``python -m voxgate.gateway.settings`` prints it)."""
    rows = ["| flag | env | default | meaning |", "|---|---|---|---|"]
    for opt in options():
        flag = f"`{opt.flag}`" if opt.flag else ""
        meaning = f"engine `{opt.group}`: {opt.help}" if opt.group else opt.help
        if opt.repeat:
            meaning += " (flag repeatable, variable comma-separated)"
        rows.append(f"| {flag} | `{opt.env}` | {opt.shown_default()} | {meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
