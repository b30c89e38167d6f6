"""OpenAI-compatible ``POST /v1/audio/speech``: the whole input in, audio streamed out as it is made.

The route drives the same text side and core as the WebSocket (``protocol.session``, ``protocol.core``):
the input is one utterance (sentence cuts; its text is all there at once, so no early cut), a producer
task synthesizes its segments in order ahead of the response body, feeding the core, so the next
segment is being made while the current one is sent, and ``_Body`` is the codec that renders the
core's outputs as the body. The first audio is awaited before the response starts, so an engine that
fails at once, whatever it raises, gets a proper error status instead of an empty 200 (or no answer at
all).

``pcm`` and ``wav`` stream chunk by chunk. ``mp3``, ``opus`` and ``flac`` are encoded once the
whole signal is there (their encoders write headers that describe the whole stream: a Xing frame,
Ogg granule positions, FLAC STREAMINFO), so they arrive in one piece at the end: use ``pcm`` or
``wav`` when time to first audio matters.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
import time
from collections.abc import AsyncIterator

import msgspec
import numpy as np
import soundfile
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..engine.base import SynthesisRequest
from ..protocol.audio import AudioFormat, Samples, decode
from ..protocol.core import Core
from ..protocol.errors import ErrorCode, ProtocolError, field_path
from ..protocol.messages import InputDone, InputText, SessionConfig, SessionDone
from ..protocol.output import Audio, Message, Output, OutputFormat, Report, Speak
from ..protocol.speech import PRODUCIBLE_FORMATS, SpeechRequest, decode_speech_request
from .catalog import Catalog, Resolved
from .failures import REFUSALS, error_for
from .http import BodyTooLarge, error_response, read_body
from .jobs import Playback
from .metrics import REST_DIALECT, Metrics, SessionMeter

logger = logging.getLogger(__name__)

# The input is at most 4096 characters; a body can still carry ref_audio inline (a data URL).
MAX_BODY_BYTES = 16 * 1024 * 1024
# Output tokens reported per second of audio: Qwen3-TTS's codec rate (12.5 frames a second).
OUTPUT_TOKENS_PER_S = 12.5
# Core outputs (100 ms frames, messages) the producer may run ahead of a slow reader before it waits.
AHEAD_OUTPUTS = 32
MEDIA_TYPES = {
    "pcm": "audio/pcm",
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "flac": "audio/flac",
}
# Rates each compressed container accepts (libsndfile's Opus and MPEG encoders).
_CODEC_RATES = {
    "opus": {8000, 12000, 16000, 24000, 48000},
    "mp3": {8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000},
}
_SOUNDFILE = {"mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS"), "flac": ("FLAC", "PCM_16")}


#: What the producer hands the body: core outputs, a synthesis failure, then None at the very end.
_Item = Output | ProtocolError | None
_STREAMED_FORMATS: dict[str, AudioFormat] = {"pcm": "pcm", "wav": "wav"}


class _Body:
    """The REST codec: renders the core's outputs as the body of one format.

    ``pcm`` and ``wav`` stream as they come; the compressed formats collect the core's float32 audio
    and are encoded whole at the end.
    """

    def __init__(self, core: Core, fmt: str, rate: int, meter: SessionMeter) -> None:
        self.core, self.fmt, self.rate, self.meter = core, fmt, rate, meter
        self._f32: list[bytes] = []
        self.audio_ms = 0.0

    def render(self, output: Output) -> bytes:
        sent = self.core.sending(output, time.perf_counter())  # stamps send times, fills in reports
        self.meter.sent(sent)
        match sent:
            case Audio(data=data) if self.fmt in _STREAMED_FORMATS:
                return data
            case Audio(data=data):
                self._f32.append(data)
            case Message(msg=SessionDone(audio_ms=audio_ms)):
                self.audio_ms = audio_ms
        return b""

    def finish(self) -> bytes:
        if self.fmt in _STREAMED_FORMATS:
            return b""
        return _encode(decode(b"".join(self._f32), "f32"), self.rate, self.fmt)


def _encode(audio: Samples, rate: int, fmt: str) -> bytes:
    container, subtype = _SOUNDFILE[fmt]
    out = io.BytesIO()
    soundfile.write(out, np.clip(audio, -1.0, 1.0), rate, format=container, subtype=subtype)
    return out.getvalue()


async def _produce(
    resolved: Resolved,
    req: SpeechRequest,
    core: Core,
    speaks: list[Speak],
    queue: asyncio.Queue[_Item],
    meter: SessionMeter,
) -> None:
    """Synthesize the segments in order, feeding the core; its outputs go to ``queue``, None at the end.

    The first failure ends the response: the error goes to ``queue`` after the core's outputs.
    """

    async def flush() -> None:
        for output in core.data_to_send():
            await queue.put(output)

    playback = Playback()  # the request's deadlines, as on the WebSocket (``gateway.jobs``)
    for job in speaks:
        request = SynthesisRequest(
            text=job.text,
            voice=resolved.voice,
            speed=req.speed,
            seed=req.seed,
            options=resolved.options,
            reference=resolved.reference,
            deadline=playback.deadline(time.monotonic()),
        )
        core.segment_started(job.utterance, job.sentence)
        await flush()
        error: ProtocolError | None = None
        synthesis_s = 0.0
        try:
            async with contextlib.aclosing(meter.timed(resolved.engine.synthesize(request))) as chunks:
                t = time.perf_counter()
                async for chunk in chunks:
                    synthesis_s += time.perf_counter() - t
                    playback.add(len(chunk.samples) / chunk.sample_rate, time.monotonic())
                    core.audio(job.utterance, job.sentence, chunk.samples, chunk.sample_rate)
                    await flush()
                    t = time.perf_counter()
        except Exception as exc:  # the task's boundary: any failure must reach the response, or it hangs
            error = error_for(exc)
            if error.code is ErrorCode.INTERNAL_ERROR:
                logger.exception("engine %s raised an unexpected error", resolved.engine.name)
        core.segment_done(job.utterance, job.sentence, synthesis_s=synthesis_s, error=error)
        await flush()
        if error is not None:
            await queue.put(error)
            break
    await queue.put(None)


async def _head(queue: asyncio.Queue[_Item]) -> list[_Item]:
    """The outputs up to the first audio, failure or end: what decides the response's status."""
    head: list[_Item] = []
    while not head or isinstance(head[-1], Message | Report):
        head.append(await queue.get())
    return head


async def _stream(
    body: _Body,
    head: list[_Item],
    queue: asyncio.Queue[_Item],
    producer: asyncio.Task[None],
) -> AsyncIterator[bytes | ProtocolError]:
    """Body pieces in order; a failure after the first byte is yielded for the caller to report."""
    try:
        body.meter.open()
        pending = list(head)
        while True:
            item = pending.pop(0) if pending else await queue.get()
            if item is None:
                break
            if isinstance(item, ProtocolError):
                body.meter.error(item.code)
                yield item
                return
            if data := body.render(item):
                yield data
        if tail := body.finish():
            yield tail
    finally:
        body.meter.close()
        producer.cancel()  # a client that goes away stops the engine work too
        # asyncio.wait, not ``await producer``: the surrounding scope is being cancelled, and anyio's
        # repeated cancels would otherwise interrupt the producer's own cleanup (closing the upstream).
        await asyncio.wait([producer])


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
    if req.response_format not in PRODUCIBLE_FORMATS:
        message = (
            f"response_format {req.response_format!r} cannot be produced here; use one of "
            f"{sorted(PRODUCIBLE_FORMATS)}"
        )
        return _refused(request, ProtocolError(ErrorCode.UNSUPPORTED_FORMAT, message))
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
    except REFUSALS as exc:
        return _refused(request, error_for(exc, ref_audio=req.ref_audio is not None))
    for name in resolved.ignored:
        logger.warning("engine %r cannot follow %r; it is ignored", resolved.engine.name, name)
    rate = req.output_rate(resolved.engine.sample_rate)
    if rate not in _CODEC_RATES.get(req.response_format, {rate}):
        message = (
            f"{req.response_format} cannot be encoded at {rate} Hz; use one of "
            f"{sorted(_CODEC_RATES[req.response_format])}"
        )
        return _refused(request, ProtocolError(ErrorCode.UNSUPPORTED_RATE, message))

    core_format = OutputFormat(_STREAMED_FORMATS.get(req.response_format, "f32"), rate, frame_ms=100)
    core = Core(core_format)
    now = time.perf_counter()
    # The whole input is one utterance, cut as the WebSocket cuts it by default. All of its text is
    # there at once, so no time passes and the eager first segment is never cut early: no ticks.
    config = SessionConfig(split_granularity="sentence", eager_first_segment=True)
    core.receive_message(config, now)
    core.accept_config(config, core_format)
    core.receive_message(InputText(text=req.input), now)
    core.receive_message(InputDone(), now)
    speaks = [output for output in core.data_to_send() if isinstance(output, Speak)]
    if not speaks:
        return _refused(request, ProtocolError(ErrorCode.EMPTY_INPUT, "input has no text to speak"))
    queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=AHEAD_OUTPUTS)
    meter = request.state.metrics.session(REST_DIALECT)
    meter.configured(resolved.engine.name)
    producer = asyncio.create_task(_produce(resolved, req, core, speaks, queue, meter))
    head = await _head(queue)
    if isinstance(failure := head[-1], ProtocolError):
        producer.cancel()
        logger.warning("engine %s failed before the first audio: %s", resolved.engine.name, failure.message)
        return _refused(request, failure)
    body = _Body(core, req.response_format, rate, meter)
    headers = {"x-sample-rate": str(rate), "x-voxgate-engine": resolved.engine.name}
    if req.stream_format == "sse":
        return StreamingResponse(
            _sse(body, head, queue, producer, len(req.input)),
            media_type="text/event-stream",
            headers=headers,
        )
    return StreamingResponse(
        _audio(body, head, queue, producer), media_type=MEDIA_TYPES[req.response_format], headers=headers
    )


async def _audio(
    body: _Body,
    head: list[_Item],
    queue: asyncio.Queue[_Item],
    producer: asyncio.Task[None],
) -> AsyncIterator[bytes]:
    async for piece in _stream(body, head, queue, producer):
        if isinstance(piece, ProtocolError):
            # The status is already sent: the body ends early, and the log says why.
            logger.warning("engine failed mid-stream; response truncated: %s", piece)
            return
        body.meter.wrote(piece)
        yield piece


def _refused(request: Request, error: ProtocolError) -> Response:
    """The error response, counted in ``voxgate_errors_total``."""
    metrics: Metrics = request.state.metrics
    metrics.errors.labels(error.code, REST_DIALECT).inc()
    return error_response(error)


def _event(payload: dict[str, object]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def _sse(
    body: _Body, head: list[_Item], queue: asyncio.Queue[_Item], producer: asyncio.Task[None], characters: int
) -> AsyncIterator[bytes]:
    async for piece in _stream(body, head, queue, producer):
        if isinstance(piece, ProtocolError):
            error = {"message": piece.message, "code": piece.code}
            yield _event({"type": "speech.audio.error", "error": error})
            return
        event = _event({"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode()})
        body.meter.wrote(event)
        yield event
    # OpenAI's usage fields. No tokenizer runs here: a character counts as an input token and 80 ms of
    # audio (one frame of Qwen3-TTS's 12.5 Hz codec) as an output token.
    output_tokens = round(body.audio_ms / 1000.0 * OUTPUT_TOKENS_PER_S)
    usage = {
        "input_tokens": characters,
        "output_tokens": output_tokens,
        "total_tokens": characters + output_tokens,
    }
    yield _event({"type": "speech.audio.done", "usage": usage})


routes = [Route("/v1/audio/speech", create_speech, methods=["POST"])]
