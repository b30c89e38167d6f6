"""ElevenLabs-compatible WebSockets, ``stream-input`` and ``multi-stream-input`` (REST: ``elevenlabs_rest``).

One socket is one voxgate session: a ``Connection`` (``gateway/transport/socket.py``, which drives the session
core) runs on the socket itself with ElevenLabs' codec (``protocol.codecs.elevenlabs_socket``), which
translates
both ways: each ElevenLabs context is one of the session's contexts (``context_id``, docs/protocol.md §11,
with the mapping in §11.1); ``stream-input`` uses one fixed context. So every rule of the session core and
its shell (segmentation, contexts and their cap and idle timeout, backpressure, timeouts, read receipts,
drain, metrics) holds here unchanged, and the socket is admitted and counted as one session
(``gateway/server/sessions.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from ...engine.base import UnsupportedOption
from ...protocol.codecs.elevenlabs import Params, Stream, close_code, parse_params
from ...protocol.codecs.elevenlabs_socket import ElevenLabsSocket
from ...protocol.errors import ProtocolError
from ..session.failures import REFUSALS, error_for
from ..session.receipts import read_receipts
from ..transport.socket import CLOSE_TIMEOUT_S, Connection
from ..voices.catalog import Catalog, Resolved
from .elevenlabs_dictionaries import owned

logger = logging.getLogger(__name__)

#: The ``dialect`` label of this surface in the metrics.
DIALECT = "elevenlabs"


def connection_for(websocket: WebSocket, stream: Stream, params: Params, resolved: Resolved) -> Connection:
    """A voxgate session on ``websocket`` with ElevenLabs' codec; ``inactivity_timeout`` is its idle timeout,
    and bounds its contexts' (``context_idle_timeout``)."""
    state = websocket.state
    settings = state.settings
    idle_s = context_idle_timeout(settings.context_idle_timeout_s, params, multi=stream.multi)
    settings = msgspec.structs.replace(
        settings, idle_timeout_s=float(params.inactivity_timeout_s), context_idle_timeout_s=idle_s
    )
    owner = getattr(state, "owner", "")
    return Connection(
        websocket,
        state.catalog.primed(owner, stream.voice_id, params.model_id, resolved),
        settings,
        owner=getattr(state, "owner", ""),
        extensions=True,
        meter=state.metrics.session(DIALECT),
        sessions=getattr(state, "sessions", None),
        receipts=read_receipts(websocket.scope),
        codec=ElevenLabsSocket(stream, settings.max_message_bytes),
    )


def context_idle_timeout(server_s: float, params: Params, *, multi: bool) -> float:
    """The contexts' idle timeout: the client's ``inactivity_timeout`` within the server's
    ``context_idle_timeout_s`` (0 there: no limit). ``stream-input``'s one context never times out by
    itself: the session's idle timeout (the same ``inactivity_timeout``) closes the socket instead."""
    if not multi:
        return 0.0
    client_s = float(params.inactivity_timeout_s)
    return min(client_s, server_s) if server_s > 0 else client_s


async def check_voice(state: object, voice_id: str, params: Params) -> tuple[bool, Resolved]:
    """Refuse an unknown voice before any text arrives, as ElevenLabs does; whether its engine times words
    (the alignment then follows them, else it is spread over each sentence), and the voice resolved, which
    the session's configuration then reuses (``Catalog.primed``: the voice is looked up once)."""
    catalog: Catalog = state.catalog  # type: ignore[attr-defined]
    owner = getattr(state, "owner", "")
    try:
        resolved = await catalog.resolve(owner, voice_id, params.model_id)
        catalog.checked(resolved, {"word_timestamps": True})
        return True, resolved
    except UnsupportedOption as exc:
        if exc.field != "word_timestamps":
            raise error_for(exc) from None
    except REFUSALS as exc:
        raise error_for(exc) from None
    return False, resolved


def times_words(resolved: Resolved) -> bool:
    """Whether the engine of a prepared request times words for its voice (the alignment then follows them,
    else it is spread over each sentence), asked of the engine without resolving the voice again."""
    engine = resolved.engine
    voice = resolved.voice if resolved.reference is None else engine.default_voice
    try:
        engine.check(voice, {**resolved.options, "word_timestamps": True})
    except UnsupportedOption:
        return False
    return True


async def _refuse(websocket: WebSocket, err: ProtocolError) -> None:
    """Refuse a socket before its session starts (its query, its voice): the error, then the close."""
    err.fatal = True  # its close code goes in the error (ElevenLabs' shape of an error that closes)
    with contextlib.suppress(OSError, RuntimeError, WebSocketDisconnect, TimeoutError):
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await websocket.send_text(Stream("", Params(), multi=False).error(err).decode())
            await websocket.close(close_code(err.close_code))


async def _serve(websocket: WebSocket, *, multi: bool) -> None:
    voice_id = websocket.path_params["voice_id"]
    await websocket.accept()
    try:
        params = parse_params(websocket.query_params)
        words, resolved = await check_voice(websocket.state, voice_id, params)
    except ProtocolError as err:
        await _refuse(websocket, err)
        return
    dictionaries = await owned(websocket.state, getattr(websocket.state, "owner", ""))
    stream = Stream(voice_id, params, multi=multi, words=words, dictionaries=dictionaries)
    connection = connection_for(websocket, stream, params, resolved)
    try:
        with connection.meter.active():
            await asyncio.create_task(connection.run())  # its own task, as when it ran behind a pipe
    except Exception:
        logger.exception("elevenlabs session %s failed", connection.id)
        if websocket.application_state is not WebSocketState.DISCONNECTED:
            await connection.fail()


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
