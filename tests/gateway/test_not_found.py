"""A path no route serves answers 404 on every surface (a WebSocket is denied before accept, not closed)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from starlette.types import Message
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.http import not_found
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.conftest import TIMEOUT_S, serve_engine

PATHS = ["/nope", "/v1/nope", "/v1/audio/voices", "/"]  # the last two serve HTTP only


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    with serve_engine(FakeEngine()) as address:
        yield address


@pytest.mark.parametrize("path", ["/nope", "/v1/nope", "/v1/audio/voices/x/y", "/missing.js"])
def test_http_to_an_unknown_path_is_a_404_error(address: str, path: str) -> None:
    response = httpx.get(f"http://{address}{path}", timeout=TIMEOUT_S)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("path", PATHS)
def test_websocket_to_an_unknown_path_is_denied_with_404(address: str, path: str) -> None:
    with pytest.raises(InvalidStatus) as denied:
        connect(f"ws://{address}{path}", open_timeout=TIMEOUT_S)
    assert denied.value.response.status_code == 404
    assert b'"not_found"' in (denied.value.response.body or b"")


def test_without_the_denial_extension_a_websocket_is_closed() -> None:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "websocket.connect"}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(not_found({"type": "websocket", "path": "/x", "extensions": {}}, receive, send))
    assert [m["type"] for m in sent] == ["websocket.close"]
