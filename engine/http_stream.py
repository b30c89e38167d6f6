"""The speech requests' HTTP client: aiohttp, for the one request per segment whose audio streams.

The remote engine's hot path is reading a WAV stream from an upstream, a few pieces per audio second
for every session. httpx (which the rarer requests still use: surveys, voice uploads) spends about
0.2-0.3 ms of CPU per piece in its layers (httpcore, anyio, h11, one async generator per layer); aiohttp
reads the same pieces with a parser in C. ``bench/upstream_read.py`` (8 concurrent requests to the CPU
stand-in of vllm-omni) measured this process's CPU per streamed audio second: bare httpx 0.78 ms on 7-s
answers and 1.16 ms on 3-s answers, bare aiohttp 0.40 and 0.48 ms, the remote engine on aiohttp 0.51 and
0.63 ms (docs/performance.md, "The upstream's stream").

Its limits are httpx's as the engine had them: at most 100 connections (``POOL_SIZE``), and waiting for
one, then connecting, bounded by the connect deadline. The proxy comes from the environment
(``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``), as httpx takes it for the probes, read
once per upstream (``proxy_for``): aiohttp's own ``trust_env`` reads it, and ``~/.netrc``, in a worker
thread on every request, which cost more CPU than the request's audio. A response whose body was not read
to its end closes its connection when it is let go (``finish``), so a cancelled segment's upstream sees
its client go and aborts the request.
"""

from __future__ import annotations

import functools
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Mapping

import aiohttp
import msgspec

#: Connections open at once across the upstreams (httpx's default, which the engine used before).
POOL_SIZE = 100
#: An idle connection is closed before uvicorn's (vllm-omni's server) would close it, after 5 s: a request
#: is never sent on a connection its server is closing at that moment.
KEEPALIVE_S = 4.0
#: What a broken upstream connection raises while a request is sent or its body read.
StreamError = (aiohttp.ClientError, OSError)

_encode = msgspec.json.Encoder().encode
_JSON = {"Content-Type": "application/json"}


def open_session(connect_timeout_s: float, headers: Mapping[str, str]) -> aiohttp.ClientSession:
    """A pooled session; each request's own waits are bounded by the caller (``engine.deadlines``)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=POOL_SIZE, limit_per_host=0, keepalive_timeout=KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s),
        headers=dict(headers),
    )


@functools.lru_cache(maxsize=256)
def proxy_for(base_url: str) -> str | None:
    """The proxy the environment names for an upstream (None: direct), as httpx would use."""
    parts = urllib.parse.urlsplit(base_url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")


async def post_json(
    session: aiohttp.ClientSession, base_url: str, path: str, body: object
) -> aiohttp.ClientResponse:
    """``POST base_url + path`` with ``body`` as JSON; the answer with its headers read, its body not yet.

    A redirect is never followed: it is the answer (the remote engine counts a 3xx as the upstream's
    failure), since following it would send the body, a tenant's reference clip included, elsewhere.
    """
    return await session.post(
        base_url + path,
        data=_encode(body),
        headers=_JSON,
        proxy=proxy_for(base_url),
        allow_redirects=False,
    )


def reader(response: aiohttp.ClientResponse) -> Callable[[], Awaitable[bytes]]:
    """Reads the next piece of the body as it comes; ``b""`` at its end."""
    return response.content.readany


def finish(response: aiohttp.ClientResponse) -> None:
    """Let the response go: its connection back to the pool when the body was read to its end, else
    closed (the upstream sees its client leave)."""
    if response.content.is_eof():
        response.release()
    else:
        response.close()
