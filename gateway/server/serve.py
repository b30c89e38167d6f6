"""The uvicorn server of ``voxgate serve``: a graceful drain on SIGTERM (``gateway.server.sessions``), and a
timeout and a size limit on request headers (``http_protocol``).

uvicorn bounds neither a request's head in time nor, under httptools (its default parser when installed),
in size: httptools gathers each header whole before handing it on, so a 50 MB header was read and held.
``http_protocol`` wraps both of uvicorn's parsers with a limit of ``max_header_bytes`` on a request's line
and headers. Under h11 the limit is h11's own ``max_incomplete_event_size`` for a head still arriving, and
the size of the parsed request for one that came whole in a read; h11 raises its error hinting 431, which
uvicorn would answer with a plain 400 (``_H11Connection`` keeps the hint). Under httptools it counts the
target and headers as the parser hands them over, and the whole reads that arrive while a head is still
incomplete (``_HeadCount``). Either way the answer is 431 ``header_too_large`` in OpenAI's error shape and
the connection is closed, so a head holds at most the limit plus one read of the socket (asyncio reads
256 KiB at most).
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

from ...protocol.errors import ErrorCode, ProtocolError
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
#: ``max_header_bytes``' default: 4 times h11's and nginx's largest header buffers (16 KiB, 4 x 8 KiB),
#: room for big cookies and tokens, while a head that large costs nothing worth noticing.
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
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


def _error_response(error: ProtocolError, reason: str) -> bytes:
    """``error`` in OpenAI's error shape with ``Connection: close``, as raw bytes: written by the protocol
    itself, before any request has reached the app."""
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
        f"HTTP/1.1 {error.status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nx-content-type-options: nosniff\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _timeout_response(timeout_s: float) -> bytes:
    """408 ``header_timeout``."""
    error = ProtocolError(
        ErrorCode.HEADER_TIMEOUT, f"the request headers did not arrive within {timeout_s:g} s"
    )
    return _error_response(error, "Request Timeout")


def _too_large_response(max_bytes: int) -> bytes:
    """431 ``header_too_large``."""
    error = ProtocolError(
        ErrorCode.HEADER_TOO_LARGE, f"the request line and headers are over the {max_bytes} byte limit"
    )
    return _error_response(error, "Request Header Fields Too Large")


def _refuse_head(transport: asyncio.Transport, max_bytes: int) -> None:
    """Answer 431 and close: whatever else the client sends is never read."""
    logger.info(
        "closed a connection from %s: request headers over %d bytes",
        transport.get_extra_info("peername"),
        max_bytes,
    )
    transport.write(_too_large_response(max_bytes))
    transport.close()


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


class _H11Connection(h11.Connection):
    """h11's connection with heads of at most ``max_header_bytes``, remembering the status its last
    refusal of the client's data hinted (uvicorn answers every refusal with 400).

    h11 bounds only a head still incomplete (``max_incomplete_event_size``); one that arrives whole in a
    read is measured here, as it is parsed, before uvicorn starts the request.
    """

    refused_status = 0

    def __init__(self, max_header_bytes: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self.max_header_bytes = max_header_bytes

    def next_event(self) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        try:
            event = super().next_event()
            if isinstance(event, h11.Request) and _head_size(event) > self.max_header_bytes:
                raise h11.RemoteProtocolError("request headers too large", error_status_hint=431)
        except h11.RemoteProtocolError as exc:
            self.refused_status = exc.error_status_hint
            raise
        return event


def _head_size(request: h11.Request) -> int:
    """The bytes of a request's line and headers, as sent but for optional whitespace."""
    line = len(request.method) + len(request.target) + len(request.http_version) + 12
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers.raw_items())


class H11HeaderTimeout(H11Protocol):
    """uvicorn's h11 protocol with a ``HeaderDeadline`` of ``header_timeout_s`` and heads of at most
    ``max_header_bytes`` (h11 counts them: its ``max_incomplete_event_size``)."""

    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    max_header_bytes = DEFAULT_MAX_HEADER_BYTES

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Nothing was read yet: the connection uvicorn made is replaced by one with our limit.
        self.conn = _H11Connection(self.max_header_bytes)
        self.header_deadline = HeaderDeadline(self.loop, transport, self.header_timeout_s)
        self.header_deadline.arm(started=False)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:  # waiting for a request line: this is its first byte or more
            self.header_deadline.arm(started=True)
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # h11 yields the request only once its headers are in
            self.header_deadline.disarm()

    def send_400_response(self, msg: str) -> None:
        conn = self.conn
        if isinstance(conn, _H11Connection) and conn.refused_status == 431:
            _refuse_head(self.transport, self.max_header_bytes)
            return
        super().send_400_response(msg)

    def connection_lost(self, exc: Exception | None) -> None:
        self.header_deadline.disarm()
        super().connection_lost(exc)


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop httptools at a head over the limit (httptools raises it
    again as an ``HttpParserError``, which uvicorn answers with ``send_400_response``)."""


class _HeadCount:
    """The bytes of one request head seen so far, by httptools: those its callbacks gave (the target and
    each whole header) and those of the whole reads that came after the one the head began in (they hold
    the header httptools is still buffering)."""

    def __init__(self) -> None:
        self.parsed = 0
        self.read = 0


if HttpToolsProtocol is not None:

    class HttpToolsHeaderTimeout(HttpToolsProtocol):
        """uvicorn's httptools protocol with a ``HeaderDeadline`` of ``header_timeout_s`` and heads of at
        most ``max_header_bytes`` (``_HeadCount``)."""

        header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
        max_header_bytes = DEFAULT_MAX_HEADER_BYTES

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.head: _HeadCount | None = None  # None: no head is being read
            self.head_refused = False
            self.header_deadline = HeaderDeadline(self.loop, transport, self.header_timeout_s, self._busy)
            self.header_deadline.arm(started=False)

        def _busy(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def data_received(self, data: bytes) -> None:
            before = self.head
            super().data_received(data)
            if before is not None and self.head is before:  # the whole read is part of this head
                before.read += len(data)
                if before.read > self.max_header_bytes and not self.transport.is_closing():
                    self._refuse()

        def _count(self, parsed: int) -> None:
            """Count bytes the parser gave; past the limit, stop it (uvicorn calls ``send_400_response``)."""
            assert self.head is not None
            self.head.parsed += parsed
            if self.head.parsed > self.max_header_bytes:
                self.head_refused = True
                raise _HeadTooLarge

        def send_400_response(self, msg: str) -> None:
            if self.head_refused:
                self._refuse()
                return
            super().send_400_response(msg)

        def _refuse(self) -> None:
            self.head = None
            if self._busy():  # a pipelined head: a 431 now would land inside the response being written
                self.transport.close()
            else:
                _refuse_head(self.transport, self.max_header_bytes)

        def on_message_begin(self) -> None:  # the parser saw the first byte of a request
            self.head = _HeadCount()
            self.header_deadline.arm(started=True)
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)  # ": " and CRLF
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self.head = None
            self.header_deadline.disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self.header_deadline.disarm()
            super().connection_lost(exc)


def http_protocol(
    header_timeout_s: float, impl: str = "auto", max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
) -> type[asyncio.Protocol]:
    """The HTTP protocol class to pass to ``uvicorn.Config(http=...)``: uvicorn's own (httptools when
    installed, as uvicorn's ``auto`` picks, else h11; or ``impl``) with a header timeout and size limit."""
    use_httptools = impl == "httptools" or (impl == "auto" and HttpToolsProtocol is not None)
    if use_httptools:

        class LimitedHttpTools(HttpToolsHeaderTimeout):
            pass

        LimitedHttpTools.header_timeout_s = header_timeout_s
        LimitedHttpTools.max_header_bytes = max_header_bytes
        return LimitedHttpTools

    class LimitedH11(H11HeaderTimeout):
        pass

    LimitedH11.header_timeout_s = header_timeout_s
    LimitedH11.max_header_bytes = max_header_bytes
    return LimitedH11
