"""API keys and the WebSocket Origin allowlist, on a real uvicorn server."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from voxgate.engine.fake import FakeEngine
from websockets.exceptions import InvalidStatus
from websockets.typing import Origin

from tests.conftest import recv_message, send, serve_engine, voxgate_connect

URL = "/v1/audio/speech/stream"


def test_rest_routes_need_a_key_when_keys_are_set() -> None:
    with serve_engine(FakeEngine(), api_keys=("key-a", "key-b")) as address:
        base = f"http://{address}"
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert httpx.get(f"{base}/readyz").status_code == 200
        missing = httpx.post(f"{base}/v1/audio/speech", json={"input": "hi", "response_format": "pcm"})
        wrong = httpx.post(
            f"{base}/v1/audio/speech", json={"input": "hi"}, headers={"Authorization": "Bearer nope"}
        )
        good = httpx.post(
            f"{base}/v1/audio/speech",
            json={"input": "hi", "response_format": "pcm"},
            headers={"Authorization": "Bearer key-b"},
        )
        voices = httpx.get(f"{base}/v1/audio/voices")
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    assert missing.headers["x-request-id"]
    assert wrong.status_code == 401 and voices.status_code == 401
    assert good.status_code == 200 and good.content


def test_websocket_is_refused_before_accept_without_a_key() -> None:
    with serve_engine(FakeEngine(), api_keys=("secret",)) as address:
        with pytest.raises(InvalidStatus) as refused:
            voxgate_connect(f"ws://{address}{URL}")
        assert refused.value.response.status_code == 403
        with pytest.raises(InvalidStatus):
            voxgate_connect(f"ws://{address}{URL}?api_key=wrong")
        # The three ways a client can present the key.
        kwargs: dict[str, Any]
        for kwargs in (
            {"additional_headers": {"Authorization": "Bearer secret"}},
            {"subprotocols": ["voxgate.key.secret"]},
        ):
            with voxgate_connect(f"ws://{address}{URL}", **kwargs) as ws:
                send(ws, type="session.config")
                assert recv_message(ws)["type"] == "session.ready"
                if "subprotocols" in kwargs:
                    assert ws.subprotocol == "voxgate.v1"
        with voxgate_connect(f"ws://{address}{URL}?api_key=secret") as ws:
            send(ws, type="session.config")
            assert recv_message(ws)["type"] == "session.ready"


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        (None, True),  # not a browser
        ("http://localhost:3000", True),
        ("http://127.0.0.1:8080", True),
        ("https://evil.example", False),
        ("https://app.example", True),  # listed in allowed_origins below
    ],
)
def test_websocket_origin_allowlist(origin: str | None, allowed: bool) -> None:
    with serve_engine(FakeEngine(), allowed_origins=("https://app.example",)) as address:
        url = f"ws://{address}{URL}"
        if allowed:
            with voxgate_connect(url, origin=Origin(origin) if origin else None) as ws:
                send(ws, type="session.config")
                assert recv_message(ws)["type"] == "session.ready"
        else:
            with pytest.raises(InvalidStatus) as refused:
                voxgate_connect(url, origin=Origin(origin) if origin else None)
            assert refused.value.response.status_code == 403


def test_dns_rebinding_is_refused_though_origin_matches_host() -> None:
    # An attacker's name resolved to this server: the browser sends Origin and Host with that name.
    with serve_engine(FakeEngine()) as address:
        host = address.replace("127.0.0.1", "attacker.example")
        with pytest.raises(InvalidStatus) as refused:
            voxgate_connect(
                f"ws://{address}{URL}", origin=Origin(f"http://{host}"), additional_headers={"Host": host}
            )
        assert refused.value.response.status_code == 403


def test_api_keys_in_urls_are_redacted_from_logs() -> None:
    import logging

    from voxgate.gateway.middleware.auth import RedactKeys

    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s"',
        ("127.0.0.1", "GET", "/v1/audio/speech/stream?api_key=s3cret&x=1"),
        None,
    )
    assert RedactKeys().filter(record)
    assert "s3cret" not in record.getMessage() and "api_key=***&x=1" in record.getMessage()


def test_every_api_path_needs_the_key_even_with_a_dot_and_probes_do_not() -> None:
    with serve_engine(FakeEngine(), api_keys=("secret",)) as address:
        base = f"http://{address}"
        for path in ("/v1/audio/voices/x.y", "/v1/audio/voices/a.wav", "/v1/audio/voices/..x"):
            assert httpx.get(f"{base}{path}").status_code == 401, path
            assert httpx.delete(f"{base}{path}").status_code == 401, path
        for path in ("/healthz", "/health", "/readyz"):
            assert httpx.get(f"{base}{path}").status_code == 200, path


def test_elevenlabs_key_names_count_and_are_redacted() -> None:
    import logging

    from voxgate.gateway.middleware.auth import RedactKeys, presented_key, redact

    assert presented_key({"headers": [(b"xi-api-key", b"k1")]}) == "k1"
    assert presented_key({"headers": [], "query_string": b"a=1&xi-api-key=k2"}) == "k2"
    assert presented_key({"headers": [], "query_string": b"xi_api_key=k3"}) == "k3"
    bearer = [(b"authorization", b"Bearer k4"), (b"xi-api-key", b"k5")]
    assert presented_key({"headers": bearer}) == "k4"
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "WebSocket %s" [accepted]',
        ("127.0.0.1", "/v1/text-to-speech/tone/stream-input?xi-api-key=s3cret&output_format=pcm_16000"),
        None,
    )
    assert RedactKeys().filter(record)
    assert "s3cret" not in record.getMessage() and "xi-api-key=***&output_format" in record.getMessage()
    assert redact('{"text": " ", "xi_api_key": "s3cret"}') == '{"text": " ", "xi_api_key": "***"}'
    assert redact("?XI%5FAPI%5FKEY=s3cret") == "?XI%5FAPI%5FKEY=***"


def test_wrong_keys_are_limited_per_address_and_the_valid_key_never_is() -> None:
    from voxgate.gateway.middleware.auth import FAILED_AUTH_BURST

    with serve_engine(FakeEngine(), api_keys=("right-key",)) as address:
        url = f"http://{address}/v1/audio/voices"
        with httpx.Client() as http:
            answers = [
                http.get(url, headers={"Authorization": f"Bearer guess-{n}"})
                for n in range(FAILED_AUTH_BURST + 5)
            ]
            # Past the limit, the valid key still passes from the same address, and a WebSocket with a
            # wrong key is refused with 429 too.
            valid = http.get(url, headers={"Authorization": "Bearer right-key"})
            with pytest.raises(InvalidStatus) as refused:
                voxgate_connect(f"ws://{address}{URL}?api_key=wrong")
            with voxgate_connect(f"ws://{address}{URL}?api_key=right-key") as ws:
                send(ws, type="session.config")
                assert recv_message(ws)["type"] == "session.ready"
    statuses = [a.status_code for a in answers]
    assert statuses[:FAILED_AUTH_BURST] == [401] * FAILED_AUTH_BURST
    limited = [a for a in answers if a.status_code == 429]
    assert limited, statuses
    assert limited[0].json()["error"]["code"] == "rate_limited"
    assert int(limited[0].headers["retry-after"]) >= 1
    assert valid.status_code == 200
    assert refused.value.response.status_code == 429


def test_the_failed_key_allowance_comes_back_with_time() -> None:
    asyncio.run(_failed_key_allowance())


async def _failed_key_allowance() -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from voxgate.gateway.middleware.auth import AuthMiddleware

    async def ok(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    now = [100.0]
    app = AuthMiddleware(
        Starlette(routes=[Route("/v1/x", ok)]),
        keys=("k",),
        failed_auth_burst=2,
        failed_auth_per_s=0.5,
        clock=lambda: now[0],
    )
    transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        wrong = {"Authorization": "Bearer nope"}
        first = [(await http.get("/v1/x", headers=wrong)).status_code for _ in range(2)]
        refused = await http.get("/v1/x", headers=wrong)
        assert (await http.get("/v1/x", headers={"Authorization": "Bearer k"})).status_code == 200
        now[0] += 2.0  # one failure's allowance back (0.5 a second)
        again = (await http.get("/v1/x", headers=wrong)).status_code
        after = (await http.get("/v1/x", headers=wrong)).status_code
    other = httpx.ASGITransport(app=app, client=("203.0.113.8", 5000))
    async with httpx.AsyncClient(transport=other, base_url="http://gw") as http:
        elsewhere = (await http.get("/v1/x", headers=wrong)).status_code
    assert first == [401, 401]
    assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
    assert (again, after, elsewhere) == (401, 429, 401)


def test_a_key_is_redacted_as_a_whole_token_only() -> None:
    from voxgate.gateway.middleware.auth import install_redaction, redact

    install_redaction(["ka"])
    # Inside a longer word the letters stay: redacting them would say what the key holds.
    assert redact("/usr/lib/python3/site-packages/x.py") == "/usr/lib/python3/site-packages/x.py"
    assert redact("skaters kayak") == "skaters kayak"
    assert redact("key ka sent") == "key *** sent"
    assert redact("/v1/ka/x?t=ka&y=1") == "/v1/***/x?t=***&y=1"
    assert redact("Bearer%20ka") == "Bearer%20***"
