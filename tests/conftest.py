"""Shared fixtures: a real uvicorn server on a free loopback port, and a WebSocket client helper."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from voxgate.engine.base import TTSEngine
from voxgate.gateway.app import create_app
from voxgate.gateway.server.config import server_config
from voxgate.gateway.session.receipts import ReceiptProtocol
from voxgate.gateway.settings import Settings
from voxgate.protocol.codecs.stream import EXTENSIONS_SUBPROTOCOL
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

# The bound on every wait in the tests, so a slow machine can raise them all at once.
TIMEOUT_S = 30.0


def bound_socket() -> socket.socket:
    """A loopback socket bound to a free port and not yet listening: connections to it are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class LogRecords(logging.Handler):
    """A logging handler that keeps every record it is given."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def serve(
    app: Starlette,
    sock: socket.socket | None = None,
    *,
    ws_max_size: int = 16 * 1024 * 1024,
    ws: str | type[ReceiptProtocol] = ReceiptProtocol,
    ws_per_message_deflate: bool = True,
    **options: Any,
) -> Iterator[str]:
    """Run ``app`` on uvicorn in a thread on ``sock`` or a free loopback port; yields ``host:port``.

    The configuration is the one ``voxgate serve`` runs (``gateway.server.config``: uvicorn's sans-I/O
    WebSocket protocol with read receipts, the header timeout and size limit) at the default settings;
    permessage-deflate is accepted, as ``ws_compression`` would, so the tests meet the harder case.
    ``options`` replace any of it as they are (``ssl_certfile``, ...).
    """
    sock = sock or bound_socket()
    port = sock.getsockname()[1]
    config = server_config(
        app,
        Settings.from_env({}),
        log_level="warning",
        ws_max_size=ws_max_size,
        ws=ws,
        ws_per_message_deflate=ws_per_message_deflate,
        **options,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(TIMEOUT_S)
        sock.close()


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate and key for 127.0.0.1 in ``folder`` (skips the test without openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


@contextmanager
def serve_engine(tts: TTSEngine | Sequence[TTSEngine] | None = None, **settings: object) -> Iterator[str]:
    """Serve a gateway app with the engine(s) ``tts`` (or, when None, those named in settings).

    Voices go to a fresh temporary folder unless ``voices_dir`` is given, never to the user's cache.
    """
    with tempfile.TemporaryDirectory(prefix="voxgate-voices-") as voices_dir:
        settings.setdefault("voices_dir", voices_dir)
        with serve(create_app(Settings.from_env({}, **settings), engine=tts)) as address:
            yield address


@dataclass
class Received:
    """Everything a client got, in order: JSON messages as dicts, binary frames as bytes."""

    items: list[dict[str, object] | bytes] = field(default_factory=list)

    def messages(self, kind: str | None = None) -> list[dict[str, object]]:
        return [m for m in self.items if isinstance(m, dict) and (kind is None or m["type"] == kind)]

    def frames(self) -> list[bytes]:
        return [m for m in self.items if isinstance(m, bytes)]

    def types(self) -> list[str]:
        return ["<audio>" if isinstance(m, bytes) else str(m["type"]) for m in self.items]


def send(ws: ClientConnection, **message: object) -> None:
    ws.send(json.dumps(message))


def recv(ws: ClientConnection, timeout: float = TIMEOUT_S) -> dict[str, object] | bytes:
    data = ws.recv(timeout=timeout)
    return data if isinstance(data, bytes) else json.loads(data)


def recv_message(ws: ClientConnection, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """Receive one JSON message (fails on a binary frame)."""
    item = recv(ws, timeout)
    assert isinstance(item, dict), f"expected a JSON message, got {len(item)} bytes of audio"
    return item


def recv_until(
    ws: ClientConnection, kind: str, received: Received | None = None, timeout: float = TIMEOUT_S
) -> Received:
    """Receive until a JSON message of type ``kind`` arrives (included)."""
    received = received or Received()
    deadline = time.monotonic() + timeout
    while True:
        item = recv(ws, max(0.01, deadline - time.monotonic()))
        received.items.append(item)
        if isinstance(item, dict) and item["type"] == kind:
            return received


def voxgate_connect(uri: str, **kwargs: Any) -> ClientConnection:
    """Open a WebSocket that opts in to voxgate's extensions (subprotocol ``voxgate.v1``)."""
    offered = [Subprotocol(EXTENSIONS_SUBPROTOCOL), *kwargs.pop("subprotocols", [])]
    conn: ClientConnection = connect(uri, subprotocols=offered, **kwargs)
    return conn


@contextmanager
def session(address: str, **config: object) -> Iterator[ClientConnection]:
    """Open a WebSocket session opted in to voxgate's extensions, send session.config, await session.ready."""
    with voxgate_connect(
        f"ws://{address}/v1/audio/speech/stream", max_size=None, open_timeout=TIMEOUT_S
    ) as ws:
        send(ws, type="session.config", **config)
        ready = recv(ws)
        assert isinstance(ready, dict) and ready["type"] == "session.ready", ready
        yield ws


@pytest.fixture(scope="session")
def output_dir() -> Path:
    """A folder for artefacts a person may want to look at (screenshots, audio)."""
    path = Path(__file__).resolve().parent.parent / "test-output"
    path.mkdir(exist_ok=True)
    return path
