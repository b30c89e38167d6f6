"""OpenAI-compatible ``POST /v1/audio/speech``: the whole input in, audio streamed out as it is made.

The route builds the request's session on the one session host (``gateway.session.host``: the same text side,
limits, core and engine pump as the WebSocket) and answers through the body transport
(``gateway.transport.body``)
in one of OpenAI's shapes (``protocol.codecs.bodies``): the encoded audio as the body, SSE deltas, or the
answer
held whole. The input is one utterance (sentence cuts; its text is all there at once, so no early cut).

Every format streams: ``pcm`` and ``wav`` as they come, ``mp3``, ``opus`` (Ogg), ``aac`` (ADTS) and
``flac`` through one streaming encoder for the whole response (``protocol.encoders``). A streamed ``wav``'s
sizes and a streamed ``flac``'s sample count say "unknown" (docs/protocol.md says how to read them).

Held whole, with true sizes: ``word_timestamps`` (vllm-omni 0.30's REST field: its timings go out in the
``X-Word-Timestamps`` response header, replaced by ``X-Word-Timestamps-Omitted`` past 4 KB, as vllm-omni
does; a streamed request for them is refused) and ``stream: false`` (vllm-omni's non-streamed answer).
``prepare`` and ``speak`` are this route's steps, shared with each item of a batch (``gateway.routes.batch``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import NamedTuple

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...protocol import pronounce
from ...protocol.codecs.bodies import Body, HeldAudio, SseBody
from ...protocol.codecs.openai import (
    SpeechRequest,
    check_limits,
    check_word_timestamps,
    decode_speech_request,
    speakable,
)
from ...protocol.encoders import MEDIA_TYPES as COMPRESSED_MEDIA_TYPES
from ...protocol.errors import ErrorCode, ProtocolError
from ...protocol.messages import SessionConfig
from ...protocol.output import OutputFormat
from ..metrics import REST_DIALECT, Metrics
from ..middleware.http import error_response, read_json
from ..session.failures import REFUSALS, error_for
from ..session.host import SessionHost, ignored_headers
from ..transport.body import respond
from ..voices.catalog import Catalog, Resolved

logger = logging.getLogger(__name__)

# The input is at most 4096 characters; a body can still carry ref_audio inline (a data URL).
MAX_BODY_BYTES = 16 * 1024 * 1024
MEDIA_TYPES = {"pcm": "audio/pcm", "wav": "audio/wav", **COMPRESSED_MEDIA_TYPES}


class Prepared(NamedTuple):
    """A checked request: the engine and voice that speak it, its output format and its core's config."""

    resolved: Resolved
    fmt: OutputFormat
    config: SessionConfig


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
    # ipa the voice cannot say is refused; an engine without phoneme input says the alias (a warning header)
    unheard = pronounce.check(req.pronunciations, resolved.engine.ipa_symbols)
    resolved = dataclasses.replace(resolved, ignored=resolved.ignored + unheard)
    for name in resolved.ignored:
        logger.warning("engine %r cannot follow %r; it is ignored", resolved.engine.name, name)
    # Cut as the WebSocket cuts by default.
    config = SessionConfig(
        split_granularity="sentence",
        eager_first_segment=True,
        speed=req.speed,
        seed=req.seed,
        word_timestamps=req.word_timestamps,
        text_normalization=req.text_normalization,
        keep_emoji=req.keep_emoji,
        pronunciations=req.pronunciations,
    )
    return Prepared(resolved, fmt, config)


async def speak(request: Request, text: str, prepared: Prepared) -> SessionHost:
    """The session that speaks ``text`` (``SessionHost.speak``), metered as a REST session.

    Raises:
        ProtocolError: the session's limits refuse the text (``text_backlog_full``, ...).
    """
    meter = request.state.metrics.session(REST_DIALECT)
    meter.configured(prepared.resolved.engine.name)
    host = SessionHost(request.state.settings, meter)
    await host.speak(prepared.config, prepared.fmt, text, prepared.resolved)
    return host


def body_of(req: SpeechRequest, fmt: OutputFormat) -> Body:
    """The answer's shape: held whole (word timings, ``stream: false``), SSE deltas, or the audio itself."""
    media_type = MEDIA_TYPES[req.response_format]
    if req.word_timestamps or req.stream is False:
        return HeldAudio(media_type, fmt.fmt, fmt.sample_rate, words=req.word_timestamps)
    if req.stream_format == "sse":
        return SseBody(len(req.input))
    return Body(media_type)


async def create_speech(request: Request) -> Response:
    """OpenAI-compatible text to speech."""
    try:
        req = await _decoded(request)
        prepared = await prepare(request, req)
        host = await speak(request, req.input, prepared)
    except ProtocolError as err:
        return _refused(request, err)
    fmt = prepared.fmt
    headers = {"x-sample-rate": str(fmt.sample_rate), "x-voxgate-engine": prepared.resolved.engine.name}
    headers |= ignored_headers(prepared.resolved)
    return await respond(host, body_of(req, fmt), functools.partial(_refused, request), headers)


def _refused(request: Request, error: ProtocolError) -> Response:
    """The error response, counted in ``voxgate_errors_total``."""
    metrics: Metrics = request.state.metrics
    metrics.errors.labels(error.code, REST_DIALECT).inc()
    return error_response(error)


routes = [Route("/v1/audio/speech", create_speech, methods=["POST"])]
