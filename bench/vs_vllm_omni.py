"""The headline comparison: vllm-omni 0.30.0's own WebSocket endpoint against voxgate's, side by side.

Both endpoints run on the same engine. ``tests/vllm_omni/server.py`` serves vllm-omni 0.30.0's real HTTP and
WebSocket layer with only its engine client replaced, by a CPU one that speaks Piper audio at 24 kHz. A
``voxgate serve --engine remote`` gateway is put in front of that same server. Then, for each endpoint and
concurrency level, the same paragraph is streamed token by token at LLM pace (20 tokens/s), and the bench
records:

- time to first audio (TTFA): first ``input.text`` sent -> first binary audio frame received;
- underruns of a player that plays the audio in real time behind a 150 ms jitter buffer, between the first
  and the last audio frame (count and total ms);
- time from a stop to silence. voxgate stops with ``input.cancel``: the bench measures when the last audio
  byte arrives after it, and when the engine client logs the abort of voxgate's upstream request. vllm-omni
  has no cancel, so the client disconnects, and the bench reads from the server's log when vllm-omni's
  handler has stopped working for it (``Streaming speech: client disconnected``, logged after the abort of
  the request in flight, or after that request's end). voxgate is measured with a disconnect too.

The endpoints are vllm-omni with its default ``split_granularity: "none"`` (it buffers until
``input.done``), vllm-omni with ``split_granularity: "sentence"``, and voxgate with its defaults.

    .venv/bin/python bench/vs_vllm_omni.py [--runs N] [--stop-runs N] [--concurrency 1 4 8] [--json OUT]

Loopback only. It needs the vllm-omni environment that ``.ci/vllm_omni_env.sh`` builds. See
``docs/comparison.md`` for a measured table and ``bench/README.md`` for what each figure means.
Exits non-zero, with the reason on stderr, when anything fails: no figure is printed from a broken run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from _serve import free_port
from _text import PARAGRAPH, tokenize
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

REPO = Path(__file__).resolve().parents[1]
# The env .ci/vllm_omni_env.sh builds; VOXGATE_VLLM_OMNI_PYTHON overrides it (as in tests/vllm_omni/).
VLLM_ENV = Path.home() / ".cache" / "voxgate" / "vllm-omni-0.30.0"
VLLM_PYTHON = Path(os.environ.get("VOXGATE_VLLM_OMNI_PYTHON") or VLLM_ENV / "bin" / "python")
VOXGATE = Path(sys.executable).parent / "voxgate"
PATH = "/v1/audio/speech/stream"

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


class BenchError(Exception):
    """The benchmark could not measure what it claims to measure."""


# -- processes ---------------------------------------------------------------------------------------


class Server:
    """A subprocess in its own process group; every line it prints is kept with its arrival time."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            list(argv),
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self._lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"log-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            stamp = time.perf_counter()
            with self._lock:
                self._lines.append((stamp, line.rstrip("\n")))

    def lines(self, since: int = 0) -> list[tuple[float, str]]:
        with self._lock:
            return self._lines[since:]

    def mark(self) -> int:
        with self._lock:
            return len(self._lines)

    def save(self, path: Path) -> None:
        """The output so far, each line after its arrival time (perf_counter seconds, as the sessions')."""
        path.write_text("".join(f"{stamp:.4f} {line}\n" for stamp, line in self.lines()))

    def tail(self, n: int = 40) -> str:
        return "\n".join(line for _, line in self.lines()[-n:])

    def wait_http(self, url: str, timeout_s: float) -> None:
        """Poll ``url`` until it answers 200; fail if the process exits or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: {url} not ready within {timeout_s:g} s:\n{self.tail()}")
            time.sleep(0.5)

    def cpu_s(self) -> float:
        """CPU seconds used so far by the live processes of this server's process group."""
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text(encoding="ascii", errors="replace").rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.proc.pid:  # pgrp
                total += int(fields[11]) + int(fields[12])  # utime + stime
        return total / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._reader.join(5)


@contextlib.contextmanager
def servers() -> Iterator[tuple[Server, Server]]:
    """The vllm-omni server (CPU engine client) and a voxgate gateway in front of it."""
    if not VLLM_PYTHON.exists():
        raise BenchError(f"no vllm-omni environment ({VLLM_PYTHON}): run .ci/vllm_omni_env.sh first")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    upstream_port, gateway_port = free_port(), free_port()
    started: list[Server] = []
    voices_dir = tempfile.mkdtemp(prefix="voxgate-bench-voices-")  # the gateway's, empty
    try:
        upstream = Server(
            "vllm-omni",
            [str(VLLM_PYTHON), "tests/vllm_omni/server.py", "--port", str(upstream_port)]
            + ["--kind", "CustomVoice"],
            env,
        )
        started.append(upstream)
        upstream.wait_http(f"http://127.0.0.1:{upstream_port}/health", UPSTREAM_START_S)
        gateway = Server(
            "voxgate",
            [str(VOXGATE), "serve", "--engine", "remote", "--upstream", f"http://127.0.0.1:{upstream_port}"]
            + ["--port", str(gateway_port), "--voices-dir", voices_dir],
            env,
        )
        started.append(gateway)
        gateway.wait_http(f"http://127.0.0.1:{gateway_port}/readyz", GATEWAY_START_S)
        yield upstream, gateway
    finally:
        for server in reversed(started):
            server.stop()
        shutil.rmtree(voices_dir, ignore_errors=True)


def upstream_voice(port: int) -> str:
    """vllm-omni's first real voice (``vivian`` on a CustomVoice model), spoken by both endpoints."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/audio/voices", timeout=10.0) as response:
        voices = [v for v in json.load(response).get("voices", []) if v != "default"]
    if not voices:
        raise BenchError("the vllm-omni server lists no voices")
    return "vivian" if "vivian" in voices else str(voices[0])


def port_of(server: Server) -> int:
    argv = server.proc.args
    assert isinstance(argv, list)
    return int(argv[argv.index("--port") + 1])


# -- endpoints and sessions --------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    key: str
    label: str
    url: str
    config: dict[str, Any]
    stops: tuple[StopKind, ...]
    # The line in the vllm-omni server's output that says this endpoint's engine work for a stopped session
    # is over: vllm-omni's handler noticing the disconnect; for voxgate, the abort of its upstream request.
    stopped_re: re.Pattern[str]
    # WebSocket subprotocols offered: voxgate's input.cancel is a voxgate.v1 extension.
    subprotocols: tuple[str, ...] = ()


@dataclass(frozen=True)
class Frame:
    t: float  # client perf_counter when received
    audio_s: float


@dataclass
class Session:
    """What one WebSocket session saw (perf_counter seconds)."""

    t_first_text: float = 0.0
    frames: list[Frame] = field(default_factory=list)
    t_session_done: float | None = None
    segments: int = 0
    stop: StopKind | None = None
    t_stop: float | None = None
    t_cancelled: float | None = None
    segment_open: bool = False  # an audio.start was received and its audio.done not yet
    busy_at_stop: bool = False  # a segment was open when the stop was sent
    finished_before_stop: bool = False
    engine_stop_ms: float | None = None  # stop -> the endpoint's `stopped_re` line, matched after the round

    @property
    def ttfa_ms(self) -> float:
        return (self.frames[0].t - self.t_first_text) * 1000.0

    @property
    def audio_s(self) -> float:
        return sum(f.audio_s for f in self.frames)

    def playback(self, jitter_ms: float = JITTER_BUFFER_MS) -> tuple[list[float], float]:
        """Underruns (ms) of a player starting ``jitter_ms`` after the first frame arrives, and its end.

        It plays every frame back to back in real time; a frame that arrives after everything before it has
        played is an underrun, and playback resumes as soon as that frame is there. The end is in ms from
        the first ``input.text``: when the listener hears the last word.
        """
        underruns: list[float] = []
        play_end = self.frames[0].t + jitter_ms / 1000.0
        for frame in self.frames:
            if frame.t > play_end:
                underruns.append((frame.t - play_end) * 1000.0)
                play_end = frame.t
            play_end += frame.audio_s
        return underruns, (play_end - self.t_first_text) * 1000.0

    def underruns_ms(self) -> list[float]:
        return self.playback()[0]

    def after_stop(self) -> list[Frame]:
        assert self.t_stop is not None
        return [f for f in self.frames if f.t > self.t_stop]

    @property
    def silence_ms(self) -> float:
        """Stop -> the last audio frame received after it (0 when none came)."""
        assert self.t_stop is not None
        late = self.after_stop()
        return (late[-1].t - self.t_stop) * 1000.0 if late else 0.0


@dataclass(frozen=True)
class Plan:
    tokens: list[str]
    delay_s: float
    stop_after_s: float


def _as_dict(message: str | bytes) -> dict[str, Any]:
    if isinstance(message, bytes):
        raise BenchError(f"expected a JSON message, got {len(message)} bytes of audio")
    data = json.loads(message)
    if not isinstance(data, dict):
        raise BenchError(f"expected a JSON object, got {message[:200]!r}")
    return data


async def _send_text(
    ws: ClientConnection, plan: Plan, session: Session, stop: asyncio.Event, kind: StopKind | None
) -> None:
    """Stream the tokens at a fixed cadence, then input.done; on ``stop``, cancel or disconnect."""
    next_t = time.perf_counter()
    interrupted = False
    for i, token in enumerate(plan.tokens):
        pause = next_t - time.perf_counter()
        if pause > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)
        if stop.is_set():
            interrupted = True
            break
        if i == 0:
            session.t_first_text = time.perf_counter()
        await ws.send(json.dumps({"type": "input.text", "text": token}))
        next_t += plan.delay_s  # a fixed cadence, so the cost of sending does not slow the stream
    if not interrupted:
        await ws.send(json.dumps({"type": "input.done"}))
    if kind is None:
        return
    await stop.wait()
    session.t_stop = time.perf_counter()
    session.busy_at_stop = session.segment_open
    if kind == "cancel":
        await ws.send(json.dumps({"type": "input.cancel"}))
    else:
        await ws.close()


async def run_session(
    endpoint: Endpoint, plan: Plan, barrier: asyncio.Barrier, kind: StopKind | None
) -> Session:
    """One session: configure, wait for the others, stream the paragraph and record what arrives."""
    session = Session(stop=kind)
    stop = asyncio.Event()
    async with connect(
        endpoint.url,
        subprotocols=[Subprotocol(p) for p in endpoint.subprotocols] or None,
        max_size=None,
        open_timeout=30,
        close_timeout=2,
    ) as ws:
        await ws.send(json.dumps({"type": "session.config", **endpoint.config}))
        await barrier.wait()
        sender = asyncio.create_task(_send_text(ws, plan, session, stop, kind))
        try:
            await asyncio.wait_for(_receive(ws, session, stop, plan), SESSION_TIMEOUT_S)
        except TimeoutError:
            raise BenchError(
                f"{endpoint.key}: a session did not end within {SESSION_TIMEOUT_S:g} s"
            ) from None
        finally:
            if not sender.done():
                sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await sender
    if not session.frames:
        raise BenchError(f"{endpoint.key}: a session received no audio")
    if kind is None and session.t_session_done is None:
        raise BenchError(f"{endpoint.key}: a session ended without session.done")
    return session


async def _receive(ws: ClientConnection, session: Session, stop: asyncio.Event, plan: Plan) -> None:
    rate = 0
    stop_from: float | None = None  # the stop fires at the first frame received after this time
    drain_until: float | None = None
    while True:
        try:
            if drain_until is not None:
                message = await asyncio.wait_for(ws.recv(), max(0.0, drain_until - time.perf_counter()))
            else:
                message = await ws.recv()
        except TimeoutError:
            return  # the drain after audio.cancelled is over
        except ConnectionClosed:
            if session.stop == "disconnect" and session.t_stop is not None:
                return
            raise BenchError("the server closed the session early") from None
        now = time.perf_counter()
        if isinstance(message, bytes):
            if not rate:
                raise BenchError("audio arrived before any audio.start")
            session.frames.append(Frame(now, len(message) / 2 / rate))  # s16le mono
            if session.stop is not None and not stop.is_set():
                if stop_from is None:
                    stop_from = now + plan.stop_after_s
                elif now >= stop_from:
                    stop.set()
            continue
        data = _as_dict(message)
        match data.get("type"):
            case "session.ready":
                pass  # voxgate's; a session may or may not get one
            case "audio.start":
                rate = int(data.get("sample_rate") or 0)
                if not rate:
                    raise BenchError(f"audio.start without a sample_rate: {data}")
                session.segments += 1
                session.segment_open = True
            case "audio.done":
                if data.get("error"):
                    raise BenchError(f"the engine failed on a segment: {data}")
                session.segment_open = False
            case "session.done":
                session.t_session_done = now
                if session.stop is not None and session.t_stop is None:
                    session.finished_before_stop = True
                return
            case "audio.cancelled":
                if session.t_cancelled is None:
                    session.t_cancelled = now
                    drain_until = now + DRAIN_S
            case "error":
                raise BenchError(f"server error: {data.get('code', '')} {data.get('message')}")
            case other:
                raise BenchError(f"unexpected message {other!r}")


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
    endpoint: Endpoint, plan: Plan, sessions: int, kind: StopKind, upstream: Server
) -> tuple[list[Session], int]:
    """A round of stopped sessions, matched to the server's lines; also how many requests were aborted."""
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


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else math.nan


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
            ends = [s.playback()[1] / 1000.0 for s in sessions]
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
                late = [sum(f.audio_s for f in s.after_stop()) * 1000.0 for s in stopped]
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
        "last_word_heard_ms": s.playback()[1],
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


def _busy_cpu_s() -> float:
    fields = Path("/proc/stat").read_text(encoding="ascii").splitlines()[0].split()
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def endpoints_for(upstream_port: int, gateway_port: int, voice: str) -> list[Endpoint]:
    vllm = f"ws://127.0.0.1:{upstream_port}{PATH}"
    # stream_audio spelled out for all: vllm-omni's default is false, voxgate's depends on the format.
    common = {"voice": voice, "response_format": "pcm", "stream_audio": True}
    return [
        Endpoint(
            "vllm-omni-none",
            'vllm-omni, `split_granularity: "none"` (its default)',
            vllm,
            dict(common),
            ("disconnect",),
            DISCONNECTED_RE,
        ),
        Endpoint(
            "vllm-omni-sentence",
            'vllm-omni, `split_granularity: "sentence"`',
            vllm,
            {**common, "split_granularity": "sentence"},
            ("disconnect",),
            DISCONNECTED_RE,
        ),
        Endpoint(
            "voxgate",
            "voxgate (`--engine remote` in front of it; defaults)",
            f"ws://127.0.0.1:{gateway_port}{PATH}",
            dict(common),
            ("cancel", "disconnect"),
            ABORT_RE,
            ("voxgate.v1",),
        ),
    ]


async def measure(args: argparse.Namespace, upstream: Server, gateway: Server) -> dict[str, Any]:
    voice = upstream_voice(port_of(upstream))
    endpoints = endpoints_for(port_of(upstream), port_of(gateway), voice)
    plan = Plan(tokenize(PARAGRAPH), args.token_delay_ms / 1000.0, args.stop_after_ms / 1000.0)
    for endpoint in endpoints:  # warm-up: first-use costs on every side
        await run_round(endpoint, plan, 1, None)
    streaming: dict[tuple[str, int], list[Session]] = {}
    stopping: dict[tuple[str, StopKind, int], list[Session]] = {}
    aborted: dict[tuple[str, StopKind, int], int] = {}
    mark = upstream.mark()
    busy0, own0, t0 = _busy_cpu_s(), time.process_time(), time.perf_counter()
    bench0 = upstream.cpu_s() + gateway.cpu_s()
    load_before = os.getloadavg()
    for level in args.concurrency:
        for r in range(math.ceil(args.runs / level)):
            for i in range(len(endpoints)):  # rotate the order, so drifting load favours no endpoint
                endpoint = endpoints[(i + r) % len(endpoints)]
                got = await run_round(endpoint, plan, level, None)
                streaming.setdefault((endpoint.key, level), []).extend(got)
                worst = max(s.ttfa_ms for s in got)
                print(f"  {endpoint.key} x{level}: worst TTFA {worst:.0f} ms", file=sys.stderr)
        for r in range(math.ceil(args.stop_runs / level)):
            for i in range(len(endpoints)):
                endpoint = endpoints[(i + r) % len(endpoints)]
                for kind in endpoint.stops:
                    got, aborts = await stop_round(endpoint, plan, level, kind, upstream)
                    stopping.setdefault((endpoint.key, kind, level), []).extend(got)
                    aborted[endpoint.key, kind, level] = aborted.get((endpoint.key, kind, level), 0) + aborts
                    print(f"  {endpoint.key} x{level} {kind}: done", file=sys.stderr)
    elapsed = time.perf_counter() - t0
    busy = (_busy_cpu_s() - busy0) / elapsed
    bench_cores = (upstream.cpu_s() + gateway.cpu_s() - bench0 + time.process_time() - own0) / elapsed
    requests = sum(1 for _, line in upstream.lines(mark) if GENERATE_RE.search(line))
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
    print(
        f"measured in {elapsed:.0f} s on {os.cpu_count()} CPUs; load average before "
        f"{', '.join(f'{x:.2f}' for x in load_before)}, after "
        f"{', '.join(f'{x:.2f}' for x in meta['load_average_after'])}; busy cores {busy:.2f}, of which "
        f"this bench (client and both servers) {bench_cores:.2f}, other processes {meta['other_cores']:.2f}"
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
    parser.add_argument("--json", type=Path, help="write every sample and the run's settings here")
    parser.add_argument("--log-dir", type=Path, help="write both servers' output here, lines time-stamped")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        print("starting the vllm-omni server and a voxgate gateway in front of it ...", file=sys.stderr)
        with servers() as (upstream, gateway):
            try:
                out = asyncio.run(measure(args, upstream, gateway))
            finally:
                if args.log_dir:
                    args.log_dir.mkdir(parents=True, exist_ok=True)
                    for server in (upstream, gateway):
                        server.save(args.log_dir / f"{server.name}.log")
    except (BenchError, OSError, ConnectionClosed) as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    print(f"elapsed {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
