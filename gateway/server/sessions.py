"""The process's sessions: who may open one (caps, drain), and the graceful drain on shutdown.

A session is any WebSocket (``/v1/audio/speech/stream``, ElevenLabs' ``stream-input`` and
``multi-stream-input``: each socket is one session, whatever its contexts) or one ``POST`` that speaks
(``/v1/audio/speech``, ElevenLabs' ``/v1/text-to-speech/...``) with its streamed body (``is_session``).
``Admission`` (an ASGI middleware, inside ``AuthMiddleware`` so the caller's ``owner``
is known) refuses one before it starts, a WebSocket before it is accepted:

- while the server drains: 503 ``server_shutdown``;
- past ``max_sessions`` in the process: 503 ``server_busy``;
- past ``max_sessions_per_key`` for one API key (when keys are configured): 429 ``too_many_sessions``;

each with ``Retry-After``. Otherwise it holds a place for the session's whole life.

With ``redis_url`` set, the per-key cap holds across the fleet (``gateway.middleware.shared_limits``): past
the
process's own checks, ``place`` takes a lease in Redis under the cap, atomically, and gives it back when
the session ends; the process's own count is still checked first, so while Redis is down the cap is
per process, as without Redis. (``POST /v1/audio/speech/batch`` holds its places with ``hold``: its leases
count in Redis from the next renewal, but its admission checks the process's count only.)

The drain (``Sessions.drain``, started on SIGTERM by ``voxgate serve``): ``/readyz`` turns 503 and new
sessions are refused at once; a WebSocket session refuses new utterances (non-fatal ``server_shutdown``:
the utterances it has open go on) and ends as soon as nothing is in flight (``Connection`` waits on
``until_idle``) and REST streams run to their end, for up to ``drain_timeout_s``; then the
remaining WebSocket sessions get a fatal ``server_shutdown`` (close 1001), and the server stops.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator

from starlette.types import ASGIApp, Receive, Scope, Send

from ...protocol.errors import ErrorCode, ProtocolError
from ..middleware.http import error_response
from ..middleware.shared_limits import SharedLimits, new_lease

#: The paths, and the path prefixes, whose ``POST`` requests are sessions (every WebSocket is one).
SESSION_POSTS = frozenset({"/v1/audio/speech", "/v1/speak", "/tts/bytes", "/tts/sse"})
SESSION_POST_PREFIXES = ("/v1/text-to-speech/",)
#: ``Retry-After`` of a refusal for a cap: a session may end any moment.
BUSY_RETRY_AFTER_S = 1
#: ``Retry-After`` of a refusal while draining: a new replica takes a few seconds to be ready.
DRAIN_RETRY_AFTER_S = 5
#: How often a session checks, while draining, whether it has nothing in flight any more.
IDLE_POLL_S = 0.05


class Sessions:
    """The sessions of the process, by owner, and the drain state.

    Args:
        drain_timeout_s: how long a drain lets sessions finish before closing the rest.
        max_sessions: sessions allowed in the process (0: no cap).
        max_sessions_per_key: sessions allowed per API key (0: no cap; the anonymous owner ``""`` of a
            gateway without keys is only capped by ``max_sessions``).
        shared: the fleet's leases in Redis, which ``place`` takes under ``max_sessions_per_key``.
    """

    def __init__(
        self,
        *,
        drain_timeout_s: float,
        max_sessions: int = 0,
        max_sessions_per_key: int = 0,
        shared: SharedLimits | None = None,
    ) -> None:
        self.drain_timeout_s = drain_timeout_s
        self.max_sessions = max_sessions
        self.max_sessions_per_key = max_sessions_per_key
        self.shared = shared
        self.draining = False
        self.count = 0
        self._per_owner: collections.Counter[str] = collections.Counter()
        self.start()

    def start(self) -> None:
        """Begin serving (the app's lifespan): not draining, with events of the running loop."""
        self.draining = False
        self._started = asyncio.Event()  # the drain began
        self._expired = asyncio.Event()  # the drain's time is up: remaining sessions end now
        self._idle = asyncio.Event()  # no session left
        if not self.count:
            self._idle.set()

    def refusal(self, owner: str) -> tuple[ProtocolError, int] | None:
        """Why a new session of ``owner`` is refused, with its ``Retry-After`` seconds; None to admit it."""
        if self.draining:
            return ProtocolError(
                ErrorCode.SERVER_SHUTDOWN, "the server is shutting down"
            ), DRAIN_RETRY_AFTER_S
        if self.max_sessions and self.count >= self.max_sessions:
            message = f"the server holds its maximum of {self.max_sessions} sessions"
            return ProtocolError(ErrorCode.SERVER_BUSY, message), BUSY_RETRY_AFTER_S
        if owner and self.max_sessions_per_key and self._per_owner[owner] >= self.max_sessions_per_key:
            return _too_many(self.max_sessions_per_key), BUSY_RETRY_AFTER_S
        return None

    @contextlib.asynccontextmanager
    async def place(self, owner: str) -> AsyncIterator[tuple[ProtocolError, int] | None]:
        """Hold a place for a session of ``owner`` while the block runs, the fleet's lease included;
        yields None then, or, holding nothing, the refusal with its ``Retry-After`` seconds."""
        refused = self.refusal(owner)
        lease = new_lease()
        if refused is None and self.shared is not None and owner and self.max_sessions_per_key:
            if not await self.shared.acquire(owner, lease, self.max_sessions_per_key):
                refused = _too_many(self.max_sessions_per_key), BUSY_RETRY_AFTER_S
            elif (refused := self.refusal(owner)) is not None:  # a drain or a cap reached meanwhile
                self.shared.release(owner, lease)
        if refused is not None:
            yield refused
            return
        with self.hold(owner, lease):
            yield None

    @contextlib.contextmanager
    def hold(self, owner: str, lease: str | None = None) -> Iterator[None]:
        """Count one session of ``owner`` while the block runs (and its lease in Redis, if shared)."""
        self.count += 1
        self._per_owner[owner] += 1
        self._idle.clear()
        shared = self.shared if owner and self.max_sessions_per_key else None
        lease = lease or new_lease()
        if shared is not None:
            shared.hold(owner, lease)
        try:
            yield
        finally:
            if shared is not None:
                shared.release(owner, lease)
            self.count -= 1
            self._per_owner[owner] -= 1
            if not self._per_owner[owner]:
                del self._per_owner[owner]
            if not self.count:
                self._idle.set()

    async def drain(self, grace_s: float) -> None:
        """Refuse new sessions, let the others finish for ``drain_timeout_s``, then end them.

        Returns once no session is left, or ``grace_s`` after the remaining ones were told to end.
        """
        self.draining = True
        self._started.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.drain_timeout_s):
                await self._idle.wait()
        self._expired.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await self._idle.wait()

    async def until_draining(self) -> None:
        """Return once a drain has begun."""
        await self._started.wait()

    async def until_idle(self, busy: Callable[[], bool]) -> None:
        """Return once a drain has begun and the session is not ``busy``, or the drain's time is up."""
        await self._started.wait()
        while busy() and not self._expired.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(IDLE_POLL_S):
                    await self._expired.wait()


def _too_many(cap: int) -> ProtocolError:
    return ProtocolError(ErrorCode.TOO_MANY_SESSIONS, f"this API key holds its maximum of {cap} sessions")


def shutdown_error() -> ProtocolError:
    """The error that refuses a session, or ends one (fatal), when the server drains."""
    return ProtocolError(ErrorCode.SERVER_SHUTDOWN, "the server is shutting down", fatal=True)


class Admission:
    """Refuses a session the ``Sessions`` will not take, and holds a place for those it admits."""

    def __init__(self, app: ASGIApp, *, sessions: Sessions) -> None:
        self.app = app
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_session(scope):
            await self.app(scope, receive, send)
            return
        owner = str(scope.get("state", {}).get("owner", ""))
        async with self.sessions.place(owner) as refused:
            if refused is None:
                await self.app(scope, receive, send)
                return
        assert refused is not None
        error, retry_after = refused
        await _refuse(scope, receive, send, error, retry_after)


def is_session(scope: Scope) -> bool:
    """Whether a request is a session: every WebSocket, and the ``POST`` requests that speak."""
    if scope["type"] == "websocket":
        return True
    path = str(scope.get("path", ""))
    return (
        scope["type"] == "http"
        and scope.get("method") == "POST"
        and (path in SESSION_POSTS or path.startswith(SESSION_POST_PREFIXES))
    )


async def _refuse(scope: Scope, receive: Receive, send: Send, error: ProtocolError, retry_after: int) -> None:
    """Answer with the error's HTTP status, ``Retry-After`` and OpenAI's error shape; a WebSocket is
    refused before it is accepted (the ASGI denial response; a server without one answers 403)."""
    response = error_response(error)
    response.headers["retry-after"] = str(retry_after)
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": error.close_code, "reason": error.code})
            return
    await response(scope, receive, send)
