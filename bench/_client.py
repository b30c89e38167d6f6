"""The WebSocket client every bench speaks with: open a session, stream text at an LLM's pace, play the audio.

The player: playback starts ``jitter_s`` after a turn's first audio frame arrives and plays every frame back
to back in real time. A frame that arrives after everything before it has played is an underrun (its
lateness is the underrun's length), and playback resumes as soon as it is there. It is computed from the
arrival times, so nothing sleeps for playback. The second half is ``bench/load.py``'s worker process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from _text import tokenize
from voxgate.protocol.audio import BYTES_PER_SAMPLE
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

PATH = "/v1/audio/speech/stream"
EXTENSIONS = "voxgate.v1"
# Handshakes at once per load worker: thousands of simultaneous connects overflow the listen backlog.
CONNECT_CONCURRENCY = 32
# How often the loop-lag probe wakes: its oversleep shows a worker that cannot keep up.
LAG_PROBE_S = 0.05
# File descriptors wanted by a load worker and the bench: one socket per session, plus headroom.
NOFILE = 65536
WIDTH: dict[str, int] = dict(BYTES_PER_SAMPLE)  # bytes per sample of each uncompressed format


class SessionRefused(Exception):
    """``session.config`` was answered with something other than ``session.ready`` (``reply``)."""

    def __init__(self, reply: dict[str, Any]) -> None:
        super().__init__(f"session.config answered with {json.dumps(reply)[:300]}")
        self.reply = reply


class Player:
    """A listener's player, simulated from the frames' arrival times (see the module docstring)."""

    def __init__(self, jitter_s: float = 0.0) -> None:
        self.jitter_s = jitter_s
        self.end: float | None = None  # when everything received so far has played (perf_counter)
        self.underruns: list[float] = []  # seconds of silence each
        self.underrun_at: list[float] = []  # where each fell: seconds of the turn's audio played before it
        self.audio_s = 0.0

    def arrive(self, t: float, audio_s: float) -> None:
        if self.end is None:
            self.end = t + self.jitter_s
        elif t > self.end:
            self.underruns.append(t - self.end)
            self.underrun_at.append(self.audio_s)
            self.end = t
        self.end += audio_s
        self.audio_s += audio_s


@dataclass
class Turn:
    """One utterance as the client saw it (``time.perf_counter`` seconds)."""

    player: Player
    sent: list[float] = field(default_factory=list)  # when each input.text left
    send_lag_s: float = 0.0  # the latest token sent after its scheduled time
    t_first_audio: float | None = None
    audio_s: float = 0.0
    bytes: int = 0
    frames: int = 0
    messages: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # every JSON message
    errors: list[dict[str, Any]] = field(default_factory=list)
    t_done: float | None = None  # session.done
    closed: bool = False  # the connection closed before session.done

    @property
    def ttfa_ms(self) -> float | None:
        """First ``input.text`` sent -> first audio byte received."""
        if self.t_first_audio is None or not self.sent:
            return None
        return (self.t_first_audio - self.sent[0]) * 1000.0

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for _, m in self.messages if m.get("type") == kind]


Hook = Callable[[Turn, float, bytes | dict[str, Any]], None]


async def open_session(
    url: str,
    config: dict[str, Any] | None = None,
    *,
    extensions: bool = True,
    compression: bool = False,
    timeout_s: float = 30.0,
) -> tuple[ClientConnection, dict[str, Any]]:
    """Connect and configure; returns the connection and ``session.ready`` (``{}`` without extensions)."""
    ws = await connect(
        url,
        subprotocols=[Subprotocol(EXTENSIONS)] if extensions else None,
        compression="deflate" if compression else None,
        max_size=None,
        open_timeout=timeout_s,
        close_timeout=2,
        ping_interval=None,  # thousands of pings are load of their own; every run is bounded anyway
    )
    await ws.send(json.dumps({"type": "session.config", **(config or {})}))
    if not extensions:
        return ws, {}
    async with asyncio.timeout(timeout_s):
        reply = json.loads(await ws.recv())
    if reply.get("type") != "session.ready":
        await ws.close()
        raise SessionRefused(reply)
    return ws, dict(reply)


async def send_tokens(
    ws: ClientConnection, tokens: Sequence[str], interval_s: float, turn: Turn, stop: asyncio.Event | None
) -> None:
    """One ``input.text`` per token every ``interval_s``, then ``input.done``; nothing more once ``stop``."""
    t0 = time.perf_counter()
    for i, token in enumerate(tokens):
        lag = time.perf_counter() - (t0 + i * interval_s)
        if lag < 0 and stop is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), -lag)
        elif lag < 0:
            await asyncio.sleep(-lag)
        else:
            turn.send_lag_s = max(turn.send_lag_s, lag)
        if stop is not None and stop.is_set():
            return
        turn.sent.append(time.perf_counter())
        await ws.send(json.dumps({"type": "input.text", "text": token}))
    await ws.send('{"type": "input.done"}')


async def speak(
    ws: ClientConnection,
    tokens: Sequence[str],
    interval_s: float = 0.0,
    *,
    width: int = 2,
    jitter_s: float = 0.0,
    timeout_s: float = 120.0,
    drain_s: float | None = None,
    stop: asyncio.Event | None = None,
    hook: Hook | None = None,
) -> Turn:
    """Stream one utterance and read it to ``session.done`` (or a fatal error, or the close).

    ``width`` is bytes per sample of the format (0: compressed, audio seconds unknown per frame). After an
    ``audio.cancelled`` it listens ``drain_s`` more for stray audio; ``hook`` sees every message as it
    arrives. Raises ``TimeoutError`` past ``timeout_s`` plus the time the tokens take.
    """
    turn = Turn(Player(jitter_s))
    sender = asyncio.create_task(send_tokens(ws, tokens, interval_s, turn, stop))
    try:
        async with asyncio.timeout(timeout_s + len(tokens) * interval_s):
            await _receive(ws, turn, width, drain_s, hook)
    finally:
        if not sender.done():
            sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)  # a send after the close: the turn says so
    return turn


async def _receive(
    ws: ClientConnection, turn: Turn, width: int, drain_s: float | None, hook: Hook | None
) -> None:
    rate, drain_until = 0, None
    while True:
        try:
            if drain_until is None:
                message = await ws.recv()
            else:
                message = await asyncio.wait_for(ws.recv(), max(0.0, drain_until - time.perf_counter()))
        except TimeoutError:
            if drain_until is None:
                raise
            return  # the drain after audio.cancelled is over
        except (ConnectionClosed, OSError):  # closed, or reset: the turn records it
            turn.closed = True
            return
        now = time.perf_counter()
        if isinstance(message, bytes):
            audio_s = len(message) / (width * rate) if width and rate else 0.0
            if turn.t_first_audio is None:
                turn.t_first_audio = now
            turn.player.arrive(now, audio_s)
            turn.audio_s += audio_s
            turn.bytes += len(message)
            turn.frames += 1
            if hook is not None:
                hook(turn, now, message)
            continue
        data: dict[str, Any] = json.loads(message)
        turn.messages.append((now, data))
        kind = data.get("type")
        if kind == "audio.start":
            rate = int(data.get("sample_rate") or 0)
        if hook is not None:
            hook(turn, now, data)
        if kind == "session.done":
            turn.t_done = now
            return
        if kind == "error":
            turn.errors.append(data)
            if data.get("fatal"):
                return
        if kind == "audio.cancelled" and drain_s is not None and drain_until is None:
            drain_until = now + drain_s


async def say(url: str, text: str, config: dict[str, Any] | None = None, timeout_s: float = 120.0) -> Turn:
    """One session that speaks ``text`` (sent whole) and closes: a warm-up, or a one-off."""
    ws, _ = await open_session(url, config, timeout_s=timeout_s)
    async with ws:
        return await speak(ws, [text], timeout_s=timeout_s)


# -- bench/load.py's worker process --------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What every session of a load worker does (sent to the worker as a dict)."""

    url: str
    sessions: int
    first_index: int  # of this worker's first session among all sessions, for the ramp offsets
    total_sessions: int
    text: str
    tokens_per_s: float
    jitter_ms: float
    ramp_s: float
    sample_rate: int
    frame_ms: int
    response_format: str
    compression: bool
    pause_s: float  # between a turn's last word played and the next turn's first text
    timeout_s: float


def outcome(turn: Turn | None, error: str | None = None) -> dict[str, Any]:
    """A turn's figures as ``bench/load.py`` sums them (``turn`` None: it failed before it ended)."""
    if turn is None:
        return {
            "ttfa_ms": None,
            "underruns": 0,
            "underrun_s": 0.0,
            "underrun_at_s": [],
            "audio_s": 0.0,
            "bytes": 0,
            "frames": 0,
            "send_lag_ms": 0.0,
            "error": error,
        }
    if turn.errors:
        error = f"{turn.errors[0].get('code')}: {turn.errors[0].get('message')}"
    elif turn.closed:
        error = "the connection closed before session.done"
    under = turn.player.underruns
    return {
        "ttfa_ms": turn.ttfa_ms,
        "underruns": len(under),
        "underrun_s": sum(under),
        "underrun_at_s": turn.player.underrun_at,
        "audio_s": turn.audio_s,
        "bytes": turn.bytes,
        "frames": turn.frames,
        "send_lag_ms": turn.send_lag_s * 1000.0,
        "error": error,
    }


class _Session:
    def __init__(self, plan: Plan, index: int) -> None:
        self.plan, self.index = plan, index
        self.ws: ClientConnection | None = None
        self.turns: list[dict[str, Any]] = []
        self.tokens = tokenize(plan.text, index)

    async def connect(self) -> None:
        p = self.plan
        config = {"response_format": p.response_format, "sample_rate": p.sample_rate, "frame_ms": p.frame_ms}
        self.ws, _ = await open_session(p.url, config, compression=p.compression, timeout_s=p.timeout_s)

    async def run(self, start: float, end: float) -> None:
        assert self.ws is not None
        p = self.plan
        await _sleep_until(start + p.ramp_s * self.index / max(1, p.total_sessions))
        width = WIDTH[p.response_format]
        while True:  # every session speaks at least once, even when the ramp outlasts the run
            try:
                turn = await speak(
                    self.ws, self.tokens, 1.0 / p.tokens_per_s, width=width, jitter_s=p.jitter_ms / 1000.0
                )
            except (OSError, TimeoutError) as exc:
                self.turns.append(outcome(None, f"{type(exc).__name__}: {exc}"))
                return
            self.turns.append(outcome(turn))
            if turn.closed or any(e.get("fatal") for e in turn.errors):
                return
            await asyncio.sleep(max(0.0, (turn.player.end or 0.0) + p.pause_s - time.perf_counter()))
            if time.monotonic() >= end:
                break
        await self.ws.close()


async def _sleep_until(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.monotonic()))


async def _probe_lag(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t = time.monotonic()
        await asyncio.sleep(LAG_PROBE_S)
        lags.append((time.monotonic() - t - LAG_PROBE_S) * 1000.0)


async def _work(plan: Plan, pipe: Connection) -> dict[str, Any]:
    failures: list[str] = []
    lags: list[float] = []
    sessions = [_Session(plan, plan.first_index + i) for i in range(plan.sessions)]
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def connect(s: _Session) -> None:
        async with gate:
            try:
                await s.connect()
            except Exception as exc:  # a refused session is a result to report, not a crash
                failures.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(connect(s) for s in sessions))
    pipe.send(("connected", plan.sessions - len(failures)))
    start, end = await asyncio.get_running_loop().run_in_executor(None, pipe.recv)
    live = [s for s in sessions if s.ws is not None]
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe_lag(lags, stop))
    await asyncio.gather(*(s.run(start, end) for s in live))
    stop.set()
    await probe
    return {
        "turns": [t for s in live for t in s.turns],
        "connect_failures": failures,
        "loop_lag_ms": lags,
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def raise_nofile(wanted: int = NOFILE) -> int:
    """Raise this process's open-file limit towards ``wanted`` (children inherit it); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < limit:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    return max(soft, limit)


def worker(plan_fields: dict[str, Any], pipe: Connection) -> None:
    """Entry point of a load worker process: runs its sessions, sends ``("report", dict)`` to the parent."""
    raise_nofile()
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # uvicorn[standard] brings it; without it the stock loop works, a little slower
        runner = asyncio.run
    pipe.send(("report", runner(_work(Plan(**plan_fields), pipe))))
    pipe.close()


def split(total: int, parts: int) -> Sequence[tuple[int, int]]:
    """``(first_index, count)`` of each of ``parts`` workers sharing ``total`` sessions evenly."""
    parts = max(1, min(parts, total))
    base, extra = divmod(total, parts)
    out, first = [], 0
    for k in range(parts):
        n = base + (1 if k < extra else 0)
        out.append((first, n))
        first += n
    return out
