"""Load benchmark: N sessions stream text at an LLM's pace and play their audio in real time.

Starts ``voxgate serve`` itself (or uses ``--url`` and ``--server-pid``), and for each level of
``--sessions`` runs that many WebSocket sessions at once from several client processes
(``bench/_load_client.py``: asyncio inside each). Every session streams a paragraph one token at a time at
``--tokens-per-s``, sends ``input.done``, plays the audio behind a ``--jitter-ms`` buffer (simulated, from
the frames' arrival times), waits until the last word is played, and starts the next turn, until
``--duration-s`` has passed. See ``docs/performance.md`` for the figures and how to read them.

    .venv/bin/python bench/load.py --engine fake --sessions 1,100,1000,2000 --json out.json --png out.png
    .venv/bin/python bench/load.py --engine piper --sessions 4,8,12,16,20

Per level it reports time to first audio (first ``input.text`` sent -> first audio byte received)
p50/p95/p99, underruns (count and seconds of silence), the server's CPU (``/proc/<pid>/stat``) and memory
(RSS with every session connected and configured but idle, and its peak while they stream, each less the
RSS before the sessions connected, per session), and the client processes' own CPU, send lag and event
loop lag, which show whether the client kept up. Exits non-zero when a level could not be measured.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _procstat  # noqa: E402
from _load_client import Plan, split, worker  # noqa: E402
from _serve import free_port, serve_command, stop  # noqa: E402
from _text import PARAGRAPH  # noqa: E402

# Seconds of audio per 250 ms chunk of the fake engine's tone (engine/fake.py), to turn an RTF into
# its ``fake_delay_s``.
FAKE_CHUNK_S = 0.25
# File descriptors wanted on each side: one socket per session, plus headroom.
NOFILE = 65536
STARTUP_TIMEOUT_S = 120.0  # Piper loads and warms its model in the lifespan
# How often the server's RSS is sampled while the sessions stream (its peak is reported).
RSS_SAMPLE_S = 0.25


class BenchError(Exception):
    """The benchmark could not measure what it claims to measure."""


@dataclass
class Server:
    url: str  # ws://host:port
    pid: int | None


def raise_nofile(wanted: int = NOFILE) -> int:
    """Raise this process's open-file limit towards ``wanted`` (children inherit it); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < limit:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    return max(soft, limit)


def uptime() -> str:
    """``uptime``'s line, or the load averages where the command is missing."""
    if shutil.which("uptime"):
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    return _procstat.uptime_line()


def server_env(args: argparse.Namespace, voices_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "VOXGATE_MAX_SESSIONS": "0",  # the cap is the point of the measurement, not a limit on it
            "VOXGATE_IDLE_TIMEOUT_S": "3600",
            "VOXGATE_VOICES_DIR": voices_dir,
            "VOXGATE_LOG_LEVEL": "warning",
        }
    )
    if args.engine == "fake":
        env["VOXGATE_FAKE_DELAY_S"] = repr(args.fake_rtf * FAKE_CHUNK_S)
    for item in args.server_env:
        key, _, value = item.partition("=")
        env[key] = value
    return env


@contextmanager
def started_server(args: argparse.Namespace, log: Path) -> Iterator[Server]:
    """``voxgate serve`` in a subprocess on a free loopback port, ready; stopped on exit."""
    port = free_port()
    command = serve_command("--engine", args.engine, "--host", "127.0.0.1", "--port", str(port))
    with tempfile.TemporaryDirectory(prefix="voxgate-load-") as voices, log.open("ab") as out:
        proc = subprocess.Popen(
            command, env=server_env(args, voices), stdout=out, stderr=subprocess.STDOUT, cwd=voices
        )
        try:
            wait_ready(f"http://127.0.0.1:{port}", proc)
            print(f"server pid {proc.pid} on port {port}", file=sys.stderr, flush=True)
            yield Server(f"ws://127.0.0.1:{port}", proc.pid)
        finally:
            stop(proc)  # a drain: the sessions are over by now


def wait_ready(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"the server exited with {proc.returncode} during startup")
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise BenchError(f"the server was not ready within {STARTUP_TIMEOUT_S:g} s")


def warm_up(url: str, args: argparse.Namespace) -> None:
    """One short session, so that lazy imports and first-use caches are not counted as per-session cost."""
    from websockets.sync.client import connect

    config = {"type": "session.config", "response_format": args.format, "sample_rate": args.sample_rate}
    with connect(f"{url}/v1/audio/speech/stream", open_timeout=30) as ws:
        ws.send(json.dumps(config))
        ws.send(json.dumps({"type": "input.text", "text": "Warming up. One two three."}))
        ws.send(json.dumps({"type": "input.done"}))
        while True:
            message = ws.recv(timeout=STARTUP_TIMEOUT_S)
            if isinstance(message, str) and json.loads(message)["type"] in ("session.done", "error"):
                break


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    p50, p95, p99 = np.percentile(np.asarray(values, dtype=np.float64), [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(max(values))}


def run_level(n: int, args: argparse.Namespace, server: Server) -> dict[str, Any]:
    """Run ``n`` sessions against ``server``; returns the level's figures."""
    ctx = multiprocessing.get_context("spawn")
    rss_before = _procstat.rss_kib(server.pid) if server.pid else 0
    workers = []
    for first, count in split(n, args.client_procs):
        plan = Plan(
            url=f"{server.url}/v1/audio/speech/stream",
            sessions=count,
            first_index=first,
            total_sessions=n,
            text=args.text,
            tokens_per_s=args.tokens_per_s,
            jitter_ms=args.jitter_ms,
            duration_s=args.duration_s,
            ramp_s=args.ramp_s,
            sample_rate=args.sample_rate,
            frame_ms=args.frame_ms,
            response_format=args.format,
            compression=args.compression,
            pause_s=args.pause_s,
            timeout_s=args.timeout_s,
        )
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(asdict(plan), child, NOFILE), daemon=True)
        proc.start()
        workers.append((proc, parent))
    connected = 0
    t_connect = time.monotonic()
    for proc, pipe in workers:
        if not pipe.poll(args.timeout_s + n * 0.05):
            raise BenchError(f"a client process did not connect its sessions (exit code {proc.exitcode})")
        kind, count = pipe.recv()
        connected += count
    connect_s = time.monotonic() - t_connect
    time.sleep(1.0)  # let the server settle after the handshakes before its RSS is read
    rss_idle = _procstat.rss_kib(server.pid) if server.pid else 0

    pids = [p.pid for p, _ in workers if p.pid is not None]
    start = time.monotonic() + 0.2
    end = start + args.duration_s
    load_before = uptime()
    for _, pipe in workers:
        pipe.send((start, end))
    cpu0 = _cpu(server.pid, pids)
    t0 = time.monotonic()
    rss_peak = rss_idle
    reports: dict[int, dict[str, Any]] = {}
    deadline = end + args.timeout_s + 60.0
    while len(reports) < len(workers):
        if time.monotonic() > deadline:
            raise BenchError("the client processes did not finish in time")
        for k, (proc, pipe) in enumerate(workers):
            if k not in reports and pipe.poll(0):
                kind, report = pipe.recv()
                reports[k] = report
            elif k not in reports and not proc.is_alive() and not pipe.poll(0):
                raise BenchError(f"a client process died (exit code {proc.exitcode})")
        if server.pid:
            rss_peak = max(rss_peak, _procstat.rss_kib(server.pid))
        time.sleep(RSS_SAMPLE_S)
    wall = time.monotonic() - t0
    cpu1 = _cpu(server.pid, pids)
    for proc, _ in workers:
        proc.join(10)
    load_after = uptime()
    return summarize(
        n,
        list(reports.values()),
        connected=connected,
        connect_s=connect_s,
        wall_s=wall,
        cpu=(cpu0, cpu1),
        rss=(rss_before, rss_idle, rss_peak),
        load=(load_before, load_after),
        server=server,
    )


def _cpu(server_pid: int | None, client_pids: Sequence[int]) -> tuple[float, float, float]:
    """(server, clients, whole machine) CPU seconds so far."""
    server = _procstat.cpu_s(server_pid) if server_pid else 0.0
    return server, sum(_procstat.cpu_s(p) for p in client_pids), _procstat.machine_busy_s()


def summarize(
    n: int,
    reports: list[dict[str, Any]],
    *,
    connected: int,
    connect_s: float,
    wall_s: float,
    cpu: tuple[tuple[float, float, float], tuple[float, float, float]],
    rss: tuple[int, int, int],
    load: tuple[str, str],
    server: Server,
) -> dict[str, Any]:
    turns = [t for r in reports for t in r["turns"]]
    done = [t for t in turns if t["error"] is None and t["ttfa_ms"] is not None]
    errors = [t["error"] for t in turns if t["error"] is not None]
    failures = [f for r in reports for f in r["connect_failures"]]
    (s0, c0, m0), (s1, c1, m1) = cpu
    server_cores = (s1 - s0) / wall_s
    client_cores = (c1 - c0) / wall_s
    machine_cores = (m1 - m0) / wall_s
    rss_before, rss_idle, rss_peak = rss
    audio_s = sum(t["audio_s"] for t in turns)
    frames = sum(t["frames"] for t in turns)
    per = max(1, connected)
    return {
        "sessions": n,
        "connected": connected,
        "connect_failures": len(failures),
        "connect_failure_examples": failures[:3],
        "connect_s": round(connect_s, 3),
        "turns": len(turns),
        "turns_completed": len(done),
        "errors": len(errors),
        "error_examples": errors[:3],
        "ttfa_ms": percentiles([t["ttfa_ms"] for t in done]),
        "underruns": sum(t["underruns"] for t in done),
        "underrun_s": sum(t["underrun_s"] for t in done),
        "turns_with_underrun": sum(1 for t in done if t["underruns"]),
        "underrun_s_per_turn": percentiles([t["underrun_s"] for t in done]),
        "audio_s": sum(t["audio_s"] for t in done),
        "bytes_received": sum(t["bytes"] for t in turns),
        "frames_received": sum(t["frames"] for t in turns),
        "wall_s": round(wall_s, 3),
        "server_cpu_cores": round(server_cores, 3),
        # What one second of streamed audio costs the server: stable under load from other processes,
        # unlike the capacity itself, so it is the figure to compare before and after a change.
        "server_cpu_ms_per_audio_s": round((s1 - s0) * 1000.0 / audio_s, 3) if audio_s else None,
        "server_cpu_us_per_frame": round((s1 - s0) * 1e6 / frames, 2) if frames else None,
        "client_cpu_cores": round(client_cores, 3),
        "other_cpu_cores": round(max(0.0, machine_cores - server_cores - client_cores), 3),
        "client_processes": len(reports),
        "client_send_lag_ms": percentiles([t["send_lag_ms"] for t in turns]),
        "client_loop_lag_ms": percentiles([x for r in reports for x in r["loop_lag_ms"]]),
        "client_max_rss_kib": max((r["max_rss_kib"] for r in reports), default=0),
        "server_pid": server.pid,
        "server_rss_kib": {"before": rss_before, "idle": rss_idle, "streaming_peak": rss_peak},
        "rss_per_idle_session_kib": round((rss_idle - rss_before) / per, 1) if server.pid else None,
        "rss_per_streaming_session_kib": round((rss_peak - rss_before) / per, 1) if server.pid else None,
        "uptime_before": load[0],
        "uptime_after": load[1],
    }


def report_line(level: dict[str, Any]) -> str:
    t = level["ttfa_ms"]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    mem = ""
    if level["rss_per_idle_session_kib"] is not None:
        mem = (
            f" | RSS/session idle {level['rss_per_idle_session_kib']:.0f} KiB,"
            f" streaming {level['rss_per_streaming_session_kib']:.0f} KiB"
        )
    return (
        f"{level['sessions']:>5} sessions: TTFA p50/p95/p99 {ms(t['p50'])}/{ms(t['p95'])}/{ms(t['p99'])} ms"
        f" | underruns {level['underruns']} ({level['underrun_s']:.2f} s,"
        f" {level['turns_with_underrun']}/{level['turns_completed']} turns)"
        f" | errors {level['errors'] + level['connect_failures']}"
        f" | CPU server {level['server_cpu_cores']:.2f} client {level['client_cpu_cores']:.2f}"
        f" other {level['other_cpu_cores']:.2f} cores"
        f" ({_num(level['server_cpu_ms_per_audio_s'])} ms server CPU per audio s)"
        f" | client lag p99 send {ms(level['client_send_lag_ms']['p99'])} ms"
        f" loop {ms(level['client_loop_lag_ms']['p99'])} ms{mem}"
    )


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def plot(levels: list[dict[str, Any]], path: Path, title: str) -> None:
    """TTFA p50/p95 and underruns against sessions, as a small PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [lv["sessions"] for lv in levels]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 5.2), sharex=True, constrained_layout=True)
    for key, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
        top.plot(n, [lv["ttfa_ms"][key] for lv in levels], style, label=f"TTFA {key}")
    top.set_ylabel("time to first audio (ms)")
    top.set_ylim(bottom=0)
    top.legend(loc="upper left")
    top.grid(alpha=0.3)
    top.set_title(title, fontsize=10)
    bottom.bar(n, [lv["underrun_s"] for lv in levels], width=_bar_width(n), color="tab:red", alpha=0.7)
    bottom.set_ylabel("underrun, total s", color="tab:red")
    bottom.set_xlabel("concurrent sessions")
    bottom.grid(alpha=0.3)
    counts = bottom.twinx()
    counts.plot(n, [lv["underruns"] for lv in levels], "k.-", label="underruns (count)")
    counts.set_ylabel("underruns (count)")
    counts.set_ylim(bottom=0)
    counts.legend(loc="upper left")
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _bar_width(n: Sequence[int]) -> float:
    gaps = [b - a for a, b in zip(n, n[1:], strict=False)]
    return 0.6 * min(gaps) if gaps else 0.6


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", default="fake", help="engine the started server runs: fake or piper")
    p.add_argument(
        "--sessions", default="4,8,12,16,20", help="levels of concurrent sessions, comma-separated"
    )
    p.add_argument("--tokens-per-s", type=float, default=20.0, help="text pace of each session")
    p.add_argument("--jitter-ms", type=float, default=150.0, help="the player's jitter buffer")
    p.add_argument("--duration-s", type=float, default=30.0, help="turns start until this much time passed")
    p.add_argument("--ramp-s", type=float, default=5.0, help="sessions start spread over this time")
    p.add_argument("--pause-s", type=float, default=1.0, help="between a turn's last word and the next turn")
    p.add_argument("--text", default=PARAGRAPH, help="what each turn says")
    p.add_argument("--sample-rate", type=int, default=24000)
    p.add_argument("--frame-ms", type=int, default=40)
    p.add_argument("--format", default="pcm", choices=("pcm", "f32", "mulaw"))
    p.add_argument("--compression", action="store_true", help="offer permessage-deflate, as browsers do")
    p.add_argument(
        "--fake-rtf",
        type=float,
        default=0.05,
        help="engine fake: seconds of (sleeping) synthesis per audio s",
    )
    p.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--client-procs", type=int, default=max(2, os.cpu_count() or 1))
    p.add_argument("--timeout-s", type=float, default=120.0, help="bound on connecting, and on a turn")
    p.add_argument("--url", help="a running gateway (ws://host:port) instead of starting one")
    p.add_argument("--server-pid", type=int, help="with --url: its process, for CPU and memory")
    p.add_argument("--server-log", type=Path, help="where the started server's output goes")
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument("--png", type=Path, help="plot TTFA and underruns against sessions here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # A SIGTERM unwinds like Ctrl-C, so the server this started is stopped and the clients end with it.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    levels_wanted = [int(x) for x in args.sessions.split(",") if x.strip()]
    nofile = raise_nofile()
    load_at_start = os.getloadavg()[0]
    log = args.server_log or Path(tempfile.gettempdir()) / f"voxgate-load-{os.getpid()}.log"
    print(f"voxgate load bench: {args.engine}, {uptime()}", file=sys.stderr)
    levels: list[dict[str, Any]] = []
    try:
        for n in levels_wanted:
            with _server(args, log) as server:
                warm_up(server.url, args)
                level = run_level(n, args, server)
            levels.append(level)
            print(report_line(level), flush=True)
    except BenchError as exc:
        print(f"bench failed: {exc} (server log: {log})", file=sys.stderr)
        return 1
    unloaded = levels[0]["ttfa_ms"]["p95"] if levels else None
    for level in levels:
        p95 = level["ttfa_ms"]["p95"]
        level["ttfa_p95_vs_first_level"] = round(p95 / unloaded, 3) if p95 and unloaded else None
    result = {
        "engine": args.engine,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "nofile": nofile,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "levels": levels,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.png and levels:
        title = (
            f"engine {args.engine}, {args.tokens_per_s:g} tokens/s, {args.jitter_ms:g} ms jitter buffer, "
            f"load average {load_at_start:.1f} at start"
        )
        plot(levels, args.png, title)
        print(f"wrote {args.png}", file=sys.stderr)
    bad = [lv["sessions"] for lv in levels if not lv["turns_completed"]]
    if bad:
        print(f"bench failed: no turn completed at {bad} sessions (server log: {log})", file=sys.stderr)
        return 1
    return 0


@contextmanager
def _server(args: argparse.Namespace, log: Path) -> Iterator[Server]:
    if args.url:
        yield Server(args.url.rstrip("/"), args.server_pid)
    else:
        with started_server(args, log) as server:
            yield server


if __name__ == "__main__":
    sys.exit(main())
