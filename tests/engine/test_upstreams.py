"""UpstreamPool bookkeeping, with a clock the test moves by hand."""

from __future__ import annotations

import pytest
from voxgate.engine.upstreams import Upstream, UpstreamPool

URLS = ["http://a:1", "http://b:2", "http://c:3"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pool(
    urls: list[str] = URLS, *, failures: int = 3, cooldown_s: float = 30.0
) -> tuple[UpstreamPool, Clock]:
    clock = Clock()
    return UpstreamPool(urls, breaker_failures=failures, breaker_cooldown_s=cooldown_s, clock=clock), clock


def urls(upstreams: list[Upstream]) -> list[str]:
    return [u.url for u in upstreams]


def test_needs_an_upstream_and_strips_trailing_slashes() -> None:
    with pytest.raises(ValueError, match="at least one upstream"):
        UpstreamPool([])
    assert urls(UpstreamPool(["http://a:1/", "http://b:2"]).upstreams) == ["http://a:1", "http://b:2"]


def test_fewest_outstanding_first() -> None:
    p, _ = pool()
    a, b, c = p.upstreams
    with p.lease(a), p.lease(a), p.lease(b):
        assert (a.outstanding, b.outstanding, c.outstanding) == (2, 1, 0)
        for _ in range(len(URLS)):  # whatever the rotation
            assert urls(p.candidates()) == ["http://c:3", "http://b:2", "http://a:1"]
    assert (a.outstanding, b.outstanding, c.outstanding) == (0, 0, 0)


def test_lease_is_returned_when_the_request_raises() -> None:
    p, _ = pool()
    a = p.upstreams[0]
    with pytest.raises(RuntimeError), p.lease(a):
        raise RuntimeError("request failed")
    assert a.outstanding == 0


def test_ties_rotate_so_load_spreads() -> None:
    p, _ = pool()
    firsts = [p.candidates()[0].url for _ in range(6)]
    assert firsts == URLS * 2
    # The order is a rotation, never a shuffle: every upstream still comes once.
    assert all(sorted(urls(p.candidates())) == URLS for _ in range(3))


def test_ties_rotate_among_the_least_loaded_only() -> None:
    p, _ = pool()
    a = p.upstreams[0]
    with p.lease(a):
        firsts = {p.candidates()[0].url for _ in range(6)}
        assert firsts == {"http://b:2", "http://c:3"}
        assert all(p.candidates()[-1] is a for _ in range(3))


def test_unhealthy_upstream_is_not_offered() -> None:
    p, _ = pool()
    b = p.upstreams[1]
    b.healthy, b.last_error = False, "health check answered 503"
    assert all(b not in p.candidates() for _ in range(3))
    assert not p.available(b)
    b.healthy = True
    assert b in p.candidates()


def test_no_candidates_when_every_upstream_is_out() -> None:
    p, _ = pool(URLS[:1], failures=1)
    p.failure(p.upstreams[0], "status 500")
    assert p.candidates() == []


def test_breaker_opens_after_consecutive_failures() -> None:
    p, clock = pool(failures=3)
    a = p.upstreams[0]
    p.failure(a, "status 500")
    p.failure(a, "status 500")
    assert p.available(a) and a.opened_at is None
    p.failure(a, "read timeout")
    assert not p.available(a) and a.opened_at == clock.now
    assert a not in p.candidates()
    clock.now += 29.9
    assert not p.available(a)


def test_a_success_in_between_resets_the_count() -> None:
    p, _ = pool(failures=2)
    a = p.upstreams[0]
    for _ in range(5):
        p.failure(a, "status 500")
        p.success(a)
    assert p.available(a) and a.failures == 0


def test_half_open_after_cooldown_then_one_failure_reopens() -> None:
    p, clock = pool(failures=2, cooldown_s=10.0)
    a = p.upstreams[0]
    p.failure(a, "status 500")
    p.failure(a, "status 500")
    assert not p.available(a)
    clock.now += 10.0
    assert p.available(a) and a in p.candidates()  # half-open: offered again
    p.failure(a, "still 500")
    assert not p.available(a) and a.opened_at == clock.now
    clock.now += 9.0
    assert not p.available(a)
    clock.now += 1.0
    assert p.available(a)


def test_success_closes_the_breaker() -> None:
    p, clock = pool(failures=1, cooldown_s=5.0)
    a = p.upstreams[0]
    p.failure(a, "status 500")
    clock.now += 5.0
    p.success(a)
    assert (a.failures, a.opened_at, a.last_error) == (0, None, "")
    p.failure(a, "status 500")  # a fresh count: one failure (the threshold) opens it again
    assert not p.available(a)


def test_health_and_breaker_both_count() -> None:
    p, clock = pool(failures=1, cooldown_s=5.0)
    a = p.upstreams[0]
    p.failure(a, "status 500")
    a.healthy = False
    clock.now += 5.0
    assert not p.available(a)  # the cooldown is over, but the last health check failed
    a.healthy = True
    assert p.available(a)


def test_describe() -> None:
    p, _ = pool(URLS, failures=1)
    a, b, c = p.upstreams
    assert p.describe() == "http://a:1: up; http://b:2: up; http://c:3: up"
    p.failure(a, "status 500: b'boom'")
    b.healthy, b.last_error = False, "health check failed: ConnectError()"
    assert p.describe() == (
        "http://a:1: down (status 500: b'boom'); http://b:2: down (health check failed: ConnectError()); "
        "http://c:3: up"
    )


def test_an_upstream_marked_down_is_offered_again_once_healthy() -> None:
    p, _ = pool()
    a = p.upstreams[0]
    p.down(a, "voice list: no answer within 5 s")
    assert a not in p.candidates() and "no answer within 5 s" in p.describe()
    a.healthy = True  # its next health check passed
    assert a in p.candidates()
