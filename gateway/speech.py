"""OpenAI-compatible ``POST /v1/audio/speech``: the whole input in, audio streamed out as it is made.

The route is a transport over the REST producer (``gateway.rest``: the same text side, core and engine
pump as the WebSocket); the input is one utterance (sentence cuts; its text is all there at once, so no
early cut). This module renders what the producer gives: the encoded audio as the body, or as SSE deltas.
The first audio is awaited before the response starts, so an engine that fails at once, whatever it
raises, gets a proper error status instead of an empty 200.

Every format streams: ``pcm`` and ``wav`` as they come, ``mp3``, ``opus`` (Ogg), ``aac`` (ADTS) and
``flac`` through one streaming encoder for the whole response (``protocol.encoders``), each engine chunk
encoded and sent as it arrives.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..protocol.encoders import MEDIA_TYPES as COMPRESSED_MEDIA_TYPES
from ..protocol.errors import ErrorCode, ProtocolError, field_path
from ..protocol.messages import SessionConfig, SessionDone
from ..protocol.output import Audio, Message, OutputFormat
from ..protocol.speech import decode_speech_request, speakable
from .catalog import Catalog
from .failures import REFUSALS, error_for
from .http import BodyTooLarge, error_response, read_body
from .metrics import REST_DIALECT, Metrics
from .rest import Producer, pieces, start

logger = logging.getLogger(__name__)

# The input is at most 4096 characters; a body can still carry ref_audio inline (a data URL).
MAX_BODY_BYTES = 16 * 1024 * 1024
# Output tokens reported per second of audio: Qwen3-TTS's codec rate (12.5 frames a second).
OUTPUT_TOKENS_PER_S = 12.5
MEDIA_TYPES = {"pcm": "audio/pcm", "wav": "audio/wav", **COMPRESSED_MEDIA_TYPES}


#: What the body gets: audio bytes, the failure that ends it early, or the utterance's end.
_Piece = bytes | ProtocolError | SessionDone


async def _pieces(stream: Producer) -> AsyncIterator[_Piece]:
    """The body's pieces in order (``rest.pieces``): its audio, ending at ``session.done`` or a failure."""
    async for piece in pieces(stream):
        match piece:
            case Audio(data=data):
                yield data
            case Message(msg=SessionDone() as done):
                yield done
            case ProtocolError():
                yield piece


async def create_speech(request: Request) -> Response:
    """OpenAI-compatible text to speech."""
    try:
        req = decode_speech_request(await read_body(request, MAX_BODY_BYTES))
    except BodyTooLarge as exc:
        return _refused(request, ProtocolError(ErrorCode.REQUEST_TOO_LARGE, str(exc), field="$"))
    except msgspec.ValidationError as exc:
        return _refused(request, ProtocolError(ErrorCode.INVALID_MESSAGE, str(exc), field=field_path(exc)))
    except msgspec.DecodeError as exc:
        return _refused(request, ProtocolError(ErrorCode.INVALID_JSON, f"invalid JSON body: {exc}"))
    if not speakable(req.input):
        return _refused(request, ProtocolError(ErrorCode.EMPTY_INPUT, "input has no text to speak"))
    catalog: Catalog = request.state.catalog
    try:
        resolved = await catalog.prepare(
            request.state.owner,
            req.voice_name,
            req.model,
            req.engine_options(),
            ref_audio=req.ref_audio,
            ref_text=req.ref_text,
        )
        rate = req.output_rate(resolved.engine.sample_rate)
        fmt = OutputFormat(req.response_format, rate, frame_ms=100).check()
    except REFUSALS as exc:
        return _refused(request, error_for(exc, ref_audio=req.ref_audio is not None))
    except ProtocolError as err:
        return _refused(request, err)
    for name in resolved.ignored:
        logger.warning("engine %r cannot follow %r; it is ignored", resolved.engine.name, name)

    meter = request.state.metrics.session(REST_DIALECT)
    meter.configured(resolved.engine.name)
    # Cut as the WebSocket cuts by default.
    config = SessionConfig(
        split_granularity="sentence", eager_first_segment=True, speed=req.speed, seed=req.seed
    )
    stream = await start(request.state.settings, config, fmt, req.input, resolved, meter)
    pieces = _pieces(stream)
    head = await anext(pieces)
    if isinstance(head, ProtocolError):
        await stream.aclose()
        logger.warning("engine %s failed before the first audio: %s", resolved.engine.name, head.message)
        return _refused(request, head)
    headers = {"x-sample-rate": str(rate), "x-voxgate-engine": resolved.engine.name}
    if req.stream_format == "sse":
        body = _sse(stream, head, pieces, len(req.input))
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)
    return StreamingResponse(
        _audio(stream, head, pieces), media_type=MEDIA_TYPES[req.response_format], headers=headers
    )


async def _audio(stream: Producer, head: _Piece, pieces: AsyncIterator[_Piece]) -> AsyncIterator[bytes]:
    stream.meter.open()
    try:
        piece = head
        while True:
            if isinstance(piece, ProtocolError):
                # The status is already sent: the body ends early, and the log says why.
                stream.meter.error(piece.code)
                logger.warning("engine failed mid-stream; response truncated: %s", piece.message)
                return
            if isinstance(piece, SessionDone):
                return
            stream.meter.wrote(piece)
            yield piece
            piece = await anext(pieces)
    finally:
        stream.meter.close()
        await stream.aclose()


def _refused(request: Request, error: ProtocolError) -> Response:
    """The error response, counted in ``voxgate_errors_total``."""
    metrics: Metrics = request.state.metrics
    metrics.errors.labels(error.code, REST_DIALECT).inc()
    return error_response(error)


def _event(payload: dict[str, object]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def _sse(
    stream: Producer, head: _Piece, pieces: AsyncIterator[_Piece], characters: int
) -> AsyncIterator[bytes]:
    stream.meter.open()
    try:
        piece = head
        while not isinstance(piece, SessionDone):
            if isinstance(piece, ProtocolError):
                stream.meter.error(piece.code)
                yield _event(
                    {"type": "speech.audio.error", "error": {"message": piece.message, "code": piece.code}}
                )
                return
            event = _event({"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode()})
            stream.meter.wrote(event)
            yield event
            piece = await anext(pieces)
        # OpenAI's usage fields. No tokenizer runs here: a character counts as an input token and 80 ms
        # of audio (one frame of Qwen3-TTS's 12.5 Hz codec) as an output token.
        output_tokens = round(piece.audio_ms / 1000.0 * OUTPUT_TOKENS_PER_S)
        usage = {
            "input_tokens": characters,
            "output_tokens": output_tokens,
            "total_tokens": characters + output_tokens,
        }
        yield _event({"type": "speech.audio.done", "usage": usage})
    finally:
        stream.meter.close()
        await stream.aclose()


routes = [Route("/v1/audio/speech", create_speech, methods=["POST"])]
