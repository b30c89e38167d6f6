"""Sessions per process and per API key are capped: refused before accept, 503 / 429 with Retry-After."""

from __future__ import annotations

import asyncio
import time
from collections.abc import MutableMapping
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.server.sessions import Admission, Sessions
from websockets.exceptions import InvalidStatus

from tests.conftest import TIMEOUT_S, recv_message, recv_until, send, serve_engine, voxgate_connect

URL = "/v1/audio/speech/stream"


def _refused(address: str, key: str | None = None) -> InvalidStatus:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with pytest.raises(InvalidStatus) as refused:
        voxgate_connect(f"ws://{address}{URL}", additional_headers=headers)
    return refused.value


def _speech(address: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"http://{address}/v1/audio/speech", json={"input": "hi"}, headers=headers)


def _admitted(address: str, key: str | None = None) -> None:
    """Open a session once a place is free (a closed session gives its place back as its handler ends)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            with voxgate_connect(f"ws://{address}{URL}", additional_headers=headers) as ws:
                send(ws, type="session.config")
                assert recv_message(ws)["type"] == "session.ready"
                return
        except InvalidStatus:
            assert time.monotonic() < deadline, "the place was never given back"
            time.sleep(0.02)


def test_sessions_past_max_sessions_are_refused_with_503() -> None:
    with serve_engine(FakeEngine(), max_sessions=1) as address:
        with voxgate_connect(f"ws://{address}{URL}") as ws:
            send(ws, type="session.config")
            ready = recv_message(ws)
            assert ready["limits"]["max_sessions"] == 1
            refused = _refused(address)
            assert refused.response.status_code == 503
            assert refused.response.headers["retry-after"] == "1"
            assert b"server_busy" in refused.response.body
            rest = _speech(address)
            assert rest.status_code == 503 and rest.json()["error"]["code"] == "server_busy"
            assert rest.headers["retry-after"] == "1"
            assert httpx.get(f"http://{address}/readyz").status_code == 200
        _admitted(address)
        assert _speech(address).status_code == 200


def test_sessions_past_max_sessions_per_key_are_refused_with_429_for_that_key_only() -> None:
    with serve_engine(FakeEngine(), api_keys=("key-a", "key-b"), max_sessions_per_key=1) as address:
        headers = {"Authorization": "Bearer key-a"}
        with voxgate_connect(f"ws://{address}{URL}", additional_headers=headers) as ws:
            send(ws, type="session.config")
            assert recv_message(ws)["type"] == "session.ready"
            refused = _refused(address, "key-a")
            assert refused.response.status_code == 429
            assert refused.response.headers["retry-after"] == "1"
            assert b"too_many_sessions" in refused.response.body
            rest = _speech(address, "key-a")
            assert rest.status_code == 429 and rest.json()["error"]["code"] == "too_many_sessions"
            _admitted(address, "key-b")
            assert _speech(address, "key-b").status_code == 200
        _admitted(address, "key-a")


def test_without_keys_only_the_process_cap_applies() -> None:
    with serve_engine(FakeEngine(), max_sessions_per_key=1) as address:
        with voxgate_connect(f"ws://{address}{URL}") as ws:
            send(ws, type="session.config")
            assert recv_message(ws)["type"] == "session.ready"
            _admitted(address)


def test_text_past_the_backlog_cap_is_refused_and_the_session_goes_on() -> None:
    with serve_engine(FakeEngine(), max_pending_text_chars=30) as address:
        with voxgate_connect(f"ws://{address}{URL}") as ws:
            send(ws, type="session.config")
            ready = recv_message(ws)
            assert ready["limits"]["max_pending_text_chars"] == 30
            send(ws, type="input.text", text="x" * 31)
            error = recv_message(ws)
            assert error["type"] == "error" and error["code"] == "text_backlog_full"
            assert error["fatal"] is False and error["field"] == "$.text"
            send(ws, type="input.text", text="Short.")
            send(ws, type="input.done")
            got = recv_until(ws, "session.done")
            assert [m["sentence_text"] for m in got.messages("audio.start")] == ["Short."]


def test_a_server_without_denial_responses_gets_a_close_before_accept() -> None:
    sessions = Sessions(drain_timeout_s=1.0)
    sessions.draining = True
    sent: list[dict[str, object]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("a refused session never reaches the app")

    async def receive() -> dict[str, object]:
        return {"type": "websocket.connect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope: Scope = {"type": "websocket", "path": URL, "state": {"owner": ""}}
    asyncio.run(Admission(app, sessions=sessions)(scope, receive, send))
    assert sent == [{"type": "websocket.close", "code": 1001, "reason": "server_shutdown"}]
