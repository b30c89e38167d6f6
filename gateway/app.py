"""The Starlette application: routes, middleware, and the lifespan that owns the engines."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from importlib import resources
from pathlib import Path
from typing import TypedDict

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from ..engine import ENGINES, TTSEngine
from .metrics import Metrics, metrics_endpoint
from .middleware.auth import AuthMiddleware
from .middleware.headers import SecurityHeadersMiddleware
from .middleware.http import RequestIdMiddleware, WebFiles, http_error
from .middleware.ratelimit import RateLimitMiddleware, rate_limiter
from .middleware.shared_limits import SharedLimits
from .routes import batch, cartesia, deepgram, elevenlabs_dictionaries, elevenlabs_rest, voices, wyoming
from .routes import elevenlabs_ws as elevenlabs
from .routes import openai as speech
from .routes.stream import speech_stream
from .server.sessions import Admission, Sessions
from .settings import Settings
from .voices.backend import VoiceBackend, open_store, parse_location
from .voices.catalog import Catalog
from .voices.clips import MAX_CLIP_RATE, MIN_SAMPLE_RATE
from .voices.dictionaries import DictionaryBackend, open_dictionaries

logger = logging.getLogger(__name__)
# The demo page is package data of voxgate (voxgate/web), in a checkout and in any install.
WEB_DIR = Path(str(resources.files("voxgate.web")))


class State(TypedDict):
    """What the lifespan hands to every request."""

    catalog: Catalog
    dictionaries: DictionaryBackend
    metrics: Metrics
    sessions: Sessions
    settings: Settings
    voices: VoiceBackend


async def healthz(request: Request) -> JSONResponse:
    """The process is up."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> JSONResponse:
    """Every engine is loaded and answering, and the server is not draining; reports each one."""
    catalog: Catalog = request.state.catalog
    if request.state.sessions.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    report: dict[str, str] = {}
    for name, engine in catalog.engines.items():
        try:
            report[name] = "ready" if await engine.ready() else "unavailable"
        except Exception as exc:  # a probe: any failure means "not ready", with the reason shown
            report[name] = f"error: {exc}"
    ready = all(v == "ready" for v in report.values())
    return JSONResponse(
        {"status": "ready" if ready else "unavailable", "engines": report}, status_code=200 if ready else 503
    )


def engine_names(settings: Settings) -> list[str]:
    """The configured engines, in order; the first is the default."""
    return [n.strip() for n in settings.engine.split(",") if n.strip()]


def create_app(
    settings: Settings | None = None, engine: TTSEngine | Sequence[TTSEngine] | None = None
) -> Starlette:
    """Build the app; ``engine`` overrides the engines named in ``settings`` (tests inject FakeEngines)."""
    settings = settings or Settings.from_env()
    if engine is None:
        unknown = [n for n in engine_names(settings) if n not in ENGINES]
        if unknown:
            raise ValueError(f"unknown engine(s) {unknown}; choose from {sorted(ENGINES)}")
    if settings.voice_store:
        parse_location(settings.voice_store)  # a malformed location fails here, not at the first request
    if settings.wyoming:
        wyoming.parse_address(settings.wyoming)  # a malformed address fails here, not as the server starts
    if not MIN_SAMPLE_RATE <= settings.max_clip_rate_hz <= MAX_CLIP_RATE:
        raise ValueError(f"max_clip_rate_hz must be {MIN_SAMPLE_RATE} to {MAX_CLIP_RATE}")
    metrics = Metrics()
    # Per-key caps and rate limits across the fleet (unset: per process).
    shared = SharedLimits(settings.redis_url, lease_s=settings.redis_lease_s) if settings.redis_url else None
    sessions = Sessions(
        drain_timeout_s=settings.drain_timeout_s,
        max_sessions=settings.max_sessions,
        max_sessions_per_key=settings.max_sessions_per_key,
        shared=shared,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        if engine is None:
            engines = [ENGINES[name](settings.engine_settings(name)) for name in engine_names(settings)]
        else:
            engines = [engine] if not isinstance(engine, Sequence) else list(engine)
        store = open_store(settings)
        catalog = Catalog(
            engines, aliases=settings.voice_aliases, store=store, clip_rate_hz=settings.max_clip_rate_hz
        )
        await catalog.start()
        metrics.watch(engines)
        sessions.start()
        if shared is not None:
            await shared.start()
        for e in engines:
            if await e.ready():
                logger.info("engine %s ready at %d Hz", e.name, e.sample_rate)
            else:  # a remote engine whose upstreams are all down: it serves, but every request fails
                logger.warning(
                    "engine %s is NOT ready: its upstream is unreachable (no upstream answers); requests "
                    "fail and GET /readyz is 503 until one answers",
                    e.name,
                )
        # Home Assistant's Wyoming protocol, beside the HTTP server, on the same catalog (None unless asked).
        app.state.wyoming = await wyoming.start(settings, catalog, metrics, sessions)
        try:
            yield {
                "catalog": catalog,
                "dictionaries": open_dictionaries(settings, store),
                "metrics": metrics,
                "sessions": sessions,
                "settings": settings,
                "voices": store,
            }
        finally:
            if app.state.wyoming is not None:
                await app.state.wyoming.aclose()
            if shared is not None:
                await shared.aclose()
            await catalog.aclose()

    routes: list[BaseRoute] = [
        Route("/healthz", healthz),
        Route("/health", healthz),  # the path vllm-omni serves, so a gateway can be another's upstream
        Route("/readyz", readyz),
        Route("/metrics", metrics_endpoint),
        WebSocketRoute("/v1/audio/speech/stream", speech_stream),
        *voices.routes,
        *speech.routes,
        *batch.routes,
        *elevenlabs.routes,
        *elevenlabs_rest.routes,
        *elevenlabs_dictionaries.routes,
        *cartesia.routes,
        *deepgram.routes,
    ]
    limiter = rate_limiter(settings.rate_limit_per_s, settings.rate_limit_burst, shared=shared)
    middleware = [
        Middleware(SecurityHeadersMiddleware),  # outermost: the auth middleware's refusals get them too
        Middleware(RequestIdMiddleware),
        Middleware(
            AuthMiddleware,
            keys=settings.all_api_keys(),
            allowed_origins=settings.allowed_origins,
            server=(settings.host, settings.port),
            keyed_paths=() if settings.metrics_public else ("/metrics",),
        ),
        Middleware(RateLimitMiddleware, limiter=limiter),
        Middleware(Admission, sessions=sessions),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=middleware,
        exception_handlers={404: http_error, 405: http_error},
    )
    app.state.sessions = sessions  # voxgate serve drains them on SIGTERM
    # A path no route serves is the page's (not a Mount at "/", which would take every path, and answer
    # 405 to a POST anywhere instead of the 404, or of a route's own 405): a file, else the JSON 404, and
    # a WebSocket's 404, not Starlette's close (403). No slash redirects: "/healthz/" is a 404.
    app.router.default = WebFiles(StaticFiles(directory=WEB_DIR, html=True) if WEB_DIR.is_dir() else None)
    app.router.redirect_slashes = False
    return app
