"""Prometheus metrics, served at ``GET /metrics``: one registry per app, fed by thin hooks.

The facts already exist where the hooks sit: the core's ``audio.done`` / ``session.done`` carry the
timings (``protocol.core``), the WebSocket writer and the REST body see every output as it goes out,
and the remote engine's ``UpstreamPool`` knows each upstream's health and breaker, read at scrape
time. A ``SessionMeter`` is one session's (or one REST request's) view of the metrics.

Labels stay bounded: ``engine`` (the configured engines), ``dialect`` (``voxgate.v1``, ``vllm-omni``,
``elevenlabs``, ``cartesia``, ``deepgram``, or ``openai`` for ``POST /v1/audio/speech``), ``since``,
``code`` (the protocol's error codes) and ``upstream`` (the configured URLs as ``scheme://host:port``,
``engine.upstreams.redact_url``: no credentials, path or query). Nothing is labelled by key, owner, session
or voice.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from ..engine.base import AudioChunk, TTSEngine
from ..engine.upstreams import UpstreamPool
from ..protocol.messages import AudioDone, ContextClosed, ContextOpened, Error, SessionDone
from ..protocol.output import Audio, Message, Output

#: The ``dialect`` of ``POST /v1/audio/speech`` (the WebSocket's are ``voxgate.v1`` and ``vllm-omni``).
REST_DIALECT = "openai"
#: The ``engine`` of a session that has not been configured yet.
NO_ENGINE = "none"
_LATENCY_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_RTF_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 5.0)
_BUFFER_BUCKETS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
#: ``voxgate_upstream_breaker_state`` values.
BREAKER_CLOSED, BREAKER_HALF_OPEN, BREAKER_OPEN = 0, 1, 2


class Metrics:
    """The metric objects of one app, on their own registry (several apps never clash)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.first_audio = Histogram(
            "voxgate_time_to_first_audio_seconds",
            "Time to first audio: since=first_text per utterance (first text in to first audio out), "
            "since=segment per segment (its text complete to its first audio out)",
            ["engine", "dialect", "since"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.rtf = Histogram(
            "voxgate_real_time_factor",
            "Synthesis time over audio duration, per segment",
            ["engine"],
            buckets=_RTF_BUCKETS,
            registry=r,
        )
        self.buffer = Histogram(
            "voxgate_buffered_audio_seconds",
            "Audio the client holds ahead of real-time playback when a segment after the first starts "
            "(0: an underrun)",
            ["engine", "dialect"],
            buckets=_BUFFER_BUCKETS,
            registry=r,
        )
        self.underrun = Counter(
            "voxgate_underrun_seconds",
            "Silence inside utterances that a client playing each in real time from its first frame hears: "
            "audio written after everything before it had played",
            ["engine", "dialect"],
            registry=r,
        )
        self.sessions = Gauge(
            "voxgate_sessions_active",
            "Open sessions (WebSocket) and speech requests being answered (REST)",
            ["engine", "dialect"],
            registry=r,
        )
        self.contexts = Gauge(
            "voxgate_contexts_active",
            "Named contexts open on the sessions (docs/protocol.md, contexts)",
            ["engine", "dialect"],
            registry=r,
        )
        self.sessions_total = Counter(
            "voxgate_sessions", "Sessions and speech requests started", ["dialect"], registry=r
        )
        self.queue_depth = Gauge(
            "voxgate_engine_queue_depth",
            "Segments handed to the engine that have no audio yet (queued or making their first chunk)",
            ["engine"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "voxgate_engine_queue_wait_seconds",
            "Time from reading a segment's engine stream to its first chunk",
            ["engine"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "voxgate_errors",
            "Errors reported to clients, by protocol error code",
            ["code", "dialect"],
            registry=r,
        )
        self.bytes_out = Counter(
            "voxgate_bytes_out", "Bytes written to clients (audio and messages)", ["dialect"], registry=r
        )
        self._upstreams = _Upstreams()
        r.register(self._upstreams)

    def watch(self, engines: Iterable[TTSEngine]) -> None:
        """Report the upstream pools of these engines (the remote engine's) at each scrape."""
        self._upstreams.engines = list(engines)

    def session(self, dialect: str) -> SessionMeter:
        return SessionMeter(self, dialect)

    async def timed(
        self, engine: str, chunks: AsyncGenerator[AudioChunk, None]
    ) -> AsyncGenerator[AudioChunk, None]:
        """``chunks``, counted in the engine's queue depth and wait until the first one comes."""
        depth, waiting, start = self.queue_depth.labels(engine), True, time.perf_counter()
        depth.inc()
        try:
            async for chunk in chunks:
                if waiting:
                    waiting = False
                    depth.dec()
                    self.queue_wait.labels(engine).observe(time.perf_counter() - start)
                yield chunk
        finally:
            if waiting:
                depth.dec()
            await chunks.aclose()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class _Playback:
    """One utterance as the client plays it: when its audio began and how much has gone out."""

    start: float
    sent_s: float = 0.0
    sentence: int = 0
    end: float = 0.0  # when the audio written so far has played (an underrun restarts the clock)


@dataclass
class SessionMeter:
    """One session's hooks: the session's engine and dialect label what it reports."""

    metrics: Metrics
    dialect: str
    engine: str = NO_ENGINE
    _open: bool = False
    _playing: dict[int, _Playback] = field(default_factory=dict)
    _contexts: set[int] = field(default_factory=set)  # the numbers of the named contexts open

    def __post_init__(self) -> None:
        # Looked up once: ``labels()`` on every audio frame was a visible share of the writer's time.
        self._bytes_out = self.metrics.bytes_out.labels(self.dialect)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Count the session as active for the duration of the block."""
        self.open()
        try:
            yield
        finally:
            self.close()

    def open(self) -> None:
        self.metrics.sessions.labels(self.engine, self.dialect).inc()
        self.metrics.sessions_total.labels(self.dialect).inc()
        self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            self.metrics.sessions.labels(self.engine, self.dialect).dec()
        self.metrics.contexts.labels(self.engine, self.dialect).dec(len(self._contexts))
        self._contexts.clear()

    def configured(self, engine: str) -> None:
        """The session now speaks with ``engine``."""
        if engine != self.engine and self._open:
            self.metrics.sessions.labels(self.engine, self.dialect).dec()
            self.metrics.sessions.labels(engine, self.dialect).inc()
        if engine != self.engine and self._contexts:
            self.metrics.contexts.labels(self.engine, self.dialect).dec(len(self._contexts))
            self.metrics.contexts.labels(engine, self.dialect).inc(len(self._contexts))
        self.engine = engine

    def timed(self, chunks: AsyncGenerator[AudioChunk, None]) -> AsyncGenerator[AudioChunk, None]:
        return self.metrics.timed(self.engine, chunks)

    def sent(self, output: Output | None) -> None:
        """An output on its way to the client (after ``Core.sending``)."""
        m = self.metrics
        match output:
            case Audio(utterance=u, sentence=s, audio_s=audio_s):
                now = time.perf_counter()
                play = self._playing.get(u)
                if play is None:
                    play = self._playing[u] = _Playback(now, sentence=s, end=now)
                elif s != play.sentence:
                    play.sentence = s
                    ahead = max(0.0, play.sent_s - (now - play.start))
                    m.buffer.labels(self.engine, self.dialect).observe(ahead)
                if now > play.end:
                    m.underrun.labels(self.engine, self.dialect).inc(now - play.end)
                play.sent_s += audio_s
                play.end = max(play.end, now) + audio_s
            case Message(msg=AudioDone() as done):
                if done.text_to_first_audio_ms is not None:
                    m.first_audio.labels(self.engine, self.dialect, "segment").observe(
                        done.text_to_first_audio_ms / 1000.0
                    )
                if done.duration_ms > 0 and not done.error:
                    m.rtf.labels(self.engine).observe(done.synthesis_ms / done.duration_ms)
            case Message(msg=SessionDone() as done):
                self._playing.pop(done.utterance_index, None)
                if done.first_text_to_first_audio_ms is not None:
                    m.first_audio.labels(self.engine, self.dialect, "first_text").observe(
                        done.first_text_to_first_audio_ms / 1000.0
                    )
            case Message(msg=Error(code=code)):
                self.error(code)
            case Message(msg=ContextOpened(context_number=number)) if number not in self._contexts:
                self._contexts.add(number)
                m.contexts.labels(self.engine, self.dialect).inc()
            case Message(msg=ContextClosed(context_number=number)) if number in self._contexts:
                self._contexts.discard(number)
                m.contexts.labels(self.engine, self.dialect).dec()

    def error(self, code: str) -> None:
        self.metrics.errors.labels(code, self.dialect).inc()

    def wrote(self, payload: str | bytes) -> None:
        self._bytes_out.inc(len(payload) if isinstance(payload, bytes) else len(payload.encode()))


class _Upstreams(Collector):
    """Each remote engine's upstreams, read from its pool when scraped."""

    def __init__(self) -> None:
        self.engines: list[TTSEngine] = []

    def collect(self) -> Iterator[Metric]:
        labels = ["engine", "upstream"]
        healthy = GaugeMetricFamily(
            "voxgate_upstream_healthy", "1 when the upstream's last health check passed", labels=labels
        )
        breaker = GaugeMetricFamily(
            "voxgate_upstream_breaker_state",
            "The upstream's circuit breaker: 0 closed, 1 half-open, 2 open",
            labels=labels,
        )
        in_flight = GaugeMetricFamily(
            "voxgate_upstream_in_flight", "Requests in flight on the upstream", labels=labels
        )
        for engine in self.engines:
            pool = getattr(engine, "pool", None)
            if not isinstance(pool, UpstreamPool):
                continue
            for upstream in pool.upstreams:
                key = [engine.name, upstream.label]  # scheme://host:port: no credentials, no path
                healthy.add_metric(key, 1.0 if upstream.healthy else 0.0)
                breaker.add_metric(key, float(_BREAKER[pool.breaker(upstream)]))
                in_flight.add_metric(key, float(upstream.outstanding))
        yield from (healthy, breaker, in_flight)


_BREAKER = {"closed": BREAKER_CLOSED, "half_open": BREAKER_HALF_OPEN, "open": BREAKER_OPEN}


async def metrics_endpoint(request: Request) -> Response:
    """``GET /metrics``: the Prometheus text format."""
    metrics: Metrics = request.state.metrics
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
