"""How long the remote engine waits on an upstream: connect, first-byte, idle and overall deadlines.

A request to an upstream waits at a few points: for its connection, for the answer's headers, then for
each piece of the body. ``Waits`` (one per request) bounds each of those waits by the deadline that
applies at that point, and raises ``UpstreamTimeout`` naming it:

- first byte: from the request to its first audio (a streamed answer) or to its headers (a whole answer
  has none until the upstream has made all of it, so it has no first-byte deadline of its own);
- idle: once audio (or a whole answer's headers) came, the longest gap between two pieces;
- overall: the time spent waiting on this request in all, so an upstream that trickles a byte just
  inside the idle deadline still ends. Only waits for the upstream count: while the consumer is away (a
  slow client holds the pump, and the upstream's bytes wait in the socket buffers), no time is spent.

The connect deadline is httpx's own (``httpx.Timeout.connect``); it runs inside the first wait.
``bounded_read`` reads a body into memory only up to a size, so an answer that is not audio (an error
page, a voice list) costs at most that much, however large the upstream makes it. Bodies are read through
a ``Read`` (the next piece, ``b""`` at the end), whichever HTTP client made the request: aiohttp for the
speech requests (``engine.http_stream``), httpx for the rest (``httpx_reader``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar, cast

import httpx

T = TypeVar("T")


#: Reads the next piece of a body; ``b""`` at its end (``engine.http_stream.reader``, ``httpx_reader``).
Read = Callable[[], Awaitable[bytes]]


@contextlib.asynccontextmanager
async def httpx_reader(response: httpx.Response) -> AsyncGenerator[Read, None]:
    """A ``Read`` of an httpx response's body; the async generator httpx reads it with is closed on exit."""
    async with contextlib.aclosing(cast(AsyncGenerator[bytes, None], response.aiter_bytes())) as body:
        yield functools.partial(anext, body, b"")


class UpstreamTimeout(Exception):
    """A deadline passed while waiting on an upstream; the message says which."""


class Waits:
    """The deadlines of one request to an upstream.

    Args:
        first_byte_s: seconds from the request to its first audio; None for a whole answer (only the
            overall deadline bounds the wait for its headers).
        idle_s: seconds between two pieces of the body once it flows.
        overall_s: seconds spent waiting on the upstream in all.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        *,
        first_byte_s: float | None,
        idle_s: float,
        overall_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_s = idle_s
        self.overall_s = overall_s
        self.left_s = overall_s
        self._clock = clock
        self._first_byte_s = first_byte_s
        self._first_by: float | None = None
        self._flowing = False
        self.begin()

    def begin(self) -> None:
        """A request is sent (one segment may send a few, which share the overall deadline)."""
        self._first_by = None if self._first_byte_s is None else self._clock() + self._first_byte_s
        self._flowing = False

    def flowing(self) -> None:
        """The first audio (or a whole answer's headers) came: from now on the idle deadline applies."""
        self._flowing = True

    def _limit(self) -> tuple[float, str]:
        """The seconds the next wait may take, and what it means when they pass."""
        overall = (self.left_s, f"waited {self.overall_s:g} s on the upstream in all (the overall deadline)")
        if self._flowing:
            step = (self.idle_s, f"no byte for {self.idle_s:g} s (the idle deadline)")
        elif self._first_by is not None:
            step = (self._first_by - self._clock(), f"no audio within {self._first_byte_s:g} s (first byte)")
        else:
            return overall
        return min(step, overall, key=lambda limit: limit[0])

    async def wait(self, awaitable: Awaitable[T]) -> T:
        """``awaitable``'s result, or ``UpstreamTimeout`` once the deadline that applies now passes."""
        limit_s, meaning = self._limit()
        started = self._clock()
        timeout = asyncio.timeout(max(0.0, limit_s))
        try:
            async with timeout:
                return await awaitable
        except TimeoutError:
            if timeout.expired():
                raise UpstreamTimeout(meaning) from None
            raise
        finally:
            self.left_s -= self._clock() - started

    async def pieces(self, read: Read) -> AsyncGenerator[bytes, None]:
        """A body piece by piece, each piece within the deadline that applies."""
        while piece := await self.wait(read()):
            yield piece


async def bounded_read(read: Read, limit_bytes: int, waits: Waits | None = None) -> bytes:
    """The first ``limit_bytes`` of a body (a stream); the rest is never read.

    ``waits`` bounds each piece; without it the caller bounds the whole read.
    """
    data = bytearray()
    while len(data) < limit_bytes:
        piece = await (waits.wait(read()) if waits is not None else read())
        if not piece:
            break
        data += piece
    return bytes(data[:limit_bytes])
