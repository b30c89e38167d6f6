"""The streaming speech WebSocket endpoint, ``WS /v1/audio/speech/stream``."""

from __future__ import annotations

import logging

from starlette.websockets import WebSocket, WebSocketState

from gateway.auth import SUBPROTOCOL
from gateway.connection import Connection
from protocol.errors import CloseCode

logger = logging.getLogger(__name__)


async def speech_stream(websocket: WebSocket) -> None:
    """Accept the socket and drive one session; any unexpected failure closes it with 1011."""
    # Browsers that pass the API key as a subprotocol also offer "voxgate", which we must echo.
    offered = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    state = websocket.state
    connection = Connection(websocket, state.catalog, state.settings, owner=getattr(state, "owner", ""))
    try:
        await connection.run()
    except Exception:
        logger.exception("session %s failed", connection.id)
        if websocket.application_state is not WebSocketState.DISCONNECTED:
            try:
                await websocket.close(CloseCode.INTERNAL_ERROR, "internal_error")
            except RuntimeError:
                pass  # the socket went away while we were closing it
