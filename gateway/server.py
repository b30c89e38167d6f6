"""The uvicorn server of ``voxgate serve``, with a graceful drain on SIGTERM (``gateway.sessions``)."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn

from voxgate.gateway.sessions import Sessions

logger = logging.getLogger(__name__)

#: After a drain's timeout, how long the sessions told to end get to send their error and close.
DRAIN_GRACE_S = 3.0


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
