"""Read receipts: whether a WebSocket client still reads what the gateway sends.

The writer notices a client that stopped reading once a send blocks, that is once every buffer
between the two is full. That can take very long: the client's kernel acknowledges bytes its program
never reads, and with permessage-deflate (or behind a proxy that buffers) those buffers hold minutes
of audio; a compressed tone never filled them in a test. TCP cannot tell the two apart; the WebSocket
can. A client answers a ping only once it has read everything sent before the ping, so pings placed in
the stream of audio come back as read receipts:

- a ping goes out after every ``interval_s`` of audio written, and once a burst of writes is over
  (nothing written for ``quiet_s``), so every message written is followed by a ping;
- while a ping is unanswered, the stall clock runs from that ping, or from the last pong that answered
  an earlier one: a client reading at playback pace answers one every ``interval_s`` however far
  behind it is, and is never stalled;
- no pong for ``timeout_s`` (the session's ``send_timeout_s``) while one is awaited: ``stalled`` is set,
  and the session ends with ``slow_consumer`` (4001).

``ReceiptProtocol`` is uvicorn's sans-I/O WebSocket protocol with a ``ReadReceipts`` per connection,
published to the app in the scope's extensions (``read_receipts(scope)``). Its pings carry 8 bytes,
so their pongs are told apart from those of uvicorn's keepalive pings (4 bytes).
"""

from __future__ import annotations

import asyncio
from asyncio.transports import BaseTransport, Transport
from collections.abc import Callable, Mapping
from typing import Any, cast

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.frames import Frame

#: The key of the scope's ``extensions`` that holds a connection's ``ReadReceipts``.
EXTENSION = "voxgate.read_receipts"
_PREFIX = b"vxrr"  # then a 4-byte sequence number
#: Audio between two pings, as a share of the timeout: a client at playback pace answers 4 per timeout.
INTERVAL_SHARE = 0.25
#: A burst of writes is over once nothing was written for this long; its last messages then get a ping.
QUIET_S = 0.2


class ReadReceipts:
    """The pings of one connection and the pongs that answer them (one event loop, no locks).

    Args:
        send_ping: writes a ping with this payload; False when the connection is closing.
        loop: the connection's event loop.
    """

    def __init__(self, send_ping: Callable[[bytes], bool], loop: asyncio.AbstractEventLoop) -> None:
        self._send_ping = send_ping
        self._loop = loop
        self.timeout_s = 0.0  # 0: not watching (``watch`` starts it)
        self.interval_s = 0.0
        self.stalled = asyncio.Event()
        self._sent = 0  # sequence number of the last ping written
        self._answered = 0  # ... of the last one answered
        self._audio_s = 0.0  # audio written since the last ping
        self._unreceipted = False  # something was written since the last ping
        self._last_write = 0.0
        self._stall_since: float | None = None  # a ping is awaited, with no pong since this time
        self._quiet: asyncio.TimerHandle | None = None
        self._watch: asyncio.TimerHandle | None = None

    @property
    def awaiting(self) -> bool:
        """A ping is unanswered: the client has not yet shown that it read everything written."""
        return self._answered < self._sent

    def watch(self, timeout_s: float) -> None:
        """Start watching: ``stalled`` is set once a ping goes ``timeout_s`` without a pong."""
        self.timeout_s = timeout_s
        self.interval_s = timeout_s * INTERVAL_SHARE

    def wrote(self, audio_s: float = 0.0) -> None:
        """One message was written to the socket, carrying ``audio_s`` of audio."""
        if not self.timeout_s:
            return
        self._audio_s += audio_s
        self._unreceipted = True
        self._last_write = self._loop.time()
        if self._audio_s >= self.interval_s:
            self._ping()
        elif self._quiet is None:
            self._quiet = self._loop.call_at(self._last_write + QUIET_S, self._on_quiet)

    def pong(self, payload: bytes) -> bool:
        """A pong arrived; False if it does not answer one of these pings (uvicorn's keepalive)."""
        if len(payload) != len(_PREFIX) + 4 or not payload.startswith(_PREFIX):
            return False
        seq = int.from_bytes(payload[len(_PREFIX) :], "big")
        if self._answered < seq <= self._sent:
            self._answered = seq
            self._stall_since = None if seq == self._sent else self._loop.time()
        return True

    def close(self) -> None:
        """Stop: no more pings, no more checks."""
        self.timeout_s = 0.0
        for handle in (self._quiet, self._watch):
            if handle is not None:
                handle.cancel()
        self._quiet = self._watch = None

    def _on_quiet(self) -> None:
        self._quiet = None
        if not self._unreceipted or not self.timeout_s:
            return
        due = self._last_write + QUIET_S
        if self._loop.time() < due:  # written since this timer was armed: the burst goes on
            self._quiet = self._loop.call_at(due, self._on_quiet)
            return
        self._ping()

    def _ping(self) -> None:
        payload = _PREFIX + (self._sent + 1).to_bytes(4, "big")
        if not self._send_ping(payload):
            return
        self._sent += 1
        self._audio_s = 0.0
        self._unreceipted = False
        if self._stall_since is None:
            self._stall_since = self._loop.time()
            if self._watch is None:
                self._watch = self._loop.call_at(self._stall_since + self.timeout_s, self._check)

    def _check(self) -> None:
        self._watch = None
        if self._stall_since is None or not self.timeout_s:
            return
        due = self._stall_since + self.timeout_s
        if self._loop.time() < due:  # a pong came since: the clock restarted
            self._watch = self._loop.call_at(due, self._check)
            return
        self.stalled.set()


class CoalescingTransport:
    """A transport whose writes in one turn of the event loop go to the socket as one write.

    The writer sends the frames of an engine chunk one after another without yielding (six 40 ms frames
    of a 250 ms chunk); uvicorn writes each to the transport, one system call apiece. Here they are
    joined and written once, at the end of the loop's turn, in the order they came (close frames and
    pings included: everything goes through ``write``). ``close`` writes what is pending first.
    """

    def __init__(self, transport: Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def _flush(self) -> None:
        if self._pending:
            data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def __getattr__(self, name: str) -> Any:  # is_closing, pause_reading, get_extra_info, ...
        return getattr(self._transport, name)


class ReceiptProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol, with read receipts (pass it as ``uvicorn.Config(ws=...)``),
    writing through a ``CoalescingTransport``."""

    def connection_made(self, transport: BaseTransport) -> None:
        coalescing = CoalescingTransport(cast(Transport, transport), self.loop)
        super().connection_made(cast(Transport, coalescing))

    def handle_connect(self, event: Any) -> None:
        self.receipts = ReadReceipts(self._send_receipt_ping, self.loop)
        super().handle_connect(event)
        if self.handshake_initiated and not self.close_sent:  # accepted for the app: it has a scope
            extensions: dict[str, Any] = self.scope["extensions"]
            extensions[EXTENSION] = self.receipts

    def handle_pong(self, event: Frame) -> None:
        receipts: ReadReceipts | None = getattr(self, "receipts", None)
        if receipts is None or not receipts.pong(bytes(event.data)):
            super().handle_pong(event)

    def connection_lost(self, exc: Exception | None) -> None:
        receipts: ReadReceipts | None = getattr(self, "receipts", None)
        if receipts is not None:
            receipts.close()
        super().connection_lost(exc)

    def _send_receipt_ping(self, payload: bytes) -> bool:
        if self.close_sent or self.disconnected or self.transport.is_closing():
            return False
        try:
            self.conn.send_ping(payload)
        except InvalidState:
            return False
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True


def read_receipts(scope: Mapping[str, Any]) -> ReadReceipts | None:
    """The read receipts of a WebSocket's connection; None when its server is not ``ReceiptProtocol``."""
    receipts = (scope.get("extensions") or {}).get(EXTENSION)
    return receipts if isinstance(receipts, ReadReceipts) else None
