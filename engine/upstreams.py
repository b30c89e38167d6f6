"""A pool of upstream speech servers: least-outstanding-requests choice, health and a circuit breaker.

Pure bookkeeping (no I/O): the remote engine asks ``candidates()`` for the order in which to try
upstreams, holds a ``lease`` while a request is in flight, and reports ``success`` / ``failure``.
An upstream whose last health check failed, or whose circuit is open, is not offered; once the
cooldown has passed the circuit is half-open and the upstream is offered again, and one more
failure opens it for another cooldown.

An upstream is named, wherever it is named (errors a client sees, ``/metrics`` labels, the log), by its
``label``: ``redact_url`` of its URL, ``scheme://host:port`` with no user, password, path or query, so a
URL that carries credentials (``http://user:PASS@host``) or a secret path never leaves the process. What
the pool records of a failure passes through ``Upstream.scrub`` too, and so does the log of the HTTP client
the probes use (httpx logs every request's URL at INFO: ``ScrubUrls``).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


def redact_url(url: str) -> str:
    """``url`` as ``scheme://host:port`` (the port only when it has one): no user, password, path or
    query, however it was written. The one way an upstream is named in errors, metrics and logs."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:  # an unreadable port: name the scheme alone
        return f"{url.partition(':')[0][:16]}://?"
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{f':{port}' if port is not None else ''}"


@dataclass
class Upstream:
    """One upstream server and what the pool knows of it."""

    url: str
    outstanding: int = 0
    failures: int = 0
    opened_at: float | None = None
    healthy: bool = True
    last_error: str = ""
    #: Its last failure said it is busy (429, or 503 with ``Retry-After``).
    busy: bool = False
    #: How the upstream is named everywhere outside the request itself (``redact_url``).
    label: str = field(init=False)

    def __post_init__(self) -> None:
        self.label = redact_url(self.url)

    def scrub(self, text: str) -> str:
        """``text`` (an exception's message, a reason) with the upstream's URL as its label, and its
        user and password left out wherever they appear (a password short enough to be part of ordinary
        words is left out only as ``user:password@``)."""
        text = text.replace(self.url, self.label)
        userinfo, at, _ = urllib.parse.urlsplit(self.url).netloc.rpartition("@")
        if at:
            text = text.replace(userinfo + at, "")
            password = userinfo.partition(":")[2]
            if len(password) >= 6:
                text = text.replace(password, "***").replace(urllib.parse.unquote(password), "***")
        return text


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
        upstream.busy = False

    def failure(self, upstream: Upstream, reason: str, *, busy: bool = False) -> None:
        """A request failed on this upstream's side (``busy``: it said it is busy); enough in a row open
        its circuit."""
        upstream.failures += 1
        upstream.last_error = upstream.scrub(reason)
        upstream.busy = busy
        if upstream.failures >= self.breaker_failures:
            upstream.opened_at = self._clock()

    def busy_for(self) -> int | None:
        """Whole seconds until the first circuit opened for busy answers half-opens, when every upstream
        is out for that alone (healthy, circuit open, last failure busy); None otherwise."""
        now = self._clock()
        waits = []
        for u in self.upstreams:
            if not (u.healthy and u.busy and u.opened_at is not None):
                return None
            waits.append(self.breaker_cooldown_s - (now - u.opened_at))
        return max(1, math.ceil(min(waits))) if waits else None

    def down(self, upstream: Upstream, reason: str) -> None:
        """A probe got no answer: the upstream is not offered until its next health check passes."""
        upstream.healthy = False
        upstream.last_error = upstream.scrub(reason)

    def describe(self) -> str:
        """One line per upstream, for error messages and logs."""
        lines = []
        for u in self.upstreams:
            why = f" ({u.last_error})" if u.last_error else ""
            lines.append(f"{u.label}: {'up' if self.available(u) else 'down'}{why}")
        return "; ".join(lines)


class ScrubUrls(logging.Filter):
    """Scrubs the upstreams' URLs (``Upstream.scrub``) out of the records of the logger it is added to."""

    def __init__(self, pool: UpstreamPool) -> None:
        super().__init__()
        self.pool = pool

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        scrubbed = text
        for upstream in self.pool.upstreams:
            scrubbed = upstream.scrub(scrubbed)
        if scrubbed != text:
            record.msg, record.args = scrubbed, ()
        return True
