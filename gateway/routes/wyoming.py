"""Home Assistant's Wyoming protocol over TCP: ``voxgate serve --wyoming HOST:PORT`` (``VOXGATE_WYOMING``).

One TCP connection is one voxgate session: the WebSocket shell (``gateway.transport.socket.Connection``) runs
on
the connection itself, through ``TcpSocket`` (the ``Socket`` it uses, over a TCP stream: each whole Wyoming
event is one message), with Wyoming's codec (``protocol.codecs.wyoming``). So every rule of the session core
and its
shell (segmentation, the audio cap, backpressure, timeouts, drain, metrics) holds here unchanged, and the
connection is admitted and counted as one session (``gateway.server.sessions``). The two events that are no
part of
a session, ``describe`` and ``ping``, are answered by ``TcpSocket`` itself.

The server runs in the app's lifespan (``gateway.app``), beside the HTTP server, with the same catalog,
engines, metrics and sessions. Wyoming has no authentication, so the API keys cannot apply to it: it listens
on loopback unless its address names another host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from importlib.metadata import PackageNotFoundError, version

from starlette.websockets import WebSocketDisconnect

from ...protocol.codecs.wyoming import (
    DESCRIBE,
    PING,
    Framer,
    VoiceInfo,
    WyomingCodec,
    error_event,
    info,
    parse,
    pong,
)
from ...protocol.errors import ProtocolError
from ...protocol.messages import Error
from ..metrics import Metrics
from ..server.sessions import Sessions
from ..settings import Settings
from ..transport.socket import CLOSE_TIMEOUT_S, Connection
from ..voices.catalog import Catalog

logger = logging.getLogger(__name__)

#: The ``dialect`` label of this surface in the metrics.
DIALECT = "wyoming"
#: Bytes asked of the stream per read: many events, or a good part of the largest one.
READ_BYTES = 64 * 1024
#: The host an address without one listens on: Wyoming has no authentication.
LOOPBACK = "127.0.0.1"

#: The transport's answer to an event outside the session, or None for one of the session's.
Answer = Callable[[bytes], Awaitable[bytes | None]]


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPV6]:PORT``, ``:PORT`` or ``PORT`` as a host and port (loopback without a host).

    Raises:
        ValueError: not an address.
    """
    host, _, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]") or LOOPBACK
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"wyoming: {text!r} is not HOST:PORT (a port of 0 to 65535)")
    return host, int(port)


class TcpSocket:
    """A TCP stream as a ``Connection``'s socket: one whole Wyoming event per message, each written whole.

    ``answer`` answers the events that are no part of the session (``describe``, ``ping``): they are written
    here, at once, and never reach the session. A peer that hangs up, or whose connection fails, is a
    disconnect: on reading (the session stops, and the engine work with it) and on writing.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, framer: Framer, answer: Answer
    ) -> None:
        self.reader, self.writer, self.framer, self.answer = reader, writer, framer, answer
        self._events: deque[bytes] = deque()

    async def receive(self) -> Mapping[str, object]:
        while True:
            while not self._events:
                try:
                    data = await self.reader.read(READ_BYTES)
                except OSError:
                    data = b""
                if not data:
                    return {"type": "websocket.disconnect", "code": 1000}
                self._events.extend(self.framer.feed(data))
            # Cancel-safe: the event is taken only once its answer is known (the caller's timeouts cancel).
            reply = await self.answer(self._events[0])
            event = self._events.popleft()
            if reply is None:
                return {"type": "websocket.receive", "bytes": event}
            try:
                await self.send_bytes(reply)
            except WebSocketDisconnect:
                return {"type": "websocket.disconnect", "code": 1006}

    async def send_bytes(self, data: bytes) -> None:
        if self.writer.is_closing():
            raise WebSocketDisconnect(1006)
        try:
            self.writer.write(data)
            await self.writer.drain()
        except OSError:
            raise WebSocketDisconnect(1006) from None

    async def send_text(self, data: str) -> None:
        await self.send_bytes(data.encode())

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        """Hang up (Wyoming has no close message: ``code`` and ``reason`` are not sent)."""
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


class WyomingServer:
    """The Wyoming TCP server of one app: its connections run as sessions over the app's catalog."""

    def __init__(self, settings: Settings, catalog: Catalog, metrics: Metrics, sessions: Sessions) -> None:
        self.settings, self.catalog, self.metrics, self.sessions = settings, catalog, metrics, sessions
        self.server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._version = _version()

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens (the port the system chose for a port of 0)."""
        assert self.server is not None and self.server.sockets, "start() first"
        host, port = self.server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._client, host, port)
        logger.info("Wyoming server on %s:%d (no authentication: API keys do not apply)", *self.address)

    async def aclose(self) -> None:
        """Stop listening, end the connections (their engine work stops), and wait for them."""
        if self.server is not None:
            self.server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        socket = TcpSocket(reader, writer, Framer(self.settings.max_message_bytes), self._answer)
        try:
            await self._session(socket, writer.get_extra_info("peername"))
        finally:
            self._tasks.discard(task)
            await socket.close()

    async def _session(self, socket: TcpSocket, peer: object) -> None:
        async with self.sessions.place("") as refused:
            if refused is not None:
                await _refuse(socket, refused[0])
                return
            connection = Connection(
                socket,
                self.catalog,
                self.settings,
                extensions=False,
                meter=self.metrics.session(DIALECT),
                sessions=self.sessions,
                codec=WyomingCodec(self.settings.max_message_bytes),
            )
            connection.log.info("Wyoming connection from %s", peer)
            try:
                with connection.meter.active():
                    await connection.run()
            except Exception:
                logger.exception("wyoming session %s failed", connection.id)
                await connection.fail()

    async def _answer(self, event: bytes) -> bytes | None:
        """``info`` for ``describe``, ``pong`` for ``ping``; None for the session's events (and bad ones:
        the session's codec refuses them)."""
        try:
            parsed = parse(event, self.settings.max_message_bytes)
        except ProtocolError:
            return None
        if parsed.type == PING:
            return pong(parsed)
        if parsed.type != DESCRIBE:
            return None
        voices = await self.catalog.builtin_voices()
        listed = [VoiceInfo(v.name, v.engine, v.language, v.description) for v in voices]
        return info(listed, self._version)


async def _refuse(socket: TcpSocket, err: ProtocolError) -> None:
    """Refuse a connection the sessions will not take (a drain, a cap): the error, then hang up."""
    with contextlib.suppress(WebSocketDisconnect, TimeoutError):
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await socket.send_bytes(error_event(Error.of(err)))


async def start(
    settings: Settings, catalog: Catalog, metrics: Metrics, sessions: Sessions
) -> WyomingServer | None:
    """The Wyoming server at ``settings.wyoming``, listening; None when that is empty."""
    if not settings.wyoming:
        return None
    server = WyomingServer(settings, catalog, metrics, sessions)
    await server.start(*parse_address(settings.wyoming))
    return server


def _version() -> str:
    try:
        return version("voxgate")
    except PackageNotFoundError:
        return "0"
