"""A pool of upstream speech servers: least-outstanding-requests choice, health and a circuit breaker.

Pure bookkeeping (no I/O): the remote engine asks ``candidates()`` for the order in which to try
upstreams, holds a ``lease`` while a request is in flight, and reports ``success`` / ``failure``.
An upstream whose last health check failed, or whose circuit is open, is not offered; once the
cooldown has passed the circuit is half-open and the upstream is offered again, and one more
failure opens it for another cooldown.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Upstream:
    """One upstream server and what the pool knows of it."""

    url: str
    outstanding: int = 0
    failures: int = 0
    opened_at: float | None = None
    healthy: bool = True
    last_error: str = ""


class UpstreamPool:
    """The upstreams of one remote engine.

    Args:
        urls: base URLs, without a trailing slash.
        breaker_failures: consecutive failures that open an upstream's circuit.
        breaker_cooldown_s: how long an open circuit keeps the upstream out.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        urls: list[str],
        *,
        breaker_failures: int = 3,
        breaker_cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("the remote engine needs at least one upstream URL")
        self.upstreams = [Upstream(u.rstrip("/")) for u in urls]
        self.breaker_failures = breaker_failures
        self.breaker_cooldown_s = breaker_cooldown_s
        self._clock = clock
        self._turn = itertools.count()

    def available(self, upstream: Upstream) -> bool:
        """Healthy and its circuit closed (or half-open after the cooldown)."""
        if not upstream.healthy:
            return False
        return upstream.opened_at is None or self._clock() - upstream.opened_at >= self.breaker_cooldown_s

    def breaker(self, upstream: Upstream) -> str:
        """The upstream's circuit: ``closed``, ``open``, or ``half_open`` once the cooldown has passed."""
        if upstream.opened_at is None:
            return "closed"
        return "half_open" if self._clock() - upstream.opened_at >= self.breaker_cooldown_s else "open"

    def candidates(self) -> list[Upstream]:
        """Available upstreams, fewest requests in flight first; ties rotate so load spreads."""
        start = next(self._turn)
        n = len(self.upstreams)
        rotated = [self.upstreams[(start + i) % n] for i in range(n)]
        return sorted((u for u in rotated if self.available(u)), key=lambda u: u.outstanding)

    @contextmanager
    def lease(self, upstream: Upstream) -> Iterator[Upstream]:
        """Count a request in flight on ``upstream`` for the duration of the block."""
        upstream.outstanding += 1
        try:
            yield upstream
        finally:
            upstream.outstanding -= 1

    def success(self, upstream: Upstream) -> None:
        """A request completed: the circuit closes."""
        upstream.failures = 0
        upstream.opened_at = None
        upstream.last_error = ""

    def failure(self, upstream: Upstream, reason: str) -> None:
        """A request failed on this upstream's side; enough in a row open its circuit."""
        upstream.failures += 1
        upstream.last_error = reason
        if upstream.failures >= self.breaker_failures:
            upstream.opened_at = self._clock()

    def down(self, upstream: Upstream, reason: str) -> None:
        """A probe got no answer: the upstream is not offered until its next health check passes."""
        upstream.healthy = False
        upstream.last_error = reason

    def describe(self) -> str:
        """One line per upstream, for error messages and logs."""
        return "; ".join(
            f"{u.url}: {'up' if self.available(u) else 'down'}{f' ({u.last_error})' if u.last_error else ''}"
            for u in self.upstreams
        )
