"""The HTTP header timeout (slowloris) on a real uvicorn server, with each of uvicorn's HTTP parsers."""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.app import create_app
from voxgate.gateway.server.config import uvicorn_ws_options
from voxgate.gateway.server.serve import HTTP_IMPLS, http_protocol
from voxgate.gateway.settings import Settings

from tests.conftest import TIMEOUT_S, bound_socket, recv_until, send, session

#: Small, so the test does not wait long; the assertions are about closure, never about speed.
HEADER_TIMEOUT_S = 0.5
IMPLS = list(HTTP_IMPLS)


@contextmanager
def timed_server(impl: str) -> Iterator[tuple[str, int]]:
    """The gateway on uvicorn with the header timeout of ``voxgate serve`` (``http_protocol``)."""
    with tempfile.TemporaryDirectory() as voices_dir:
        settings = Settings(voices_dir=voices_dir, header_timeout_s=HEADER_TIMEOUT_S)
        app = create_app(settings, engine=FakeEngine())
        sock = bound_socket()
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="on",
            http=http_protocol(settings.header_timeout_s, impl),
            timeout_keep_alive=120,  # far beyond the test's pauses: only the header timer may close
            **uvicorn_ws_options(settings),
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while not server.started:
                assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.01)
            yield "127.0.0.1", sock.getsockname()[1]
        finally:
            server.should_exit = True
            thread.join(TIMEOUT_S)
            sock.close()


def _connect(address: tuple[str, int]) -> socket.socket:
    conn = socket.create_connection(address, timeout=TIMEOUT_S)
    conn.settimeout(TIMEOUT_S)  # a hang fails the test (socket.timeout) instead of blocking it
    return conn


def _read_to_close(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def _read_response(conn: socket.socket) -> bytes:
    """One response with a ``content-length`` body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, "closed mid-body"
        body += chunk
    return head + b"\r\n\r\n" + body


def _assert_408(data: bytes) -> None:
    assert data.startswith(b"HTTP/1.1 408 "), data
    body = json.loads(data.partition(b"\r\n\r\n")[2])
    assert body["error"]["code"] == "header_timeout"


GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("impl", IMPLS)
def test_half_a_request_line_gets_408_and_the_connection_closed(impl: str) -> None:
    with timed_server(impl) as address, _connect(address) as conn:
        conn.sendall(b"GET /heal")
        _assert_408(_read_to_close(conn))


@pytest.mark.parametrize("impl", IMPLS)
def test_headers_trickled_a_byte_at_a_time_do_not_extend_the_deadline(impl: str) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000 + b"\r\n\r\n"
    with timed_server(impl) as address, _connect(address) as conn:
        conn.settimeout(HEADER_TIMEOUT_S / 10)
        closed = False
        for byte in request:  # a byte every 50 ms at most: this would take > 8 minutes to finish
            try:
                conn.sendall(bytes([byte]))
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                closed = True
                break
            conn.settimeout(TIMEOUT_S)
            data += _read_to_close(conn)
            _assert_408(data)
            closed = True
            break
        assert closed


@pytest.mark.parametrize("impl", IMPLS)
def test_a_connection_that_sends_nothing_is_closed_silently(impl: str) -> None:
    with timed_server(impl) as address, _connect(address) as conn:
        assert _read_to_close(conn) == b""


@pytest.mark.parametrize("impl", IMPLS)
def test_normal_and_slow_but_complete_keep_alive_clients_are_unaffected(impl: str) -> None:
    with timed_server(impl) as address:
        host, port = address
        assert httpx.get(f"http://{host}:{port}/healthz").status_code == 200
        with _connect(address) as conn:
            for _ in range(3):  # idle between requests far longer than the header timeout
                conn.sendall(GET)
                assert _read_response(conn).startswith(b"HTTP/1.1 200 ")
                time.sleep(HEADER_TIMEOUT_S * 2)
            # A slow body is not the headers' business: its pieces come over several header timeouts.
            body = json.dumps({"input": "Hi."}).encode()
            conn.sendall(
                b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
            )
            for i in range(0, len(body), 5):
                time.sleep(HEADER_TIMEOUT_S / 2)
                conn.sendall(body[i : i + 5])
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                assert chunk, "closed while the body was slow"
                head += chunk
            assert head.startswith(b"HTTP/1.1 200 "), head


@pytest.mark.parametrize("impl", IMPLS)
def test_the_next_request_on_a_keep_alive_connection_has_its_own_deadline(impl: str) -> None:
    with timed_server(impl) as address, _connect(address) as conn:
        conn.sendall(GET)
        assert _read_response(conn).startswith(b"HTTP/1.1 200 ")
        time.sleep(HEADER_TIMEOUT_S * 2)  # idle keep-alive: not timed by the header timer
        conn.sendall(b"GET /hea")
        _assert_408(_read_to_close(conn))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_partial_request_pipelined_behind_a_complete_one_is_timed_too(impl: str) -> None:
    with timed_server(impl) as address, _connect(address) as conn:
        conn.sendall(GET + b"GET /hea")  # one chunk: the second head starts while the first is served
        assert _read_response(conn).startswith(b"HTTP/1.1 200 ")
        conn.sendall(b"l")  # and goes on trickling
        _assert_408(_read_to_close(conn))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_websocket_outlives_the_header_timeout(impl: str) -> None:
    with timed_server(impl) as (host, port), session(f"{host}:{port}") as ws:
        time.sleep(HEADER_TIMEOUT_S * 2)
        send(ws, type="input.text", text="Still open.")
        send(ws, type="input.done")
        assert recv_until(ws, "session.done").frames()
