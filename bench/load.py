"""Load benchmark: N sessions stream text at an LLM's pace and play their audio in real time.

    .venv/bin/python bench/load.py --engine fake --sessions 1,100,1000,2000 --json out.json --png out.png
    .venv/bin/python bench/load.py --engine piper --sessions 8,12,16,20,24

Per level of ``--sessions``: a fresh ``voxgate serve`` (``bench/_serve.py``; or ``--url``), the sessions
from ``--client-procs`` worker processes (``bench/_client.py``), TTFA p50/p95/p99, underruns, server and
client CPU (the server's split into its engine's inference threads and the rest), the time the server kept
every core busy, memory per session. With ``--engine piper`` it also measures stock Piper's CPU per second
of audio before and after the levels (``bench/_piper_cost.py``, in a process of its own), and states the
machine's compute limit (cores / that cost: the most real-time streams with nothing else running) and the
largest level with zero underruns as a share of it. What each figure means: docs/performance.md ("The load
benchmark"). Exits non-zero when a level could not be measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _stats
from _client import PATH, Plan, raise_nofile, say, split, worker
from _serve import BenchError, gateway
from _stats import percentiles
from _text import PARAGRAPH

BENCH = Path(__file__).resolve().parent
# The engine's inference threads, by their kernel name (``engine.workers.name_os_thread``).
ENGINE_THREADS = "piper"
# A sample in which the server used at least this share of the cores counts as the machine saturated.
SATURATED = 0.95
# The target: sessions with zero underruns, as a share of the compute limit.
TARGET_SHARE = 0.8
# ... at which TTFA p95 must stay within this.
CLEAN_TTFA_P95_MS = 1000.0

# Seconds of audio per 250 ms chunk of the fake engine's tone (engine/fake.py), to turn an RTF into
# its ``fake_delay_s``.
FAKE_CHUNK_S = 0.25
# How often the server's RSS is sampled while the sessions stream (its peak is reported).
RSS_SAMPLE_S = 0.25
# The settings every session of a level shares, as ``Plan`` names them.
SHARED = "text tokens_per_s jitter_ms ramp_s sample_rate frame_ms compression pause_s timeout_s".split()


@dataclass
class Server:
    url: str  # ws://host:port
    pid: int | None


def server_env(args: argparse.Namespace) -> dict[str, str]:
    env = {
        "VOXGATE_MAX_SESSIONS": "0",  # the cap is the point of the measurement, not a limit on it
        "VOXGATE_IDLE_TIMEOUT_S": "3600",
        "VOXGATE_LOG_LEVEL": "warning",
    }
    if args.engine == "fake":
        env["VOXGATE_FAKE_DELAY_S"] = repr(args.fake_rtf * FAKE_CHUNK_S)
    for item in args.server_env:
        key, _, value = item.partition("=")
        env[key] = value
    return env


@contextmanager
def _server(args: argparse.Namespace, log: Path) -> Iterator[Server]:
    """``--url``, or ``voxgate serve`` on a free loopback port (``bench/_serve.py``), stopped on exit."""
    if args.url:
        yield Server(args.url.rstrip("/"), args.server_pid)
        return
    with gateway("--engine", args.engine, env=server_env(args), log=log) as server:
        print(f"server pid {server.pid} on port {server.port}", file=sys.stderr, flush=True)
        yield Server(server.url(scheme="ws"), server.pid)


def warm_up(url: str, args: argparse.Namespace) -> None:
    """One short session, so that lazy imports and first-use caches are not counted as per-session cost."""
    config = {"response_format": args.format, "sample_rate": args.sample_rate}
    asyncio.run(say(f"{url}{PATH}", "Warming up. One two three.", config))


def run_level(n: int, args: argparse.Namespace, server: Server) -> dict[str, Any]:
    """Run ``n`` sessions against ``server``; returns the level's figures."""
    ctx = multiprocessing.get_context("spawn")
    rss_before = _stats.rss_kib(server.pid) if server.pid else 0
    workers = []
    shared = {k: getattr(args, k) for k in SHARED}
    for first, count in split(n, args.client_procs):
        plan = Plan(f"{server.url}{PATH}", count, first, n, response_format=args.format, **shared)
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(asdict(plan), child), daemon=True)
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
    rss_idle = _stats.rss_kib(server.pid) if server.pid else 0

    pids = [p.pid for p, _ in workers if p.pid is not None]
    start = time.monotonic() + 0.2
    end = start + args.duration_s
    load_before = _stats.uptime_line()
    for _, pipe in workers:
        pipe.send((start, end))
    cpu0 = _cpu(server.pid, pids)
    engine0 = _stats.thread_cpu_s(server.pid, ENGINE_THREADS) if server.pid else 0.0
    t0 = time.monotonic()
    rss_peak = rss_idle
    cores = _stats_cores()
    saturated_s, last = 0.0, (t0, cpu0[0])
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
            rss_peak = max(rss_peak, _stats.rss_kib(server.pid))
            now, used = time.monotonic(), _stats.cpu_s(server.pid)
            if now > last[0] and (used - last[1]) / (now - last[0]) >= SATURATED * cores:
                saturated_s += now - last[0]
            last = (now, used)
        time.sleep(RSS_SAMPLE_S)
    wall = time.monotonic() - t0
    cpu1 = _cpu(server.pid, pids)
    engine_s = (_stats.thread_cpu_s(server.pid, ENGINE_THREADS) if server.pid else 0.0) - engine0
    for proc, _ in workers:
        proc.join(10)
    load_after = _stats.uptime_line()
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
        engine_s=engine_s,
        saturated_s=saturated_s,
    )


def _stats_cores() -> int:
    """The cores the server may run on (this process's affinity, which it inherits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def stock_piper(rounds: int) -> dict[str, float]:
    """Stock Piper's CPU per audio second, measured now in a process of its own (``bench/_piper_cost.py``)."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "_piper_cost.py"), "--rounds", str(rounds)],
        capture_output=True,
        text=True,
        check=False,
        cwd=BENCH,
    )
    if done.returncode != 0:
        raise BenchError(f"stock Piper could not be measured: {done.stderr.strip()[-500:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def capacity(
    levels: list[dict[str, Any]], before: dict[str, float], after: dict[str, float]
) -> dict[str, Any]:
    """The compute limit (cores / stock Piper's best cost) and the largest clean level as a share of it.

    A level is clean when every session connected, every turn completed without an error, no frame came
    late (zero underruns), and TTFA p95 stayed within ``CLEAN_TTFA_P95_MS``.
    """
    cost = min(before["best_ms_per_audio_s"], after["best_ms_per_audio_s"])
    cores = _stats_cores()
    limit = cores * 1000.0 / cost
    clean = [
        lv["sessions"]
        for lv in levels
        if lv["underruns"] == 0
        and lv["errors"] == 0
        and lv["connect_failures"] == 0
        and lv["turns_completed"] == lv["turns"]
        and (lv["ttfa_ms"]["p95"] or 0.0) <= CLEAN_TTFA_P95_MS
    ]
    best = max(clean, default=0)
    return {
        "stock_piper_before": before,
        "stock_piper_after": after,
        "stock_ms_per_audio_s": cost,
        "cores": cores,
        "compute_limit_sessions": round(limit, 2),
        "largest_clean_level": best,
        "clean_share_of_limit": round(best / limit, 3),
    }


def capacity_line(c: dict[str, Any]) -> str:
    return (
        f"stock Piper {c['stock_ms_per_audio_s']:.1f} ms CPU per audio s (best; before "
        f"{c['stock_piper_before']['best_ms_per_audio_s']:.1f},"
        f" after {c['stock_piper_after']['best_ms_per_audio_s']:.1f})"
        f" -> compute limit {c['compute_limit_sessions']:.1f} sessions on {c['cores']} cores;"
        f" largest level with zero underruns: {c['largest_clean_level']}"
        f" = {100 * c['clean_share_of_limit']:.0f}% of it (target {100 * TARGET_SHARE:.0f}%)"
    )


def _cpu(server_pid: int | None, client_pids: Sequence[int]) -> tuple[float, float, float]:
    """(server, clients, whole machine) CPU seconds so far."""
    server = _stats.cpu_s(server_pid) if server_pid else 0.0
    return server, sum(_stats.cpu_s(p) for p in client_pids), _stats.machine_busy_s()


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
    engine_s: float = 0.0,
    saturated_s: float = 0.0,
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
        # where in their turns the gaps fell (s of audio played before each): at a sentence's start or not
        "underrun_at_s": sorted(round(at, 2) for t in done for at in t["underrun_at_s"]),
        "audio_s": sum(t["audio_s"] for t in done),
        "bytes_received": sum(t["bytes"] for t in turns),
        "frames_received": sum(t["frames"] for t in turns),
        "wall_s": round(wall_s, 3),
        "server_cpu_cores": round(server_cores, 3),
        # The server's CPU split: its engine's inference threads (ONNX Runtime's included) and the rest (the
        # event loop: framing, resampling, sending; uvicorn).
        "server_engine_cpu_cores": round(engine_s / wall_s, 3),
        "server_other_cpu_cores": round(max(0.0, server_cores - engine_s / wall_s), 3),
        # How long the server kept every core busy (samples of 250 ms at >= 95% of the cores).
        "server_saturated_s": round(saturated_s, 2),
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
        f" (server: engine {level['server_engine_cpu_cores']:.2f},"
        f" rest {level['server_other_cpu_cores']:.2f};"
        f" all cores busy {level['server_saturated_s']:.0f} of {level['wall_s']:.0f} s)"
        f" ({_num(level['server_cpu_ms_per_audio_s'])} ms server CPU per audio s)"
        f" | client lag p99 send {ms(level['client_send_lag_ms']['p99'])} ms"
        f" loop {ms(level['client_loop_lag_ms']['p99'])} ms{mem}"
    )


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def plot(levels: list[dict[str, Any]], path: Path, title: str, limits: dict[str, Any] | None = None) -> None:
    """TTFA p50/p95 and underruns against sessions, as a small PNG; with ``limits``, the compute limit, 80% of
    it, and the largest level with zero underruns."""
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
    if limits is not None:
        limit = limits["compute_limit_sessions"]
        marks = (
            (limit, "k", "-", f"compute limit {limit:.1f}"),
            (TARGET_SHARE * limit, "tab:green", "--", f"{100 * TARGET_SHARE:.0f}% of it"),
            (limits["largest_clean_level"], "tab:blue", ":", "largest clean level"),
        )
        for axis in (top, bottom):
            for x, color, style, label in marks:
                axis.axvline(x, color=color, linestyle=style, label=label if axis is bottom else None)
        bottom.legend(loc="upper right", fontsize=8)
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
    p.add_argument(
        "--stock-rounds",
        type=int,
        default=5,
        help="engine piper: rounds of stock Piper's cost, before and after the levels (0: not measured)",
    )
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
    print(f"voxgate load bench: {args.engine}, {_stats.uptime_line()}", file=sys.stderr)
    levels: list[dict[str, Any]] = []
    stock = args.engine == "piper" and args.stock_rounds > 0
    limits: dict[str, Any] | None = None
    try:
        before = stock_piper(args.stock_rounds) if stock else None
        for n in levels_wanted:
            with _server(args, log) as server:
                warm_up(server.url, args)
                level = run_level(n, args, server)
            levels.append(level)
            print(report_line(level), flush=True)
        if before is not None:
            limits = capacity(levels, before, stock_piper(args.stock_rounds))
            print(capacity_line(limits), flush=True)
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
        "capacity": limits,
    }
    _stats.write_json(result, args.json)
    if args.png and levels:
        title = (
            f"engine {args.engine}, {args.tokens_per_s:g} tokens/s, {args.jitter_ms:g} ms jitter buffer, "
            f"load average {load_at_start:.1f} at start"
        )
        plot(levels, args.png, title, limits)
        print(f"wrote {args.png}", file=sys.stderr)
    bad = [lv["sessions"] for lv in levels if not lv["turns_completed"]]
    if bad:
        print(f"bench failed: no turn completed at {bad} sessions (server log: {log})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
