"""Cartesia-compatible text to speech: ``WS /tts/websocket``, ``POST /tts/bytes`` and ``POST /tts/sse``.

The socket is one voxgate session (``gateway.transport.socket``) speaking through Cartesia's codec
(``protocol.codecs.cartesia.CartesiaSocket``): each Cartesia context is one of the session's contexts, so
every
rule of the session core (segmentation, contexts, cancel, backpressure, timeouts, caps, drain, metrics) holds
here unchanged. Each REST request is one utterance of a session on the one host (``gateway.session.host``),
answered by ``gateway.transport.body`` in the route's body codec: the audio as it comes (``/tts/bytes``: raw,
a
streamed WAV, or mp3), or Cartesia's SSE events (``/tts/sse``). docs/protocol.md §14 has the mapping.

Keys: ``X-API-Key`` (pipecat, livekit), ``Authorization: Bearer`` (the SDK) or ``?api_key=``; any
``Cartesia-Version`` header or ``cartesia_version`` query parameter is taken, as is any ``model_id``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from ...protocol.codecs.bodies import Body
from ...protocol.codecs.cartesia import (
    CartesiaSocket,
    decode_request,
    error_payload,
    session_config,
    settings_of,
)
from ...protocol.codecs.cartesia_rest import MEDIA_TYPES, CartesiaSse
from ...protocol.codecs.vendor import RawAudio, wav_head
from ...protocol.errors import ErrorCode, ProtocolError
from ...protocol.output import OutputFormat
from ..middleware.http import BodyTooLarge, read_body
from ..transport.body import respond
from .vendors import run_socket, speak, voice_book

#: The ``dialect`` label of this surface in the metrics.
DIALECT = "cartesia"
#: A body holds a transcript and a few options.
MAX_BODY_BYTES = 1024 * 1024


def _refused(err: ProtocolError) -> Response:
    return Response(error_payload(err.code, err.message, None), err.status, media_type="application/json")


async def websocket(ws: WebSocket) -> None:
    """``WS /tts/websocket``: contexts named by ``context_id``."""
    await ws.accept()
    codec = CartesiaSocket(await voice_book(ws.state), ws.state.settings.max_message_bytes)
    await run_socket(ws, codec, DIALECT)


async def _answer(request: Request, *, sse: bool) -> Response:
    state = request.state
    try:
        req = decode_request(await read_body(request, MAX_BODY_BYTES), " body")
        if not (req.transcript or "").strip():
            raise ProtocolError(
                ErrorCode.EMPTY_INPUT, "transcript has nothing to speak", field="$.transcript"
            )
        book = await voice_book(state)
        s = settings_of(req, book, rest=not sse)
        words = sse and req.add_timestamps and book.times_words(s.voice)
        config = session_config(s, words=words)
        fmt = OutputFormat(s.fmt, s.sample_rate, frame_ms=100, bitrate=config.bitrate, word_timestamps=words)
        host = await speak(state, config, fmt, req.transcript or "", DIALECT)
    except BodyTooLarge as exc:
        return _refused(ProtocolError(ErrorCode.REQUEST_TOO_LARGE, str(exc)))
    except ProtocolError as err:
        return _refused(err)
    body: Body
    if sse:
        body = CartesiaSse(req.context_id, to_alaw=s.to_alaw, words=words)
    else:
        encoding = (req.output_format.encoding if req.output_format else None) or "pcm_s16le"
        wav = s.container == "wav"
        media_type = MEDIA_TYPES["wav" if wav else "mp3" if s.fmt == "mp3" else encoding]
        head = wav_head("alaw" if s.to_alaw else s.fmt, s.sample_rate) if wav else b""
        body = RawAudio(media_type, to_alaw=s.to_alaw, head=head)
    headers = {"x-sample-rate": str(s.sample_rate)}
    return await respond(host, body, _refused, headers)


async def tts_bytes(request: Request) -> Response:
    """``POST /tts/bytes``: the audio as it is made."""
    return await _answer(request, sse=False)


async def tts_sse(request: Request) -> Response:
    """``POST /tts/sse``: Cartesia's events as the audio is made."""
    return await _answer(request, sse=True)


routes = [
    WebSocketRoute("/tts/websocket", websocket),
    Route("/tts/bytes", tts_bytes, methods=["POST"]),
    Route("/tts/sse", tts_sse, methods=["POST"]),
]
