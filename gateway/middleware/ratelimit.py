"""A rate limit on the REST routes: one token bucket per API key, or per client address without keys.

``TokenBuckets`` is the pure logic, with time passed in (tests drive it with a fake clock).
``RateLimitMiddleware`` applies it to HTTP requests under ``/v1/`` (speech, voices): the probes
(``/healthz``, ``/readyz``), ``/metrics``, the demo page and WebSockets are not counted (WebSocket
sessions have their own caps, ``gateway.server.sessions``). A refused request gets 429 ``rate_limited`` with
``Retry-After``, the seconds until a token is back (at least 1).

Memory is bounded: a bucket that has refilled to full holds nothing a fresh bucket would not, so it is
dropped; buckets are kept in least-recently-used order, so the idle ones are found first, at the front.
Past ``max_entries`` the least recently used bucket is dropped even if not full (its caller then starts
again with a full burst): a flood of distinct addresses cannot grow the table.

With ``redis_url`` set, the bucket is the fleet's, in Redis (``gateway.middleware.shared_limits``: the same
arithmetic in a Lua script, on Redis' clock): a caller gets ``rate`` across all replicas, not per replica.
While Redis is down, each process's own buckets apply again (fail open to the per-process limit).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from ...protocol.errors import ErrorCode, ProtocolError
from .auth import API_PREFIX
from .http import error_response
from .shared_limits import SharedLimits

#: Buckets kept at most (about 100 bytes each).
MAX_BUCKETS = 10_000
#: Inline ``ref_audio`` clips a session or a batch may have decoded: this many at once, then one every
#: ``REFERENCE_EVERY_S``.
REFERENCES_BURST = 3
REFERENCE_EVERY_S = 10.0


class TokenBuckets:
    """Token buckets by key: ``rate`` tokens a second up to ``burst``; each request takes one.

    Args:
        rate: tokens added per second (> 0).
        burst: the bucket's size, the requests allowed at once (>= 1).
        max_entries: buckets kept at most; the least recently used is dropped past it.
    """

    def __init__(self, rate: float, burst: int, *, max_entries: int = MAX_BUCKETS) -> None:
        if rate <= 0 or burst < 1 or max_entries < 1:
            raise ValueError("rate must be > 0, burst and max_entries >= 1")
        self.rate = rate
        self.burst = float(burst)
        self.max_entries = max_entries
        # key -> (tokens, when they were counted), least recently used first.
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def _level(self, key: str, now: float) -> float:
        tokens, then = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + max(0.0, now - then) * self.rate)

    def take(self, key: str, now: float) -> float:
        """Take a token for ``key`` at time ``now`` (seconds); returns 0.0 when granted, else the seconds
        until a token is available (nothing is taken then)."""
        self._evict(now)
        tokens = self._level(key, now)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            self._buckets.move_to_end(key)
            self._trim()
            return 0.0
        # Refused: the bucket is kept as it was counted, so a refusal does not reset its refill.
        self._buckets[key] = (tokens, now)
        self._buckets.move_to_end(key)
        self._trim()
        return (1.0 - tokens) / self.rate

    def _evict(self, now: float) -> None:
        """Drop, from the least recently used end, the buckets that have refilled to full."""
        while self._buckets:
            key = next(iter(self._buckets))
            if self._level(key, now) < self.burst:
                return
            del self._buckets[key]

    def _trim(self) -> None:
        while len(self._buckets) > self.max_entries:
            self._buckets.popitem(last=False)


def retry_after(wait_s: float) -> int:
    """``Retry-After`` in whole seconds for a wait of ``wait_s``: rounded up, at least 1."""
    return max(1, math.ceil(wait_s))


class RateLimiter:
    """The per-caller rate limit of REST requests (the fleet's buckets in Redis, else the process's own).

    A batch's items each take a token too (``gateway.routes.batch``): a batch is admitted item by item.

    Args:
        rate: requests per second per caller (> 0).
        burst: requests a caller may make at once.
        clock: seconds, monotonic (tests pass a fake one).
        max_entries: buckets kept at most.
        shared: the fleet's buckets in Redis; the process's own are used while it is down.
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = MAX_BUCKETS,
        shared: SharedLimits | None = None,
    ) -> None:
        self.shared = shared
        self.burst = max(1, burst)
        self.buckets = TokenBuckets(rate, self.burst, max_entries=max_entries)
        self.clock = clock

    @staticmethod
    def key(scope: Scope) -> str:
        """The caller's bucket: its API key's owner, else its address."""
        owner = str(scope.get("state", {}).get("owner", ""))
        client = scope.get("client")
        return f"key:{owner}" if owner else f"addr:{client[0] if client else ''}"

    async def take(self, key: str) -> float:
        """Take a token of ``key``'s bucket: 0 when taken, else the seconds until one is back."""
        wait_s = None if self.shared is None else await self.shared.take(key, self.buckets.rate, self.burst)
        if wait_s is None:
            wait_s = self.buckets.take(key, self.clock())
        return wait_s

    def refusal(self, wait_s: float) -> tuple[ProtocolError, int]:
        """The ``rate_limited`` error for a wait of ``wait_s``, and its ``Retry-After``."""
        seconds = retry_after(wait_s)
        message = f"too many requests: retry in {seconds} s ({self.buckets.rate:g} a second)"
        return ProtocolError(ErrorCode.RATE_LIMITED, message), seconds


def rate_limiter(
    rate: float,
    burst: int,
    *,
    clock: Callable[[], float] = time.monotonic,
    shared: SharedLimits | None = None,
) -> RateLimiter | None:
    """The rate limit of ``rate`` requests a second past ``burst``; None for a rate of 0 (no limit)."""
    return RateLimiter(rate, burst, clock=clock, shared=shared) if rate > 0 else None


class RateLimitMiddleware:
    """429 ``rate_limited`` with ``Retry-After`` for REST requests over the caller's rate (``limiter``; None
    turns the limit off).

    Sits inside ``AuthMiddleware``, which records the caller's ``owner`` (a hash of the key); without
    keys (owner ``""``) the client's address is the bucket's key: the ASGI ``client``, the TCP peer's
    unless the peer is one of ``trusted_proxies`` (then uvicorn put the ``X-Forwarded-For`` address
    there, ``gateway.server.config``), so a client cannot pick its bucket with the header.
    The limiter is left in the request's state (``rate_limiter``) for the routes that admit work in parts.
    """

    def __init__(self, app: ASGIApp, *, limiter: RateLimiter | None) -> None:
        self.app, self.limiter = app, limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limiter = self.limiter
        if limiter is None or scope["type"] != "http" or not scope["path"].startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        wait_s = await limiter.take(limiter.key(scope))
        if not wait_s:
            scope.setdefault("state", {})["rate_limiter"] = limiter
            await self.app(scope, receive, send)
            return
        error, seconds = limiter.refusal(wait_s)
        response = error_response(error)
        response.headers["retry-after"] = str(seconds)
        await response(scope, receive, send)


class References:
    """The inline ``ref_audio`` clips one session (or one batch) may have decoded: ``REFERENCES_BURST`` at
    once, then one every ``REFERENCE_EVERY_S``. Each is decoded on the process's few decode threads (tens
    of ms of CPU for a 30 s clip), so a caller that sends clip after clip would keep them busy for every
    other caller's uploads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._buckets = TokenBuckets(1.0 / REFERENCE_EVERY_S, REFERENCES_BURST)
        self._clock = clock

    def admit(self) -> None:
        """Take a clip's token.

        Raises:
            ProtocolError: ``rate_limited`` on ``$.ref_audio``.
        """
        wait = self._buckets.take("", self._clock())
        if wait:
            message = (
                f"at most {REFERENCES_BURST} inline ref_audio clips at once and one every "
                f"{REFERENCE_EVERY_S:g} s per session or batch; retry in {math.ceil(wait)} s, "
                "or upload the voice"
            )
            raise ProtocolError(ErrorCode.RATE_LIMITED, message, field="$.ref_audio")
