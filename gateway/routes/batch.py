"""vllm-omni's ``POST /v1/audio/speech/batch``: many texts in, each one's whole audio out as base64.

The body (``protocol.codecs.openai.BatchRequest``) holds ``items`` and the defaults they share; each item is
merged with them (``protocol.codecs.openai.merge``) into the single request it stands for, and spoken as
``POST /v1/audio/speech`` speaks one: the same checks (``speech.prepare``), the same session host, limits
and engine pump (``speech.speak``: the text cap, look-ahead, the audio cap, deadlines), held whole with its
true sizes (``gateway.transport.body.drained``, ``protocol.codecs.bodies.HeldAudio``). An
item that fails (refused, or its engine failed) is a failed result, and the others go on: the answer is
200 with ``succeeded`` and ``failed``, in vllm-omni's shape (its ``BatchSpeechResponse``, null fields
left out). Only the batch itself is refused: not JSON, no items, a bad field of the batch's schema, more
than ``max_batch_items`` items (400), or no session place (below).

The answer is written as the results come, in order (``protocol.codecs.bodies.BatchBody``), not built whole,
and bounded: only the item whose turn it is to be written is drained and held whole (its audio in the
pieces it came in, then its base64 written in slices: no copy of it is made); the items begun after it
make their audio only up to their outbox's bound (``max_buffered_audio_s``) and wait for their turn.
So a batch holds about one item's answer, whatever its length, where it held up to eight finished
answers (1.3 GB for 32 items of 4,096 characters at speed 0.25 in 48 kHz WAV).

Admitted item by item: each item after the first takes a token of the caller's rate limit (waiting for
it: the batch is paced at the caller's rate, not refused halfway), and inline ``ref_audio`` clips are
decoded under the same budget as a WebSocket session's (``gateway.middleware.ratelimit.References``): past it
an
item fails with ``rate_limited`` (upload the voice instead).

Sessions: each item that runs is a session of the caller, counted against ``max_sessions`` and
``max_sessions_per_key`` (``gateway.server.sessions``) like a ``POST /v1/audio/speech``. The batch takes its
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
import collections
import contextlib
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import NamedTuple

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ...protocol.codecs.bodies import BatchBody, HeldAudio, ItemResult, Usage
from ...protocol.codecs.openai import BatchItem, BatchRequest, SpeechRequest, decode_batch_request, merge
from ...protocol.errors import ErrorCode, ProtocolError, field_path
from ..metrics import REST_DIALECT, Metrics
from ..middleware.http import error_response, read_json
from ..middleware.ratelimit import RateLimiter, References
from ..server.sessions import Sessions
from ..session.host import SessionHost
from ..transport.body import BodyResponse, drained
from .openai import MAX_BODY_BYTES, MEDIA_TYPES, prepare, speak

logger = logging.getLogger(__name__)

#: Items of one batch spoken at once, each a session: enough to keep an engine's workers (or a vllm-omni
#: upstream's batching) busy, few enough that one batch does not take a key's share of the session caps
#: (``max_sessions_per_key`` is 64 by default).
ITEMS_AT_ONCE = 4


class _Started(NamedTuple):
    """An item whose session speaks: its request, host and output rate."""

    number: int  #: the item's index in the batch
    req: SpeechRequest
    host: SessionHost
    rate: int


class _Spoken(NamedTuple):
    """An item's whole answer: its audio and length."""

    started: _Started
    audio: list[bytes]  #: in the pieces it came in (``HeldAudio.parts``): no copy of it is made
    audio_ms: float


async def _decoded(request: Request) -> BatchRequest:
    """The body as a ``BatchRequest``; raises ``ProtocolError`` for one that is not."""
    return await read_json(request, MAX_BODY_BYTES, decode_batch_request)


class _Batch:
    """One batch's admission: its items' checks, the caller's rate, the inline-clip budget."""

    def __init__(self, request: Request, batch: BatchRequest) -> None:
        self.request, self.batch = request, batch
        self.references = References()
        self.limiter: RateLimiter | None = getattr(request.state, "rate_limiter", None)
        self.key = "" if self.limiter is None else self.limiter.key(request.scope)

    async def start(self, index: int, item: BatchItem) -> _Started | ItemResult:
        """Item ``index`` started (its session speaks), or its failure."""
        try:
            try:
                req = merge(self.batch, item)
            except msgspec.ValidationError as exc:
                raise ProtocolError(ErrorCode.INVALID_MESSAGE, str(exc), field=field_path(exc)) from exc
            if index:  # the batch's own request took the first token
                await self._paced()
            if req.ref_audio is not None:
                self.references.admit()
            prepared = await prepare(self.request, req)
            host = await speak(self.request, req.input, prepared)
            return _Started(index, req, host, prepared.fmt.sample_rate)
        except ProtocolError as err:
            return self.failed(index, err)

    async def _paced(self) -> None:
        """Wait for a token of the caller's rate limit."""
        if self.limiter is None:
            return
        while wait_s := await self.limiter.take(self.key):  # noqa: ASYNC110 - a refill time, no event
            await asyncio.sleep(wait_s)

    async def finish(self, started: _Started) -> _Spoken | ItemResult:
        """A started item's whole answer, or its failure."""
        fmt = started.req.response_format
        host = started.host
        body = HeldAudio(MEDIA_TYPES[fmt], fmt, started.rate)
        pieces = host.pieces()
        try:
            done = await drained(host, body, await anext(pieces), pieces)
        except ProtocolError as err:
            return self.failed(started.number, err)
        return _Spoken(started, body.parts(done), done.audio_ms)

    def failed(self, index: int, err: ProtocolError) -> ItemResult:
        metrics: Metrics = self.request.state.metrics
        metrics.errors.labels(err.code, REST_DIALECT).inc()
        logger.info("batch item %d failed: %s %s", index, err.code, err.message)
        return ItemResult(index=index, status="error", error=err.message)


async def _results(admission: _Batch, at_once: int) -> AsyncIterator[_Spoken | ItemResult]:
    """Every item's result, in order: ``at_once`` items spoken at a time. Only the item whose turn it is
    is drained; those begun after it wait at their outbox's bound (see the module's docstring)."""
    places = asyncio.Semaphore(at_once)

    async def start(index: int, item: BatchItem) -> _Started | ItemResult:
        await places.acquire()  # released once the item is written (or failed)
        try:
            return await admission.start(index, item)
        except BaseException:
            places.release()
            raise

    pending: collections.deque[asyncio.Task[_Started | ItemResult]] = collections.deque()
    items = iter(enumerate(admission.batch.items))
    try:
        while True:
            for index, item in itertools.islice(items, 2 * at_once - len(pending)):
                pending.append(asyncio.create_task(start(index, item)))
            if not pending:
                return
            # asyncio.wait, not ``await``: a cancel (the client left) must reach every item at once, not
            # the first alone, whose unwinding would let a waiting one begin.
            await asyncio.wait([pending[0]])
            started = pending.popleft().result()
            try:
                yield started if isinstance(started, ItemResult) else await admission.finish(started)
            finally:
                places.release()
    finally:
        # Nothing awaits before every item's work is told to stop: the client may be gone, and the scope
        # this runs in cancelled (each await may be interrupted).
        _stop(pending)
        if pending:
            await asyncio.wait(pending)
            _stop(pending)  # an item that started as it was cancelled


def _stop(tasks: collections.deque[asyncio.Task[_Started | ItemResult]]) -> None:
    """Tell every item's work to stop, without waiting."""
    for task in tasks:
        if not task.done():
            task.cancel()
        elif not task.cancelled() and isinstance(started := task.result(), _Started):
            started.host.cancel()


def _written(body: BatchBody, result: _Spoken | ItemResult) -> Iterator[bytes]:
    """One result's bytes: a failure whole, a success's audio in base64 slices."""
    if isinstance(result, ItemResult):
        yield body.result(result)
        return
    req = result.started.req
    usage = Usage.of(len(req.input), result.audio_ms)
    yield from body.success(result.started.number, result.audio, MEDIA_TYPES[req.response_format], usage)


async def _body(admission: _Batch, at_once: int) -> AsyncIterator[bytes]:
    """vllm-omni's ``BatchSpeechResponse`` JSON, written one result at a time as each is ready in turn."""
    body = BatchBody(f"speech-batch-{uuid.uuid4().hex}", len(admission.batch.items))
    yield body.head()
    async for result in _results(admission, at_once):
        for piece in _written(body, result):
            yield piece
    yield body.end()


class _Answer(BodyResponse):
    """The streamed answer, holding the batch's session places until it is sent or the client is gone
    (Starlette cancels the body then, which cancels the items' engine work)."""

    def __init__(
        self, body: AsyncIterator[bytes], places: contextlib.AsyncExitStack, send_timeout_s: float
    ) -> None:
        super().__init__(body, "application/json", send_timeout_s=send_timeout_s)
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
    taken, refused = 0, None
    while taken < min(ITEMS_AT_ONCE, len(batch.items)):
        refused = await places.enter_async_context(sessions.place(owner))
        if refused is not None:
            break
        taken += 1
    if not taken:
        assert refused is not None
        await places.aclose()
        error, retry_after = refused
        response = _refused(request, error)
        response.headers["retry-after"] = str(retry_after)
        return response
    return _Answer(_body(_Batch(request, batch), taken), places, settings.send_timeout_s)


def _refused(request: Request, error: ProtocolError) -> Response:
    """The error response, counted in ``voxgate_errors_total``."""
    metrics: Metrics = request.state.metrics
    metrics.errors.labels(error.code, REST_DIALECT).inc()
    return error_response(error)


routes = [Route("/v1/audio/speech/batch", create_speech_batch, methods=["POST"])]
