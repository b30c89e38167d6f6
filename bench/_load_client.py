"""The client side of ``bench/load.py``: one worker process drives its share of the sessions.

Each session is one WebSocket. It connects, sends ``session.config`` and waits for ``session.ready``, then
reports in; once every worker has reported, the parent sends the start time. From then on each session
runs turns until the run's end (at least one): it streams the text one token at a time at
``tokens_per_s`` (an LLM's pace, on an absolute schedule, so a late send does not delay the next), sends
``input.done``, reads the audio as it comes, and waits for the simulated player to finish before the
next turn.

The player: playback starts ``jitter_ms`` after the first audio frame of a turn arrives and plays every
frame back to back in real time. A frame that arrives after everything before it has played is an underrun
(its lateness is the underrun's length) and playback resumes as soon as it is there (``bench/vs_vllm_omni.py``
counts them the same way). It is computed as frames arrive, from their arrival times, so nothing sleeps for
playback except the wait before the next turn.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from _text import tokenize
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

PATH = "/v1/audio/speech/stream"
# Handshakes at once per worker: thousands of simultaneous connects overflow the listen backlog.
CONNECT_CONCURRENCY = 32
# How often the loop-lag probe wakes: its oversleep shows a worker that cannot keep up.
LAG_PROBE_S = 0.05


@dataclass(frozen=True)
class Plan:
    """What every session of a worker does (sent to the worker as a dict)."""

    url: str
    sessions: int
    first_index: int  # of this worker's first session among all sessions, for the ramp offsets
    total_sessions: int
    text: str
    tokens_per_s: float
    jitter_ms: float
    duration_s: float
    ramp_s: float
    sample_rate: int
    frame_ms: int
    response_format: str
    compression: bool
    pause_s: float  # between a turn's last word played and the next turn's first text
    timeout_s: float


@dataclass
class Turn:
    """One utterance of one session, as the client saw it."""

    ttfa_ms: float | None = None  # first input.text sent -> first audio frame received
    underruns: int = 0
    underrun_s: float = 0.0
    audio_s: float = 0.0
    bytes: int = 0
    frames: int = 0
    send_lag_ms: float = 0.0  # the latest token sent after its scheduled time
    error: str | None = None


@dataclass
class Report:
    """A worker's results, sent back to the parent as a dict."""

    turns: list[dict[str, Any]] = field(default_factory=list)
    connect_failures: list[str] = field(default_factory=list)
    loop_lag_ms: list[float] = field(default_factory=list)
    max_rss_kib: int = 0


class _Session:
    def __init__(self, plan: Plan, index: int) -> None:
        self.plan = plan
        self.index = index
        self.ws: ClientConnection | None = None
        self.turns: list[Turn] = []
        self.tokens = [json.dumps({"type": "input.text", "text": t}) for t in tokenize(plan.text, index)]
        self.bytes_per_s = plan.sample_rate * {"pcm": 2, "f32": 4, "mulaw": 1}[plan.response_format]

    async def connect(self) -> None:
        p = self.plan
        self.ws = await connect(
            p.url,
            subprotocols=[Subprotocol("voxgate.v1")],
            compression="deflate" if p.compression else None,
            max_size=None,
            open_timeout=p.timeout_s,
            ping_interval=None,  # thousands of pings are load of their own; the run is bounded anyway
        )
        config = {
            "type": "session.config",
            "response_format": p.response_format,
            "sample_rate": p.sample_rate,
            "frame_ms": p.frame_ms,
        }
        await self.ws.send(json.dumps(config))
        async with asyncio.timeout(p.timeout_s):
            reply = json.loads(await self.ws.recv())
        if reply.get("type") != "session.ready":
            raise RuntimeError(f"session.config answered with {reply}")

    async def run(self, start: float, end: float) -> None:
        assert self.ws is not None
        p = self.plan
        await _sleep_until(start + p.ramp_s * self.index / max(1, p.total_sessions))
        try:
            while True:  # every session speaks at least once, even when the ramp outlasts the run
                turn = Turn()
                self.turns.append(turn)
                play_end = await self._turn(self.ws, turn)
                await _sleep_until(play_end + p.pause_s)
                if time.monotonic() >= end:
                    break
            await self.ws.close()
        except (ConnectionClosed, OSError, TimeoutError, RuntimeError) as exc:
            if self.turns and self.turns[-1].error is None:
                self.turns[-1].error = f"{type(exc).__name__}: {exc}"

    async def _turn(self, ws: ClientConnection, turn: Turn) -> float:
        """Stream one utterance and play it; returns when its last word has been played (monotonic)."""
        p = self.plan
        interval = 1.0 / p.tokens_per_s
        sender = asyncio.create_task(self._send_text(ws, turn, interval))
        first_text = time.monotonic()
        play_end = 0.0
        try:
            async with asyncio.timeout(p.timeout_s + len(self.tokens) * interval):
                async for message in ws:
                    now = time.monotonic()
                    if isinstance(message, bytes):
                        audio_s = len(message) / self.bytes_per_s
                        if turn.ttfa_ms is None:
                            turn.ttfa_ms = (now - first_text) * 1000.0
                            play_end = now + p.jitter_ms / 1000.0
                        elif now > play_end:
                            turn.underruns += 1
                            turn.underrun_s += now - play_end
                            play_end = now
                        play_end += audio_s
                        turn.audio_s += audio_s
                        turn.bytes += len(message)
                        turn.frames += 1
                    elif '"session.done"' in message:
                        break
                    elif '"error"' in message:
                        kind = json.loads(message)
                        if kind.get("type") == "error":
                            turn.error = f"{kind.get('code')}: {kind.get('message')}"
                            if kind.get("fatal"):
                                break
                else:
                    raise ConnectionClosed(None, None)
        finally:
            if not sender.done():
                sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        return play_end

    async def _send_text(self, ws: ClientConnection, turn: Turn, interval: float) -> None:
        t0 = time.monotonic()
        for i, token in enumerate(self.tokens):
            due = t0 + i * interval
            lag = time.monotonic() - due
            if lag < 0:
                await asyncio.sleep(-lag)
            else:
                turn.send_lag_ms = max(turn.send_lag_ms, lag * 1000.0)
            await ws.send(token)
        await ws.send('{"type": "input.done"}')


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def _probe_lag(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t = time.monotonic()
        await asyncio.sleep(LAG_PROBE_S)
        lags.append((time.monotonic() - t - LAG_PROBE_S) * 1000.0)


async def _work(plan: Plan, pipe: Connection) -> Report:
    report = Report()
    sessions = [_Session(plan, plan.first_index + i) for i in range(plan.sessions)]
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def connect(s: _Session) -> None:
        async with gate:
            try:
                await s.connect()
            except Exception as exc:  # a refused session is a result to report, not a crash
                report.connect_failures.append(f"{type(exc).__name__}: {exc}")
                s.ws = None

    await asyncio.gather(*(connect(s) for s in sessions))
    pipe.send(("connected", plan.sessions - len(report.connect_failures)))
    loop = asyncio.get_running_loop()
    start, end = await loop.run_in_executor(None, pipe.recv)
    live = [s for s in sessions if s.ws is not None]
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe_lag(report.loop_lag_ms, stop))
    await asyncio.gather(*(s.run(start, end) for s in live))
    stop.set()
    await probe
    report.turns = [asdict(t) for s in live for t in s.turns]
    report.max_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return report


def worker(plan_fields: dict[str, Any], pipe: Connection, nofile: int) -> None:
    """Entry point of a worker process: runs its sessions and sends ``("report", dict)`` to the parent."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, nofile), hard), hard))
    plan = Plan(**plan_fields)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # uvicorn[standard] brings it; without it the stock loop works, a little slower
        runner = asyncio.run
    report = runner(_work(plan, pipe))
    pipe.send(("report", asdict(report)))
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
