"""vllm-omni's ``POST /v1/audio/speech/batch``: many texts in, each one's whole audio out as base64.

The body (``protocol.speech.BatchRequest``) holds ``items`` and the defaults they share; each item is
merged with them (``protocol.speech.merge``) into the single request it stands for, and spoken as
``POST /v1/audio/speech`` speaks one: the same checks (``speech.prepare``), the same REST producer and
engine pump (``speech.speak``: look-ahead, the audio cap, deadlines), held whole (``speech.whole``). An
item that fails (refused, or its engine failed) is a failed result, and the others go on: the answer is
200 with ``succeeded`` and ``failed``, in vllm-omni's shape (its ``BatchSpeechResponse``, null fields
left out). Only the batch itself is refused: not JSON, no items, a bad field of the batch's schema, more
than ``max_batch_items`` items (400), or no session place (below).

The answer is written as the results come, in order (``_body``), not built whole: 32 items of 4096
characters are about 490 MB of base64 audio, which held at once cost 650 MB of memory for a 200 KB
request. At most ``2 * ITEMS_AT_ONCE`` items are begun and not yet written, so a slow item holds back
only a few finished answers.

Sessions: each item that runs is a session of the caller, counted against ``max_sessions`` and
``max_sessions_per_key`` (``gateway.sessions``) like a ``POST /v1/audio/speech``. The batch takes its
places up front, up to ``ITEMS_AT_ONCE`` and as many as the caps leave free, and runs that many items at
once until all are done; with no place free it is refused as a single request would be (503
``server_busy`` or ``server_shutdown``, 429 ``too_many_sessions``, with ``Retry-After``). So a batch never
takes the process past its caps, nor fails an item for them, and a drain waits for it as for any REST
session.

A client that goes away stops the batch: its items' engine work is cancelled (vllm-omni's
``with_cancellation`` does the same).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import itertools
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..protocol.errors import ErrorCode, ProtocolError, field_path
from ..protocol.speech import BatchItem, BatchRequest, decode_batch_request, merge
from .http import error_response, read_json
from .metrics import REST_DIALECT, Metrics
from .sessions import Sessions
from .speech import MAX_BODY_BYTES, MEDIA_TYPES, OUTPUT_TOKENS_PER_S, prepare, speak, whole

logger = logging.getLogger(__name__)

#: Items of one batch spoken at once, each a session: enough to keep an engine's workers (or a vllm-omni
#: upstream's batching) busy, few enough that one batch does not take a key's share of the session caps
#: (``max_sessions_per_key`` is 64 by default) nor hold much more than this many answers being made.
ITEMS_AT_ONCE = 4


class InputTokenDetails(msgspec.Struct, kw_only=True):
    """vllm-omni's ``SpeechInputTokenDetails``; voxgate counts a character as a text token."""

    text_tokens: int = 0
    audio_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    """vllm-omni's ``SpeechTokenUsage``: an output token is 80 ms of audio (Qwen3-TTS's 12.5 Hz codec)."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    input_token_details: InputTokenDetails = msgspec.field(default_factory=InputTokenDetails)


class ItemResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """vllm-omni's ``SpeechBatchItemResult``, its null fields left out as vllm-omni leaves them out."""

    index: int
    status: Literal["success", "error"]
    audio_data: str | None = None
    media_type: str | None = None
    error: str | None = None
    usage: Usage | None = None


async def _decoded(request: Request) -> BatchRequest:
    """The body as a ``BatchRequest``; raises ``ProtocolError`` for one that is not."""
    return await read_json(request, MAX_BODY_BYTES, decode_batch_request)


async def _item(request: Request, batch: BatchRequest, index: int, item: BatchItem) -> ItemResult:
    """One item spoken as the single request it stands for, or its failure."""
    try:
        try:
            req = merge(batch, item)
        except msgspec.ValidationError as exc:
            raise ProtocolError(ErrorCode.INVALID_MESSAGE, str(exc), field=field_path(exc)) from exc
        prepared = await prepare(request, req)
        held = await whole(await speak(request, req.input, prepared), prepared.fmt)
    except ProtocolError as err:
        metrics: Metrics = request.state.metrics
        metrics.errors.labels(err.code, REST_DIALECT).inc()
        logger.info("batch item %d failed: %s %s", index, err.code, err.message)
        return ItemResult(index=index, status="error", error=err.message)
    output_tokens = round(held.done.audio_ms / 1000.0 * OUTPUT_TOKENS_PER_S)
    characters = len(req.input)
    usage = Usage(
        input_tokens=characters,
        output_tokens=output_tokens,
        total_tokens=characters + output_tokens,
        input_token_details=InputTokenDetails(text_tokens=characters),
    )
    return ItemResult(
        index=index,
        status="success",
        audio_data=base64.b64encode(held.audio).decode(),
        media_type=MEDIA_TYPES[req.response_format],
        usage=usage,
    )


async def _results(request: Request, batch: BatchRequest, at_once: int) -> AsyncIterator[ItemResult]:
    """Every item's result, in order: ``at_once`` items spoken at a time, and at most ``2 * at_once``
    begun and not yet handed out, so that a slow item holds back few finished answers."""
    limiter = asyncio.Semaphore(at_once)

    async def run(index: int, item: BatchItem) -> ItemResult:
        async with limiter:
            return await _item(request, batch, index, item)

    pending: collections.deque[asyncio.Task[ItemResult]] = collections.deque()
    items = iter(enumerate(batch.items))
    try:
        while True:
            for index, item in itertools.islice(items, 2 * at_once - len(pending)):
                pending.append(asyncio.create_task(run(index, item)))
            if not pending:
                return
            # asyncio.wait, not ``await``: a cancel (the client left) must reach every item at once, not
            # the first alone, whose unwinding would let a waiting one begin.
            await asyncio.wait([pending[0]])
            yield pending.popleft().result()
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


async def _body(request: Request, batch: BatchRequest, at_once: int) -> AsyncIterator[bytes]:
    """vllm-omni's ``BatchSpeechResponse`` JSON, written one result at a time as each is ready in turn."""
    yield b'{"id":"speech-batch-' + uuid.uuid4().hex.encode() + b'","results":['
    succeeded = 0
    async for result in _results(request, batch, at_once):
        yield (b"," if result.index else b"") + msgspec.json.encode(result)
        succeeded += result.status == "success"
    total = len(batch.items)
    yield f'],"total":{total},"succeeded":{succeeded},"failed":{total - succeeded}}}'.encode()


class _Answer(StreamingResponse):
    """The streamed answer, holding the batch's session places until it is sent or the client is gone
    (Starlette cancels the body then, which cancels the items' engine work)."""

    def __init__(self, body: AsyncIterator[bytes], places: contextlib.AsyncExitStack) -> None:
        super().__init__(body, media_type="application/json")
        self.places = places

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self.places:
            await super().__call__(scope, receive, send)


async def create_speech_batch(request: Request) -> Response:
    """Speak a batch of texts; each item's audio comes back whole, base64-encoded."""
    settings = request.state.settings
    try:
        batch = await _decoded(request)
    except ProtocolError as err:
        return _refused(request, err)
    if len(batch.items) > settings.max_batch_items:
        message = (
            f"Batch contains {len(batch.items)} items, exceeding the maximum of {settings.max_batch_items}."
        )
        return _refused(request, ProtocolError(ErrorCode.INVALID_MESSAGE, message, field="$.items"))
    sessions: Sessions = request.state.sessions
    owner: str = request.state.owner
    places = contextlib.AsyncExitStack()  # each a session's place, the fleet's lease included (Redis)
    held, refused = 0, None
    while held < min(ITEMS_AT_ONCE, len(batch.items)):
        refused = await places.enter_async_context(sessions.place(owner))
        if refused is not None:
            break
        held += 1
    if not held:
        assert refused is not None
        await places.aclose()
        error, retry_after = refused
        response = _refused(request, error)
        response.headers["retry-after"] = str(retry_after)
        return response
    return _Answer(_body(request, batch, held), places)


def _refused(request: Request, error: ProtocolError) -> Response:
    """The error response, counted in ``voxgate_errors_total``."""
    metrics: Metrics = request.state.metrics
    metrics.errors.labels(error.code, REST_DIALECT).inc()
    return error_response(error)


routes = [Route("/v1/audio/speech/batch", create_speech_batch, methods=["POST"])]
