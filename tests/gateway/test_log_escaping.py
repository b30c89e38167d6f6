"""What clients and upstreams send reaches the log escaped: one record is one line, with no raw control
character (issue 18 #12: a config field named ``x\\x1b[31mERROR\\nfake`` forged a red ERROR line).

The gateway runs as ``voxgate serve`` runs it, a subprocess with the CLI's logging (and uvicorn's access
log), the remote engine in front of a stub upstream whose 4xx text carries escapes too.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from voxgate.gateway.logs import escape, escape_record

from tests.conftest import TIMEOUT_S, bound_socket, recv_until, send, session
from tests.engine import upstream_stub
from tests.engine.upstream_stub import StubUpstream, serve_stub

VOXGATE = Path(sys.executable).with_name("voxgate")
#: A field name that, logged raw, turns the terminal red and starts a forged ERROR line.
FIELD = "x\u001b[31mERROR\nfake gateway ERROR line\u001b[0m"
#: An upstream's refusal that, logged raw, forges a line and clears the screen (C1 CSI, then a bell).
REFUSAL = "voice refused\r\n2026-01-01 00:00:00 ERROR voxgate forged\u009b2J\u0007\u2028end"
#: Control characters a log line must never hold raw (a line break ends the record's line).
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


@pytest.fixture
def cli_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """``voxgate serve --engine remote`` before a refusing stub; yields its address and its log file."""
    monkeypatch.setattr(upstream_stub, "REFUSAL", REFUSAL)
    log = tmp_path / "gateway.log"
    with serve_stub(StubUpstream(mode="refuse400")) as upstream, log.open("wb") as out:
        sock = bound_socket()
        port = sock.getsockname()[1]
        sock.close()  # the port is free again for the subprocess (SO_REUSEADDR)
        env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
        env |= {"NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1", "VOXGATE_VOICES_DIR": str(tmp_path)}
        command = [str(VOXGATE), "serve", "--engine", "remote", "--upstream", upstream, "--port", str(port)]
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            address = f"127.0.0.1:{port}"
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                assert proc.poll() is None, log.read_text(errors="replace")
                try:
                    if httpx.get(f"http://{address}/readyz", timeout=1.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.1)
            yield address, log
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_client_and_upstream_text_is_logged_escaped_one_record_a_line(
    cli_gateway: tuple[str, Path],
) -> None:
    address, log = cli_gateway
    with session(address, **{FIELD: 1}) as ws:
        send(ws, type="input.text", text="Say this.")
        send(ws, type="input.done")
        got = recv_until(ws, "session.done")
    assert any(REFUSAL.split("\r")[0] in str(m["message"]) for m in got.messages("error"))
    rest = httpx.post(
        f"http://{address}/v1/audio/speech?x=%1b[31m%0aforged", json={"input": "Hi."}, timeout=TIMEOUT_S
    )
    assert rest.status_code == 400
    time.sleep(0.5)  # the log lines of what was just answered are written by now, on any machine
    text = log.read_bytes().decode("utf-8", errors="replace")
    assert escape(FIELD) in text  # the field was logged, escaped
    # The upstream's text: its control characters never reach the log raw (the remote engine keeps one
    # printable line of a refusal, its controls turned to spaces, before anything logs or relays it).
    assert "voice refused 2026-01-01 00:00:00 ERROR voxgate forged" in text
    raw = [line for line in text.splitlines() if RAW_CONTROL.search(line)]
    assert not raw, raw
    forged = [line for line in text.splitlines() if line.startswith(("fake", "2026-01-01", "forged"))]
    assert not forged, forged


def test_escape_keeps_argument_types_and_traceback_lines() -> None:
    try:
        raise ValueError("bad \u001b[2J value\nsecond")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.INFO, __file__, 1, "%s %d %r", ("a\nb", 7, "c\u0085"), sys.exc_info()
        )
    escape_record(record)
    assert record.getMessage() == "a\\nb 7 'c\\\\x85'"
    assert isinstance(record.args, tuple) and record.args[1] == 7
    assert record.exc_text is not None and "bad \\x1b[2J value" in record.exc_text
    assert record.exc_text.count("\n") >= 2  # a traceback keeps its lines
    assert not RAW_CONTROL.search(record.exc_text)
