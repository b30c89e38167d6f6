"""The streaming speech WebSocket endpoint, ``WS /v1/audio/speech/stream``."""

from __future__ import annotations

import logging

from starlette.websockets import WebSocket, WebSocketState

from gateway.connection import Connection
from protocol.errors import CloseCode

logger = logging.getLogger(__name__)


async def speech_stream(websocket: WebSocket) -> None:
    """Accept the socket and drive one session; any unexpected failure closes it with 1011."""
    await websocket.accept()
    connection = Connection(websocket, websocket.state.engine, websocket.state.settings)
    try:
        await connection.run()
    except Exception:
        logger.exception("session %s failed", connection.id)
        if websocket.application_state is not WebSocketState.DISCONNECTED:
            try:
                await websocket.close(CloseCode.INTERNAL_ERROR, "internal_error")
            except RuntimeError:
                pass  # the socket went away while we were closing it
