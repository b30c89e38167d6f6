"""ElevenLabs-compatible WebSockets, ``stream-input`` and ``multi-stream-input`` (REST: ``elevenlabs_rest``).

One socket is one voxgate session: a ``Connection`` (``gateway/connection.py``, which drives the session
core) talks to a ``Pipe`` instead of a socket, and ``protocol.elevenlabs.Stream`` translates both ways:
each ElevenLabs context is one of the session's contexts (``context_id``, docs/protocol.md §11, with the
mapping in §11.1); ``stream-input`` uses one fixed context. So every rule of the session core and its
shell (segmentation, contexts and their cap and idle timeout, backpressure, timeouts, drain, metrics)
holds here unchanged, and the socket is admitted and counted as one session (``gateway/sessions.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from ..engine.base import UnsupportedOption
from ..protocol.elevenlabs import Params, Stream, close_code, decode_inbound, parse_params
from ..protocol.errors import INTERNAL_ERROR_MESSAGE, CloseCode, ErrorCode, ProtocolError
from ..protocol.messages import ClientMessage
from .catalog import Catalog
from .connection import CLOSE_TIMEOUT_S, Connection
from .failures import REFUSALS, error_for
from .receipts import ReadReceipts, read_receipts

logger = logging.getLogger(__name__)

#: The ``dialect`` label of this surface in the metrics.
DIALECT = "elevenlabs"
_encode = msgspec.json.Encoder().encode
_Sink = Callable[[str | bytes], Awaitable[None]]


class Pipe:
    """The socket of a ``Connection``: messages in from the endpoint, its output to ``sink``."""

    def __init__(self, sink: _Sink) -> None:
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._sink = sink
        self.close_code: int | None = None

    def push(self, msg: ClientMessage) -> None:
        self._inbox.put_nowait({"type": "websocket.receive", "text": _encode(msg).decode()})

    def hang_up(self) -> None:
        self._inbox.put_nowait({"type": "websocket.disconnect", "code": CloseCode.NORMAL})

    async def receive(self) -> dict[str, Any]:
        return await self._inbox.get()

    async def send_text(self, data: str) -> None:
        await self._sink(data)

    async def send_bytes(self, data: bytes) -> None:
        await self._sink(data)

    async def close(self, code: int = CloseCode.NORMAL, reason: str | None = None) -> None:
        if self.close_code is None:
            self.close_code = code


def connection_for(
    scope_state: object,
    pipe: Pipe,
    params: Params,
    *,
    context_idle_timeout_s: float | None = None,
    receipts: ReadReceipts | None = None,
) -> Connection:
    """A voxgate session behind ``pipe``; ElevenLabs' ``inactivity_timeout`` is its idle timeout.

    Args:
        context_idle_timeout_s: the idle timeout of its contexts (None: the server's setting).
    """
    settings = scope_state.settings  # type: ignore[attr-defined]
    settings = msgspec.structs.replace(settings, idle_timeout_s=float(params.inactivity_timeout_s))
    if context_idle_timeout_s is not None:
        settings = msgspec.structs.replace(settings, context_idle_timeout_s=context_idle_timeout_s)
    return Connection(
        pipe,
        scope_state.catalog,  # type: ignore[attr-defined]
        settings,
        owner=getattr(scope_state, "owner", ""),
        extensions=True,
        meter=scope_state.metrics.session(DIALECT),  # type: ignore[attr-defined]
        sessions=getattr(scope_state, "sessions", None),
        receipts=receipts,
    )


def context_idle_timeout(server_s: float, params: Params, *, multi: bool) -> float:
    """The contexts' idle timeout: the client's ``inactivity_timeout`` within the server's
    ``context_idle_timeout_s`` (0 there: no limit). ``stream-input``'s one context never times out by
    itself: the session's idle timeout (the same ``inactivity_timeout``) closes the socket instead."""
    if not multi:
        return 0.0
    client_s = float(params.inactivity_timeout_s)
    return min(client_s, server_s) if server_s > 0 else client_s


async def run_session(connection: Connection, pipe: Pipe) -> None:
    """Run a session to its end; an unexpected failure is logged and ends it as an internal error."""
    try:
        with connection.meter.active():
            await connection.run()
    except Exception:
        logger.exception("elevenlabs session %s failed", connection.id)
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
    """One ``stream-input`` or ``multi-stream-input`` socket: its session, and one writer at a time."""

    def __init__(self, ws: WebSocket, codec: Stream) -> None:
        self.ws, self.codec = ws, codec
        self.pipe = Pipe(self._render)
        self._lock = asyncio.Lock()
        self._closed = False
        self._pending: set[asyncio.Task[None]] = set()

    async def _render(self, data: str | bytes) -> None:
        for message in self.codec.render(data):
            await self.send(message)

    async def send(self, data: bytes) -> None:
        async with self._lock:
            if self._closed:
                raise WebSocketDisconnect(CloseCode.NORMAL)
            try:
                await self.ws.send_text(data.decode())
            except (OSError, RuntimeError) as exc:  # the client went away: the session ends
                raise WebSocketDisconnect(CloseCode.GOING_AWAY) from exc

    async def close(self, code: int) -> None:
        async with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(OSError, RuntimeError, WebSocketDisconnect, TimeoutError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.ws.close(code)

    async def run(self, params: Params) -> None:
        """Run the session until it ends (it closes the socket) or the client goes away."""
        state = self.ws.state
        idle_s = context_idle_timeout(state.settings.context_idle_timeout_s, params, multi=self.codec.multi)
        connection = connection_for(
            state, self.pipe, params, context_idle_timeout_s=idle_s, receipts=read_receipts(self.ws.scope)
        )
        for out in self.codec.start():
            self.pipe.push(out)
        session = asyncio.create_task(run_session(connection, self.pipe))
        reader = asyncio.create_task(self._read())
        try:
            await asyncio.wait([session, reader], return_when=asyncio.FIRST_COMPLETED)
            if reader.done():  # the client went away (or sent what is not ElevenLabs'): the session ends
                self.pipe.hang_up()
            await session
        finally:
            reader.cancel()
            self.pipe.hang_up()
            await asyncio.wait([session, reader])
        if not reader.cancelled() and (failure := reader.exception()) is not None:
            raise failure  # logged by ``_serve``, which closes the socket as an internal error
        await self.close(close_code(self.pipe.close_code or CloseCode.NORMAL))

    async def _read(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                self.pipe.hang_up()
                return
            try:
                msg = decode_inbound(message.get("text") or message.get("bytes") or b"")
            except ProtocolError as err:
                await self._fail(err)
                return
            try:
                outs = self.codec.receive(msg)
            except ProtocolError as err:  # a first message refused: the next one is a first one again
                self._later(self.codec.error(err, self.codec.context_of(msg)))
                continue
            for out in outs:
                self.pipe.push(out)

    def _later(self, message: bytes) -> None:
        """Send ``message`` from a task of its own (the reader never waits on the socket)."""
        task = asyncio.create_task(self.send(message))
        self._pending.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if not task.cancelled():
            task.exception()  # a socket already gone: nothing more to tell it

    async def _fail(self, err: ProtocolError) -> None:
        """A message that is not ElevenLabs': report it, and end the session with the error's close code."""
        with contextlib.suppress(WebSocketDisconnect):
            await self.send(self.codec.error(err))
        await self.close(close_code(err.close_code))
        self.pipe.hang_up()


async def _serve(websocket: WebSocket, *, multi: bool) -> None:
    voice_id = websocket.path_params["voice_id"]
    await websocket.accept()
    try:
        params = parse_params(websocket.query_params)
        words = await check_voice(websocket.state, voice_id, params)
    except ProtocolError as err:
        await _Socket(websocket, Stream(voice_id, Params(), multi=False))._fail(err)
        return
    socket = _Socket(websocket, Stream(voice_id, params, multi=multi, words=words))
    try:
        await socket.run(params)
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


routes = [
    WebSocketRoute("/v1/text-to-speech/{voice_id}/stream-input", stream_input),
    WebSocketRoute("/v1/text-to-speech/{voice_id}/multi-stream-input", multi_stream_input),
]
