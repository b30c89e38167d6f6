"""``GET /metrics``: a real scrape after real sessions and requests moves the right series, and only those."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families
from voxgate.engine.fake import FakeEngine
from voxgate.engine.upstreams import UpstreamPool
from voxgate.gateway.metrics import Metrics
from websockets.sync.client import connect

from tests.conftest import TIMEOUT_S, recv_until, send, serve_engine, session

TWO_SENTENCES = "The first sentence is here. And then a second one follows it."
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def exposition(address: str, key: str | None = None) -> str:
    """The text of one scrape."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(f"http://{address}/metrics", headers=headers, timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


def scrape(address: str, key: str | None = None) -> Series:
    """Every sample of a scrape, by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition(address, key))
        for sample in family.samples
    }


def value(series: Series, name: str, **labels: str) -> float:
    return series.get((name, frozenset(labels.items())), 0.0)


def speak(address: str, text: str = TWO_SENTENCES, **config: object) -> None:
    with session(address, **config) as ws:
        send(ws, type="input.text", text=text)
        send(ws, type="input.done")
        recv_until(ws, "session.done")


def settle(address: str, name: str, key: str | None = None, **labels: str) -> Series:
    """Scrape until the gauge ``name`` is back to 0 (a session's end is counted after its socket closes)."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        series = scrape(address, key)
        if value(series, name, **labels) == 0 or time.monotonic() > deadline:
            return series
        time.sleep(0.02)


def test_a_session_and_a_speech_request_move_their_series() -> None:
    with serve_engine(FakeEngine()) as address:
        speak(address)
        response = httpx.post(
            f"http://{address}/v1/audio/speech", json={"input": TWO_SENTENCES}, timeout=TIMEOUT_S
        )
        assert response.status_code == 200
        empty = httpx.post(f"http://{address}/v1/audio/speech", json={"input": "  "}, timeout=TIMEOUT_S)
        assert empty.status_code == 400
        series = settle(address, "voxgate_sessions_active", engine="fake", dialect="voxgate.v1")

    ttfa = "voxgate_time_to_first_audio_seconds_count"
    for dialect in ("voxgate.v1", "openai"):
        assert value(series, ttfa, engine="fake", dialect=dialect, since="first_text") == 1
        assert value(series, ttfa, engine="fake", dialect=dialect, since="segment") == 2
        assert value(series, "voxgate_sessions_total", dialect=dialect) == 1
        assert value(series, "voxgate_sessions_active", engine="fake", dialect=dialect) == 0
        assert value(series, "voxgate_bytes_out_total", dialect=dialect) > 0
        # The second segment starts while the first one's audio is still ahead of playback.
        assert value(series, "voxgate_buffered_audio_seconds_count", engine="fake", dialect=dialect) == 1
    assert value(series, "voxgate_real_time_factor_count", engine="fake") == 4
    assert value(series, "voxgate_engine_queue_wait_seconds_count", engine="fake") == 4
    assert value(series, "voxgate_engine_queue_depth", engine="fake") == 0
    assert value(series, "voxgate_errors_total", code="empty_input", dialect="openai") == 1


def test_the_vllm_omni_dialect_and_a_session_error_are_labelled() -> None:
    with serve_engine(FakeEngine()) as address:
        with connect(f"ws://{address}/v1/audio/speech/stream", open_timeout=TIMEOUT_S) as ws:
            send(ws, type="session.config", voice="nobody-by-this-name")
            ws.recv(timeout=TIMEOUT_S)  # the fatal error
        series = settle(address, "voxgate_sessions_active", engine="none", dialect="vllm-omni")
    assert value(series, "voxgate_sessions_total", dialect="vllm-omni") == 1
    errors = {labels: v for (name, labels), v in series.items() if name == "voxgate_errors_total"}
    assert len(errors) == 1 and dict(next(iter(errors)))["dialect"] == "vllm-omni"


def test_named_contexts_are_counted_while_open() -> None:
    with serve_engine(FakeEngine()) as address:
        with session(address) as ws:
            for context in ("a", "b"):
                send(ws, type="keepalive", context_id=context)
                recv_until(ws, "context.opened")
            open_two = scrape(address)
            send(ws, type="context.close", context_id="a")
            recv_until(ws, "context.closed")
            open_one = scrape(address)
        series = settle(address, "voxgate_contexts_active", engine="fake", dialect="voxgate.v1")
    active = "voxgate_contexts_active"
    assert value(open_two, active, engine="fake", dialect="voxgate.v1") == 2
    assert value(open_one, active, engine="fake", dialect="voxgate.v1") == 1
    assert value(series, active, engine="fake", dialect="voxgate.v1") == 0  # the session ended with b open


def test_metrics_are_public_by_default_even_with_keys() -> None:
    with serve_engine(FakeEngine(), api_keys=("k1",)) as address:
        assert "# TYPE voxgate_sessions_active gauge" in exposition(address)


def test_metrics_behind_the_keys_when_not_public() -> None:
    with serve_engine(FakeEngine(), api_keys=("k1",), metrics_public=False) as address:
        refused = httpx.get(f"http://{address}/metrics", timeout=TIMEOUT_S)
        assert refused.status_code == 401
        assert "# TYPE voxgate_sessions_active gauge" in exposition(address, key="k1")


def test_two_keys_add_no_series() -> None:
    with serve_engine(FakeEngine(), api_keys=("k1", "k2")) as address:
        uri = f"ws://{address}/v1/audio/speech/stream?api_key=k1"
        with connect(uri, subprotocols=["voxgate.v1"], open_timeout=TIMEOUT_S) as ws:  # type: ignore[list-item]
            send(ws, type="session.config")
            send(ws, type="input.text", text=TWO_SENTENCES)
            send(ws, type="input.done")
            recv_until(ws, "session.done")
        first = settle(address, "voxgate_sessions_active", key="k1", engine="fake", dialect="voxgate.v1")
        uri = f"ws://{address}/v1/audio/speech/stream?api_key=k2"
        with connect(uri, subprotocols=["voxgate.v1"], open_timeout=TIMEOUT_S) as ws:  # type: ignore[list-item]
            send(ws, type="session.config")
            send(ws, type="input.text", text=TWO_SENTENCES)
            send(ws, type="input.done")
            recv_until(ws, "session.done")
        second = settle(address, "voxgate_sessions_active", key="k1", engine="fake", dialect="voxgate.v1")
    assert set(second) == set(first)
    assert value(second, "voxgate_sessions_total", dialect="voxgate.v1") == 2
    assert not any("k1" in str(labels) or "k2" in str(labels) for _, labels in second)


class _Remote:
    """Stands for the remote engine: all the collector reads is its name and its pool."""

    name = "remote"

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool


def test_upstream_health_and_breaker_are_read_at_scrape_time() -> None:
    now = [0.0]
    pool = UpstreamPool(
        ["http://a:1", "http://b:1"], breaker_failures=1, breaker_cooldown_s=10, clock=lambda: now[0]
    )
    metrics = Metrics()
    metrics.watch([_Remote(pool)])  # type: ignore[list-item]
    pool.upstreams[1].healthy = False
    pool.failure(pool.upstreams[0], "boom")
    text = metrics.exposition().decode()
    assert 'voxgate_upstream_breaker_state{engine="remote",upstream="http://a:1"} 2.0' in text
    assert 'voxgate_upstream_healthy{engine="remote",upstream="http://b:1"} 0.0' in text
    now[0] = 11.0
    text = metrics.exposition().decode()
    assert 'voxgate_upstream_breaker_state{engine="remote",upstream="http://a:1"} 1.0' in text
