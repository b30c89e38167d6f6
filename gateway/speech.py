"""OpenAI-compatible ``POST /v1/audio/speech``: the whole input in, audio streamed out as it is made.

The route is a transport over the REST producer (``gateway.rest``: the same text side, core and engine
pump as the WebSocket); the input is one utterance (sentence cuts; its text is all there at once, so no
early cut). This module renders what the producer gives: the encoded audio as the body, or as SSE deltas.
The first audio is awaited before the response starts, so an engine that fails at once, whatever it
raises, gets a proper error status instead of an empty 200.

Every format streams: ``pcm`` and ``wav`` as they come, ``mp3``, ``opus`` (Ogg), ``aac`` (ADTS) and
``flac`` through one streaming encoder for the whole response (``protocol.encoders``), each engine chunk
encoded and sent as it arrives.

``word_timestamps`` (vllm-omni 0.30's REST field) is the one case that is not streamed: its timings go out
in the ``X-Word-Timestamps`` response header (a JSON list of ``{word, start_ms, end_ms}``, replaced by
``X-Word-Timestamps-Omitted`` past 4 KB, as vllm-omni does), so the answer is held whole (``whole``) and
a streamed request for them is refused. ``whole`` is also how each item of a batch (``gateway.batch``) is
spoken: ``prepare`` and ``speak`` are this route's steps, shared with it.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator
from typing import NamedTuple

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..protocol.audio import wav_header
from ..protocol.encoders import MEDIA_TYPES as COMPRESSED_MEDIA_TYPES
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.messages import SessionConfig, SessionDone, WordTimestamps
from ..protocol.output import Audio, Message, OutputFormat
from ..protocol.speech import (
    SpeechRequest,
    check_limits,
    check_word_timestamps,
    decode_speech_request,
    speakable,
)
from .catalog import Catalog, Resolved
from .failures import REFUSALS, error_for
from .http import error_response, read_json
from .metrics import REST_DIALECT, Metrics
from .rest import Producer, pieces, start

logger = logging.getLogger(__name__)

# The input is at most 4096 characters; a body can still carry ref_audio inline (a data URL).
MAX_BODY_BYTES = 16 * 1024 * 1024
# Output tokens reported per second of audio: Qwen3-TTS's codec rate (12.5 frames a second).
OUTPUT_TOKENS_PER_S = 12.5
MEDIA_TYPES = {"pcm": "audio/pcm", "wav": "audio/wav", **COMPRESSED_MEDIA_TYPES}
#: vllm-omni's budget for the ``X-Word-Timestamps`` header: larger headers become opaque 502s at common
#: reverse-proxy defaults, so past it the header is replaced by ``X-Word-Timestamps-Omitted``.
MAX_WORDS_HEADER_CHARS = 4096
_WAV_HEADER_BYTES = 44


#: What the body gets: audio bytes, the failure that ends it early, or the utterance's end.
_Piece = bytes | ProtocolError | SessionDone


class Prepared(NamedTuple):
    """A checked request: the engine and voice that speak it, its output format and its core's config."""

    resolved: Resolved
    fmt: OutputFormat
    config: SessionConfig


class Whole(NamedTuple):
    """An answer held whole: its encoded audio, its word timings (``word_timestamps``) and its end."""

    audio: bytes
    words: list[dict[str, object]]
    done: SessionDone


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


async def _decoded(request: Request) -> SpeechRequest:
    """The request's body as a ``SpeechRequest``; raises ``ProtocolError`` for one that is not."""
    return await read_json(request, MAX_BODY_BYTES, decode_speech_request)


async def prepare(request: Request, req: SpeechRequest) -> Prepared:
    """Check ``req`` against the server's limits and its engine, before any engine work.

    Raises:
        ProtocolError: the request is refused (its status, code and field say why).
    """
    check_limits(req, request.state.settings.max_instructions_chars)
    check_word_timestamps(req)
    if not speakable(req.input):
        raise ProtocolError(ErrorCode.EMPTY_INPUT, "input has no text to speak")
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
        raise error_for(exc, voice_field=req.voice_field, ref_audio=req.ref_audio is not None) from exc
    for name in resolved.ignored:
        logger.warning("engine %r cannot follow %r; it is ignored", resolved.engine.name, name)
    # Cut as the WebSocket cuts by default.
    config = SessionConfig(
        split_granularity="sentence",
        eager_first_segment=True,
        speed=req.speed,
        seed=req.seed,
        word_timestamps=req.word_timestamps,
    )
    return Prepared(resolved, fmt, config)


async def speak(request: Request, text: str, prepared: Prepared) -> Producer:
    """Start the core and engine pump that speak ``text`` (``rest.start``), metered as a REST session."""
    meter = request.state.metrics.session(REST_DIALECT)
    meter.configured(prepared.resolved.engine.name)
    return await start(request.state.settings, prepared.config, prepared.fmt, text, prepared.resolved, meter)


async def whole(stream: Producer, fmt: OutputFormat) -> Whole:
    """All of ``stream``'s answer, held: its audio (a ``wav`` with its real sizes), its word timings.

    Raises:
        ProtocolError: the engine failed; nothing of the answer is kept.
    """
    audio: list[bytes] = []
    words: list[dict[str, object]] = []
    stream.meter.open()
    try:
        async for piece in pieces(stream):
            match piece:
                case Audio(data=data):
                    stream.meter.wrote(data)
                    audio.append(data)
                case Message(msg=WordTimestamps(timestamps=timed)):
                    # vllm-omni's shape (forced_aligner.py ``extract_word_timestamps``): whole milliseconds.
                    words += [
                        {"word": w.word, "start_ms": round(w.start_ms), "end_ms": round(w.end_ms)}
                        for w in timed
                    ]
                case Message(msg=SessionDone() as done):
                    return Whole(_sized(b"".join(audio), fmt), words, done)
                case ProtocolError():
                    stream.meter.error(piece.code)
                    raise piece
        raise ProtocolError(ErrorCode.INTERNAL_ERROR, "synthesis ended early")  # pragma: no cover
    finally:
        stream.meter.close()
        await stream.aclose()


def _sized(data: bytes, fmt: OutputFormat) -> bytes:
    """A held ``wav`` with the sizes its streamed header could not know; other formats as they are."""
    if fmt.fmt != "wav" or len(data) < _WAV_HEADER_BYTES:
        return data
    return wav_header(fmt.sample_rate, len(data) - _WAV_HEADER_BYTES) + data[_WAV_HEADER_BYTES:]


def words_headers(words: list[dict[str, object]]) -> dict[str, str]:
    """vllm-omni's ``X-Word-Timestamps`` header (ASCII JSON), or its ``-Omitted`` marker past 4 KB."""
    text = json.dumps(words)
    if len(text) <= MAX_WORDS_HEADER_CHARS:
        return {"x-word-timestamps": text}
    return {"x-word-timestamps-omitted": f"oversize; bytes={len(text)}; limit={MAX_WORDS_HEADER_CHARS}"}


async def create_speech(request: Request) -> Response:
    """OpenAI-compatible text to speech."""
    try:
        req = await _decoded(request)
        prepared = await prepare(request, req)
    except ProtocolError as err:
        return _refused(request, err)
    resolved, fmt = prepared.resolved, prepared.fmt
    stream = await speak(request, req.input, prepared)
    headers = {"x-sample-rate": str(fmt.sample_rate), "x-voxgate-engine": resolved.engine.name}
    if req.word_timestamps:
        try:
            held = await whole(stream, fmt)
        except ProtocolError as err:
            logger.warning("engine %s failed: %s", resolved.engine.name, err.message)
            return _refused(request, err)
        headers.update(words_headers(held.words))
        return Response(held.audio, media_type=MEDIA_TYPES[req.response_format], headers=headers)
    pieces = _pieces(stream)
    head = await anext(pieces)
    if isinstance(head, ProtocolError):
        await stream.aclose()
        logger.warning("engine %s failed before the first audio: %s", resolved.engine.name, head.message)
        return _refused(request, head)
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
