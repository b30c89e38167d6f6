"""API keys and the WebSocket Origin allowlist, on a real uvicorn server."""

from __future__ import annotations

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

    from voxgate.gateway.auth import RedactKeys

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

    from voxgate.gateway.auth import RedactKeys, presented_key, redact

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
