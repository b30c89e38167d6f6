"""Soak test: N WebSocket sessions stream text into a real gateway for T minutes while the server's RSS,
open file descriptors and threads are sampled from /proc.

    .venv/bin/python bench/soak.py --engine fake --sessions 200 --minutes 30 --json soak-fake.json
    .venv/bin/python bench/soak.py --engine piper --sessions 4 --minutes 30 --json soak-piper.json

The server is ``voxgate serve`` started as a subprocess on a free loopback port (its log goes to a file
next to the JSON, and is searched for tracebacks at the end). Each session connects, sends
``session.config``, then loops: streams a sentence as small ``input.text`` pieces, sends ``input.done``,
reads the audio until ``session.done``; every ``--reconnect-every`` utterances it closes and opens a new
WebSocket, so connection set-up and tear-down are soaked too. The fake engine is paced at real time
(``--fake-delay-s 0.25`` per 250 ms chunk) unless told otherwise.

Every ``--sample-s`` seconds it reads ``VmRSS`` and ``Threads`` from ``/proc/PID/status`` and counts
``/proc/PID/fd``. The RSS slope is a least-squares fit over the samples after ``--warmup-min`` minutes.
The JSON holds the samples and the summary; the summary is also printed. Exit status 1 when the server
died, a session got an ``error`` or an unexpected close, or the server logged a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _serve import free_port, serve_command, stop
from voxgate.protocol.dialect import EXTENSIONS_SUBPROTOCOL
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.typing import Subprotocol

PATH = "/v1/audio/speech/stream"
SENTENCES = (
    "The gateway turns a stream of words into speech while the model is still writing.",
    "Short pauses between sentences sound natural to the listener.",
    "A soak test runs for a long time to find what slowly leaks.",
    "Memory, file handles and threads should stay flat once it is warm.",
)
#: Bound on any wait for the server (a reply, a close): past it the session counts a hang.
REPLY_TIMEOUT_S = 120.0
START_TIMEOUT_S = 120.0


@dataclass
class Sample:
    t_s: float
    rss_mb: float
    fds: int
    threads: int


@dataclass
class Counters:
    utterances: int = 0
    connections: int = 0
    audio_bytes: int = 0
    audio_s: float = 0.0
    errors: int = 0
    unexpected_closes: int = 0
    hangs: int = 0
    refused: int = 0
    error_codes: dict[str, int] = field(default_factory=dict)


def read_proc(pid: int) -> tuple[float, int, int]:
    """RSS in MB, open fds, threads of ``pid`` (Linux /proc)."""
    rss_kb, threads = 0, 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss_kb / 1024, fds, threads


def slope_per_min(samples: list[Sample], after_s: float) -> float | None:
    """Least-squares slope of RSS (MB per minute) over the samples taken after ``after_s``."""
    points = [(s.t_s / 60, s.rss_mb) for s in samples if s.t_s >= after_s]
    if len(points) < 3:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return sxy / sxx if sxx else None


def start_server(args: argparse.Namespace, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    command = serve_command(
        "--engine",
        args.engine,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-sessions",
        str(max(512, args.sessions * 2)),
        "--log-level",
        "warning",
    )
    if args.engine == "fake":
        command += ["--fake-delay-s", str(args.fake_delay_s)]
    log = log_path.open("wb")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


async def wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    host, port = url.split("//")[1].split(":")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"soak failed: the server exited with {process.returncode}")
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            status = await reader.readline()
            writer.close()
            if b" 200 " in status:
                return
        await asyncio.sleep(0.5)
    raise SystemExit("soak failed: the server was not ready in time")


async def run_session(index: int, ws_url: str, stop_at: float, every: int, counters: Counters) -> None:
    rng = random.Random(index)
    await asyncio.sleep(rng.uniform(0, 2.0))  # spread the connects
    while time.monotonic() < stop_at:
        try:
            async with connect(
                ws_url,
                max_size=None,
                open_timeout=REPLY_TIMEOUT_S,
                subprotocols=[Subprotocol(EXTENSIONS_SUBPROTOCOL)],
            ) as ws:
                counters.connections += 1
                await ws.send(json.dumps({"type": "session.config"}))
                ready = json.loads(await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S))
                if ready.get("type") != "session.ready":
                    counters.errors += 1
                    return
                rate = int(ready.get("config", {}).get("sample_rate", 24000))
                for _ in range(every):
                    if time.monotonic() >= stop_at:
                        break
                    await utterance(ws, rng, counters, rate)
        except InvalidHandshake:
            counters.refused += 1
            await asyncio.sleep(1.0)
        except TimeoutError:
            counters.hangs += 1
        except (ConnectionClosed, OSError):
            counters.unexpected_closes += 1
            await asyncio.sleep(0.5)


async def utterance(ws: Any, rng: random.Random, counters: Counters, rate: int) -> None:
    text = rng.choice(SENTENCES)
    pos = 0
    while pos < len(text):
        step = rng.randint(2, 6)
        await ws.send(json.dumps({"type": "input.text", "text": text[pos : pos + step]}))
        pos += step
        await asyncio.sleep(0.02)
    await ws.send(json.dumps({"type": "input.done"}))
    while True:
        item = await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
        if isinstance(item, bytes):
            counters.audio_bytes += len(item)
            counters.audio_s += len(item) / 2 / rate  # pcm16 mono
            continue
        message = json.loads(item)
        if message.get("type") == "error":
            counters.errors += 1
            code = str(message.get("code"))
            counters.error_codes[code] = counters.error_codes.get(code, 0) + 1
        elif message.get("type") == "session.done":
            counters.utterances += 1
            return


async def sample_loop(pid: int, start: float, stop_at: float, every_s: float, out: list[Sample]) -> None:
    while True:
        with contextlib.suppress(OSError, ValueError):
            rss, fds, threads = read_proc(pid)
            out.append(Sample(round(time.monotonic() - start, 2), round(rss, 2), fds, threads))
        if time.monotonic() >= stop_at:
            return
        await asyncio.sleep(min(every_s, max(0.0, stop_at - time.monotonic())))


def tracebacks(log_path: Path) -> int:
    text = log_path.read_text(errors="replace")
    return text.count("Traceback (most recent call last)")


async def main_async(args: argparse.Namespace) -> int:
    out = Path(args.json) if args.json else None
    log_path = Path(args.log or (f"{out}.server.log" if out else f"/tmp/soak-{os.getpid()}.log"))
    port = free_port()
    process = start_server(args, port, log_path)
    try:
        await wait_ready(f"http://127.0.0.1:{port}", process)
        counters = Counters()
        samples: list[Sample] = []
        start = time.monotonic()
        stop_at = start + args.minutes * 60
        ws_url = f"ws://127.0.0.1:{port}{PATH}"
        sampler = asyncio.create_task(sample_loop(process.pid, start, stop_at, args.sample_s, samples))
        sessions = [
            asyncio.create_task(run_session(i, ws_url, stop_at, args.reconnect_every, counters))
            for i in range(args.sessions)
        ]
        await asyncio.gather(*sessions)
        await sampler
        closed: Sample | None = None
        with contextlib.suppress(OSError, ValueError):  # after every session closed: not in the slope
            rss, fds, threads = read_proc(process.pid)
            closed = Sample(round(time.monotonic() - start, 2), round(rss, 2), fds, threads)
        alive = process.poll() is None
    finally:
        stop(process, 60.0)
    warm_s = args.warmup_min * 60
    slope = slope_per_min(samples, warm_s)
    after = [s for s in samples if s.t_s >= warm_s] or samples
    summary: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "engine": args.engine,
        "sessions": args.sessions,
        "minutes": args.minutes,
        "warmup_min": args.warmup_min,
        "server_alive_at_end": alive,
        "server_tracebacks": tracebacks(log_path),
        "rss_mb": {
            "start": samples[0].rss_mb if samples else None,
            "after_warmup": after[0].rss_mb if after else None,
            "max": max((s.rss_mb for s in samples), default=None),
            "end": samples[-1].rss_mb if samples else None,
            "after_close": closed.rss_mb if closed else None,
            "slope_mb_per_min_after_warmup": None if slope is None else round(slope, 4),
            "slope_mb_per_hour_after_warmup": None if slope is None else round(slope * 60, 2),
        },
        "fds": {
            "start": samples[0].fds if samples else None,
            "end": samples[-1].fds if samples else None,
            "after_close": closed.fds if closed else None,
            "max": max((s.fds for s in samples), default=None),
        },
        "threads": {
            "start": samples[0].threads if samples else None,
            "end": samples[-1].threads if samples else None,
            "after_close": closed.threads if closed else None,
            "max": max((s.threads for s in samples), default=None),
        },
        **{k: v for k, v in asdict(counters).items()},
        "audio_hours": round(counters.audio_s / 3600, 2),
        "load_avg": os.getloadavg(),
    }
    if out:
        out.write_text(json.dumps({"summary": summary, "samples": [asdict(s) for s in samples]}, indent=1))
    print(json.dumps(summary, indent=1))
    failed = (
        not alive
        or summary["server_tracebacks"]
        or counters.errors
        or counters.unexpected_closes
        or counters.hangs
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", default="fake", help="engine of the server: fake (default) or piper")
    parser.add_argument("--sessions", type=int, default=50, help="concurrent sessions")
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the sessions stream")
    parser.add_argument("--warmup-min", type=float, default=None, help="minutes left out of the slope")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between /proc samples")
    parser.add_argument("--reconnect-every", type=int, default=20, help="utterances per connection")
    parser.add_argument("--fake-delay-s", type=float, default=0.25, help="fake engine's pace per 250 ms")
    parser.add_argument("--json", help="write samples and summary here")
    parser.add_argument("--log", help="server log file (default: next to --json)")
    args = parser.parse_args(argv)
    if args.warmup_min is None:
        args.warmup_min = min(5.0, args.minutes / 3)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
