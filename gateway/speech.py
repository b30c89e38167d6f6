"""OpenAI-compatible ``POST /v1/audio/speech``: the whole input in, audio streamed out as it is made.

The input goes through the same segmenter as the WebSocket (sentence cuts, eager first segment), and
a producer task synthesizes the segments in order ahead of the response body, so the next segment
is being made while the current one is sent. The first audio is awaited before the response starts,
so an engine that fails at once gets a proper error status instead of an empty 200.

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
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
import numpy as np
import soundfile
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from voxgate.engine.base import (
    AudioChunk,
    EngineError,
    RequestRefused,
    SynthesisRequest,
    UnknownVoice,
    UnsupportedOption,
)
from voxgate.gateway.catalog import Catalog, Resolved, VoiceNotServable
from voxgate.gateway.http import BodyTooLarge, api_error, read_body
from voxgate.gateway.voices import Rejected
from voxgate.protocol.audio import Resampler, Samples
from voxgate.protocol.errors import field_path
from voxgate.protocol.packer import AudioPacker
from voxgate.protocol.segmenter import Segmenter
from voxgate.protocol.speech import PRODUCIBLE_FORMATS, SpeechRequest, decode_speech_request

logger = logging.getLogger(__name__)

# The input is at most 4096 characters; a body can still carry ref_audio inline (a data URL).
MAX_BODY_BYTES = 16 * 1024 * 1024
# Output tokens reported per second of audio: Qwen3-TTS's codec rate (12.5 frames a second).
OUTPUT_TOKENS_PER_S = 12.5
# Chunks the producer may run ahead of a slow reader before it waits (backpressure).
AHEAD_CHUNKS = 32
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


@dataclass(frozen=True, slots=True)
class _Piece:
    """A chunk of segment ``index``; ``chunk`` None marks the segment's end."""

    index: int
    chunk: AudioChunk | None


#: What the producer hands the body: pieces, an engine failure, then None at the very end.
_Item = _Piece | EngineError | None


class _Body:
    """Turns engine chunks into body bytes of one format at one rate."""

    def __init__(self, fmt: str, rate: int) -> None:
        self.fmt, self.rate = fmt, rate
        self.packer = AudioPacker(
            0,
            fmt="wav" if fmt == "wav" else "pcm",
            sample_rate=rate,
            frame_ms=100,
            frame_header=False,
            stream_audio=True,
        )
        self._resampler: Resampler | None = None
        self._segment: list[Samples] = []
        self._all: list[Samples] = []
        self.samples = 0

    def start_segment(self, index: int) -> None:
        self.packer.start_segment(index)
        self._resampler, self._segment = None, []

    def push(self, chunk: AudioChunk) -> bytes:
        if self.fmt in ("pcm", "wav"):
            return b"".join(self.packer.push(chunk.samples, chunk.sample_rate))
        if self._resampler is None:
            self._resampler = Resampler(chunk.sample_rate, self.rate)
        self._segment.append(self._resampler.process(chunk.samples))
        return b""

    def end_segment(self) -> bytes:
        if self.fmt in ("pcm", "wav"):
            data = b"".join(self.packer.end_segment())
            self.samples = self.packer.samples_sent
            return data
        if self._resampler is not None:
            self._segment.append(self._resampler.process(np.zeros(0, np.float32), last=True))
        audio = np.concatenate(self._segment) if self._segment else np.zeros(0, np.float32)
        self.samples += len(audio)
        self._all.append(audio)
        return b""

    def finish(self) -> bytes:
        if self.fmt not in ("pcm", "wav"):
            return _encode(
                np.concatenate(self._all) if self._all else np.zeros(0, np.float32), self.rate, self.fmt
            )
        return b""


def _encode(audio: Samples, rate: int, fmt: str) -> bytes:
    container, subtype = _SOUNDFILE[fmt]
    out = io.BytesIO()
    soundfile.write(out, np.clip(audio, -1.0, 1.0), rate, format=container, subtype=subtype)
    return out.getvalue()


async def _produce(
    resolved: Resolved, req: SpeechRequest, texts: list[str], queue: asyncio.Queue[_Item]
) -> None:
    """Synthesize the segments in order into ``queue``: (index, chunk), (index, None) at a segment's end."""
    try:
        for index, text in enumerate(texts):
            request = SynthesisRequest(
                text=text,
                voice=resolved.voice,
                speed=req.speed,
                seed=req.seed,
                options=resolved.options,
                reference=resolved.reference,
                priority=index,
            )
            async with contextlib.aclosing(resolved.engine.synthesize(request)) as chunks:
                async for chunk in chunks:
                    await queue.put(_Piece(index, chunk))
            await queue.put(_Piece(index, None))
    except EngineError as exc:
        await queue.put(exc)
    await queue.put(None)


async def _stream(
    body: _Body,
    first: _Item,
    queue: asyncio.Queue[_Item],
    producer: asyncio.Task[None],
) -> AsyncIterator[bytes | EngineError]:
    """Body pieces in order; an EngineError after the first byte is yielded for the caller to report."""
    item, started = first, -1
    try:
        while item is not None:
            if isinstance(item, EngineError):
                yield item
                break
            if item.index != started:
                body.start_segment(item.index)
                started = item.index
            data = body.push(item.chunk) if item.chunk is not None else body.end_segment()
            if data:
                yield data
            item = await queue.get()
        if tail := body.finish():
            yield tail
    finally:
        producer.cancel()  # a client that goes away stops the engine work too
        # asyncio.wait, not ``await producer``: the surrounding scope is being cancelled, and anyio's
        # repeated cancels would otherwise interrupt the producer's own cleanup (closing the upstream).
        await asyncio.wait([producer])


async def create_speech(request: Request) -> Response:
    """OpenAI-compatible text to speech."""
    try:
        req = decode_speech_request(await read_body(request, MAX_BODY_BYTES))
    except BodyTooLarge as exc:
        return api_error(413, str(exc), code="body_too_large")
    except msgspec.ValidationError as exc:
        return api_error(400, str(exc), param=(field_path(exc) or "$.")[2:] or None, code="invalid_value")
    except msgspec.DecodeError as exc:
        return api_error(400, f"invalid JSON body: {exc}", code="invalid_json")
    if req.response_format not in PRODUCIBLE_FORMATS:
        return api_error(
            400,
            f"response_format {req.response_format!r} cannot be produced here; use one of "
            f"{sorted(PRODUCIBLE_FORMATS)}",
            param="response_format",
            code="unsupported_format",
        )
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
    except Rejected as exc:
        return api_error(exc.status, exc.message, param=exc.param, code=exc.code)
    except UnknownVoice as exc:
        return api_error(400, str(exc), param="voice", code="voice_not_found")
    except VoiceNotServable as exc:
        param = "ref_audio" if req.ref_audio is not None else "voice"
        return api_error(400, str(exc), param=param, code="voice_requires_cloning")
    except UnsupportedOption as exc:
        return api_error(400, str(exc), param=exc.field, code="unsupported_option")
    for name in resolved.ignored:
        logger.warning("engine %r cannot follow %r; it is ignored", resolved.engine.name, name)
    rate = req.output_rate(resolved.engine.sample_rate)
    if rate not in _CODEC_RATES.get(req.response_format, {rate}):
        return api_error(
            400,
            f"{req.response_format} cannot be encoded at {rate} Hz; use one of "
            f"{sorted(_CODEC_RATES[req.response_format])}",
            param="sample_rate",
            code="unsupported_rate",
        )

    segmenter = Segmenter("sentence", eager_first=True)
    texts = segmenter.push(req.input) + segmenter.flush()
    if not texts:
        return api_error(400, "input has no text to speak", param="input", code="empty_input")
    queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=AHEAD_CHUNKS)
    producer = asyncio.create_task(_produce(resolved, req, texts, queue))
    first = await queue.get()
    if isinstance(first, RequestRefused):
        producer.cancel()
        return api_error(first.status, str(first), param=first.field, code="request_refused")
    if isinstance(first, EngineError):
        producer.cancel()
        logger.warning("engine %s failed before the first audio: %s", resolved.engine.name, first)
        return api_error(502, f"engine {resolved.engine.name!r} failed: {first}", code="engine_error")
    body = _Body(req.response_format, rate)
    headers = {"x-sample-rate": str(rate), "x-voxgate-engine": resolved.engine.name}
    if req.stream_format == "sse":
        return StreamingResponse(
            _sse(body, first, queue, producer, len(req.input)),
            media_type="text/event-stream",
            headers=headers,
        )
    return StreamingResponse(
        _audio(body, first, queue, producer), media_type=MEDIA_TYPES[req.response_format], headers=headers
    )


async def _audio(
    body: _Body,
    first: _Item,
    queue: asyncio.Queue[_Item],
    producer: asyncio.Task[None],
) -> AsyncIterator[bytes]:
    async for piece in _stream(body, first, queue, producer):
        if isinstance(piece, EngineError):
            # The status is already sent: the body ends early, and the log says why.
            logger.warning("engine failed mid-stream; response truncated: %s", piece)
            return
        yield piece


def _event(payload: dict[str, object]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def _sse(
    body: _Body, first: _Item, queue: asyncio.Queue[_Item], producer: asyncio.Task[None], characters: int
) -> AsyncIterator[bytes]:
    async for piece in _stream(body, first, queue, producer):
        if isinstance(piece, EngineError):
            code = "request_refused" if isinstance(piece, RequestRefused) else "engine_error"
            yield _event({"type": "speech.audio.error", "error": {"message": str(piece), "code": code}})
            return
        yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode()})
    # OpenAI's usage fields. No tokenizer runs here: a character counts as an input token and 80 ms of
    # audio (one frame of Qwen3-TTS's 12.5 Hz codec) as an output token.
    output_tokens = round(body.samples / body.rate * OUTPUT_TOKENS_PER_S)
    usage = {
        "input_tokens": characters,
        "output_tokens": output_tokens,
        "total_tokens": characters + output_tokens,
    }
    yield _event({"type": "speech.audio.done", "usage": usage})


routes = [Route("/v1/audio/speech", create_speech, methods=["POST"])]
