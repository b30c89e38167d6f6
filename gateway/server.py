"""The uvicorn server of ``voxgate serve``: a graceful drain on SIGTERM (``gateway.sessions``), and a
timeout on request headers (``http_protocol``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
from collections.abc import Callable
from types import FrameType

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..protocol.errors import ErrorCode, ProtocolError
from .sessions import Sessions

try:  # uvicorn's default HTTP parser when installed (uvicorn[standard]); h11 otherwise
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - depends on the install
    HttpToolsProtocol = None  # type: ignore[assignment,misc]
#: The parsers ``http_protocol`` can time: uvicorn's h11 one, and its httptools one when installed.
HTTP_IMPLS = ("h11", "httptools") if HttpToolsProtocol is not None else ("h11",)

logger = logging.getLogger(__name__)

#: ``header_timeout_s``'s default (``gateway.settings`` declares the setting).
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: After a drain's timeout, how long the sessions told to end get to send their error and close.
DRAIN_GRACE_S = 3.0


#: What uvicorn logs, with a traceback, about a client's own fault: it answers it (1007) itself.
_CLIENT_FAULTS = frozenset({"Invalid UTF-8 sequence received from client."})


class ClientFaultFilter(logging.Filter):
    """Turns uvicorn's ERROR-with-traceback about a client's invalid data into one INFO line.

    uvicorn's sans-I/O WebSocket implementation logs ``Invalid UTF-8 sequence received from client.``
    with ``logger.exception`` and then closes with 1007: the client's fault, already answered, so not
    an error of the server (and never a traceback: anything a client can send is a plain line).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in _CLIENT_FAULTS:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info = record.exc_text = None
        return True


def quiet_client_faults() -> None:
    """Install ``ClientFaultFilter`` on uvicorn's error logger (once)."""
    log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ClientFaultFilter) for f in log.filters):
        log.addFilter(ClientFaultFilter())


class DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM or SIGINT drains the sessions before the server stops.

    uvicorn's own handler stops listening at once and closes every WebSocket with 1012. Here the
    listener stays open (``/readyz`` answers 503, new sessions are refused) while the sessions finish
    (``Sessions.drain``); then uvicorn's shutdown runs. A second signal stops at once (uvicorn's
    shutdown), a SIGINT after that forces the exit. The signal is not raised again once the server has
    stopped, so the process exits with 0.
    """

    def __init__(self, config: uvicorn.Config, sessions: Sessions) -> None:
        super().__init__(config)
        quiet_client_faults()
        self.sessions = sessions
        self.signalled = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.drain: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.signalled and self.loop is not None:
            self.signalled = True
            self.loop.call_soon_threadsafe(self._start_drain)
        elif self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True

    def _start_drain(self) -> None:
        self.drain = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        s = self.sessions
        logger.info("draining %d session(s) for up to %g s", s.count, s.drain_timeout_s)
        await s.drain(DRAIN_GRACE_S)
        logger.info("drained; %d session(s) left", s.count)
        self.should_exit = True


def _timeout_response(timeout_s: float) -> bytes:
    """408 ``header_timeout`` in OpenAI's error shape, with ``Connection: close``, as raw bytes."""
    error = ProtocolError(
        ErrorCode.HEADER_TIMEOUT, f"the request headers did not arrive within {timeout_s:g} s"
    )
    body = json.dumps(
        {
            "error": {
                "message": error.message,
                "type": "invalid_request_error",
                "param": None,
                "code": error.code,
            }
        }
    ).encode()
    head = (
        f"HTTP/1.1 {error.status} Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nx-content-type-options: nosniff\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class HeaderDeadline:
    """The header timer of one connection (slowloris): armed when the connection opens and at the first
    byte of each request, disarmed once the request's headers are complete; when it fires, the
    connection is closed, after a 408 if part of a request had arrived.

    uvicorn has no such timer: its keep-alive timeout covers only the wait between requests, and it is
    cancelled by any byte, so a client sending a header byte every few seconds held a connection forever.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.Transport,
        timeout_s: float,
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        self.loop = loop
        self.transport = transport
        self.timeout_s = timeout_s
        #: Whether a response is being written (a pipelined request's head may trickle in meanwhile):
        #: the timer then waits another ``timeout_s``, so nothing is ever written into a response.
        self.busy = busy
        self.started = False  # a byte of the current request has arrived
        self.handle: asyncio.TimerHandle | None = None

    def arm(self, *, started: bool) -> None:
        """Start the timer if it is not running (a later byte never extends it)."""
        self.started = self.started or started
        if self.timeout_s > 0 and self.handle is None:
            self.handle = self.loop.call_later(self.timeout_s, self._expire)

    def disarm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.started = False

    def _expire(self) -> None:
        self.handle = None
        if self.transport.is_closing():
            return
        if self.busy():
            self.handle = self.loop.call_later(self.timeout_s, self._expire)
            return
        peer = self.transport.get_extra_info("peername")
        logger.info(
            "closed a connection from %s: no complete request headers within %g s", peer, self.timeout_s
        )
        if self.started:
            self.transport.write(_timeout_response(self.timeout_s))
        self.transport.close()


class H11HeaderTimeout(H11Protocol):
    """uvicorn's h11 protocol with a ``HeaderDeadline`` of ``header_timeout_s``."""

    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.header_deadline = HeaderDeadline(self.loop, transport, self.header_timeout_s)
        self.header_deadline.arm(started=False)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:  # waiting for a request line: this is its first byte or more
            self.header_deadline.arm(started=True)
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # h11 yields the request only once its headers are in
            self.header_deadline.disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.header_deadline.disarm()
        super().connection_lost(exc)


if HttpToolsProtocol is not None:

    class HttpToolsHeaderTimeout(HttpToolsProtocol):
        """uvicorn's httptools protocol with a ``HeaderDeadline`` of ``header_timeout_s``."""

        header_timeout_s = DEFAULT_HEADER_TIMEOUT_S

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.header_deadline = HeaderDeadline(self.loop, transport, self.header_timeout_s, self._busy)
            self.header_deadline.arm(started=False)

        def _busy(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def on_message_begin(self) -> None:  # the parser saw the first byte of a request
            self.header_deadline.arm(started=True)
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self.header_deadline.disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self.header_deadline.disarm()
            super().connection_lost(exc)


def http_protocol(header_timeout_s: float, impl: str = "auto") -> type[asyncio.Protocol]:
    """The HTTP protocol class to pass to ``uvicorn.Config(http=...)``: uvicorn's own (httptools when
    installed, as uvicorn's ``auto`` picks, else h11; or ``impl``) with a header timeout."""
    use_httptools = impl == "httptools" or (impl == "auto" and HttpToolsProtocol is not None)
    if use_httptools:

        class TimedHttpTools(HttpToolsHeaderTimeout):
            pass

        TimedHttpTools.header_timeout_s = header_timeout_s
        return TimedHttpTools

    class TimedH11(H11HeaderTimeout):
        pass

    TimedH11.header_timeout_s = header_timeout_s
    return TimedH11
