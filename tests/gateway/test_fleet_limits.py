"""Per-key limits hold across replicas sharing a real Redis (``redis_url``), and survive its restart.

Two real uvicorn servers (or one and a ``voxgate serve`` process, to be SIGKILLed) share one Debian
``redis-server`` on a loopback port. Without ``redis_url`` each would allow the cap by itself.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.middleware.shared_limits import redacted
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection

from tests.conftest import TIMEOUT_S, LogRecords, recv_message, send, serve_engine, voxgate_connect
from tests.redis_server import RedisServer, redis_server
from tests.replicas import replica

URL = "/v1/audio/speech/stream"
KEY, OTHER = "fleet-key", "other-key"
CAP = 2


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as server:
        yield server


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _open(stack: ExitStack, address: str, key: str = KEY) -> ClientConnection:
    """A session of ``key`` on ``address``, ready, closed with ``stack``."""
    ws = stack.enter_context(voxgate_connect(f"ws://{address}{URL}", additional_headers=_headers(key)))
    send(ws, type="session.config")
    assert recv_message(ws)["type"] == "session.ready"
    return ws


def _refused(address: str, key: str = KEY) -> int:
    """The status a new session of ``key`` is refused with (fails if it is admitted)."""
    with pytest.raises(InvalidStatus) as refused:
        with voxgate_connect(f"ws://{address}{URL}", additional_headers=_headers(key)):
            pass
    status: int = refused.value.response.status_code
    return status


def _admitted(address: str, key: str = KEY) -> bool:
    """Whether a new session of ``key`` is admitted now (it is closed at once)."""
    try:
        with ExitStack() as stack:
            _open(stack, address, key)
            return True
    except InvalidStatus as refused:
        assert refused.response.status_code == 429
        return False


def _settings(redis: RedisServer, **more: object) -> dict[str, object]:
    return {
        "api_keys": (KEY, OTHER),
        "max_sessions_per_key": CAP,
        "redis_url": redis.url,
        "redis_lease_s": 1.5,
        **more,
    }


def test_a_keys_session_cap_holds_across_two_replicas(redis: RedisServer) -> None:
    with (
        serve_engine(FakeEngine(), **_settings(redis)) as a,
        serve_engine(FakeEngine(), **_settings(redis)) as b,
    ):
        with ExitStack() as stack:
            _open(stack, a)
            _open(stack, b)
            # Each replica holds one: per process both would admit another.
            assert _refused(a) == 429
            assert _refused(b) == 429
            rest = httpx.post(f"http://{b}/v1/audio/speech", json={"input": "hi"}, headers=_headers(KEY))
            assert rest.status_code == 429 and rest.json()["error"]["code"] == "too_many_sessions"
            # Another key is counted apart.
            _open(stack, b, OTHER)
        # The places are given back when the sessions end.
        deadline = time.monotonic() + TIMEOUT_S
        while not _admitted(b):
            assert time.monotonic() < deadline, "the places were never given back"
            time.sleep(0.05)


def test_the_rate_limit_holds_across_two_replicas(redis: RedisServer) -> None:
    # 4 at once and then one every 100 s: per process, each replica would allow 4.
    limits = _settings(redis, rate_limit_per_s=0.01, rate_limit_burst=4)
    with serve_engine(FakeEngine(), **limits) as a, serve_engine(FakeEngine(), **limits) as b:
        statuses = [
            httpx.get(f"http://{address}/v1/audio/voices", headers=_headers(KEY)).status_code
            for address in (a, b, a, b, a, b)
        ]
        assert statuses == [200, 200, 200, 200, 429, 429]
        refused = httpx.get(f"http://{a}/v1/audio/voices", headers=_headers(KEY))
        assert refused.json()["error"]["code"] == "rate_limited"
        assert int(refused.headers["retry-after"]) > 50
        assert httpx.get(f"http://{b}/v1/audio/voices", headers=_headers(OTHER)).status_code == 200


def test_a_killed_replicas_sessions_stop_counting_within_the_lease(
    redis: RedisServer, tmp_path: Path
) -> None:
    lease_s = 1.0
    env = {
        "VOXGATE_API_KEYS": f"{KEY},{OTHER}",
        "VOXGATE_MAX_SESSIONS_PER_KEY": str(CAP),
        "VOXGATE_REDIS_URL": redis.url,
        "VOXGATE_REDIS_LEASE_S": str(lease_s),
    }
    with serve_engine(FakeEngine(), **_settings(redis, redis_lease_s=lease_s)) as a:
        with replica(tmp_path, "b", env) as b, ExitStack() as stack:
            _open(stack, b.address)
            _open(stack, b.address)
            time.sleep(lease_s * 2)  # renewed meanwhile: still counted
            assert _refused(a) == 429
            b.signal(signal.SIGKILL)
            b.process.wait(TIMEOUT_S)
            killed = time.monotonic()
            while not _admitted(a):
                assert time.monotonic() - killed < TIMEOUT_S, "the dead replica's sessions count forever"
                time.sleep(0.05)
            waited_s = time.monotonic() - killed
        # Within the lease (and the machine's slack), not after the key's own expiry or never.
        assert waited_s < lease_s + 5.0, waited_s


def test_a_redis_restart_is_survived_and_the_limits_come_back(redis: RedisServer) -> None:
    records = LogRecords()
    log = logging.getLogger("voxgate.gateway.middleware.shared_limits")
    log.addHandler(records)
    try:
        limits = _settings(redis, rate_limit_per_s=100.0, rate_limit_burst=100)
        with serve_engine(FakeEngine(), **limits) as a, serve_engine(FakeEngine(), **limits) as b:
            redis.stop()
            with ExitStack() as stack:
                # Redis is down: served, within each process's own cap.
                _open(stack, a)
                _open(stack, b)
                for _ in range(5):
                    for address in (a, b):
                        voices = httpx.get(f"http://{address}/v1/audio/voices", headers=_headers(KEY))
                        assert voices.status_code == 200
                assert _admitted(a)
                redis.start()  # empty: the replicas write their leases back
                deadline = time.monotonic() + TIMEOUT_S
                while _admitted(a):
                    assert time.monotonic() < deadline, "the cap never came back after the restart"
                    time.sleep(0.1)
                assert _refused(b) == 429
        down = [r for r in records.records if "unreachable" in r.getMessage()]
        back = [r for r in records.records if "is back:" in r.getMessage()]
        assert len(down) == 2 and len(back) == 2, [
            r.getMessage() for r in records.records
        ]  # once per replica
    finally:
        log.removeHandler(records)


def test_the_redis_password_never_reaches_the_log() -> None:
    assert redacted("redis://:s3cret@10.0.0.5:6379/0") == "redis://***@10.0.0.5:6379/0"
    assert redacted("rediss://user:s3cret@host:6380/1") == "rediss://***@host:6380/1"
    assert redacted("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def over_cap_after_restarts(redis: RedisServer, rounds: int) -> list[int]:
    """Cap 3, held as 2 sessions on one replica and 1 on another; Redis restarted ``rounds`` times, and
    each time as many more sessions opened on both as they admit: how many each round admitted."""
    lease_s = 6.0  # renewed every 2 s: a restart leaves the leases missing for up to that long
    limits = _settings(redis, max_sessions_per_key=3, redis_lease_s=lease_s)
    over: list[int] = []
    with serve_engine(FakeEngine(), **limits) as a, serve_engine(FakeEngine(), **limits) as b:
        with ExitStack() as stack:
            _open(stack, a)
            _open(stack, a)
            _open(stack, b)
            assert _refused(a) == 429 and _refused(b) == 429
            for _ in range(rounds):
                redis.stop()
                redis.start()
                with ExitStack() as extra:
                    admitted = 0
                    # Per process each replica would admit more (a holds 2 of 3, b 1 of 3).
                    for address in (b, a, b, b):
                        try:
                            _open(extra, address)
                            admitted += 1
                        except InvalidStatus as refused:
                            assert refused.response.status_code == 429
                    over.append(admitted)
    return over


def test_a_redis_restart_never_admits_over_the_cap(redis: RedisServer) -> None:
    """Restarted between two renewals, Redis is empty and redis-py reconnects without a word: new sessions
    wait until every replica has written its leases back instead of being counted against nothing."""
    assert over_cap_after_restarts(redis, rounds=3) == [0, 0, 0]
