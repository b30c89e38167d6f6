"""The Starlette application: routes, and the lifespan that owns the engine."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypedDict

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from engine import ENGINES, TTSEngine
from gateway.settings import Settings
from gateway.ws import speech_stream

logger = logging.getLogger(__name__)
WEB_DIR = Path(__file__).resolve().parent.parent / "web"


class State(TypedDict):
    """What the lifespan hands to every request."""

    engine: TTSEngine
    settings: Settings


async def healthz(request: Request) -> JSONResponse:
    """The process is up."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> JSONResponse:
    """The engine is loaded and answering."""
    engine: TTSEngine = request.state.engine
    try:
        ready = await engine.ready()
    except Exception as exc:  # a probe: any failure means "not ready", with the reason shown
        return JSONResponse({"status": "unavailable", "engines": {engine.name: f"error: {exc}"}}, status_code=503)
    status = "ready" if ready else "loading"
    return JSONResponse({"status": status, "engines": {engine.name: status}}, status_code=200 if ready else 503)


def create_app(settings: Settings | None = None, engine: TTSEngine | None = None) -> Starlette:
    """Build the app; ``engine`` overrides the one named in ``settings`` (tests inject a FakeEngine)."""
    settings = settings or Settings.from_env()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        active = engine or ENGINES[settings.engine](settings)
        await active.start()
        logger.info("engine %s ready at %d Hz", active.name, active.sample_rate)
        try:
            yield {"engine": active, "settings": settings}
        finally:
            await active.aclose()

    routes: list[Route | WebSocketRoute | Mount] = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        WebSocketRoute("/v1/audio/speech/stream", speech_stream),
    ]
    if WEB_DIR.is_dir():
        routes.append(Mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web"))
    return Starlette(routes=routes, lifespan=lifespan)
