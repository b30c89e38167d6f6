"""An S3 server that answers a GET with more than the object's HEAD said (a tampered or hostile store, or
an object replaced in between) costs the gateway at most the size of a voice file, not the object's size.

The server here is a stub speaking just enough S3 for obstore: HEAD says a small object, GET sends
``BODY_BYTES`` and counts what the gateway took before it hung up.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from voxgate.gateway.voices import s3 as store_s3
from voxgate.gateway.voices.s3 import S3VoiceStore

LIMIT = 1 << 20  # the largest voice file, for this test (MAX_FILE_BYTES is 64 MiB)
BODY_BYTES = 64 << 20
CHUNK = b"\0" * (64 << 10)


class LyingS3(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    sent = 0

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _head(self, length: int) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", '"one"')
        self.send_header("Last-Modified", formatdate(usegmt=True))
        self.end_headers()

    def do_HEAD(self) -> None:
        self._head(4096)

    def do_GET(self) -> None:
        self._head(BODY_BYTES)
        try:
            for _ in range(BODY_BYTES // len(CHUNK)):
                self.wfile.write(CHUNK)
                LyingS3.sent += len(CHUNK)
        except OSError:  # the gateway hung up: what it was sent is counted
            pass


@contextmanager
def lying_server() -> Iterator[dict[str, str]]:
    """A running ``LyingS3``; the AWS variables that point a store at it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), LyingS3)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    LyingS3.sent = 0
    try:
        yield {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_address[1]}",
            "AWS_ACCESS_KEY_ID": "key",
            "AWS_SECRET_ACCESS_KEY": "secret",
            "AWS_REGION": "us-east-1",
        }
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def lying_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with lying_server() as env:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        yield


def test_an_object_larger_than_its_head_said_is_not_read_whole(
    lying_s3: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_s3, "MAX_FILE_BYTES", LIMIT)
    voices = S3VoiceStore("voxgate", "p")
    assert voices.get("", "maria") is None  # skipped as unreadable, as any broken object is
    # What reached the gateway: its limit, and what the sockets buffered, never the 64 MiB sent for.
    assert LyingS3.sent < 16 * LIMIT, LyingS3.sent
