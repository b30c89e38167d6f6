"""bench/load.py measures what it says: a real server, real sessions, figures in its JSON and plot.

No speed is asserted; the capacity targets live in the benchmark and docs/performance.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Two short turns' worth: long enough for a second segment, short enough for a quick run.
TEXT = "Hello there. How are you today?"


@pytest.mark.slow
def test_load_bench_runs_sessions_and_reports_figures(tmp_path: Path) -> None:
    out, png = tmp_path / "load.json", tmp_path / "load.png"
    command = [sys.executable, str(ROOT / "bench" / "load.py"), "--engine", "fake", "--sessions", "2"]
    command += ["--duration-s", "1", "--ramp-s", "0.2", "--text", TEXT, "--client-procs", "2"]
    command += ["--json", str(out), "--png", str(png), "--server-log", str(tmp_path / "server.log")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr

    result = json.loads(out.read_text())
    [level] = result["levels"]
    assert level["sessions"] == level["connected"] == 2
    assert level["client_processes"] == 2
    assert level["connect_failures"] == level["errors"] == 0
    assert level["turns_completed"] >= 2  # every session spoke at least once
    ttfa = level["ttfa_ms"]
    assert 0 < ttfa["p50"] <= ttfa["p95"] <= ttfa["p99"] <= ttfa["max"]
    # The fake engine speaks 60 ms per character: each turn is the whole text's audio, in pcm at 24 kHz.
    assert level["audio_s"] == pytest.approx(level["turns_completed"] * len(TEXT) * 0.06, rel=0.05)
    assert level["bytes_received"] == pytest.approx(level["audio_s"] * 24000 * 2, rel=0.01)
    assert level["frames_received"] > 0
    assert level["underruns"] >= 0 and level["underrun_s"] >= 0.0
    # CPU is read in clock ticks (10 ms): two quiet sessions may not use one in the window.
    assert level["server_pid"] and level["server_cpu_cores"] >= 0.0 and level["client_cpu_cores"] >= 0.0
    assert level["server_rss_kib"]["idle"] > 0 and level["server_rss_kib"]["streaming_peak"] > 0
    assert level["uptime_before"] and level["uptime_after"]
    assert level["ttfa_p95_vs_first_level"] == 1.0
    assert "2 sessions: TTFA" in done.stdout
    assert png.read_bytes().startswith(b"\x89PNG")
    assert result["capacity"] is None  # the fake engine has no stock cost to set a compute limit by


def _load_module() -> object:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import load
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return load


def _level(
    sessions: int, underruns: int = 0, p95: float = 400.0, completed: int | None = None
) -> dict[str, Any]:
    turns = 2 * sessions
    return {
        "sessions": sessions,
        "underruns": underruns,
        "errors": 0,
        "connect_failures": 0,
        "turns": turns,
        "turns_completed": turns if completed is None else completed,
        "ttfa_ms": {"p50": p95 / 2, "p95": p95, "p99": p95},
        "underrun_s": 0.1 * underruns,
    }


def test_capacity_is_the_largest_clean_level_over_cores_per_stock_cost(tmp_path: Path) -> None:
    load: Any = _load_module()
    levels = [
        _level(8),
        _level(12),
        _level(16, p95=1400.0),  # no underrun, but first audio too late: not clean
        _level(18, completed=35),  # a turn did not complete: not clean
        _level(20, underruns=3),
    ]
    cost = {"best_ms_per_audio_s": 80.0, "median_ms_per_audio_s": 82.0}
    c = load.capacity(levels, cost, {"best_ms_per_audio_s": 75.0, "median_ms_per_audio_s": 77.0})
    cores = len(os.sched_getaffinity(0))
    assert c["stock_ms_per_audio_s"] == 75.0  # the better of the two measurements
    assert c["compute_limit_sessions"] == pytest.approx(cores * 1000.0 / 75.0, abs=0.01)
    assert c["largest_clean_level"] == 12
    assert c["clean_share_of_limit"] == pytest.approx(12 / (cores * 1000.0 / 75.0), abs=0.001)
    assert "largest level with zero underruns: 12" in load.capacity_line(c)
    png = tmp_path / "load.png"
    load.plot(levels, png, "capacity", c)
    assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_stock_piper_cost_is_measured_in_a_process_of_its_own() -> None:
    load: Any = _load_module()
    cost = load.stock_piper(1)
    assert cost["rounds"] == 1
    assert 0 < cost["best_ms_per_audio_s"] <= cost["median_ms_per_audio_s"] < 1000.0
