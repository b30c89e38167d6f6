"""Read receipts: whether a WebSocket client still reads what the gateway sends, and how far behind it is.

The writer notices a client that stopped reading once a send blocks, that is once every buffer
between the two is full. That can take very long: the client's kernel acknowledges bytes its program
never reads, and with permessage-deflate (or behind a proxy that buffers) those buffers hold minutes
of audio; a compressed tone never filled them in a test. And a blocked send says nothing either way: a
client reading at playback pace 30 s behind blocks sends for as long as the kernel waits before it wakes
the writer, tens of seconds with a loopback's megabytes of buffer. TCP cannot tell the two apart; the
WebSocket can. A client answers a ping only once it has read everything sent before the ping, so pings
placed in the stream of audio come back as read receipts:

- a ping goes out after every ``interval_s`` of audio written, and once a burst of writes is over
  (nothing written for ``quiet_s``), so every message written is followed by a ping;
- each ping carries ``vxrr`` and 8 random bytes (``secrets``): a client cannot answer a ping it has not
  read (with a counter it could, and a client that read nothing held its session open by pongs sent in
  advance). The unanswered ones are kept in order; a pong answers its ping and every one before it;
- while a ping is unanswered, the stall clock runs from that ping, or from the last pong that answered
  an earlier one: a client reading at playback pace answers one every ``interval_s`` however far
  behind it is, and is never stalled;
- no pong for ``timeout_s`` (the session's ``send_timeout_s``) while one is awaited: ``stalled`` is set,
  and the session ends with ``slow_consumer`` (4001);
- each receipt calls ``on_receipt``: the session's blocked send and its idle clock start over (a blocked
  send is no stall while receipts come), and ``read_up_to`` lets the writer wait until the audio written
  but not yet read is within a bound, so synthesis does not run ahead of the client without limit.

``ReceiptProtocol`` is uvicorn's sans-I/O WebSocket protocol with a ``ReadReceipts`` per connection,
published to the app in the scope's extensions (``read_receipts(scope)``). Its pings carry 12 bytes,
so their pongs are told apart from those of uvicorn's keepalive pings (4 bytes). While anything written
is unreceipted, the receipts are the keepalive: uvicorn's keepalive ping would wait behind the audio, and
its pong timeout would cut a client that reads steadily but far behind. So that ping is skipped then, and
a keepalive pong that is late while receipts come is no timeout; a connection with nothing in flight is
still pinged, so a dead peer is found. A close is written past flow control, so a client that stopped
reading finds its close code (4001) after what it was sent whenever it reads again.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
from asyncio.transports import BaseTransport, Transport
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.frames import Frame

#: The key of the scope's ``extensions`` that holds a connection's ``ReadReceipts``.
EXTENSION = "voxgate.read_receipts"
_PREFIX = b"vxrr"
#: Random bytes after the prefix: 64 bits, which no client guesses before it has read the ping.
TOKEN_BYTES = 8
#: Audio between two pings, as a share of the timeout: a client at playback pace answers 4 per timeout.
INTERVAL_SHARE = 0.25
#: A burst of writes is over once nothing was written for this long; its last messages then get a ping.
QUIET_S = 0.2
#: How long a closed connection may take to send what it still holds before it is aborted.
CLOSE_FLUSH_S = 10.0


@dataclass(slots=True)
class _Burst:
    """What was written since the last ping."""

    audio_s: float = 0.0  # its audio
    unreceipted: bool = False  # something was written
    last_write: float = 0.0  # loop time of the last write (not reset by a ping)
    quiet: asyncio.TimerHandle | None = None  # pings it once nothing was written for ``QUIET_S``


@dataclass(slots=True)
class _Stall:
    """The stall clock."""

    since: float | None = None  # a ping is awaited, with no pong since this loop time
    timer: asyncio.TimerHandle | None = None  # checks it once ``timeout_s`` has passed


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
        self.on_receipt: Callable[[], None] | None = None  # called on each pong that answers a ping
        self.last_receipt = float("-inf")  # loop time of the last such pong
        # Unanswered pings, oldest first: payload -> the audio written before it.
        self._pings: collections.OrderedDict[bytes, float] = collections.OrderedDict()
        self._written_s = 0.0  # audio written, all told
        self._read_s = 0.0  # ... of which the client has shown it read
        self._burst = _Burst()
        self._stall = _Stall()
        self._receipt = asyncio.Event()  # set by each receipt, for ``read_up_to``

    @property
    def awaiting(self) -> bool:
        """A ping is unanswered: the client has not yet shown that it read everything written."""
        return bool(self._pings)

    @property
    def in_flight(self) -> bool:
        """While watching, something written is not yet receipted: the receipts watch the client."""
        return bool(self.timeout_s) and (bool(self._pings) or self._burst.unreceipted)

    @property
    def read_s(self) -> float:
        """Audio written that the client has shown it read, all told (as of the last receipt)."""
        return self._read_s

    @property
    def unread_s(self) -> float:
        """Audio written that the client has not yet shown it read."""
        return self._written_s - self._read_s

    def watch(self, timeout_s: float) -> None:
        """Start watching: ``stalled`` is set once a ping goes ``timeout_s`` without a pong."""
        self.timeout_s = timeout_s
        self.interval_s = timeout_s * INTERVAL_SHARE

    def wrote(self, audio_s: float = 0.0) -> None:
        """One message was written to the socket, carrying ``audio_s`` of audio."""
        if not self.timeout_s:
            return
        burst = self._burst
        burst.audio_s += audio_s
        self._written_s += audio_s
        burst.unreceipted = True
        burst.last_write = self._loop.time()
        if burst.audio_s >= self.interval_s:
            self._ping()
        elif burst.quiet is None:
            burst.quiet = self._loop.call_at(burst.last_write + QUIET_S, self._on_quiet)

    async def read_up_to(self, lead_s: float) -> None:
        """Wait until at most ``lead_s`` of the audio written is unread (returns at once when not watching).

        The last writes are pinged at once rather than after ``QUIET_S``, so the wait is a round trip to a
        client that keeps up. A client that never catches up is ``stalled`` meanwhile.
        """
        while self.timeout_s and self.unread_s > lead_s:
            if self._burst.unreceipted:
                self._ping()
            self._receipt.clear()
            await self._receipt.wait()

    def pong(self, payload: bytes) -> bool:
        """A pong arrived; False if it does not answer one of these pings (uvicorn's keepalive)."""
        if len(payload) != len(_PREFIX) + TOKEN_BYTES or not payload.startswith(_PREFIX):
            return False
        read_s = self._pings.get(payload)
        if read_s is None:  # stale (an answered ping's), or made up: it proves nothing
            return True
        while self._pings.popitem(last=False)[0] != payload:
            pass  # answered too: the client read past them
        self._read_s = read_s
        now = self._loop.time()
        self.last_receipt = now
        self._stall.since = now if self._pings else None
        self._receipt.set()
        if self.on_receipt is not None:
            self.on_receipt()
        return True

    def close(self) -> None:
        """Stop: no more pings, no more checks; ``read_up_to`` returns."""
        self.timeout_s = 0.0
        for handle in (self._burst.quiet, self._stall.timer):
            if handle is not None:
                handle.cancel()
        self._burst.quiet = self._stall.timer = None
        self._receipt.set()

    def _on_quiet(self) -> None:
        burst = self._burst
        burst.quiet = None
        if not burst.unreceipted or not self.timeout_s:
            return
        due = burst.last_write + QUIET_S
        if self._loop.time() < due:  # written since this timer was armed: the burst goes on
            burst.quiet = self._loop.call_at(due, self._on_quiet)
            return
        self._ping()

    def _ping(self) -> None:
        payload = _PREFIX + secrets.token_bytes(TOKEN_BYTES)
        if not self._send_ping(payload):
            return
        self._pings[payload] = self._written_s
        self._burst.audio_s = 0.0
        self._burst.unreceipted = False
        stall = self._stall
        if stall.since is None:
            stall.since = self._loop.time()
            if stall.timer is None:
                stall.timer = self._loop.call_at(stall.since + self.timeout_s, self._check)

    def _check(self) -> None:
        stall = self._stall
        stall.timer = None
        if stall.since is None or not self.timeout_s:
            return
        due = stall.since + self.timeout_s
        if self._loop.time() < due:  # a pong came since: the clock restarted
            stall.timer = self._loop.call_at(due, self._check)
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
        self._abort: asyncio.TimerHandle | None = None

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def close(self) -> None:
        """Close once what is written is sent; a peer that reads none of it within ``CLOSE_FLUSH_S``
        (a stalled client, whose buffers hold the audio, the error and the close) is aborted instead:
        asyncio's close alone would wait for it forever, holding the socket and its buffers."""
        self._flush()
        self._transport.close()
        if self._abort is None and self._transport.get_write_buffer_size():
            self._abort = self._loop.call_later(CLOSE_FLUSH_S, self._transport.abort)

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def lost(self) -> None:
        """The connection is gone: no abort is due."""
        if self._abort is not None:
            self._abort.cancel()
            self._abort = None

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

    def send_keepalive_ping(self) -> None:
        receipts: ReadReceipts | None = getattr(self, "receipts", None)
        if receipts is not None and receipts.in_flight:
            # The receipts watch the client now; this ping would wait behind the audio in flight.
            self.ping_timer = None
            self.schedule_ping()
            return
        super().send_keepalive_ping()

    def keepalive_timeout(self) -> None:
        receipts: ReadReceipts | None = getattr(self, "receipts", None)
        if receipts is not None and receipts.last_receipt > self.ping_sent_at:
            # The pong is late behind what was written before the ping, and the client is reading it.
            self.pong_timer = None
            self.pending_ping_payload = None
            self.schedule_ping()
            return
        super().keepalive_timeout()

    async def send(self, message: Any) -> None:
        if message["type"] == "websocket.close":
            # Past flow control: a few bytes, and nothing is written after them. A client that stopped
            # reading finds the close after what it was sent, instead of a connection dropped without one.
            self.writable.set()
        await super().send(message)

    def connection_lost(self, exc: Exception | None) -> None:
        receipts: ReadReceipts | None = getattr(self, "receipts", None)
        if receipts is not None:
            receipts.close()
        if isinstance(self.transport, CoalescingTransport):
            self.transport.lost()
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
