"""Engine ``remote``: streams speech from vllm-omni (or any OpenAI-compatible) speech servers.

Each segment is one ``POST /v1/audio/speech`` over a pooled HTTP client (aiohttp, whose C parser reads
the audio at a third of httpx's CPU: ``engine.http_stream``; probes and uploads use httpx), asking for a
raw WAV stream: ``stream: true, stream_format: "audio", response_format: "wav"``. vllm-omni 0.30 answers
a bare ``stream: true`` with SSE (its PR #4679), and a WAV header tells the rate of every answer, so
nothing has to be learned by a probe. Upstreams are chosen by least outstanding requests; a failure
before the first audio byte fails over to the next upstream, a failure after it is an ``EngineError`` for
that segment, and a 4xx is the request's fault: ``RequestRefused`` with the upstream's message. Every
upstream failure, before or after the first byte (a timeout, a reset, an answer that is not a playable
WAV, one larger than the segment may be), counts toward that upstream's circuit breaker.

Nothing an upstream does holds the gateway (``engine.deadlines``): a request has a connect, a first-byte,
an idle and an overall deadline (the overall one grows with the segment's audio cap), a body that is not
streamed audio is read only up to a size, and a word-timed answer, which must be held whole, only up to
the segment's audio cap. What is learned without synthesis (health, voices, checkpoint, aligner) comes
from ``engine.survey``, whose rounds ask every upstream at once, each probe bounded by the first-byte
deadline, so an upstream that hangs is marked down and the gateway starts listening with the others.
Closing the iterator (cancel, disconnect) closes the HTTP response at once, and vllm-omni aborts a
request whose client went away. Uploaded voices travel inline: ``ref_audio`` as a data URL of the
stored clip plus ``ref_text`` (or ``x_vector_only_mode`` when there is no transcript), so upstreams
need no voice store of their own; to a vllm-omni family whose speaker cache keys on a voice name, the clip is
also uploaded once and named after (``engine.upstream_voices``).

What is sent follows the rules of the model family upstream (``engine.families``; the body is made by
``engine.remote_requests``): which options it takes (the rest are refused by name at session config), which
clones it cannot make (refused before any upstream call), and the default reference voice that a family
speaking only from a reference gets with a plain request.

Word timestamps come from vllm-omni's own path: a server launched with ``--forced-aligner`` runs the
Qwen3-ForcedAligner stage after the audio, and its non-streamed ``POST /v1/audio/speech`` with
``word_timestamps: true`` answers the whole WAV with an ``X-Word-Timestamps`` header,
``[{word, start_ms, end_ms}]`` in integer ms from the start of that answer's audio (its streamed HTTP route
refuses the option). So a segment that asks for words is one whole answer: its words go out with its
audio, before it. Past 4 KB vllm-omni leaves the header out (``X-Word-Timestamps-Omitted``); the segment
is then asked for again in two halves. Which upstreams have the aligner is learned by a probe that costs
no synthesis (an empty input with ``word_timestamps: true``: without the aligner vllm-omni refuses the
option first, with it the empty input), and again from any refusal that names ``--forced-aligner``; the
option is refused by name at session config once no upstream can time words.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator

import aiohttp
import numpy as np
import numpy.typing as npt

from . import http_stream
from .base import (
    AudioChunk,
    EngineError,
    RequestRefused,
    SynthesisRequest,
    UnknownVoice,
    UnsupportedOption,
    UpstreamBusy,
    Voice,
    VoiceReference,
)
from .deadlines import UpstreamTimeout, Waits, bounded_read
from .families import FAMILIES, GENERIC, Family, Presets
from .qwen3_tts import word_timings
from .remote_answers import (
    ERROR_BODY_BYTES,
    LOGGED_BODY_BYTES,
    Busy,
    NoAligner,
    UpstreamFailed,
    busy_message,
    halves,
    parse_words,
    refusal,
    retry_after,
    wav_chunks,
)
from .remote_clients import Clients, Limits
from .remote_requests import FORWARDED, SpeechBodies
from .remote_settings import DEFAULT_REFERENCE_AUDIO, DEFAULT_REFERENCE_TEXT, RemoteSettings
from .survey import ALIGNER_FLAG, Survey
from .upstream_voices import UpstreamVoices
from .upstreams import ScrubUrls, Upstream, UpstreamPool, redact_url

logger = logging.getLogger(__name__)

# vllm-omni's default voice and output rate for Qwen3-TTS; both are re-learned from the upstream.
DEFAULT_VOICE = "vivian"
DEFAULT_SAMPLE_RATE = 24000
_NO_ALIGNER = (
    "no upstream can time words: vllm-omni times them only when launched with --forced-aligner "
    "(Qwen/Qwen3-ForcedAligner-0.6B, an extra model stage); use engine piper for word timestamps"
)
# vllm-omni's headers on a non-streamed answer (serving_speech.py ``create_speech``).
_WORDS_HEADER = "x-word-timestamps"
_WORDS_OMITTED_HEADER = "x-word-timestamps-omitted"
_AUDIO_TYPES = ("audio/", "application/octet-stream")
# 4xx answers that say the upstream cannot serve now (busy, slow) or is not a speech server at all
# (no such route): another upstream may, so they fail over like a 5xx. 401/403 say our key is wrong
# for that upstream, its fault and not the request's. Any other 4xx is the request's fault.
_UPSTREAM_FAULTS = frozenset({401, 403, 404, 405, 408, 429})
# The gateway's default audio cap (gateway.settings ``max_segment_audio_*``), for a request that does
# not carry its own.
_DEFAULT_CAP_BASE_S, _DEFAULT_CAP_PER_CHAR_S = 10.0, 0.3


class RemoteEngine:
    """Speech from upstream servers.

    Args:
        urls: upstream base URLs (``http://vllm:8091``).
        model: the ``model`` sent upstream (empty: let the upstream choose).
        api_key: sent as ``Authorization: Bearer`` to every upstream (empty: none).
        connect_timeout_s: TCP connect and pool wait limit.
        first_byte_timeout_s: from a streamed request to its first audio; each probe's limit too.
        read_timeout_s: longest wait for the next bytes once audio flows (the idle deadline).
        segment_timeout_s: the overall deadline of a request, beyond its segment's audio cap.
        health_interval_s: period of the ``/health`` checks.
        breaker_failures / breaker_cooldown_s: the per-upstream circuit breaker.
        family: the upstreams' model family (a ``FAMILIES`` key); empty: detected from the model id.
        reference_audio / reference_text: the default reference voice (a WAV file and its transcript).
    """

    name = "remote"
    clones = True
    reads_numbers = True  # a speech model's own text front end
    ipa_symbols: frozenset[str] = frozenset()  # text in, no phoneme input

    def __init__(
        self,
        urls: list[str],
        *,
        model: str = "",
        api_key: str = "",
        connect_timeout_s: float = 5.0,
        first_byte_timeout_s: float = 5.0,
        read_timeout_s: float = 10.0,
        segment_timeout_s: float = 10.0,
        health_interval_s: float = 5.0,
        breaker_failures: int = 3,
        breaker_cooldown_s: float = 30.0,
        family: str = "",
        reference_audio: str = DEFAULT_REFERENCE_AUDIO,
        reference_text: str = DEFAULT_REFERENCE_TEXT,
    ) -> None:
        self.pool = UpstreamPool(
            urls, breaker_failures=breaker_failures, breaker_cooldown_s=breaker_cooldown_s
        )
        self.model = model
        self.sample_rate = DEFAULT_SAMPLE_RATE
        self.default_voice = DEFAULT_VOICE
        self.limits = Limits(
            connect_timeout_s, first_byte_timeout_s, read_timeout_s, segment_timeout_s, health_interval_s
        )
        self._clients = Clients(self.limits, api_key)
        #: What is known of the upstreams: voices, checkpoint, which time words.
        self.survey = Survey(self.pool, self._clients.http, model=model, probe_s=first_byte_timeout_s)
        self._health: asyncio.Task[None] | None = None
        self._family = FAMILIES[family] if family else None
        #: The request bodies, with the default reference voice and the clips as data URLs.
        self.bodies = SpeechBodies(model, reference_audio, reference_text)
        #: Clips uploaded to each upstream and named there, for vllm-omni's speaker cache.
        self.uploads = UpstreamVoices(self._clients.http)
        self._scrub = ScrubUrls(self.pool)

    @property
    def family(self) -> Family:
        """The upstreams' model family: the configured one, else the detected one, else ``GENERIC``."""
        return self._family or self.survey.family or GENERIC

    async def start(self) -> None:
        self.bodies.default_reference()  # a missing or unreadable file fails the start, not a request
        self._clients.open()
        logging.getLogger("httpx").addFilter(self._scrub)  # it logs each probe's URL, credentials and all
        await self._survey()
        self._health = asyncio.create_task(self._health_loop())

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.limits.health_interval_s)
            await self._survey()

    async def _survey(self) -> None:
        """One survey round (``engine.survey``), then the default voice among those it found."""
        await self.survey.round()
        names = self.survey.names
        if names and DEFAULT_VOICE not in names:
            self.default_voice = names[0]

    async def voices(self) -> list[Voice]:
        names = self.survey.names or []
        return [Voice(name=n, engine=self.name, sample_rate=self.sample_rate) for n in names]

    def check(self, voice: str, options: dict[str, object]) -> None:
        names = self.survey.names
        if names and voice not in names and self.family.presets is Presets.LISTED:
            raise UnknownVoice(voice, self.name, names)
        for field in options:
            if field not in FORWARDED:
                raise UnsupportedOption(field, self.name)
        self.family.check(options)
        if options.get("word_timestamps") and not self.survey.may_time_words():
            raise UnsupportedOption("word_timestamps", self.name, _NO_ALIGNER)

    def check_reference(self, reference: VoiceReference) -> None:
        """Refuse a clone the upstream's family cannot make, when the session is configured (the same
        check runs again before each request)."""
        self.family.check_reference(reference)

    def _body(
        self,
        text: str,
        voice: str | None,
        options: dict[str, object],
        reference: VoiceReference | None = None,
    ) -> dict[str, object]:
        """The request body of one segment, shaped by the upstreams' family (``engine.remote_requests``)."""
        return self.bodies.body(
            text,
            voice,
            options,
            family=self.family,
            names=self.survey.names,
            default_voice=self.default_voice,
            reference=reference,
        )

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        client = self._clients.speech()
        options = {**req.options, **({"seed": req.seed} if req.seed is not None else {})}
        self.family.check_request(req.reference, options)  # before any upstream call
        body = self._body(req.text, req.voice, options, reference=req.reference)
        words = bool(body.get("word_timestamps"))
        max_audio_s = req.max_audio_s
        if max_audio_s is None:
            max_audio_s = (_DEFAULT_CAP_BASE_S + _DEFAULT_CAP_PER_CHAR_S * len(req.text)) / req.speed
        candidates = self.pool.candidates()
        if not candidates and (wait_s := self.pool.busy_for()) is not None:
            raise UpstreamBusy(busy_message(wait_s), retry_after_s=wait_s)  # out for being busy
        if not candidates:
            raise EngineError(f"engine 'remote' is unavailable: {self.pool.describe()}")
        if words:  # only upstreams that may have the aligner
            candidates = [u for u in candidates if self.survey.aligners.get(u.url, True)]
            if not candidates:
                raise RequestRefused(_NO_ALIGNER, field="word_timestamps")
        busy: list[int] = []  # the Retry-After of each upstream that said it is busy
        failed = 0
        for upstream in candidates:
            waits = self.limits.waits(streamed=bool(body.get("stream")), max_audio_s=max_audio_s)
            opened = (
                functools.partial(self._timed, client, upstream, waits=waits, max_audio_s=max_audio_s)
                if words
                else functools.partial(self._stream, client, upstream, waits=waits)
            )
            stream = self.uploads.stream(upstream, self.family, body, opened)
            started = False
            with self.pool.lease(upstream):
                try:
                    async with contextlib.aclosing(stream) as chunks:
                        async for chunk in chunks:
                            started = True
                            yield chunk
                except UpstreamFailed as exc:
                    reason = upstream.scrub(str(exc))
                    self.pool.failure(upstream, reason, busy=isinstance(exc, Busy))
                    if started:  # not retried elsewhere: the listener would hear the start twice
                        raise EngineError(f"upstream {upstream.label} failed mid-stream: {reason}") from None
                    logger.warning(
                        "upstream %s failed before audio, trying the next: %s", upstream.label, reason
                    )
                    failed += 1
                    if isinstance(exc, Busy):
                        busy.append(exc.retry_after_s)
                    continue
                except NoAligner:
                    continue  # not this upstream's fault: the next one may have the aligner
                self.pool.success(upstream)
                return
        if words and not self.survey.may_time_words():
            raise RequestRefused(_NO_ALIGNER, field="word_timestamps")
        if busy and len(busy) == failed:  # every upstream tried is busy: the client may come back
            raise UpstreamBusy(busy_message(min(busy)), retry_after_s=min(busy))
        raise EngineError(f"no upstream could serve the request: {self.pool.describe()}")

    @contextlib.asynccontextmanager
    async def _answer(
        self, client: aiohttp.ClientSession, upstream: Upstream, body: dict[str, object], waits: Waits
    ) -> AsyncGenerator[aiohttp.ClientResponse, None]:
        """The upstream's 200 answer with an audio type, its body not read yet; let go on exit.

        Raises ``UpstreamFailed`` for an answer that is the upstream's fault, ``NoAligner`` for a
        refusal of word timestamps for want of the aligner, and ``RequestRefused`` for any other 4xx.
        """
        waits.begin()
        try:
            response = await waits.wait(http_stream.post_json(client, upstream.url, "/v1/audio/speech", body))
        except (*http_stream.StreamError, UpstreamTimeout) as exc:
            raise UpstreamFailed(str(exc) or repr(exc)) from exc
        try:
            status = response.status
            if 300 <= status < 400:
                # Never followed: a 307 would send the body, a tenant's reference clip included, to
                # wherever the upstream points, and a 302 would turn the request into a GET there.
                where = response.headers.get("location", "")
                logger.warning(
                    "upstream %s answered %d to %s; redirects are not followed",
                    upstream.label,
                    status,
                    redact_url(where) if where else "no location",
                )
                raise UpstreamFailed(f"answered a redirect ({status}), which is not followed")
            if status != 200:
                try:
                    content = await bounded_read(http_stream.reader(response), ERROR_BODY_BYTES, waits)
                except (*http_stream.StreamError, UpstreamTimeout) as exc:
                    raise UpstreamFailed(f"status {status}, then {exc!r}") from exc
                # The body is the upstream's (a traceback, internal addresses): the log has its start,
                # escaped; the client gets the status and, for a refusal, the message its JSON names.
                logger.info(
                    "upstream %s answered %d: %r", upstream.label, status, content[:LOGGED_BODY_BYTES]
                )
                if status == 429 or (status == 503 and "retry-after" in response.headers):
                    retry_after_s = retry_after(response.headers.get("retry-after"))
                    raise Busy(f"status {status} (busy; retry after {retry_after_s} s)", retry_after_s)
                if status >= 500 or status in _UPSTREAM_FAULTS:
                    raise UpstreamFailed(f"status {status}")
                if status == 400 and body.get("word_timestamps") and ALIGNER_FLAG.encode() in content:
                    self.survey.learn_aligner(upstream, False)
                    raise NoAligner
                raise refusal(status, content, body)
            kind = response.headers.get("content-type", "")
            if not kind.startswith(_AUDIO_TYPES):
                raise UpstreamFailed(f"answered {kind[:60] or 'no content type'!r} instead of a WAV")
            yield response
        finally:
            http_stream.finish(response)

    async def _timed(
        self,
        client: aiohttp.ClientSession,
        upstream: Upstream,
        body: dict[str, object],
        waits: Waits,
        max_audio_s: float,
    ) -> AsyncGenerator[AudioChunk, None]:
        """A segment with its words: vllm-omni's whole answer, its audio and ``X-Word-Timestamps``.

        The answer is read as it comes and held only up to the segment's audio cap: an upstream that
        sends more is failed, not read on. When vllm-omni leaves the words out for size (over 4 KB of
        JSON, ``X-Word-Timestamps-Omitted``), each half of the text is asked for on its own (between
        words, so each half is timed whole).
        """
        parts: list[npt.NDArray[np.float32]] = []
        held, rate = 0, 0
        async with self._answer(client, upstream, body, waits) as response:
            header = response.headers.get(_WORDS_HEADER)
            omitted = response.headers.get(_WORDS_OMITTED_HEADER)
            waits.flowing()  # a whole answer's headers come when it is made: its bytes follow at once
            async with contextlib.aclosing(wav_chunks(response, waits)) as chunks:
                async for chunk in chunks:
                    held, rate = held + len(chunk.samples), chunk.sample_rate
                    if held > max_audio_s * rate:
                        raise UpstreamFailed(
                            f"answered more than the segment's {max_audio_s:g} s of audio "
                            f"for {len(str(body['input']))} characters"
                        )
                    parts.append(chunk.samples)
        samples = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        rate = rate or self.sample_rate
        text = str(body["input"])
        if header is None and omitted:
            split = halves(text)
            if split is None:
                raise EngineError(f"upstream {upstream.label} left out the words of {text[:80]!r} for size")
            for half in split:
                async with contextlib.aclosing(
                    self._timed(client, upstream, {**body, "input": half}, waits, max_audio_s)
                ) as part:
                    async for chunk in part:
                        yield chunk
            return
        self.sample_rate = rate
        if header is None and self.survey.aligners.get(upstream.url):
            # vllm-omni's aligner timed nothing (a text without words, or a mismatch): it leaves the
            # header out, as its WebSocket route sends ``timestamps: null``. The audio still plays.
            logger.warning("upstream %s timed no word of %r", upstream.label, text[:80])
            yield AudioChunk(samples, rate)
            return
        if header is None:
            # An upstream that does not know the option (not vllm-omni, or one before 0.30) ignores it.
            self.survey.learn_aligner(upstream, False)
            raise RequestRefused(
                f"upstream {upstream.label} answered without word timestamps; {_NO_ALIGNER}",
                field="word_timestamps",
            )
        self.survey.learn_aligner(upstream, True)
        timings = word_timings(text, parse_words(header), rate, len(samples))
        yield AudioChunk(samples, rate, timings)

    async def _stream(
        self, client: aiohttp.ClientSession, upstream: Upstream, body: dict[str, object], waits: Waits
    ) -> AsyncGenerator[AudioChunk, None]:
        async with self._answer(client, upstream, body, waits) as response:
            async with contextlib.aclosing(wav_chunks(response, waits)) as chunks:
                async for chunk in chunks:
                    self.sample_rate = chunk.sample_rate
                    yield chunk

    async def ready(self) -> bool:
        return self._clients.opened and bool(self.pool.candidates())

    async def aclose(self) -> None:
        logging.getLogger("httpx").removeFilter(self._scrub)
        await self.uploads.aclose()
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
        await self._clients.aclose()


def create(settings: RemoteSettings) -> RemoteEngine:
    """The engine ``--engine remote`` runs."""
    return RemoteEngine(
        list(settings.upstreams),
        model=settings.upstream_model,
        api_key=settings.upstream_api_key,
        connect_timeout_s=settings.upstream_connect_timeout_s,
        first_byte_timeout_s=settings.upstream_first_byte_timeout_s,
        read_timeout_s=settings.upstream_read_timeout_s,
        segment_timeout_s=settings.upstream_segment_timeout_s,
        health_interval_s=settings.upstream_health_interval_s,
        breaker_failures=settings.upstream_breaker_failures,
        breaker_cooldown_s=settings.upstream_breaker_cooldown_s,
        family=settings.upstream_family,
        reference_audio=settings.upstream_reference_audio or DEFAULT_REFERENCE_AUDIO,
        reference_text=settings.upstream_reference_text or DEFAULT_REFERENCE_TEXT,
    )
