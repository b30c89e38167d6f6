"""The reader waits for the core's next deadline, and is woken when engine reports or writes bring it
sooner (``SessionHost.changed``), without losing the socket's read in progress (``Connection._receive``)."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Mapping
from typing import Any

import pytest
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.metrics import Metrics
from voxgate.gateway.session.host import SessionHost
from voxgate.gateway.settings import Settings
from voxgate.gateway.transport.socket import Connection
from voxgate.gateway.voices.catalog import Catalog


class _Queued:
    """A socket whose messages are put in by the test; what is sent is dropped."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[Mapping[str, Any]] = asyncio.Queue()
        self.reads = 0  # receive() calls begun

    async def receive(self) -> Mapping[str, Any]:
        self.reads += 1
        return await self.incoming.get()

    async def send_text(self, data: str) -> None:
        pass

    async def send_bytes(self, data: bytes) -> None:
        pass

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        pass


def _host(monkeypatch: pytest.MonkeyPatch, deadline: float | None) -> tuple[SessionHost, list[int]]:
    with tempfile.TemporaryDirectory() as voices_dir:
        host = SessionHost(Settings(voices_dir=voices_dir), Metrics().session("voxgate.v1"))
    woken: list[int] = []
    host.sooner = lambda: woken.append(1)
    monkeypatch.setattr(host.core, "next_deadline", lambda: deadline)
    return host, woken


def test_the_host_wakes_the_reader_once_when_the_deadline_comes_sooner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host, woken = _host(monkeypatch, deadline=5.0)
    host.waiting_until = 10.0
    host.changed()
    host.changed()  # once per wait: the reader sets its next wait itself
    assert woken == [1] and host.waiting_until is None


@pytest.mark.parametrize("deadline", [None, 10.0, 12.0])
def test_a_deadline_no_sooner_than_the_wait_wakes_nobody(
    monkeypatch: pytest.MonkeyPatch, deadline: float | None
) -> None:
    host, woken = _host(monkeypatch, deadline=deadline)
    host.waiting_until = 10.0
    host.changed()
    assert woken == [] and host.waiting_until == 10.0


def test_a_woken_reader_waits_again_and_loses_no_message() -> None:
    async def run() -> tuple[Mapping[str, Any], int, float | None]:
        engine = FakeEngine()
        await engine.start()
        socket = _Queued()
        with tempfile.TemporaryDirectory() as voices_dir:
            connection = Connection(
                ws=socket, catalog=Catalog([engine]), settings=Settings(voices_dir=voices_dir)
            )
            reader = asyncio.create_task(connection._receive())
            await asyncio.sleep(0.05)
            assert connection.host.waiting_until is not None and connection.host.sooner is not None
            connection.host.sooner()  # as an engine report that brings the deadline sooner would
            await asyncio.sleep(0.05)
            assert not reader.done()  # woken, it waits again, for the deadline it computes anew
            waiting = connection.host.waiting_until
            await socket.incoming.put(
                {"type": "websocket.receive", "text": json.dumps({"type": "keepalive"})}
            )
            message = await asyncio.wait_for(reader, 5)
        return message, socket.reads, waiting

    message, reads, waiting = asyncio.run(run())
    assert json.loads(str(message["text"])) == {"type": "keepalive"}
    assert reads == 1  # the socket's read was kept across the two waits, not begun again
    assert waiting is not None  # the second wait was armed again
