"""bench/load.py measures what it says: a real server, real sessions, figures in its JSON and plot.

No speed is asserted; the capacity targets live in the benchmark and docs/performance.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
