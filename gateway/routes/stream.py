"""The streaming speech WebSocket endpoint, ``WS /v1/audio/speech/stream``."""

from __future__ import annotations

import logging

from starlette.websockets import WebSocket, WebSocketState

from ...protocol.codecs.stream import EXTENSIONS_SUBPROTOCOL
from ..middleware.auth import SUBPROTOCOL
from ..session.receipts import read_receipts
from ..transport.socket import Connection

logger = logging.getLogger(__name__)


async def speech_stream(websocket: WebSocket) -> None:
    """Accept the socket and drive one session; any unexpected failure closes it with 1011."""
    # A client opts in to voxgate's extensions with "voxgate.v1"; browsers that pass the API key as a
    # subprotocol must see one of their offers echoed, so a bare "voxgate" is echoed too.
    offered = websocket.scope.get("subprotocols") or []
    extensions = EXTENSIONS_SUBPROTOCOL in offered
    chosen = EXTENSIONS_SUBPROTOCOL if extensions else SUBPROTOCOL if SUBPROTOCOL in offered else None
    await websocket.accept(subprotocol=chosen)
    state = websocket.state
    meter = state.metrics.session(EXTENSIONS_SUBPROTOCOL if extensions else "vllm-omni")
    connection = Connection(
        websocket,
        state.catalog,
        state.settings,
        owner=getattr(state, "owner", ""),
        extensions=extensions,
        meter=meter,
        sessions=getattr(state, "sessions", None),
        receipts=read_receipts(websocket.scope),
    )
    try:
        with meter.active():
            await connection.run()
    except Exception:
        logger.exception("session %s failed", connection.id)
        if websocket.application_state is not WebSocketState.DISCONNECTED:
            await connection.fail()
