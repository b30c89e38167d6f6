"""The graceful drain on SIGTERM, on a real ``voxgate serve`` process with real signals.

No clock decides anything here: the utterance in flight stays open (no ``input.done``) for as long as
the test checks the drain's refusals, and ends when the test sends ``input.done`` (or, in the second
run, is cut by a ``drain_timeout_s`` it can never meet).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection

from tests.conftest import TIMEOUT_S, recv, recv_until, send, session, voxgate_connect

ROOT = Path(__file__).resolve().parents[2]
TEXT = "This sentence is long enough to be spoken over many chunks of the test tone. " * 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def voxgate_serve(tmp_path: Path, *flags: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A ``voxgate serve --engine fake`` process on a free port, paced so that audio takes a while."""
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "voxgate.cli", "serve", "--engine", "fake", "--port", str(port)]
    command += ["--voices-dir", str(tmp_path), "--fake-delay-s", "0.02", "--log-level", "info", *flags]
    proc = subprocess.Popen(command, env=env, cwd=tmp_path)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                if httpx.get(f"http://{address}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "voxgate serve did not start"
            time.sleep(0.05)
        yield proc, address
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT_S)


def _speech(address: str) -> httpx.Response:
    return httpx.post(f"http://{address}/v1/audio/speech", json={"input": "hi", "voice": "tone"})


def test_sigterm_refuses_new_sessions_and_lets_the_utterance_finish(tmp_path: Path) -> None:
    with voxgate_serve(tmp_path) as (proc, address), session(address) as ws:
        send(ws, type="input.text", text=TEXT)
        assert isinstance(recv_until(ws, "audio.start").items[-1], dict)
        assert isinstance(recv(ws), bytes)  # audio is streaming
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + TIMEOUT_S
        while (ready := httpx.get(f"http://{address}/readyz")).status_code == 200:
            assert time.monotonic() < deadline, "readyz never turned 503"
            time.sleep(0.02)
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        with pytest.raises(InvalidStatus) as refused:
            voxgate_connect(f"ws://{address}/v1/audio/speech/stream", open_timeout=TIMEOUT_S)
        assert refused.value.response.status_code == 503
        assert refused.value.response.headers["retry-after"] == "5"
        rest = _speech(address)
        assert rest.status_code == 503 and rest.headers["retry-after"] == "5"
        assert rest.json()["error"]["code"] == "server_shutdown"
        # The session in flight goes on to the end of its utterance.
        send(ws, type="input.done")
        got = recv_until(ws, "session.done")
        assert got.frames() and got.messages("audio.done")
        assert not any(m.get("type") == "error" for m in got.messages())
        error = recv(ws)
        assert isinstance(error, dict) and error["type"] == "error" and error["code"] == "server_shutdown"
        with pytest.raises(ConnectionClosed) as closed:
            recv(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert proc.wait(TIMEOUT_S) == 0


def test_a_session_still_speaking_when_the_drain_times_out_gets_server_shutdown(tmp_path: Path) -> None:
    with voxgate_serve(tmp_path, "--drain-timeout-s", "0.2") as (proc, address), session(address) as ws:
        send(ws, type="input.text", text=TEXT)
        recv_until(ws, "audio.start")
        proc.send_signal(signal.SIGTERM)
        # The utterance is never ended (no input.done): the drain's time runs out.
        got = recv_until(ws, "error")
        error = got.messages("error")[0]
        assert error["code"] == "server_shutdown" and error["fatal"] is True
        assert not got.messages("session.done")
        with pytest.raises(ConnectionClosed) as closed:
            recv(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert proc.wait(TIMEOUT_S) == 0


def test_a_draining_session_refuses_new_utterances_and_ends_after_the_open_one(tmp_path: Path) -> None:
    """A client that speaks back to back (its next text right after the last) is not cut in the middle
    of an utterance at the drain's timeout: the next one is refused, the open one finishes, it ends."""
    with voxgate_serve(tmp_path, "--drain-timeout-s", "30") as (proc, address), session(address) as ws:
        send(ws, type="input.text", text=TEXT)
        recv_until(ws, "audio.start")
        proc.send_signal(signal.SIGTERM)
        _await_draining(address)
        send(ws, type="input.done")
        send(ws, type="input.text", text="A new utterance, started while the server drains.")
        send(ws, type="input.done")
        got = recv_until(ws, "session.done")
        assert got.frames() and got.messages("audio.done")
        refusals = [m for m in (got.messages("error") + _rest_until_close(ws)) if not m["fatal"]]
        assert [m["code"] for m in refusals] == ["server_shutdown", "server_shutdown"]  # its text, its done
        assert proc.wait(TIMEOUT_S) == 0


def _rest_until_close(ws: ClientConnection) -> list[dict[str, object]]:
    """The messages up to the close, which must be the fatal ``server_shutdown`` and 1001, with no
    audio of the refused utterance."""
    messages: list[dict[str, object]] = []
    while True:
        try:
            item = recv(ws)
        except ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.code == 1001
            break
        assert isinstance(item, dict), "audio after the open utterance ended"
        assert item["type"] == "error", item
        messages.append(item)
    assert messages and messages[-1]["code"] == "server_shutdown" and messages[-1]["fatal"] is True
    return messages[:-1]


def _await_draining(address: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while httpx.get(f"http://{address}/readyz").status_code == 200:
        assert time.monotonic() < deadline, "readyz never turned 503"
        time.sleep(0.02)


def test_a_rest_stream_in_flight_runs_to_its_end(tmp_path: Path) -> None:
    text = "A long request body to speak, paced by the fake engine. " * 4
    with voxgate_serve(tmp_path) as (proc, address):
        request = {"input": text, "voice": "tone", "response_format": "pcm", "sample_rate": 16000}
        with httpx.stream("POST", f"http://{address}/v1/audio/speech", json=request, timeout=TIMEOUT_S) as r:
            assert r.status_code == 200
            chunks = r.iter_bytes()
            body = next(chunks)
            proc.send_signal(signal.SIGTERM)
            body += b"".join(chunks)
        # Every segment's tone, whole: SECONDS_PER_CHAR of 16 kHz s16le audio per character.
        assert len(body) >= 2 * int(len(text.replace(" ", "")) * 0.06 * 16000)
        assert proc.wait(TIMEOUT_S) == 0


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    with voxgate_serve(tmp_path) as (proc, address), session(address) as ws:
        send(ws, type="input.text", text=TEXT)
        recv_until(ws, "audio.start")
        proc.send_signal(signal.SIGTERM)
        _await_draining(address)
        proc.send_signal(signal.SIGTERM)  # the utterance is still open: only the second signal ends it
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                recv(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
        assert proc.wait(TIMEOUT_S) == 0
