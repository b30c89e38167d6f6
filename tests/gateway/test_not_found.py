"""A path no route serves answers 404 on every surface (a WebSocket is denied before accept, not closed)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from starlette.types import Message
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.middleware.http import not_found
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


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("path", ["/nope", "/v1/nope", "/v1/audio/voices/x/y", "/missing.js", "/healthz/"])
def test_any_method_to_an_unknown_path_is_the_json_404(address: str, method: str, path: str) -> None:
    response = httpx.request(method, f"http://{address}{path}", json={}, timeout=TIMEOUT_S)
    assert (response.status_code, response.headers["content-type"]) == (404, "application/json")
    assert response.json()["error"] == {
        "message": f"no route for {path!r}",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
    }


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/healthz", "GET, HEAD"),
        ("GET", "/v1/audio/speech", "POST"),
        ("PUT", "/v1/audio/voices", "GET, HEAD, POST"),
        ("POST", "/", "GET, HEAD"),  # the demo page's files
        ("DELETE", "/app.js", "GET, HEAD"),
    ],
)
def test_a_known_path_with_the_wrong_method_is_a_json_405(
    address: str, method: str, path: str, allow: str
) -> None:
    response = httpx.request(method, f"http://{address}{path}", timeout=TIMEOUT_S)
    assert (response.status_code, response.headers["content-type"]) == (405, "application/json")
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert sorted(response.headers["allow"].split(", ")) == sorted(allow.split(", "))


def test_the_page_and_its_files_are_still_served(address: str) -> None:
    page = httpx.get(f"http://{address}/", timeout=TIMEOUT_S)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert httpx.head(f"http://{address}/app.js", timeout=TIMEOUT_S).status_code == 200


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
