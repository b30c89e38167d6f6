"""bench/ws_fuzz.py and bench/soak.py reach the ElevenLabs and phone-carrier surfaces (issue 18).

The fuzz against a real server on the fake engine: first its tour (every hostile message of these surfaces,
each on a connection of its own: deep JSON, wrong types, huge values, unknown and forged field names,
control characters, bad base64 media, malformed framing), then seeded random connections (floods of
flushes, clears and refused first messages among them). Every connection ends in a counted scenario and
nothing breaks: no traceback (deep JSON leaked ``RecursionError`` on the ElevenLabs socket), no internal
error, no raw control character in the log (forged field names were logged as sent).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SURFACES = ("elevenlabs", "elevenlabs_multi", "twilio", "telnyx")
SCENARIOS = ("tour", "hostile", "unfatal", "flood", "abrupt", "bad_open")
# The tour alone sends about 900: the rest are random connections.
MESSAGES = 1500


@pytest.mark.slow
def test_the_fuzz_covers_elevenlabs_and_carriers_without_a_crash(tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    command = [sys.executable, str(ROOT / "bench" / "ws_fuzz.py"), "--messages", str(MESSAGES)]
    command += ["--surfaces", ",".join(SURFACES), "--concurrency", "8", "--json", str(out)]
    command += ["--log", str(tmp_path / "server.log")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    result = json.loads(out.read_text())
    summary = {k: v for k, v in result.items() if k != "kinds"}

    assert result["messages"] >= MESSAGES, summary
    assert set(result["surfaces"]) == set(SURFACES), summary
    # Every connection ends in a scenario of its surface, and each surface got hostile messages.
    assert sum(result["scenarios"].values()) == sum(result["surfaces"].values()) == result["connections"]
    assert {name.split(":")[1] for name in result["scenarios"]} <= set(SCENARIOS)
    assert {name.split(":")[0] for name in result["scenarios"]} == set(SURFACES)
    toured = {name.split(":tour:")[0] for name in result["kinds"] if ":tour:" in name}
    assert toured == set(SURFACES), result["kinds"]
    assert all(result["scenarios"][f"{surface}:hostile"] for surface in SURFACES), summary
    assert result["error_codes"], summary  # hostile messages were answered
    for bad in ("crashes", "tracebacks", "hangs", "errors_without_code", "internal_errors"):
        assert result[bad] == 0, (bad, summary)
    assert result["unexpected_closes"] == result["bad_alignments"] == 0, summary
    assert result["log_control_lines"] == 0, summary  # a forged field name is not written raw
    assert result["fuzz_failures"] == {}, summary
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_the_soak_speaks_on_elevenlabs_and_twilio_too(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    command = [sys.executable, str(ROOT / "bench" / "soak.py"), "--sessions", "3", "--minutes", "0.15"]
    command += ["--sample-s", "1", "--reconnect-every", "2", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    summary = json.loads(out.read_text())["summary"]
    # One session per surface, each with utterances spoken to their end (a barge-in's end is its cancel).
    assert set(summary["by_surface"]) == {"voxgate", "elevenlabs", "twilio"}, summary
    assert all(n > 0 for n in summary["by_surface"].values()), summary
    assert summary["utterances"] == sum(summary["by_surface"].values())
    assert summary["positions"] > 0  # the echoed marks were answered
    assert summary["errors"] == summary["unexpected_closes"] == summary["hangs"] == 0, summary
    assert summary["server_tracebacks"] == 0 and summary["audio_s"] > 0
