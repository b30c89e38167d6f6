"""Cartesia's and Deepgram's routes on a real gateway: keys as their clients send them, voices, refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from voxgate.engine.fake import FakeEngine
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.conftest import TIMEOUT_S, serve_engine

KEY = "vendor-key"
BODY = {"transcript": "Hi.", "model_id": "sonic-3", "voice": {"mode": "id", "id": "tone"}}


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    with serve_engine(FakeEngine(sample_rate=16000), api_keys=KEY) as served:
        yield served


@pytest.mark.parametrize(
    "headers",
    [{"X-API-Key": KEY}, {"Authorization": f"Bearer {KEY}"}],
    ids=["x-api-key", "bearer"],
)
def test_cartesia_rest_takes_its_clients_keys(address: str, headers: dict[str, str]) -> None:
    answer = httpx.post(f"http://{address}/tts/bytes", json=BODY, headers=headers, timeout=TIMEOUT_S)
    assert answer.status_code == 200 and answer.content
    query = httpx.post(f"http://{address}/tts/sse?api_key={KEY}", json=BODY, timeout=TIMEOUT_S)
    assert query.status_code == 200 and b"event: done" in query.content


@pytest.mark.parametrize("path", ["/tts/bytes", "/tts/sse", "/v1/speak"])
def test_no_key_or_a_wrong_one_is_refused(address: str, path: str) -> None:
    for headers in ({}, {"X-API-Key": "wrong"}, {"Authorization": "Token wrong"}):
        answer = httpx.post(f"http://{address}{path}", json=BODY, headers=headers, timeout=TIMEOUT_S)
        assert answer.status_code == 401, headers


def test_deepgram_takes_a_token(address: str) -> None:
    url = f"http://{address}/v1/speak?encoding=linear16&container=none"
    answer = httpx.post(
        url, json={"text": "Hi."}, headers={"Authorization": f"Token {KEY}"}, timeout=TIMEOUT_S
    )
    assert answer.status_code == 200 and answer.headers["dg-char-count"] == "3"


@pytest.mark.parametrize("path", ["/tts/websocket", "/v1/speak"])
def test_sockets_need_the_key(address: str, path: str) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://{address}{path}", open_timeout=TIMEOUT_S).close()
    assert refused.value.response.status_code == 403
    token = {"Authorization": f"Token {KEY}"} if path == "/v1/speak" else {"X-API-Key": KEY}
    with connect(f"ws://{address}{path}", additional_headers=token, open_timeout=TIMEOUT_S):
        pass


def test_vendor_voice_ids_map_through_the_aliases() -> None:
    """``VOXGATE_VOICE_ALIASES`` maps a vendor's voice id or model name to a voxgate voice; an id it does
    not map is refused, naming the voices there are."""
    aliases = '{"a0e99841-438c-4a64-b679-ae501e7d6091": "tone", "aura-2-zeus-en": "tone"}'
    with serve_engine(FakeEngine(sample_rate=16000), voice_aliases=aliases) as served:
        mapped = {**BODY, "voice": "a0e99841-438c-4a64-b679-ae501e7d6091"}
        assert httpx.post(f"http://{served}/tts/bytes", json=mapped, timeout=TIMEOUT_S).status_code == 200
        zeus = httpx.post(
            f"http://{served}/v1/speak?model=aura-2-zeus-en", json={"text": "Hi."}, timeout=TIMEOUT_S
        )
        assert zeus.status_code == 200 and zeus.headers["dg-model-name"] == "aura-2-zeus-en"
        default = httpx.post(
            f"http://{served}/v1/speak?model=aura-2-thalia-en", json={"text": "Hi."}, timeout=TIMEOUT_S
        )
        assert default.status_code == 200  # the defaults stay, merged under the setting
        unknown = httpx.post(
            f"http://{served}/tts/bytes", json={**BODY, "voice": "b7d50908"}, timeout=TIMEOUT_S
        )
        assert unknown.status_code == 400
        error = unknown.json()
        assert error["error_code"] == "voice_not_found" and "'tone'" in error["message"]


def test_a_deepgram_query_the_engine_cannot_follow_is_refused_at_the_handshake() -> None:
    with serve_engine(FakeEngine(sample_rate=16000, supported=frozenset({"seed"}))) as served:
        with pytest.raises(InvalidStatus) as refused:
            connect(f"ws://{served}/v1/speak?speed=1.2", open_timeout=TIMEOUT_S).close()
        response = refused.value.response
        assert response.status_code == 400
        assert json.loads(response.body or b"{}")["err_code"] == "UNSUPPORTED_OPTION"
        with connect(f"ws://{served}/v1/speak", open_timeout=TIMEOUT_S):
            pass  # at its defaults it opens


def test_a_cartesia_context_whose_settings_the_engine_refuses_is_an_error_and_the_socket_goes_on() -> None:
    output_format = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000}
    base = {"model_id": "sonic-3", "voice": "tone", "output_format": output_format, "continue": False}
    with serve_engine(FakeEngine(sample_rate=16000, supported=frozenset({"speed"}))) as served:
        with connect(f"ws://{served}/tts/websocket", open_timeout=TIMEOUT_S) as ws:
            ws.send(json.dumps({**base, "context_id": "fr", "transcript": "Bonjour.", "language": "fr"}))
            refused = json.loads(ws.recv(timeout=TIMEOUT_S))
            ws.send(json.dumps({**base, "context_id": "en", "transcript": "Hello."}))
            seen = []
            while (message := json.loads(ws.recv(timeout=TIMEOUT_S)))["type"] != "done":
                seen.append((message["type"], message["context_id"]))
    assert (refused["type"], refused["context_id"], refused["done"]) == ("error", "fr", True)
    assert refused["error_code"] == "unsupported_option" and "language" in refused["message"]
    assert message["context_id"] == "en" and ("chunk", "en") in seen
    assert all(context == "en" for _, context in seen)  # nothing of the refused context
