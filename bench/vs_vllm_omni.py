"""The headline comparison: vllm-omni 0.30.0's own WebSocket endpoint against voxgate's, side by side.

Three servers, one CPU engine client (``CpuTtsEngineClient``: Piper audio at 24 kHz, in place of
``AsyncOmni``): ``tests/vllm_omni/server.py`` (vllm-omni's real serving layer over it), ``voxgate serve
--engine remote`` in front of that server (``bench/_serve.py``), and voxgate's in-process engine over the same
client in a process of its own (``tests/vllm_omni/inprocess_gateway.py``: ``--engine vllm-omni``). The same
paragraph streams at LLM pace into each endpoint and concurrency level: TTFA, underruns behind a 150 ms
jitter buffer, the time from a stop (cancel or disconnect) to silence and to the engine's stop, and the
CPU each serving layer spends per streamed audio second (the engine client's synthesis threads left out):
pooled, per round, and voxgate's rounds less vllm-omni's of the same turn. A fifth endpoint sends voxgate
vllm-omni's sentence config with frames of vllm-omni's chunk size: the same work on both sides.

    .venv/bin/python bench/vs_vllm_omni.py [--runs N] [--stop-runs N] [--concurrency 1 4 8] [--json OUT]

Needs the environment ``.ci/vllm_omni_env.sh`` builds; loopback only. What each figure means:
docs/performance.md ("vs_vllm_omni.py"); a measured table: docs/comparison.md. Exits non-zero, with the
reason on stderr, when anything fails: no figure is printed from a broken run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from _client import PATH, Turn, open_session, speak
from _serve import BenchError, Server, free_port, gateway
from _stats import CpuWindow, pct, rotated, thread_cpu_s, write_json
from _text import PARAGRAPH, tokenize
from websockets.exceptions import ConnectionClosed

REPO = Path(__file__).resolve().parents[1]
# The env .ci/vllm_omni_env.sh builds; VOXGATE_VLLM_OMNI_PYTHON overrides it (as in tests/vllm_omni/).
VLLM_ENV = Path.home() / ".cache" / "voxgate" / "vllm-omni-0.30.0"
VLLM_PYTHON = Path(os.environ.get("VOXGATE_VLLM_OMNI_PYTHON") or VLLM_ENV / "bin" / "python")

# About 20 tokens/s: an LLM streaming an answer at a comfortable reading pace.
TOKEN_DELAY_MS = 50.0
JITTER_BUFFER_MS = 150.0
LEVELS = (1, 4, 8)
# Sessions measured per endpoint and level, rounded up to whole rounds of `level` sessions at once.
RUNS = 6
STOP_RUNS = 4
# When the stop comes: the first audio frame received this long after the first audio.
STOP_AFTER_MS = 1000.0
# After audio.cancelled, how long the client keeps listening for stray audio of the cancelled utterance.
DRAIN_S = 0.3
# How long the bench waits for the engine to log the aborts of a round's stopped sessions.
ABORT_WAIT_S = 3.0
SESSION_TIMEOUT_S = 120.0
UPSTREAM_START_S = 300.0
GATEWAY_START_S = 60.0
# The CPU engine client's log lines (tests/vllm_omni/server.py): one per request it starts, and one (or two)
# per request stopped before the end of its audio.
GENERATE_RE = re.compile(r"(?:^|\s)generate (\S+):")
ABORT_RE = re.compile(r"(?:^|\s)abort (\S+)")
# vllm-omni's WebSocket handler, when it notices that its client has gone: after the abort of the request in
# flight, or after that request ran to its end (serving_speech_stream.py).
DISCONNECTED_RE = re.compile(r"Streaming speech: client disconnected")

StopKind = Literal["cancel", "disconnect"]
# The kernel name of the engine client's synthesis threads (tests/vllm_omni/server.py, SYNTH_THREAD): a
# server's CPU less theirs is its serving layer (vllm-omni's, or voxgate's with the in-process engine).
ENGINE_THREADS = "piper-upstream"
# Frames of the voxgate endpoint shaped like vllm-omni's sentence mode: the size of its streamed chunks.
SHAPED_FRAME_MS = 500


@contextlib.contextmanager
def vllm_env_server(name: str, script: str, ready: str) -> Iterator[Server]:
    """``tests/vllm_omni/SCRIPT`` run by vllm-omni's env on the CPU engine client (CustomVoice), ready at
    ``ready``; stopped after."""
    if not VLLM_PYTHON.exists():
        raise BenchError(f"no vllm-omni environment ({VLLM_PYTHON}): run .ci/vllm_omni_env.sh first")
    port = free_port()
    argv = [str(VLLM_PYTHON), f"tests/vllm_omni/{script}", "--port", str(port), "--kind", "CustomVoice"]
    server = Server(name, argv, port, cwd=REPO)
    try:
        server.wait_ready(ready, UPSTREAM_START_S)
        yield server
    finally:
        server.stop(15)


def vllm_omni() -> contextlib.AbstractContextManager[Server]:
    """vllm-omni's own server on its CPU engine client (``tests/vllm_omni/server.py``)."""
    return vllm_env_server("vllm-omni", "server.py", "/health")


def inprocess_gateway() -> contextlib.AbstractContextManager[Server]:
    """voxgate on its in-process engine over the CPU engine client (tests/vllm_omni/inprocess_gateway.py)."""
    return vllm_env_server("voxgate-inprocess", "inprocess_gateway.py", "/readyz")


@dataclass(frozen=True)
class Servers:
    upstream: Server  # vllm-omni's server on the CPU engine client
    remote: Server  # voxgate, --engine remote in front of it
    inprocess: Server  # voxgate, its in-process engine on the same kind of engine client

    def all(self) -> tuple[Server, ...]:
        return (self.upstream, self.remote, self.inprocess)


@contextlib.contextmanager
def servers() -> Iterator[Servers]:
    """The vllm-omni server, a voxgate gateway in front of it and one on the in-process engine."""
    with (
        vllm_omni() as upstream,
        gateway("--engine", "remote", "--upstream", upstream.url(), timeout_s=GATEWAY_START_S) as remote,
        inprocess_gateway() as inprocess,
    ):
        yield Servers(upstream, remote, inprocess)


def upstream_voice(upstream: Server) -> str:
    """vllm-omni's first real voice (``vivian`` on a CustomVoice model), spoken by both endpoints."""
    with urllib.request.urlopen(upstream.url("/v1/audio/voices"), timeout=10.0) as response:
        voices = [v for v in json.load(response).get("voices", []) if v != "default"]
    if not voices:
        raise BenchError("the vllm-omni server lists no voices")
    return "vivian" if "vivian" in voices else str(voices[0])


# -- endpoints and sessions --------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    key: str
    label: str
    url: str
    config: dict[str, Any]
    stops: tuple[StopKind, ...]
    # The line in the engine's server's output (``engine_log``) that says this endpoint's engine work for a
    # stopped session is over: vllm-omni's handler noticing the disconnect; for voxgate, the engine client's
    # abort of its request (in the vllm-omni server, or in voxgate's own process with the in-process engine).
    stopped_re: re.Pattern[str]
    engine_log: Server
    # voxgate's process, whose CPU is its gateway's (less the in-process engine client's synthesis threads).
    gateway: Server | None = None
    # voxgate.v1 offered (voxgate's input.cancel is one of its extensions), session.ready awaited.
    extensions: bool = False


@dataclass
class Session:
    """What one WebSocket session saw (perf_counter seconds), around the client's ``Turn``."""

    stop: StopKind | None = None
    turn: Turn | None = None
    frames: list[tuple[float, float]] = field(default_factory=list)  # (arrival, audio s received so far)
    segments: int = 0
    t_stop: float | None = None
    t_cancelled: float | None = None
    segment_open: bool = False  # an audio.start was received and its audio.done not yet
    busy_at_stop: bool = False  # a segment was open when the stop was sent
    finished_before_stop: bool = False
    engine_stop_ms: float | None = None  # stop -> the endpoint's `stopped_re` line, matched after the round
    failed_segment: dict[str, Any] | None = None  # the first `audio.done` with `error: true`

    @property
    def done(self) -> Turn:
        assert self.turn is not None
        return self.turn

    @property
    def ttfa_ms(self) -> float:
        return self.done.ttfa_ms or math.nan

    @property
    def audio_s(self) -> float:
        return self.done.audio_s

    def underruns_ms(self) -> list[float]:
        """Underruns (ms) of the player (``bench/_client.py``), ``JITTER_BUFFER_MS`` after the first frame."""
        return [u * 1000.0 for u in self.done.player.underruns]

    @property
    def last_word_ms(self) -> float:
        """When the listener hears the last word, in ms from the first ``input.text``."""
        return ((self.done.player.end or 0.0) - self.done.sent[0]) * 1000.0

    @property
    def audio_after_stop_ms(self) -> float:
        assert self.t_stop is not None
        before = max((a for t, a in self.frames if t <= self.t_stop), default=0.0)
        return (self.audio_s - before) * 1000.0

    @property
    def silence_ms(self) -> float:
        """Stop -> the last audio frame received after it (0 when none came)."""
        assert self.t_stop is not None
        return max(0.0, (self.frames[-1][0] - self.t_stop) * 1000.0)


@dataclass(frozen=True)
class Plan:
    tokens: list[str]
    delay_s: float
    stop_after_s: float


async def run_session(
    endpoint: Endpoint, plan: Plan, barrier: asyncio.Barrier, kind: StopKind | None
) -> Session:
    """One session: configure, wait for the others, stream the paragraph and record what arrives.

    A stopped session is cancelled or disconnected at the first audio frame ``stop_after_s`` after its
    first audio; after ``audio.cancelled`` it listens ``DRAIN_S`` more for stray audio.
    """
    session, stop = Session(stop=kind), asyncio.Event()
    stop_from: float | None = None

    def hook(turn: Turn, now: float, data: bytes | dict[str, Any]) -> None:
        nonlocal stop_from
        if isinstance(data, bytes):
            session.frames.append((now, turn.audio_s))
            if kind is not None and not stop.is_set():
                stop_from = stop_from or now + plan.stop_after_s
                if now >= stop_from:
                    stop.set()
            return
        match data.get("type"):
            case "audio.start":
                session.segments += 1
                session.segment_open = True
            case "audio.done" if data.get("error"):
                # Told after the session ends, with the server's error message that says why.
                session.failed_segment = session.failed_segment or data
            case "audio.done":
                session.segment_open = False
            case "audio.cancelled":
                session.t_cancelled = session.t_cancelled or now
            case "session.done" if kind is not None and session.t_stop is None:
                session.finished_before_stop = True

    ws, _ = await open_session(endpoint.url, endpoint.config, extensions=endpoint.extensions)

    async def stopper() -> None:
        await stop.wait()
        session.t_stop = time.perf_counter()
        session.busy_at_stop = session.segment_open
        if kind == "cancel":
            await ws.send(json.dumps({"type": "input.cancel"}))
        else:
            await ws.close()

    async with ws:
        await barrier.wait()
        stopping = asyncio.create_task(stopper())
        try:
            session.turn = await speak(
                ws,
                plan.tokens,
                plan.delay_s,
                jitter_s=JITTER_BUFFER_MS / 1000.0,
                timeout_s=SESSION_TIMEOUT_S,
                drain_s=DRAIN_S,
                stop=stop,
                hook=hook,
            )
        except TimeoutError:
            raise BenchError(
                f"{endpoint.key}: a session did not end within {SESSION_TIMEOUT_S:g} s"
            ) from None
        finally:
            stopping.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await stopping
    turn = session.turn
    if turn.errors:
        code, message = turn.errors[0].get("code", ""), turn.errors[0].get("message")
        raise BenchError(f"{endpoint.key}: server error: {code} {message}")
    if session.failed_segment is not None:
        raise BenchError(f"{endpoint.key}: the engine failed on a segment: {session.failed_segment}")
    if turn.closed and not (kind == "disconnect" and session.t_stop is not None):
        raise BenchError(f"{endpoint.key}: the server closed the session early")
    if not session.frames:
        raise BenchError(f"{endpoint.key}: a session received no audio")
    if kind is None and turn.t_done is None:
        raise BenchError(f"{endpoint.key}: a session ended without session.done")
    return session


async def run_round(endpoint: Endpoint, plan: Plan, sessions: int, kind: StopKind | None) -> list[Session]:
    barrier = asyncio.Barrier(sessions)
    return list(await asyncio.gather(*(run_session(endpoint, plan, barrier, kind) for _ in range(sessions))))


def events(pattern: re.Pattern[str], lines: Sequence[tuple[float, str]]) -> list[float]:
    """When ``pattern`` was logged; a line naming a request (group 1) already seen is not counted again."""
    stamps: list[float] = []
    seen: set[str] = set()
    for stamp, line in lines:
        if found := pattern.search(line):
            if pattern.groups:
                if found[1] in seen:
                    continue
                seen.add(found[1])
            stamps.append(stamp)
    return stamps


def match_stops(sessions: Sequence[Session], stamps: Sequence[float]) -> None:
    """Give each stopped session, in the order of their stops, the first line after its stop not yet taken."""
    taken = 0
    for session in sorted((s for s in sessions if s.t_stop is not None), key=lambda s: s.t_stop or 0.0):
        assert session.t_stop is not None
        while taken < len(stamps) and stamps[taken] < session.t_stop:
            taken += 1
        if taken == len(stamps):
            break
        session.engine_stop_ms = (stamps[taken] - session.t_stop) * 1000.0
        taken += 1


async def stop_round(
    endpoint: Endpoint, plan: Plan, sessions: int, kind: StopKind
) -> tuple[list[Session], int]:
    """A round of stopped sessions, matched to the engine's lines; also how many requests were aborted."""
    upstream = endpoint.engine_log
    mark = upstream.mark()
    results = await run_round(endpoint, plan, sessions, kind)
    stops = [s.t_stop for s in results if s.t_stop is not None]
    # Lines from before the first stop (a previous round's sessions closing) do not count.
    first = min(stops, default=math.inf)
    deadline = time.perf_counter() + ABORT_WAIT_S
    while time.perf_counter() < deadline:
        if len([t for t in events(endpoint.stopped_re, upstream.lines(mark)) if t >= first]) >= len(stops):
            break
        await asyncio.sleep(0.1)
    lines = upstream.lines(mark)
    match_stops(results, events(endpoint.stopped_re, lines))
    return results, len(events(ABORT_RE, lines))


# -- statistics and report -----------------------------------------------------------------------------


@dataclass
class CpuShare:
    """CPU seconds one endpoint's streaming rounds cost each side, and the audio seconds they streamed."""

    # Per round, in the order they ran: (serving_s, gateway_s, audio_s). serving_s: the vllm-omni server's
    # CPU less its synthesis threads (its serving layer); gateway_s: the endpoint's voxgate process, less any
    # synthesis threads.
    rounds: list[tuple[float, float, float]] = field(default_factory=list)

    @property
    def audio_s(self) -> float:
        return sum(a for _, _, a in self.rounds)

    def per_audio_s_ms(self) -> dict[str, float]:
        audio = self.audio_s or math.nan
        return {
            "vllm_omni_serving": sum(s for s, _, _ in self.rounds) * 1000.0 / audio,
            "voxgate_gateway": sum(g for _, g, _ in self.rounds) * 1000.0 / audio,
        }


def own_ms(endpoint: Endpoint, shares: dict[str, CpuShare]) -> list[float]:
    """Per round, ms CPU per audio s of the endpoint's own serving layer (voxgate's or vllm-omni's)."""
    gateway = endpoint.gateway is not None
    return [(g if gateway else s) * 1000.0 / (a or math.nan) for s, g, a in shares[endpoint.key].rounds]


def spread(values: Sequence[float]) -> str:
    """``median (min-max)`` of per-round figures."""
    if not values:
        return "—"
    return f"{pct(values, 50):.2f} ({min(values):.2f}-{max(values):.2f})"


def cpu_rows(endpoints: Sequence[Endpoint], shares: dict[str, CpuShare]) -> list[str]:
    rows = [
        "| endpoint | audio s streamed | vllm-omni serving layer, ms CPU per audio s"
        " | voxgate gateway, ms CPU per audio s | its own layer, per round: median (range) |",
        "|---|---|---|---|---|",
    ]
    for endpoint in endpoints:
        share = shares[endpoint.key]
        per = share.per_audio_s_ms()
        gateway = f"{per['voxgate_gateway']:.1f}" if endpoint.gateway is not None else "—"
        rows.append(
            f"| {endpoint.label} | {share.audio_s:.0f} | {per['vllm_omni_serving']:.1f} | {gateway}"
            f" | {spread(own_ms(endpoint, shares))} ({len(share.rounds)} rounds) |"
        )
    return rows


def paired(endpoints: Sequence[Endpoint], shares: dict[str, CpuShare]) -> dict[str, dict[str, Any]]:
    """Each voxgate endpoint's own layer against each vllm-omni mode's, round by round.

    Rounds are paired by their index: round r of every endpoint ran in the same turn of the rotation, within
    a minute of each other, so a pair shares the machine's load. Per pair: voxgate's figure less vllm-omni's.
    """
    out: dict[str, dict[str, Any]] = {}
    ours = [e for e in endpoints if e.gateway is not None]
    theirs = [e for e in endpoints if e.gateway is None]
    for mine in ours:
        for peer in theirs:
            diffs = [a - b for a, b in zip(own_ms(mine, shares), own_ms(peer, shares), strict=False)]
            out[f"{mine.key}-{peer.key}"] = {
                "rounds": len(diffs),
                "at_or_under": sum(d <= 0 for d in diffs),
                "median_ms": pct(diffs, 50),
                "min_ms": min(diffs, default=math.nan),
                "max_ms": max(diffs, default=math.nan),
            }
    return out


def paired_rows(pairs: dict[str, dict[str, Any]]) -> list[str]:
    rows = [
        "| voxgate - vllm-omni, same turn | rounds | voxgate at or under | median difference, ms | range |",
        "|---|---|---|---|---|",
    ]
    for key, p in pairs.items():
        rows.append(
            f"| {key} | {p['rounds']} | {p['at_or_under']} | {p['median_ms']:+.2f}"
            f" | {p['min_ms']:+.2f} to {p['max_ms']:+.2f} |"
        )
    return rows


def fmt(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.0f}"


def stream_rows(endpoints: Sequence[Endpoint], results: dict[tuple[str, int], list[Session]]) -> list[str]:
    rows = [
        "| endpoint | sessions at once | n | TTFA p50 ms | TTFA p95 ms | sessions with an underrun"
        " | underruns | underrun ms per session p50 / p95 / max | last word heard p50 / p95 s | audio s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for endpoint in endpoints:
        for (key, level), sessions in results.items():
            if key != endpoint.key:
                continue
            ttfa = [s.ttfa_ms for s in sessions]
            under = [s.underruns_ms() for s in sessions]
            totals = [sum(u) for u in under]
            ends = [s.last_word_ms / 1000.0 for s in sessions]
            rows.append(
                f"| {endpoint.label} | {level} | {len(sessions)}"
                f" | {fmt(pct(ttfa, 50))} | {fmt(pct(ttfa, 95))}"
                f" | {sum(1 for u in under if u)} | {sum(len(u) for u in under)}"
                f" | {fmt(pct(totals, 50))} / {fmt(pct(totals, 95))} / {fmt(max(totals))}"
                f" | {pct(ends, 50):.1f} / {pct(ends, 95):.1f}"
                f" | {pct([s.audio_s for s in sessions], 50):.1f} |"
            )
    return rows


def stop_rows(
    endpoints: Sequence[Endpoint],
    results: dict[tuple[str, StopKind, int], list[Session]],
    aborted: dict[tuple[str, StopKind, int], int],
) -> list[str]:
    rows = [
        "| endpoint | stop | sessions at once | n | stop → last audio byte p50 / p95 ms"
        " | audio after stop p50 / p95 ms | stop → audio.cancelled p50 ms"
        " | stop → engine done p50 / p95 ms (found) | requests aborted | segment open at stop |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for endpoint in endpoints:
        for (key, kind, level), sessions in results.items():
            if key != endpoint.key:
                continue
            stopped = [s for s in sessions if s.t_stop is not None]
            done = [s.engine_stop_ms for s in stopped if s.engine_stop_ms is not None]
            if kind == "cancel":
                silence = [s.silence_ms for s in stopped]
                late = [s.audio_after_stop_ms for s in stopped]
                acks = [(s.t_cancelled - (s.t_stop or 0.0)) * 1000.0 for s in stopped if s.t_cancelled]
                client = f"{fmt(pct(silence, 50))} / {fmt(pct(silence, 95))}"
                heard = f"{fmt(pct(late, 50))} / {fmt(pct(late, 95))}"
                ack = fmt(pct(acks, 50))
            else:
                client = heard = ack = "— (client gone)"
            note = f" ({len(sessions) - len(stopped)} ended first)" if len(stopped) < len(sessions) else ""
            rows.append(
                f"| {endpoint.label} | {kind} | {level} | {len(stopped)}{note} | {client} | {heard} | {ack}"
                f" | {fmt(pct(done, 50))} / {fmt(pct(done, 95))} ({len(done)} of {len(stopped)})"
                f" | {aborted[key, kind, level]}"
                f" | {sum(1 for s in stopped if s.busy_at_stop)} of {len(stopped)} |"
            )
    return rows


def _session_json(s: Session) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ttfa_ms": s.ttfa_ms,
        "segments": s.segments,
        "audio_s": s.audio_s,
        "frames": len(s.frames),
        "underruns_ms": s.underruns_ms(),
        "last_word_heard_ms": s.last_word_ms,
    }
    if s.stop is not None:
        out.update(
            stop=s.stop,
            stopped=s.t_stop is not None,
            t_stop=s.t_stop,  # perf_counter, as the stamps of --log-dir
            busy_at_stop=s.busy_at_stop,
            engine_stop_ms=s.engine_stop_ms,
            silence_ms=s.silence_ms if s.t_stop is not None else None,
            cancelled_ms=(s.t_cancelled - s.t_stop) * 1000.0 if s.t_cancelled and s.t_stop else None,
        )
    return out


# -- main ----------------------------------------------------------------------------------------------


def endpoints_for(servers: Servers, voice: str) -> list[Endpoint]:
    upstream = servers.upstream
    vllm = upstream.url(PATH, "ws")
    # stream_audio spelled out for all: vllm-omni's default is false, voxgate's depends on the format.
    common = {"voice": voice, "response_format": "pcm", "stream_audio": True}
    none, sentence = (
        'vllm-omni, `split_granularity: "none"` (its default)',
        'vllm-omni, `split_granularity: "sentence"`',
    )
    return [
        Endpoint("vllm-omni-none", none, vllm, dict(common), ("disconnect",), DISCONNECTED_RE, upstream),
        Endpoint(
            "vllm-omni-sentence",
            sentence,
            vllm,
            {**common, "split_granularity": "sentence"},
            ("disconnect",),
            DISCONNECTED_RE,
            upstream,
        ),
        Endpoint(
            "voxgate",
            "voxgate (`--engine remote` in front of it; defaults)",
            servers.remote.url(PATH, "ws"),
            dict(common),
            ("cancel", "disconnect"),
            ABORT_RE,
            upstream,
            servers.remote,
            extensions=True,
        ),
        Endpoint(
            "voxgate-inprocess",
            "voxgate (`--engine vllm-omni` in-process, the same engine client; defaults)",
            servers.inprocess.url(PATH, "ws"),
            dict(common),
            ("cancel", "disconnect"),
            ABORT_RE,
            servers.inprocess,
            servers.inprocess,
            extensions=True,
        ),
        # vllm-omni's sentence session sent to voxgate (no eager first segment), with frames the size of
        # vllm-omni's chunks: the same work as vllm-omni's sentence mode, so the CPU of the two layers
        # compares without the price of voxgate's defaults (earlier audio, finer frames). No stop rounds.
        Endpoint(
            "voxgate-inprocess-sentence",
            'voxgate (in-process; vllm-omni\'s `split_granularity: "sentence"`, `frame_ms: 500`)',
            servers.inprocess.url(PATH, "ws"),
            {**common, "split_granularity": "sentence", "frame_ms": SHAPED_FRAME_MS},
            (),
            ABORT_RE,
            servers.inprocess,
            servers.inprocess,
            extensions=True,
        ),
    ]


async def measure(args: argparse.Namespace, servers: Servers) -> dict[str, Any]:
    upstream = servers.upstream
    voice = upstream_voice(upstream)
    endpoints = endpoints_for(servers, voice)
    plan = Plan(tokenize(PARAGRAPH), args.token_delay_ms / 1000.0, args.stop_after_ms / 1000.0)
    for endpoint in endpoints:  # warm-up: first-use costs on every side
        await run_round(endpoint, plan, 1, None)
    streaming: dict[tuple[str, int], list[Session]] = {}
    stopping: dict[tuple[str, StopKind, int], list[Session]] = {}
    aborted: dict[tuple[str, StopKind, int], int] = {}
    marks = {server.name: server.mark() for server in (upstream, servers.inprocess)}
    window = CpuWindow(lambda: sum(server.cpu_s() for server in servers.all()) + time.process_time())
    load_before = os.getloadavg()
    shares = {e.key: CpuShare() for e in endpoints}

    def serving(server: Server | None) -> float:
        """A server's CPU less the engine client's synthesis threads in it (none in the remote gateway)."""
        return 0.0 if server is None else server.cpu_s() - thread_cpu_s(server.pid, ENGINE_THREADS)

    for level in args.concurrency:
        for r in range(math.ceil(args.runs / level)):
            for endpoint in rotated(endpoints, r):
                serving0, gateway0 = serving(upstream), serving(endpoint.gateway)
                got = await run_round(endpoint, plan, level, None)
                serving1, gateway1 = serving(upstream), serving(endpoint.gateway)
                audio_s = sum(s.audio_s for s in got)
                shares[endpoint.key].rounds.append((serving1 - serving0, gateway1 - gateway0, audio_s))
                streaming.setdefault((endpoint.key, level), []).extend(got)
                worst = max(s.ttfa_ms for s in got)
                print(f"  {endpoint.key} x{level}: worst TTFA {worst:.0f} ms", file=sys.stderr)
        for r in range(math.ceil(args.stop_runs / level)):
            for endpoint in rotated(endpoints, r):
                for kind in endpoint.stops:
                    got, aborts = await stop_round(endpoint, plan, level, kind)
                    stopping.setdefault((endpoint.key, kind, level), []).extend(got)
                    aborted[endpoint.key, kind, level] = aborted.get((endpoint.key, kind, level), 0) + aborts
                    print(f"  {endpoint.key} x{level} {kind}: done", file=sys.stderr)
    elapsed, busy, bench_cores = window.cores()
    pairs = paired(endpoints, shares)
    requests = sum(
        1
        for server in (upstream, servers.inprocess)
        for _, line in server.lines(marks[server.name])
        if GENERATE_RE.search(line)
    )
    meta = {
        "paragraph": PARAGRAPH,
        "tokens": len(plan.tokens),
        "token_delay_ms": args.token_delay_ms,
        "jitter_buffer_ms": JITTER_BUFFER_MS,
        "stop_after_ms": args.stop_after_ms,
        "voice": voice,
        "concurrency": list(args.concurrency),
        "runs": args.runs,
        "stop_runs": args.stop_runs,
        "cpus": os.cpu_count(),
        "measured_s": round(elapsed, 1),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "busy_cores": round(busy, 2),
        "bench_cores": round(bench_cores, 2),
        "other_cores": round(max(0.0, busy - bench_cores), 2),
        "engine_requests": requests,
        "cpu_ms_per_audio_s": {key: share.per_audio_s_ms() for key, share in shares.items()},
        "cpu_ms_per_audio_s_rounds": {e.key: own_ms(e, shares) for e in endpoints},
        "cpu_paired": pairs,
    }
    print()
    print(
        f"{len(plan.tokens)} tokens every {args.token_delay_ms:g} ms, voice {voice!r}, "
        f"{JITTER_BUFFER_MS:g} ms jitter buffer, stop {args.stop_after_ms:g} ms after the first audio"
    )
    print()
    print("\n".join(stream_rows(endpoints, streaming)))
    print()
    print("\n".join(stop_rows(endpoints, stopping, aborted)))
    print()
    print("CPU of the streaming rounds (all levels), the engine client's synthesis threads left out:")
    print()
    print("\n".join(cpu_rows(endpoints, shares)))
    print()
    print("\n".join(paired_rows(pairs)))
    print()
    print(
        f"measured in {elapsed:.0f} s on {os.cpu_count()} CPUs; load average before "
        f"{', '.join(f'{x:.2f}' for x in load_before)}, after "
        f"{', '.join(f'{x:.2f}' for x in meta['load_average_after'])}; busy cores {busy:.2f}, of which "
        f"this bench (client and the three servers) {bench_cores:.2f}, "
        f"other processes {meta['other_cores']:.2f}"
    )
    return {
        "meta": meta,
        "endpoints": {e.key: {"label": e.label, "config": e.config} for e in endpoints},
        "streaming": {f"{k}@{lvl}": [_session_json(s) for s in v] for (k, lvl), v in streaming.items()},
        "requests_aborted": {f"{k}/{kd}@{lvl}": n for (k, kd, lvl), n in aborted.items()},
        "stopping": {
            f"{k}/{kd}@{lvl}": [_session_json(s) for s in v] for (k, kd, lvl), v in stopping.items()
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=RUNS, help="sessions per endpoint, level")
    parser.add_argument("--stop-runs", type=int, default=STOP_RUNS, help="stops per endpoint, level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(LEVELS), help="sessions at once")
    parser.add_argument("--token-delay-ms", type=float, default=TOKEN_DELAY_MS)
    parser.add_argument("--stop-after-ms", type=float, default=STOP_AFTER_MS)
    parser.add_argument("--json", help="write every sample and the run's settings here")
    parser.add_argument("--log-dir", type=Path, help="write both servers' output here, lines time-stamped")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        print(
            "starting the vllm-omni server and two voxgate gateways (remote, in-process) ...", file=sys.stderr
        )
        with servers() as running:
            try:
                out = asyncio.run(measure(args, running))
            finally:
                if args.log_dir:
                    args.log_dir.mkdir(parents=True, exist_ok=True)
                    for server in running.all():
                        server.save(args.log_dir / f"{server.name}.log")
    except (BenchError, OSError, ConnectionClosed) as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    print(f"elapsed {time.perf_counter() - started:.0f} s")
    write_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
