"""The remote engine's deadlines and HTTP clients (``engine.remote``)."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
import httpx

from . import http_stream
from .base import EngineError
from .deadlines import Waits


@dataclass(frozen=True, slots=True)
class Limits:
    """How long the remote engine waits on an upstream (``RemoteEngine``'s arguments)."""

    connect_s: float  #: TCP connect and pool wait limit
    first_byte_s: float  #: from a streamed request to its first audio; each probe's limit too
    read_s: float  #: longest wait for the next bytes once audio flows (the idle deadline)
    segment_s: float  #: the overall deadline of a request, beyond its segment's audio cap
    health_interval_s: float  #: period of the ``/health`` checks

    def waits(self, *, streamed: bool, max_audio_s: float) -> Waits:
        """The deadlines of one request for a segment of at most ``max_audio_s`` of audio."""
        return Waits(
            first_byte_s=self.first_byte_s if streamed else None,
            idle_s=self.read_s,
            overall_s=self.segment_s + max_audio_s,
        )


class Clients:
    """The two HTTP clients: httpx for probes and uploads, aiohttp for the speech requests
    (``engine.http_stream``: their audio is the hot path). Both send ``api_key`` as ``Authorization: Bearer``
    (empty: none)."""

    def __init__(self, limits: Limits, api_key: str) -> None:
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._limits = limits
        self._probes: httpx.AsyncClient | None = None
        self._speech: aiohttp.ClientSession | None = None

    def open(self) -> None:
        connect_s = self._limits.connect_s
        # Reads are bounded by ``Waits`` (first byte, idle, overall), which httpx's per-read timeout
        # cannot tell apart: it would cut a whole answer's headers at the idle deadline.
        timeout = httpx.Timeout(connect=connect_s, read=None, write=self._limits.read_s, pool=connect_s)
        # Probes and uploads never follow a redirect either (httpx's default, said here): an upload carries
        # a tenant's clip.
        self._probes = httpx.AsyncClient(
            timeout=timeout,
            limits=httpx.Limits(max_keepalive_connections=64),
            headers=self._headers,
            follow_redirects=False,
        )
        self._speech = http_stream.open_session(connect_s, self._headers)

    @property
    def opened(self) -> bool:
        return self._probes is not None

    def http(self) -> httpx.AsyncClient:
        """The probes' and uploads' client."""
        if self._probes is None:
            raise EngineError("the remote engine is not started")
        return self._probes

    def speech(self) -> aiohttp.ClientSession:
        """The speech requests' client."""
        if self._speech is None:
            raise EngineError("the remote engine is not started")
        return self._speech

    async def aclose(self) -> None:
        if self._probes is not None:
            await self._probes.aclose()
            self._probes = None
        if self._speech is not None:
            await self._speech.close()
            self._speech = None
