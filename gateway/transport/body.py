"""The HTTP body transport: one REST answer written from a session host (``gateway.session.host``) by a body
codec.

``respond(host, body)`` is every speaking REST route's answer (OpenAI's, ElevenLabs', each batch item's
through ``held``): the route builds the host, feeds it the request's text (``SessionHost.speak``) and picks
the body's shape (``protocol.codecs.bodies``); this module does the rest, the same for all:

- the first piece is awaited before the status goes out, so an engine that fails at once gets a proper
  error status (the failure's own: an upstream's 4xx, ``Retry-After``) instead of an empty 200;
- a held body (word timings, true file sizes) is read whole, then answered as one response;
- otherwise each piece goes out as the codec renders it, and every write is bounded by the session's
  ``send_timeout_s`` as a socket's is: a client that stops reading is cut off, its engine work stopped and
  its session place freed, instead of holding them for as long as it keeps the connection open;
- the meter counts the answer as a session: open, bytes written, errors, close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping

from starlette.responses import Response, StreamingResponse
from starlette.types import Send

from ...protocol.codecs.bodies import Body
from ...protocol.errors import ErrorCode, ProtocolError
from ...protocol.messages import SessionDone
from ...protocol.output import Audio, Message
from ..metrics import SessionMeter
from ..session.host import Piece, SessionHost

logger = logging.getLogger(__name__)

#: Renders a refused answer (before any of it went out) in the route's error shape.
Refuse = Callable[[ProtocolError], Response]


async def respond(
    host: SessionHost, body: Body, refuse: Refuse, headers: Mapping[str, str] | None = None
) -> Response:
    """The answer to a request whose text ``host`` speaks, in ``body``'s shape (errors in ``refuse``'s)."""
    pieces = host.pieces()
    before: list[Piece] = []  # the messages before the first audio (audio.start, word timings)
    first = await anext(pieces)
    while isinstance(first, Message) and not isinstance(first.msg, SessionDone):
        before.append(first)
        first = await anext(pieces)
    if isinstance(first, ProtocolError):
        await host.aclose()
        logger.warning("engine failed before the first audio: %s", first.message)
        return refuse(first)
    pieces = _chain([*before, first], pieces)
    if body.held:
        try:
            data = await held(host, body, await anext(pieces), pieces)
        except ProtocolError as err:
            return refuse(err)
        return Response(data, media_type=body.media_type, headers={**(headers or {}), **body.headers()})
    content = _written(host, body, await anext(pieces), pieces)
    timeout_s = host.settings.send_timeout_s
    return BodyResponse(content, body.media_type, headers, send_timeout_s=timeout_s, meter=host.meter)


async def _chain(first: list[Piece], rest: AsyncIterator[Piece]) -> AsyncIterator[Piece]:
    for piece in first:
        yield piece
    async for piece in rest:
        yield piece


async def held(host: SessionHost, body: Body, first: Piece, pieces: AsyncIterator[Piece]) -> bytes:
    """All of the answer, rendered by a held ``body``.

    Raises:
        ProtocolError: the engine failed; nothing of the answer is kept.
    """
    return body.end(await drained(host, body, first, pieces))


async def drained(host: SessionHost, body: Body, first: Piece, pieces: AsyncIterator[Piece]) -> SessionDone:
    """Feed all of the answer to a held ``body``, up to its ``session.done`` (returned; ``end`` not called).

    Raises:
        ProtocolError: the engine failed; nothing of the answer is kept.
    """
    host.meter.open()
    try:
        piece: Piece = first
        while True:
            match piece:
                case Audio(data=data, audio_s=audio_s):
                    host.meter.wrote(data)
                    body.audio(data, audio_s)
                case Message(msg=SessionDone() as done):
                    return done
                case Message(msg=msg):
                    body.message(msg)
                case ProtocolError():
                    host.meter.error(piece.code)
                    raise piece
            piece = await anext(pieces)
    finally:
        host.meter.close()
        await host.aclose()


async def _written(
    host: SessionHost, body: Body, first: Piece, pieces: AsyncIterator[Piece]
) -> AsyncIterator[bytes]:
    """The body's bytes as each piece comes, rendered by ``body``; the host is closed when it ends."""
    host.meter.open()
    try:
        if head := body.head():
            yield head
        piece: Piece = first
        while True:
            match piece:
                case Audio(data=data, audio_s=audio_s):
                    out = body.audio(data, audio_s)
                case Message(msg=SessionDone() as done):
                    if out := body.end(done):
                        host.meter.wrote(out)
                        yield out
                    return
                case Message(msg=msg):
                    out = body.message(msg)
                case ProtocolError():
                    # The status is already sent: the body says so if its shape can (SSE's error event),
                    # else it is cut off without its end, so that it cannot be taken for complete.
                    host.meter.error(piece.code)
                    logger.warning("engine failed mid-stream; response cut off: %s", piece.message)
                    if out := body.error(piece):
                        yield out
                        return
                    raise BodyCut(piece.message)
            if out:
                host.meter.wrote(out)
                yield out
            piece = await anext(pieces)
    finally:
        host.meter.close()
        await host.aclose()  # a client that goes away stops the engine work too


class BodyCut(Exception):
    """The answer failed once its status was sent, in a shape with no place to say so: it is cut off."""


class BodyResponse(StreamingResponse):
    """A streamed answer whose every write is bounded by the session's send timeout.

    A client that reads nothing for ``send_timeout_s`` is cut off (the connection is closed without the
    body's end, so it cannot be taken for complete), as a WebSocket client is (``slow_consumer``).
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        media_type: str,
        headers: Mapping[str, str] | None = None,
        *,
        send_timeout_s: float,
        meter: SessionMeter | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._content = content
        self.send_timeout_s = send_timeout_s
        self.meter = meter

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self._content:  # BodyCut ends it (caught below)
                try:
                    async with asyncio.timeout(self.send_timeout_s):
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except TimeoutError:
                    if self.meter is not None:
                        self.meter.error(ErrorCode.SLOW_CONSUMER)
                    logger.info(
                        "the client read nothing for %g s: the answer is cut off", self.send_timeout_s
                    )
                    return  # the server closes the connection: the body never ends
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except BodyCut:
            return  # the server closes the connection: the body never ends
        finally:
            await self._close()

    async def _close(self) -> None:
        close = getattr(self._content, "aclose", None)
        if close is not None:
            await close()
