"""Per-key limits shared by every replica through Redis (``VOXGATE_REDIS_URL``): leases, token buckets.

Sessions: a key's sessions are a sorted set ``voxgate:sessions:<owner>`` of lease ids scored by their
expiry on Redis' clock (``TIME``, so the replicas' clocks do not matter). ``acquire`` is one Lua script:
drop the expired leases, count the rest, add the new one if the count is under the cap; so two replicas
admitting at once cannot both take the last place. The replica holding a lease renews every one it holds
every ``lease_s / 3`` (one script per key, re-adding what is missing); a replica that dies (SIGKILL) stops
renewing, and its sessions stop counting ``lease_s`` later at most. A lease is removed when its session ends.

REST rate limit: one token bucket per caller, a hash ``voxgate:rate:<key>`` of (tokens, when), taken by a
Lua script: the same arithmetic as ``ratelimit.TokenBuckets``, on Redis' clock, atomic across replicas.

While Redis is down, the limits fail open to the per-process ones: every call that needs Redis answers
"unknown" at once (``acquire`` admits, ``take`` returns None), the callers apply their own process's caps
and buckets, and this is logged once. A background task reconnects with backoff (``RETRY_MIN_S`` doubling
to ``RETRY_MAX_S``); once Redis answers, the leases this replica holds are written back at once (a
restarted Redis that kept nothing counts them again) and a second line is logged. A restarted Redis has
forgotten the token buckets: callers start again with a full burst.

A Redis restarted between two renewals is not noticed at all: redis-py reconnects to it on the next call,
and it holds none of the fleet's leases until each replica's next renewal (``lease_s / 3`` later at most).
So the acquire script keeps an epoch key, ``voxgate:epoch``, holding when this Redis was first used (on
its clock; it never expires). When the key is missing, Redis is empty: the script writes it, and every
admission waits until ``settle_s`` (one renewal period and ``SETTLE_MARGIN_S``) past that time, by when
every live replica has renewed, i.e. written its leases back. The first sessions of a fleet on a fresh
Redis wait that long too; a Redis that persists its data (or a failover that kept it) keeps the epoch and
nothing waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # redis-py is the `fleet` extra: imported when a Redis URL is set, not before
    import redis.asyncio as aioredis

logger = logging.getLogger(__name__)

#: A request waits this long on Redis before its limits fall back to the process's: well above a
#: loopback or in-zone round trip (under 1 ms), well below a client's patience.
REDIS_TIMEOUT_S = 1.0
#: The reconnect backoff while Redis is down: soon after a restart, without a busy loop during an outage.
RETRY_MIN_S = 0.25
RETRY_MAX_S = 5.0
#: A lease is renewed this many times per lease period: two renewals may be missed before it expires.
RENEWALS_PER_LEASE = 3

#: After Redis starts empty (a restart, a failover to an empty replica), no session is admitted for this
#: long past one renewal period, so that every live replica has written its leases back first.
SETTLE_MARGIN_S = REDIS_TIMEOUT_S

_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local settle = tonumber(ARGV[4])
local epoch = tonumber(redis.call('GET', KEYS[2]))
if not epoch then
  epoch = now
  redis.call('SET', KEYS[2], string.format('%.17g', now))
end
if now < epoch + settle then return -math.ceil((epoch + settle - now) * 1000) end
local lease = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(lease * 1000) + 1000)
return 1
"""
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local lease = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], now + lease, ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(lease * 1000) + 1000)
return 1
"""
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(v[1]) or burst
local at = tonumber(v[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'at', string.format('%.17g', now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return string.format('%.17g', wait)
"""


def new_lease() -> str:
    """A lease id unique across replicas."""
    return uuid.uuid4().hex


class SharedLimits:
    """The Redis side of the per-key session caps and the REST rate limit (see the module docstring).

    Args:
        url: ``redis://HOST:PORT/DB`` (``rediss://`` for TLS, credentials in the URL).
        lease_s: how long a session's lease lasts unrenewed: a dead replica's sessions count this long.
        prefix: the keys' prefix, so several gateways' fleets may share one Redis.
    """

    def __init__(self, url: str, *, lease_s: float, prefix: str = "voxgate") -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be > 0")
        self.url = url
        self.lease_s = lease_s
        self.prefix = prefix
        #: How long admissions wait after Redis is found empty: one renewal period and its round trip.
        self.settle_s = lease_s / RENEWALS_PER_LEASE + SETTLE_MARGIN_S
        self.up = True  # until a call fails: the first request tries Redis
        try:
            exceptions = importlib.import_module("redis.exceptions")
        except ImportError as exc:
            raise RuntimeError("VOXGATE_REDIS_URL needs redis-py: pip install 'voxgate[fleet]'") from exc
        # What a lost, refused or timed-out connection raises (redis-py's own, or the socket's).
        self._errors: tuple[type[Exception], ...] = (exceptions.RedisError, OSError)
        self._held: dict[str, set[str]] = {}  # owner -> leases this replica holds
        self._client: aioredis.Redis | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._reconnecting: asyncio.Task[None] | None = None
        self._renewer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect (lazily: the first call connects) and start renewing leases; call from the lifespan."""
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # One immediate retry: a pooled connection that a Redis restart broke is replaced at once.
        self._client = aioredis.Redis.from_url(
            self.url,
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
            retry=Retry(NoBackoff(), 1),
            health_check_interval=0,
        )
        self._acquire = self._client.register_script(_ACQUIRE)
        self._renew = self._client.register_script(_RENEW)
        self._take = self._client.register_script(_TAKE)
        self.up = True
        self._renewer = asyncio.create_task(self._renew_forever())

    async def aclose(self) -> None:
        """Stop renewing, give back the leases still held, and disconnect."""
        for task in (self._renewer, self._reconnecting, *self._tasks):
            if task is not None:
                task.cancel()
        if self._client is not None:
            if self.up:
                with contextlib.suppress(*self._errors):
                    for owner, leases in self._held.items():
                        if leases:
                            await self._client.zrem(self._key(owner), *leases)
            await self._client.aclose()
            self._client = None

    def _key(self, owner: str) -> str:
        return f"{self.prefix}:sessions:{owner}"

    async def acquire(self, owner: str, lease: str, cap: int) -> bool:
        """Take a place under ``cap`` for ``owner``'s session ``lease``; False when the fleet holds ``cap``.

        While Redis is down the place is granted (the process's own cap still applies) and the lease is
        written to Redis once it is back. A granted lease is held until ``release``. Within ``settle_s``
        of Redis being found empty (see the module docstring) the answer waits until that time is up.
        """
        granted = True
        if self.up and self._client is not None:
            keys = [self._key(owner), f"{self.prefix}:epoch"]
            args: list[str | float] = [cap, self.lease_s, lease, self.settle_s]
            try:
                answer = int(await self._acquire(keys=keys, args=args))
                if answer < 0:  # Redis started empty too recently (-answer ms) to hold every lease yet
                    await asyncio.sleep(-answer / 1000 + 0.01)
                    answer = int(await self._acquire(keys=keys, args=args))
                granted = answer > 0
            except self._errors as exc:
                self._down(exc)
        if granted:
            self.hold(owner, lease)
        return granted

    def hold(self, owner: str, lease: str) -> None:
        """Count ``lease`` as held here (written to Redis by the next renewal, if ``acquire`` did not)."""
        self._held.setdefault(owner, set()).add(lease)

    def release(self, owner: str, lease: str) -> None:
        """Give back ``lease``: no longer renewed here, and removed from Redis in the background."""
        leases = self._held.get(owner)
        if leases is not None:
            leases.discard(lease)
            if not leases:
                del self._held[owner]
        if self.up and self._client is not None:
            task = asyncio.create_task(self._remove(owner, lease))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _remove(self, owner: str, lease: str) -> None:
        assert self._client is not None
        try:
            await self._client.zrem(self._key(owner), lease)
        except self._errors as exc:
            self._down(exc)  # the lease expires by itself

    async def take(self, key: str, rate: float, burst: int) -> float | None:
        """Take a token of ``key``'s shared bucket: 0.0 granted, else the seconds until one is back;
        None while Redis is down (the caller uses its process's buckets)."""
        if not self.up or self._client is None:
            return None
        try:
            wait = await self._take(keys=[f"{self.prefix}:rate:{key}"], args=[rate, burst])
        except self._errors as exc:
            self._down(exc)
            return None
        return float(wait)

    def _down(self, exc: BaseException) -> None:
        """Redis failed: fall back to the process's limits (logged once) and reconnect in the background."""
        if not self.up:
            return
        self.up = False
        logger.warning(
            "Redis at %s is unreachable (%s): per-key limits are per process until it is back",
            redacted(self.url),
            type(exc).__name__,
        )
        self._reconnecting = asyncio.create_task(self._reconnect())

    async def _reconnect(self) -> None:
        delay = RETRY_MIN_S
        while True:
            await asyncio.sleep(delay)
            try:
                assert self._client is not None
                await self._client.ping()
                await self._write_leases()
            except self._errors:
                delay = min(RETRY_MAX_S, delay * 2)
                continue
            self.up = True
            logger.warning(
                "Redis at %s is back: per-key limits hold across replicas again", redacted(self.url)
            )
            return

    async def _write_leases(self) -> None:
        """Renew (or write back) every lease this replica holds, one script per key in one round trip."""
        assert self._client is not None
        held = [(owner, sorted(leases)) for owner, leases in self._held.items() if leases]
        if not held:
            return
        async with self._client.pipeline(transaction=False) as pipe:
            for owner, leases in held:
                await self._renew(keys=[self._key(owner)], args=[self.lease_s, *leases], client=pipe)
            await pipe.execute()

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / RENEWALS_PER_LEASE)
            if not self.up:
                continue  # the reconnect writes them back
            try:
                await self._write_leases()
            except self._errors as exc:
                self._down(exc)


def redacted(url: str) -> str:
    """The URL without its password, for the log."""
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1]}"
