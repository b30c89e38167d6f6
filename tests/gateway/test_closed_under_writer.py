"""The server closes a socket under the session's writer: the session ends quietly.

uvicorn closes a WebSocket on its own (1007 on a text frame of invalid UTF-8, 1009 on a frame past its
limit) and queues the disconnect for the reader; a writer that sends before the reader gets there meets
``RuntimeError("Unexpected ASGI message 'websocket.send', after sending 'websocket.close'.")``. The fuzz
(bench/ws_fuzz.py) hit it 90 times in 20,000 messages, each an ERROR with a traceback. This drives a
``Connection`` over a socket that does exactly that once audio flows, so the order is fixed, not raced.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import Mapping
from typing import Any

import pytest
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.settings import Settings
from voxgate.gateway.transport.socket import Connection
from voxgate.gateway.voices.catalog import Catalog

_CLOSED = "Unexpected ASGI message 'websocket.send', after sending 'websocket.close'."


class _ClosedUnderTheWriter:
    """Answers the config and one utterance, then closes itself as uvicorn does on a protocol error:
    every send raises, and the reader's disconnect is released only after the first failed send."""

    def __init__(self) -> None:
        texts = [
            {"type": "session.config"},
            {"type": "input.text", "text": "Hello there."},
            {"type": "input.done"},
        ]
        self.incoming = [{"type": "websocket.receive", "text": json.dumps(t)} for t in texts]
        self.closed = False
        self.failed_sends = 0
        self.disconnect = asyncio.Event()

    async def receive(self) -> Mapping[str, Any]:
        if self.incoming:
            return self.incoming.pop(0)
        await self.disconnect.wait()
        return {"type": "websocket.disconnect", "code": 1007}

    async def send_text(self, data: str) -> None:
        self._send(json.loads(data)["type"] == "audio.start")

    async def send_bytes(self, data: bytes) -> None:
        self._send(True)

    def _send(self, closes: bool) -> None:
        if self.closed:
            self.failed_sends += 1
            self.disconnect.set()
            raise RuntimeError(_CLOSED)
        self.closed = closes  # the close goes out as the utterance's audio begins

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        raise RuntimeError("Cannot call 'send' once a close message has been sent.")


def test_a_socket_closed_under_the_writer_ends_the_session_with_an_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def run() -> _ClosedUnderTheWriter:
        engine = FakeEngine()
        await engine.start()
        socket = _ClosedUnderTheWriter()
        with tempfile.TemporaryDirectory() as voices_dir:
            connection = Connection(
                ws=socket, catalog=Catalog([engine]), settings=Settings(voices_dir=voices_dir)
            )
            await asyncio.wait_for(connection.run(), 30)
        return socket

    with caplog.at_level(logging.INFO, logger="voxgate"):
        socket = asyncio.run(run())
    assert socket.failed_sends >= 1  # the writer did meet the closed socket
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert any("socket closed while sending" in r.getMessage() for r in caplog.records)
