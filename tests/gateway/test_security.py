"""Security on a real uvicorn server: keys never logged, Origin allowlist, voice names, headers."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
import soundfile
from voxgate.engine.fake import FakeEngine
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin, Subprotocol

from tests.conftest import TIMEOUT_S, recv_message, send, serve_engine, voxgate_connect

URL = "/v1/audio/speech/stream"
KEY = "s3cret-KEY-1"
WRONG = "guess-KEY-2"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextmanager
def server_log() -> Iterator[list[str]]:
    """Everything uvicorn and the gateway log, at INFO and above, as formatted lines."""
    handler = _Lines()
    names = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "gateway")
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.INFO)
    for logger in loggers[:2] + loggers[3:4]:  # uvicorn.error propagates to uvicorn; access does not
        logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
            logger.removeHandler(handler)


@contextmanager
def logged_server(**settings: object) -> Iterator[tuple[str, list[str]]]:
    with serve_engine(FakeEngine(), **settings) as address, server_log() as lines:
        yield address, lines


def test_keys_are_never_logged_however_they_arrive() -> None:
    with logged_server(api_keys=(KEY,)) as (address, lines):
        base = f"http://{address}"
        statuses = {
            query: httpx.get(f"{base}/v1/audio/voices?{query}").status_code
            for query in (
                f"api_key={KEY}",
                f"api%5Fkey={KEY}",  # Starlette decodes names: this is the api_key parameter
                f"x=1&api%5fkey={KEY}&y=2",
                f"API_KEY={KEY}",
                f"Api%5FKey={WRONG}",
                f"api%255Fkey={WRONG}",
                f"other={KEY.replace('-', '%2D')}",
            )
        }
        assert httpx.get(f"{base}/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"}).is_success
        for url, kwargs in (
            (f"{URL}?api%5Fkey={KEY}", {}),
            (URL, {"subprotocols": [Subprotocol(f"voxgate.key.{KEY}")]}),
            (URL, {"additional_headers": {"Authorization": f"Bearer {KEY}"}}),
        ):
            with voxgate_connect(f"ws://{address}{url}", **kwargs) as ws:
                send(ws, type="session.config")
                assert recv_message(ws)["type"] == "session.ready"
        for url in (f"{URL}?API%5FKEY={WRONG}", f"{URL}?api_key={WRONG}&x=1"):
            with pytest.raises(InvalidStatus):
                voxgate_connect(f"ws://{address}{url}")
        logging.getLogger("voxgate.gateway.test").error("failed with %s", f"voxgate.key.{WRONG}")
        try:
            raise RuntimeError(f"boom ?api_key={WRONG} Bearer {KEY}")
        except RuntimeError:
            logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    assert statuses[f"api_key={KEY}"] == 200 and statuses[f"api%5Fkey={KEY}"] == 200
    assert statuses[f"x=1&api%5fkey={KEY}&y=2"] == 200
    assert statuses[f"API_KEY={KEY}"] == 401  # the name is case-sensitive, as every other parameter
    text = "\n".join(lines)
    assert "WebSocket" in text and "GET /v1/audio/voices" in text and "***" in text, text
    for secret in (KEY, WRONG, KEY.replace("-", "%2D")):
        assert secret not in text, text


def test_elevenlabs_keys_are_never_logged() -> None:
    path = "/v1/text-to-speech/tone/stream-input?output_format=pcm_16000"
    with logged_server(api_keys=(KEY,)) as (address, lines):
        for query in (f"&xi-api-key={KEY}", f"&xi_api_key={KEY}"):
            with connect(f"ws://{address}{path}{query}") as ws:
                send(ws, text="Hi. ")
                send(ws, text="")
                assert json.loads(ws.recv(timeout=TIMEOUT_S))["audio"]
        with pytest.raises(InvalidStatus):
            connect(f"ws://{address}{path}&xi-api-key={WRONG}")
        rest = httpx.post(
            f"http://{address}/v1/text-to-speech/tone?output_format=pcm_16000&xi-api-key={KEY}",
            json={"text": "Hi."},
        )
        assert rest.status_code == 200
    text = "\n".join(lines)
    assert "xi-api-key=***" in text and "xi_api_key=***" in text, text
    for secret in (KEY, WRONG):
        assert secret not in text, text


# --- Origin ----------------------------------------------------------------------------------------


def test_canonical_origin() -> None:
    from voxgate.gateway.middleware.auth import canonical_origin, server_origins

    assert canonical_origin("HTTPS://App.Example:443/") == "https://app.example"
    assert canonical_origin("http://[::1]:8000") == "http://[::1]:8000"
    assert canonical_origin("http://localhost:80") == "http://localhost"
    for bad in ("null", "file://", "http://", "ftp://x", "http://x:99999", "http://x/path"):
        assert canonical_origin(bad) is None, bad
    assert server_origins("0.0.0.0", 8000) == frozenset()
    assert server_origins("10.0.0.5", 8000) == {"http://10.0.0.5:8000", "https://10.0.0.5:8000"}
    assert server_origins("::1", 80) == {"http://[::1]", "https://[::1]:80"}


def _upload(base: str, origin: str | None) -> httpx.Response:
    headers = {"Origin": origin} if origin else {}
    return httpx.post(
        f"{base}/v1/audio/voices",
        headers=headers,
        data={"name": "x"},  # a cross-site <form> can send this without a preflight
        files={"audio_sample": ("a.wav", b"RIFF", "audio/wav")},
    )


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        (None, True),  # SDKs and curl send no Origin
        ("http://127.0.0.1:1234", True),
        ("http://localhost:3000", True),
        ("https://app.example", True),  # listed
        ("HTTPS://APP.EXAMPLE:443/", True),  # the same origin, spelt otherwise
        ("https://evil.example", False),
        ("null", False),  # sandboxed iframes and file:// pages
    ],
)
def test_rest_routes_that_change_state_check_a_browser_origin(origin: str | None, allowed: bool) -> None:
    with serve_engine(FakeEngine(), allowed_origins=("https://app.example/",)) as address:
        base = f"http://{address}"
        headers = {"Origin": origin} if origin else {}
        upload = _upload(base, origin)
        speech = httpx.post(
            f"{base}/v1/audio/speech", headers=headers, json={"input": "Hi.", "response_format": "pcm"}
        )
        delete = httpx.delete(f"{base}/v1/audio/voices/nobody", headers=headers)
        listing = httpx.get(f"{base}/v1/audio/voices", headers=headers)  # reads are not checked
    assert listing.status_code == 200
    for response in (upload, speech, delete):
        if allowed:
            assert response.status_code != 403, response.text
        else:
            assert response.status_code == 403, response.text
            assert response.json()["error"]["code"] == "origin_not_allowed"
    assert speech.status_code == (200 if allowed else 403)


def test_dns_rebinding_is_refused_on_rest_routes_too() -> None:
    with serve_engine(FakeEngine()) as address:
        host = address.replace("127.0.0.1", "attacker.example")
        refused = httpx.post(
            f"http://{address}/v1/audio/speech",
            headers={"Origin": f"http://{host}", "Host": host},
            json={"input": "Hi.", "response_format": "pcm"},
        )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "origin_not_allowed"


def test_the_gateways_own_configured_address_is_an_allowed_origin() -> None:
    # Bound to a specific host, the page the gateway serves there has that origin.
    with serve_engine(FakeEngine(), host="10.1.2.3", port=8443) as address:
        url = f"ws://{address}{URL}"
        with voxgate_connect(url, origin=Origin("http://10.1.2.3:8443")) as ws:
            send(ws, type="session.config")
            assert recv_message(ws)["type"] == "session.ready"
        for other in ("http://10.1.2.3:9999", "http://10.1.2.4:8443"):
            with pytest.raises(InvalidStatus):
                voxgate_connect(url, origin=Origin(other))


# --- voice names ------------------------------------------------------------------------------------


def _wav() -> bytes:
    buffer = io.BytesIO()
    noise = np.random.default_rng(0).uniform(-0.5, 0.5, 24000).astype(np.float32)
    soundfile.write(buffer, noise, 16000, format="WAV")
    return buffer.getvalue()


def _upload_voice(base: str, name: str) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/audio/voices",
        data={"name": name, "consent": "speaker agreed"},
        files={"audio_sample": ("clip.wav", _wav(), "audio/wav")},
    )


@pytest.mark.parametrize(
    "name",
    [
        "evil\u202egnp.exe",  # right-to-left override
        "a\u2066b\u2069",  # bidi isolates
        "al\u200bice",  # zero-width space
        "al\u200dice",  # zero-width joiner
        "\ufeffalice",  # BOM
        "alice\u200e",  # left-to-right mark
        "al\x85ice",  # C1 control (NEL)
        "al\x9bice",  # C1 control (CSI)
        "al\x07ice",  # C0 control
        "line\u2028break",
        "priv\ue000ate",
    ],
)
def test_voice_names_with_invisible_or_reordering_characters_are_refused(name: str) -> None:
    with serve_engine(FakeEngine()) as address:
        response = _upload_voice(f"http://{address}", name)
        listed = httpx.get(f"http://{address}/v1/audio/voices").json()
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_name" and error["param"] == "name", error
    assert error["message"].startswith("name must not contain") and "U+" in error["message"], error
    assert listed["uploaded_voices"] == []


def test_voice_names_are_nfkc_normalized_and_found_by_any_compatible_spelling() -> None:
    with serve_engine(FakeEngine()) as address:
        base = f"http://{address}"
        created = _upload_voice(base, "\uff21lice\u2460")  # fullwidth A, circled one
        by_plain = httpx.get(f"{base}/v1/audio/voices/Alice1")
        by_compat = httpx.get(f"{base}/v1/audio/voices/\uff41lice1")
        deleted = httpx.delete(f"{base}/v1/audio/voices/%EF%BC%A1lice%E2%91%A0")
    assert created.status_code in (200, 201), created.text
    assert created.json()["voice"]["name"] == "Alice1"
    assert by_plain.status_code == 200 and by_plain.json()["name"] == "Alice1"
    assert by_compat.status_code == 200 and by_compat.json()["name"] == "Alice1"
    assert deleted.status_code == 200, deleted.text


def test_the_name_rule_unit() -> None:
    from voxgate.gateway.voices.names import UnsafeName, normalize_name

    assert normalize_name("\ufb01ne") == "fine"  # ligature
    assert normalize_name("Zoë") == "Zoë" and normalize_name("Zoe\u0308") == "Zoë"  # composed
    assert normalize_name("小明") == "小明"
    with pytest.raises(UnsafeName, match=r"voice must not contain .* U\+202E at position 1"):
        normalize_name("a\u202eb", field="voice")


# --- headers ----------------------------------------------------------------------------------------


def test_every_http_response_has_nosniff_and_the_page_has_a_csp() -> None:
    with serve_engine(FakeEngine(), api_keys=(KEY,)) as address:
        base = f"http://{address}"
        auth = {"Authorization": f"Bearer {KEY}"}
        responses = {
            "page": httpx.get(f"{base}/"),
            "module": httpx.get(f"{base}/app.js"),
            "worklet": httpx.get(f"{base}/player-worklet.js"),
            "missing file": httpx.get(f"{base}/nope.js"),
            "probe": httpx.get(f"{base}/healthz"),
            "no key": httpx.get(f"{base}/v1/audio/voices"),
            "bad origin": httpx.post(f"{base}/v1/audio/speech", headers={"Origin": "https://evil.example"}),
            "voices": httpx.get(f"{base}/v1/audio/voices", headers=auth),
            "speech": httpx.post(
                f"{base}/v1/audio/speech", headers=auth, json={"input": "Hi.", "response_format": "wav"}
            ),
            "bad request": httpx.post(f"{base}/v1/audio/speech", headers=auth, json={}),
        }
    assert [r.status_code for r in responses.values()] == [200, 200, 200, 404, 200, 401, 403, 200, 200, 400]
    for what, response in responses.items():
        assert response.headers.get("x-content-type-options") == "nosniff", what
    csp = responses["page"].headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp


def test_a_refused_websocket_handshake_is_a_403_with_the_reason_and_nosniff() -> None:
    with serve_engine(FakeEngine(), api_keys=(KEY,)) as address:
        url = f"ws://{address}{URL}"
        refusals = []
        for kwargs in (
            {},
            {"origin": Origin("https://evil.example"), "subprotocols": [f"voxgate.key.{KEY}"]},
        ):
            with pytest.raises(InvalidStatus) as refused:
                voxgate_connect(url, **kwargs)
            refusals.append(refused.value.response)
    codes = [json.loads(r.body or b"{}")["error"]["code"] for r in refusals]
    assert codes == ["invalid_api_key", "origin_not_allowed"]
    for response in refusals:
        assert response.status_code == 403 and response.headers["X-Content-Type-Options"] == "nosniff"
