"""The request-header size limit on a real uvicorn server, with each of uvicorn's HTTP parsers.

A client sending a huge header (issue 18 #16: 50 MB was accepted and buffered under httptools) gets
431 ``header_too_large`` and the connection closed once ``max_header_bytes`` have arrived: the server
stops reading, so the sender fails long before it has sent it all.
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import uvicorn
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.app import create_app
from voxgate.gateway.server.config import server_config
from voxgate.gateway.server.serve import HTTP_IMPLS
from voxgate.gateway.settings import Settings

from tests.conftest import TIMEOUT_S, bound_socket

IMPLS = list(HTTP_IMPLS)
MAX_HEADER_BYTES = 16 * 1024
#: Far more than the kernel's socket buffers on both ends hold (a few MB on loopback): a sender that
#: gets it all out was read by the server.
HUGE_BYTES = 64 * 1024 * 1024


@contextmanager
def limited_server(impl: str, **settings: object) -> Iterator[tuple[str, int]]:
    """The gateway on uvicorn with the HTTP options of ``voxgate serve``, parser ``impl``."""
    with tempfile.TemporaryDirectory() as voices_dir:
        config_settings = Settings.from_env(
            {}, voices_dir=voices_dir, max_header_bytes=MAX_HEADER_BYTES, **settings
        )
        app = create_app(config_settings, engine=FakeEngine())
        sock = bound_socket()
        config = server_config(app, config_settings, impl=impl, log_level="warning")
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


def _exchange(address: tuple[str, int], request: bytes) -> bytes:
    """Send ``request`` from a thread while reading the answer until the server closes."""
    conn = socket.create_connection(address, timeout=TIMEOUT_S)
    conn.settimeout(TIMEOUT_S)

    def write() -> None:
        try:
            conn.sendall(request)
        except OSError:  # the server closed: what it had to say is already on its way
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    data = b""
    try:
        while chunk := conn.recv(65536):
            data += chunk
    except ConnectionResetError:  # the server closed with our bytes unread: its answer came first
        pass
    writer.join(TIMEOUT_S)
    conn.close()
    return data


def _assert_431(data: bytes) -> None:
    assert data.startswith(b"HTTP/1.1 431 "), data[:200]
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "header_too_large" and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("impl", IMPLS)
def test_a_huge_header_gets_431_and_the_server_stops_reading(impl: str) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "
    with limited_server(impl, header_timeout_s=60.0) as address:
        conn = socket.create_connection(address, timeout=TIMEOUT_S)
        conn.settimeout(TIMEOUT_S)
        conn.sendall(request)
        sent, stopped = len(request), False
        piece = b"a" * 65536
        try:
            while sent < HUGE_BYTES:
                sent += conn.send(piece)
        except OSError:  # reset or broken pipe: the server stopped reading and closed
            stopped = True
        data = b""
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
        conn.close()
    assert stopped, f"the server read all {sent} bytes of one header"
    assert sent < HUGE_BYTES // 4
    if data:  # the answer may be lost to the reset that the unread bytes cause
        _assert_431(data)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_header_over_the_limit_gets_431_with_a_structured_error(impl: str) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (4 * MAX_HEADER_BYTES) + b"\r\n\r\n"
    with limited_server(impl) as address:
        _assert_431(_exchange(address, request))


@pytest.mark.parametrize("impl", IMPLS)
def test_headers_under_the_limit_and_large_bodies_pass(impl: str) -> None:
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(100))  # about 11 KB
    body = b"x" * (1024 * 1024)  # far over the header limit, sent with the head in one write
    get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
    post = (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    ) + body
    with limited_server(impl) as address:
        conn = socket.create_connection(address, timeout=TIMEOUT_S)
        conn.settimeout(TIMEOUT_S)
        conn.sendall(get)
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        assert data.startswith(b"HTTP/1.1 200 "), data[:200]
        conn.close()
        answer = _exchange(address, post)
    assert answer.startswith(b"HTTP/1.1 4") and not answer.startswith(b"HTTP/1.1 431"), answer[:200]
