"""OpenAI-compatible ``POST /v1/audio/speech``: the whole input in, audio streamed out as it is made.

The route is a transport: the same text side, core and engine pump as the WebSocket
(``protocol.session``, ``protocol.core``, ``gateway.pump``) make the audio; the input is one utterance
(sentence cuts; its text is all there at once, so no early cut). The pump synthesizes its segments in
order with look-ahead, the audio cap and backpressure, and this module writes what the outbox gives:
the encoded audio as the body, or as SSE deltas. The first audio is awaited before the response starts,
so an engine that fails at once, whatever it raises, gets a proper error status instead of an empty 200.

Every format streams: ``pcm`` and ``wav`` as they come, ``mp3``, ``opus`` (Ogg), ``aac`` (ADTS) and
``flac`` through one streaming encoder for the whole response (``protocol.encoders``), each engine chunk
encoded and sent as it arrives.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..protocol.core import Core
from ..protocol.encoders import MEDIA_TYPES as COMPRESSED_MEDIA_TYPES
from ..protocol.errors import ErrorCode, ProtocolError, field_path
from ..protocol.messages import Error, InputDone, InputText, SessionConfig, SessionDone
from ..protocol.output import Audio, Message, Output, OutputFormat
from ..protocol.speech import SpeechRequest, decode_speech_request, speakable
from .catalog import Catalog, Resolved
from .failures import REFUSALS, error_for
from .http import BodyTooLarge, error_response, read_body
from .jobs import AudioCap, Utterance
from .metrics import REST_DIALECT, Metrics, SessionMeter
from .outbox import Outbox
from .pump import Pump
from .settings import Settings

logger = logging.getLogger(__name__)

# The input is at most 4096 characters; a body can still carry ref_audio inline (a data URL).
MAX_BODY_BYTES = 16 * 1024 * 1024
# Output tokens reported per second of audio: Qwen3-TTS's codec rate (12.5 frames a second).
OUTPUT_TOKENS_PER_S = 12.5
MEDIA_TYPES = {"pcm": "audio/pcm", "wav": "audio/wav", **COMPRESSED_MEDIA_TYPES}
# A segment's error that does not end the response: its audio was cut to the cap, the rest goes on.
_NOT_FATAL = frozenset({ErrorCode.AUDIO_TRUNCATED.value})


class _Stream:
    """One request's core and pump, and the outputs they give in order (``next``)."""

    def __init__(self, core: Core, pump: Pump, meter: SessionMeter) -> None:
        self.core, self.pump, self.meter = core, pump, meter
        self.task = asyncio.create_task(pump.run())

    async def next(self) -> Output | ProtocolError:
        """The next output, stamped by ``Core.sending``, or the failure of the pump itself."""
        while True:
            if not len(self.pump.outbox) and not self.task.done():
                getter = asyncio.ensure_future(self.pump.outbox.get())
                await asyncio.wait([getter, self.task], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                output = getter.result()
            elif len(self.pump.outbox):
                output = await self.pump.outbox.get()
            else:
                return self._failure()
            sent = self.core.sending(output, time.perf_counter())
            self.meter.sent(sent)
            if sent is not None:
                return sent

    def _failure(self) -> ProtocolError:
        exc = None if self.task.cancelled() else self.task.exception()
        if exc is None:  # pragma: no cover - the pump only ends by failing or being cancelled
            return ProtocolError(ErrorCode.INTERNAL_ERROR, "synthesis ended early")
        error = (
            error_for(exc)
            if isinstance(exc, Exception)
            else ProtocolError(ErrorCode.INTERNAL_ERROR, str(exc))
        )
        if error.code is ErrorCode.INTERNAL_ERROR:
            logger.error("the engine pump failed", exc_info=exc)
        return error

    async def aclose(self) -> None:
        self.task.cancel()  # a client that goes away stops the engine work too
        # asyncio.wait, not ``await task``: the surrounding scope is being cancelled, and anyio's
        # repeated cancels would otherwise interrupt the pump's own cleanup (closing the upstream).
        await asyncio.wait([self.task])
        await self.pump.aclose()


#: What the body gets: audio bytes, the failure that ends it early, or the utterance's end.
_Piece = bytes | ProtocolError | SessionDone


async def _pieces(stream: _Stream) -> AsyncIterator[_Piece]:
    """The body's pieces in order, ending at the utterance's ``session.done`` or its first failure."""
    while True:
        match await stream.next():
            case Audio(data=data):
                yield data
            case Message(msg=Error(code=code, message=message)) if code in _NOT_FATAL:
                logger.warning("%s", message)
            case Message(msg=Error(code=code, message=message, field=field)):
                failure = stream.pump.failure  # the segment's own error, with its HTTP status
                yield failure if failure is not None else ProtocolError(ErrorCode(code), message, field=field)
                return
            case ProtocolError() as failure:
                yield failure
                return
            case Message(msg=SessionDone() as done):
                yield done
                return


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
    stream = _start(request.state.settings, req, resolved, fmt, meter)
    await stream.pump.route(stream.core.data_to_send())
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


def _start(
    settings: Settings, req: SpeechRequest, resolved: Resolved, fmt: OutputFormat, meter: SessionMeter
) -> _Stream:
    """The request's core, its text fed in as one utterance, and the pump that speaks it."""
    core = Core(fmt)
    now = time.perf_counter()
    # Cut as the WebSocket cuts by default. All of the text is there at once, so no time passes and
    # the eager first segment is never cut early: no ticks.
    config = SessionConfig(
        split_granularity="sentence", eager_first_segment=True, speed=req.speed, seed=req.seed
    )
    core.receive_message(config, now)
    core.accept_config(config, fmt)
    core.data_to_send()  # the config's Configure: accepted above
    core.receive_message(InputText(text=req.input), now)
    core.receive_message(InputDone(), now)
    cap = AudioCap(settings.max_segment_audio_base_s, settings.max_segment_audio_per_char_s)
    engine, voice, reference, options = resolved.engine, resolved.voice, resolved.reference, resolved.options

    def utterance(index: int) -> Utterance:
        return Utterance(index, config, engine, voice, reference, options, cap)

    outbox = Outbox(settings.max_buffered_audio_s)
    pump = Pump(core, outbox, meter, utterance, logger)
    return _Stream(core, pump, meter)


async def _audio(stream: _Stream, head: _Piece, pieces: AsyncIterator[_Piece]) -> AsyncIterator[bytes]:
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
    stream: _Stream, head: _Piece, pieces: AsyncIterator[_Piece], characters: int
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
