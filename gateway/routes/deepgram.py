"""Deepgram-compatible text to speech (Aura): ``WS /v1/speak`` and ``POST /v1/speak``.

The socket is one voxgate session (``gateway.transport.socket``) speaking through Deepgram's codec
(``protocol.codecs.deepgram.DeepgramSocket``) in its default context: every rule of the session core
(segmentation, cancel, backpressure, timeouts, caps, drain, metrics) holds here unchanged. A REST request
is one utterance of a session on the one host (``gateway.session.host``), its audio written as it is made
(``gateway.transport.body``). The query names the voice (``model``: a voxgate voice or an alias) and the
audio; a
query voxgate cannot serve is refused before the socket opens, with HTTP 400 and Deepgram's error body.
docs/protocol.md §15 has the mapping.

Keys: ``Authorization: Token KEY`` (the SDK, pipecat, livekit) or ``Bearer``.
"""

from __future__ import annotations

import contextlib
import uuid

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from ...protocol.codecs.deepgram import DeepgramSocket, decode_body, parse_params, rest_error
from ...protocol.codecs.vendor import RawAudio
from ...protocol.errors import ErrorCode, ProtocolError
from ...protocol.output import OutputFormat
from ..middleware.http import BodyTooLarge, read_body
from ..session.failures import REFUSALS, error_for
from ..transport.body import respond
from .vendors import run_socket, speak, voice_book

#: The ``dialect`` label of this surface in the metrics.
DIALECT = "deepgram"
#: A body holds one text (Deepgram takes 2,000 characters).
MAX_BODY_BYTES = 1024 * 1024


def _refusal(err: ProtocolError, request_id: str) -> Response:
    return Response(rest_error(err, request_id), err.status, media_type="application/json")


async def speak_socket(ws: WebSocket) -> None:
    """``WS /v1/speak``: ``Speak``, ``Flush``, ``Clear``, ``Close``."""
    try:
        params = parse_params(ws.query_params, await voice_book(ws.state), socket=True)
        config = params.config()
        try:  # the engine's refusal too (an option it cannot follow), before the socket opens
            await ws.state.catalog.prepare(
                getattr(ws.state, "owner", ""), config.voice_name, None, config.engine_options()
            )
        except REFUSALS as exc:
            raise error_for(exc, voice_field="model") from None
    except ProtocolError as err:
        refusal = _refusal(err, uuid.uuid4().hex)
        with contextlib.suppress(RuntimeError, WebSocketDisconnect, OSError):
            if "websocket.http.response" in ws.scope.get("extensions", {}):
                await ws.send_denial_response(refusal)
            else:  # a server without denial responses: accept, say why, close
                await ws.accept()
                await ws.send_text(bytes(refusal.body).decode())
                await ws.close(1008)
        return
    await ws.accept()
    await run_socket(ws, DeepgramSocket(params, ws.state.settings.max_message_bytes), DIALECT)


async def speak_rest(request: Request) -> Response:
    """``POST /v1/speak``: the audio as it is made (mp3 unless the query asks for another encoding)."""
    request_id = uuid.uuid4().hex
    try:
        params = parse_params(request.query_params, await voice_book(request.state), socket=False)
        text = decode_body(await read_body(request, MAX_BODY_BYTES))
        if not text.strip():
            raise ProtocolError(ErrorCode.EMPTY_INPUT, "text has nothing to speak", field="text")
        config = params.config()
        fmt = OutputFormat(params.fmt, params.sample_rate, frame_ms=100, bitrate=params.bit_rate)
        host = await speak(request.state, config, fmt, text, DIALECT)
    except BodyTooLarge as exc:
        return _refusal(ProtocolError(ErrorCode.REQUEST_TOO_LARGE, str(exc)), request_id)
    except ProtocolError as err:
        return _refusal(err, request_id)
    headers = {
        "dg-request-id": request_id,
        "dg-model-name": params.model or config.voice or "",
        "dg-char-count": str(len(text)),
        "x-sample-rate": str(params.sample_rate),
    }
    body = RawAudio(params.media_type, to_alaw=params.to_alaw, head=params.head())
    return await respond(host, body, lambda err: _refusal(err, request_id), headers)


routes = [
    WebSocketRoute("/v1/speak", speak_socket),
    Route("/v1/speak", speak_rest, methods=["POST"]),
]
