"""REST voice routes (skeleton: being implemented)."""

from __future__ import annotations

from starlette.routing import Route

routes: list[Route] = []
