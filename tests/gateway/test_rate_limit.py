"""REST rate limit: a token bucket per API key (per address without keys), 429 with Retry-After, bounded."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.middleware.ratelimit import RateLimitMiddleware, TokenBuckets, rate_limiter, retry_after

from tests.conftest import serve_engine


def test_a_bucket_grants_its_burst_then_refuses_until_it_refills() -> None:
    buckets = TokenBuckets(rate=2.0, burst=3)
    assert [buckets.take("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a", 0.0) == pytest.approx(0.5)  # one token comes back in 1/rate s
    assert buckets.take("a", 0.25) == pytest.approx(0.25)  # a refusal does not reset the refill
    assert buckets.take("a", 0.5) == 0.0
    assert buckets.take("a", 0.5) > 0
    assert buckets.take("a", 10.0) == 0.0  # refilled, but never above the burst
    assert [buckets.take("a", 10.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(0.5)]


def test_keys_have_their_own_buckets() -> None:
    buckets = TokenBuckets(rate=1.0, burst=1)
    assert buckets.take("a", 0.0) == 0.0
    assert buckets.take("a", 0.0) > 0
    assert buckets.take("b", 0.0) == 0.0


def test_full_buckets_are_dropped_and_the_table_is_capped() -> None:
    buckets = TokenBuckets(rate=1.0, burst=2, max_entries=100)
    for i in range(50):
        buckets.take(f"k{i}", 0.0)
    assert len(buckets) == 50
    buckets.take("late", 5.0)  # every earlier bucket has refilled by now: all dropped
    assert len(buckets) == 1
    for i in range(1000):  # a flood of distinct callers at one instant: none refilled, the cap holds
        buckets.take(f"flood{i}", 6.0)
    assert len(buckets) == 100
    # The least recently used went first: the newest callers are still counted.
    assert buckets.take("flood999", 6.0) == 0.0
    assert buckets.take("flood999", 6.0) > 0


def test_invalid_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        TokenBuckets(rate=0.0, burst=1)
    with pytest.raises(ValueError):
        TokenBuckets(rate=1.0, burst=0)


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert retry_after(0.001) == 1
    assert retry_after(1.0) == 1
    assert retry_after(1.2) == 2
    assert retry_after(59.5) == 60


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _app(clock: FakeClock, rate: float = 1.0, burst: int = 2) -> Starlette:
    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/v1/thing", ok), Route("/healthz", ok)])
    app.add_middleware(RateLimitMiddleware, limiter=rate_limiter(rate, burst, clock=clock))
    return app


def test_the_middleware_answers_429_with_retry_after_and_the_error_body_then_admits_after_refill() -> None:
    clock = FakeClock()
    with TestClient(_app(clock, rate=0.5, burst=2)) as client:
        assert [client.get("/v1/thing").status_code for _ in range(2)] == [200, 200]
        refused = client.get("/v1/thing")
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "2"  # one token in 1 / 0.5 s
        error = refused.json()["error"]
        assert error["code"] == "rate_limited" and error["type"] == "invalid_request_error"
        assert client.get("/healthz").status_code == 200  # probes are not counted
        clock.now += 1.5
        assert client.get("/v1/thing").headers["retry-after"] == "1"  # 0.5 s left: rounded up to 1
        clock.now += 0.5
        assert client.get("/v1/thing").status_code == 200


def test_rate_zero_turns_the_limit_off() -> None:
    clock = FakeClock()
    with TestClient(_app(clock, rate=0.0, burst=1)) as client:
        assert {client.get("/v1/thing").status_code for _ in range(20)} == {200}


def test_a_live_server_limits_each_key_on_its_own() -> None:
    # The rate is so low that no token comes back during the test, however slow the machine.
    settings: dict[str, object] = {
        "api_keys": ("key-a", "key-b"),
        "rate_limit_per_s": 0.01,
        "rate_limit_burst": 3,
    }
    with serve_engine(FakeEngine(), **settings) as address:
        base = f"http://{address}"
        a = {"Authorization": "Bearer key-a"}
        b = {"Authorization": "Bearer key-b"}
        assert [httpx.get(f"{base}/v1/audio/voices", headers=a).status_code for _ in range(3)] == [200] * 3
        refused = httpx.post(f"{base}/v1/audio/speech", json={"input": "hi"}, headers=a)
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "rate_limited"
        assert httpx.get(f"{base}/v1/audio/voices", headers=a).status_code == 429
        # Another key is unaffected, and so are the probes.
        assert httpx.post(f"{base}/v1/audio/speech", json={"input": "hi"}, headers=b).status_code == 200
        assert httpx.get(f"{base}/v1/audio/voices", headers=b).status_code == 200
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert httpx.get(f"{base}/readyz").status_code == 200


def test_a_live_server_without_keys_limits_by_client_address() -> None:
    with serve_engine(FakeEngine(), rate_limit_per_s=0.01, rate_limit_burst=2) as address:
        base = f"http://{address}"
        assert [httpx.get(f"{base}/v1/audio/voices").status_code for _ in range(3)] == [200, 200, 429]
