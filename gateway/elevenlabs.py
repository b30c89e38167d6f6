"""ElevenLabs-compatible WebSockets, ``stream-input`` and ``multi-stream-input`` (REST: ``elevenlabs_rest``).

Each ElevenLabs context is one voxgate session: a ``Connection`` (``gateway/connection.py``, which drives
the session core) talks to a ``Pipe`` instead of a socket, and ``protocol.elevenlabs.Context`` translates
both ways. So every rule of the session core and its shell (segmentation, backpressure, timeouts, drain,
metrics) holds here unchanged. ``multi-stream-input`` runs one session per context (``_Socket._open``):
written before the core had contexts. The core's contexts (docs/protocol.md §11, with the mapping of
ElevenLabs' messages in §11.1) can replace it: ``_open`` would add a ``context_id`` to one session's
messages, and ``Context.render`` route that session's messages by their ``context_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

import msgspec
from starlette.routing import WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from voxgate.engine.base import UnsupportedOption
from voxgate.gateway.catalog import Catalog
from voxgate.gateway.connection import CLOSE_TIMEOUT_S, Connection
from voxgate.gateway.failures import REFUSALS, error_for
from voxgate.gateway.sessions import Sessions, shutdown_error
from voxgate.protocol.elevenlabs import (
    Context,
    Inbound,
    Params,
    close_code,
    decode_inbound,
    parse_params,
)
from voxgate.protocol.errors import INTERNAL_ERROR_MESSAGE, CloseCode, ErrorCode, ProtocolError
from voxgate.protocol.messages import ClientMessage

logger = logging.getLogger(__name__)

#: The ``dialect`` label of this surface in the metrics.
DIALECT = "elevenlabs"
#: Contexts one socket may hold at once (ElevenLabs allows 5; the session core's contexts will allow 8).
MAX_CONTEXTS = 8
_encode = msgspec.json.Encoder().encode
_Sink = Callable[[str | bytes], Awaitable[None]]


class Pipe:
    """The socket of a context's ``Connection``: messages in from the endpoint, its output to ``sink``."""

    def __init__(self, sink: _Sink) -> None:
        self._inbox: asyncio.Queue[dict[str, object]] = asyncio.Queue()
        self._sink = sink
        self.close_code: int | None = None

    def push(self, msg: ClientMessage) -> None:
        self._inbox.put_nowait({"type": "websocket.receive", "text": _encode(msg).decode()})

    def hang_up(self) -> None:
        self._inbox.put_nowait({"type": "websocket.disconnect", "code": CloseCode.NORMAL})

    async def receive(self) -> dict[str, object]:
        return await self._inbox.get()

    async def send_text(self, data: str) -> None:
        await self._sink(data)

    async def send_bytes(self, data: bytes) -> None:
        await self._sink(data)

    async def close(self, code: int = CloseCode.NORMAL, reason: str | None = None) -> None:
        if self.close_code is None:
            self.close_code = code


@dataclass
class _Live:
    """One context: its codec, its pipe, and the task running its session."""

    codec: Context
    pipe: Pipe
    task: asyncio.Task[None] | None = None


def connection_for(scope_state: object, pipe: Pipe, params: Params) -> Connection:
    """A voxgate session behind ``pipe``; ElevenLabs' ``inactivity_timeout`` is its idle timeout."""
    settings = scope_state.settings  # type: ignore[attr-defined]
    settings = msgspec.structs.replace(settings, idle_timeout_s=float(params.inactivity_timeout_s))
    return Connection(
        cast(WebSocket, pipe),  # the four calls a Connection makes on its socket, Pipe has
        scope_state.catalog,  # type: ignore[attr-defined]
        settings,
        owner=getattr(scope_state, "owner", ""),
        extensions=True,
        meter=scope_state.metrics.session(DIALECT),  # type: ignore[attr-defined]
        sessions=getattr(scope_state, "sessions", None),
    )


async def run_session(connection: Connection) -> None:
    """Run a session to its end; an unexpected failure is logged and ends it as an internal error."""
    try:
        with connection.meter.active():
            await connection.run()
    except Exception:
        logger.exception("elevenlabs session %s failed", connection.id)
        pipe = cast(Pipe, connection.ws)
        error = ProtocolError(ErrorCode.INTERNAL_ERROR, INTERNAL_ERROR_MESSAGE, fatal=True)
        with contextlib.suppress(Exception):
            await pipe.send_text(
                _encode({"type": "error", "code": error.code, "message": error.message}).decode()
            )
        await pipe.close(CloseCode.INTERNAL_ERROR)


async def check_voice(state: object, voice_id: str, params: Params) -> bool:
    """Refuse an unknown voice before any text arrives, as ElevenLabs does; True if its engine times words
    (the alignment then follows them, else it is spread over each sentence)."""
    catalog: Catalog = state.catalog  # type: ignore[attr-defined]
    owner = getattr(state, "owner", "")
    try:
        await catalog.prepare(owner, voice_id, params.model_id, {"word_timestamps": True})
        return True
    except UnsupportedOption as exc:
        if exc.field != "word_timestamps":
            raise error_for(exc) from None
    except REFUSALS as exc:
        raise error_for(exc) from None
    return False


# -- WebSocket -------------------------------------------------------------------------------------------


class _Socket:
    """One ``stream-input`` or ``multi-stream-input`` socket: its contexts, and the order of what it sends."""

    def __init__(
        self, ws: WebSocket, voice_id: str, params: Params, *, multi: bool, words: bool = False
    ) -> None:
        self.ws, self.voice_id, self.params, self.multi, self.words = ws, voice_id, params, multi, words
        self.contexts: dict[str | None, _Live] = {}
        self._lock = asyncio.Lock()  # one writer at a time on the socket
        self._closed = False
        self._pending: set[asyncio.Task[None]] = set()

    async def send(self, data: bytes) -> None:
        async with self._lock:
            if self._closed:
                raise WebSocketDisconnect(CloseCode.NORMAL)
            await self.ws.send_text(data.decode())

    async def close(self, code: int) -> None:
        async with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(RuntimeError, WebSocketDisconnect, TimeoutError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.ws.close(code)

    def _open(self, context_id: str | None) -> _Live:
        """Start a context: one voxgate session of its own (the place to switch to the core's contexts)."""

        async def sink(data: str | bytes) -> None:
            for message in live.codec.render(data):
                await self.send(message)

        codec = Context(self.voice_id, self.params, context_id, multi=self.multi, words=self.words)
        live = _Live(codec, Pipe(sink))
        live.task = asyncio.create_task(
            self._context(live, connection_for(self.ws.state, live.pipe, self.params))
        )
        self.contexts[context_id] = live
        return live

    async def _context(self, live: _Live, connection: Connection) -> None:
        await run_session(connection)
        normal = live.pipe.close_code == CloseCode.NORMAL
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            for message in live.codec.finish(normal):
                await self.send(message)
        self.contexts.pop(live.codec.context_id, None)
        if not self.multi:  # stream-input: the socket ends with its one context
            await self.close(close_code(live.pipe.close_code or CloseCode.NORMAL))

    async def run(self) -> None:
        sessions: Sessions | None = getattr(self.ws.state, "sessions", None)
        watcher = asyncio.create_task(self._drain(sessions)) if sessions is not None else None
        try:
            await self._read()
        finally:
            if watcher is not None:
                watcher.cancel()
            for live in list(self.contexts.values()):
                live.pipe.hang_up()
            tasks = [live.task for live in self.contexts.values() if live.task is not None]
            if tasks:
                await asyncio.wait(tasks)

    async def _drain(self, sessions: Sessions) -> None:
        """On a drain, close once no context is left (each context's own session ends itself)."""
        await sessions.until_idle(lambda: bool(self.contexts))
        await self._fail(shutdown_error())

    async def _read(self) -> None:
        while True:
            try:
                # ElevenLabs' inactivity timeout: a socket with no context waits this long for text; a
                # context's own session times out the same way (its idle timeout).
                async with asyncio.timeout(None if self.contexts else self.params.inactivity_timeout_s):
                    message = await self.ws.receive()
            except TimeoutError:
                timeout = self.params.inactivity_timeout_s
                err = ProtocolError(
                    ErrorCode.IDLE_TIMEOUT, f"no text received within the timeout of {timeout} seconds"
                )
                await self._fail(err)
                return
            if message["type"] == "websocket.disconnect":
                return
            try:
                msg = decode_inbound(message.get("text") or message.get("bytes") or b"")
            except ProtocolError as err:
                await self._fail(err)
                return
            if msg.close_socket:
                await self._close_all()
                return
            self._route(msg)

    def _route(self, msg: Inbound) -> None:
        context_id = msg.context_id if self.multi else None
        live = self.contexts.get(context_id)
        if live is None:
            opening = bool(msg.text) or msg.voice_settings is not None
            if not opening or (self.multi and len(self.contexts) >= MAX_CONTEXTS):
                if opening:
                    err = ProtocolError(
                        ErrorCode.INVALID_STATE, f"at most {MAX_CONTEXTS} contexts may be open on one socket"
                    )
                    self._later(Context(self.voice_id, self.params, context_id, multi=True).error(err))
                return  # a keep-alive or close of a context not (or no longer) open
            live = self._open(context_id)
        try:
            for out in live.codec.receive(msg):
                live.pipe.push(out)
        except ProtocolError as err:
            self._later(live.codec.error(err))
            if not live.codec.configured:  # refused as it opened: the context is not kept
                live.pipe.hang_up()

    def _later(self, message: bytes) -> None:
        """Send ``message`` from a task of its own (the reader never waits on the socket)."""
        task = asyncio.create_task(self.send(message))
        self._pending.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if not task.cancelled():
            task.exception()  # a socket already gone: nothing more to tell it

    async def _close_all(self) -> None:
        """``close_socket``: end every context's input, let each finish, then close normally."""
        for live in list(self.contexts.values()):
            for out in live.codec.receive(Inbound(close_socket=True)):
                live.pipe.push(out)
        tasks = [live.task for live in self.contexts.values() if live.task is not None]
        if tasks:
            await asyncio.wait(tasks)
        await self.close(CloseCode.NORMAL)

    async def _fail(self, err: ProtocolError) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await self.send(Context(self.voice_id, self.params, multi=False).error(err))
        await self.close(close_code(err.close_code))


async def _serve(websocket: WebSocket, *, multi: bool) -> None:
    voice_id = websocket.path_params["voice_id"]
    await websocket.accept()
    try:
        params = parse_params(websocket.query_params)
        words = await check_voice(websocket.state, voice_id, params)
    except ProtocolError as err:
        socket = _Socket(websocket, voice_id, Params(), multi=False)
        await socket._fail(err)
        return
    socket = _Socket(websocket, voice_id, params, multi=multi, words=words)
    try:
        await socket.run()
    except Exception:
        logger.exception("elevenlabs socket failed")
        if websocket.application_state is not WebSocketState.DISCONNECTED:
            await socket.close(CloseCode.INTERNAL_ERROR)


async def stream_input(websocket: WebSocket) -> None:
    """``WS /v1/text-to-speech/{voice_id}/stream-input``: one context."""
    await _serve(websocket, multi=False)


async def multi_stream_input(websocket: WebSocket) -> None:
    """``WS /v1/text-to-speech/{voice_id}/multi-stream-input``: contexts named by ``context_id``."""
    await _serve(websocket, multi=True)


class KeyHeader:
    """Lets ElevenLabs clients present their key as ElevenLabs does, on ElevenLabs' routes.

    ``xi-api-key`` (header, or query parameter) becomes the ``Authorization: Bearer`` that
    ``gateway/auth.py`` checks; the query parameter is removed so no log line shows it.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and _elevenlabs_path(scope["path"]):
            _move_key(scope)
        await self.app(scope, receive, send)


def _elevenlabs_path(path: str) -> bool:
    return path.startswith("/v1/text-to-speech/") or path == "/v1/voices"


def _move_key(scope: Scope) -> None:
    headers: list[tuple[bytes, bytes]] = list(scope.get("headers", []))
    names = {k.lower() for k, _ in headers}
    key = next((v for k, v in headers if k.lower() == b"xi-api-key"), None)
    query = scope.get("query_string", b"").decode("latin-1")
    kept = []
    for part in query.split("&") if query else []:
        name, _, value = part.partition("=")
        if name.lower() in ("xi-api-key", "xi_api_key"):
            key = key or value.encode("latin-1")
        else:
            kept.append(part)
    scope["query_string"] = "&".join(kept).encode("latin-1")
    if key is not None and b"authorization" not in names:
        headers.append((b"authorization", b"Bearer " + key))
        scope["headers"] = headers


routes = [
    WebSocketRoute("/v1/text-to-speech/{voice_id}/stream-input", stream_input),
    WebSocketRoute("/v1/text-to-speech/{voice_id}/multi-stream-input", multi_stream_input),
]
