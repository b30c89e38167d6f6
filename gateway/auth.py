"""API keys and the WebSocket Origin check, as one ASGI middleware.

When keys are configured, every route except the public ones needs a key: ``Authorization: Bearer
KEY``, or for browsers (which cannot set headers on a WebSocket) an ``api_key`` query parameter or a
``Sec-WebSocket-Protocol`` entry ``voxgate.key.KEY``. The caller's identity, ``owner``, is a hash of
the key (never the key itself) and is what uploaded voices belong to; with no keys configured every
caller is the same anonymous owner ``""``.

WebSockets are also checked against an Origin allowlist (cross-site WebSocket hijacking): by default
the page's own origin and localhost. Refused WebSockets are closed before they are accepted, which
the server answers with HTTP 403.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Iterable
from urllib.parse import parse_qs, urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

#: Routes that never need a key: the probes; everything outside API_PREFIX (the demo page) is public too.
PUBLIC_PATHS = frozenset({"/healthz", "/health", "/readyz"})
API_PREFIX = "/v1/"
SUBPROTOCOL = "voxgate"
KEY_SUBPROTOCOL_PREFIX = "voxgate.key."
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})


_KEY_IN_URL = re.compile(r"(api_key=)[^&\s\"']+")


class RedactKeys(logging.Filter):
    """Hides ``api_key=...`` in log records (uvicorn logs request paths with their query string)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _KEY_IN_URL.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args
            )
        if isinstance(record.msg, str):
            record.msg = _KEY_IN_URL.sub(r"\1***", record.msg)
        return True


def owner_of(key: str) -> str:
    """The stable, non-reversible identity of an API key."""
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def presented_key(scope: Scope) -> str | None:
    """The API key a request carries, wherever it put it."""
    headers = _headers(scope)
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if query.get("api_key"):
        return str(query["api_key"][0])
    for proto in scope.get("subprotocols", []) or []:
        if proto.startswith(KEY_SUBPROTOCOL_PREFIX):
            return str(proto[len(KEY_SUBPROTOCOL_PREFIX) :])
    return None


def origin_allowed(scope: Scope, allowed: frozenset[str]) -> bool:
    """Whether a WebSocket may connect: no Origin (not a browser), same origin, localhost or listed."""
    headers = _headers(scope)
    origin = headers.get("origin")
    if origin is None or "*" in allowed or origin in allowed:
        return True
    parts = urlsplit(origin)
    host = parts.hostname or ""
    if host in _LOCAL_HOSTS or f"[{host}]" in _LOCAL_HOSTS:
        return True
    return parts.netloc == headers.get("host")


class AuthMiddleware:
    """Checks keys and origins, then records ``owner`` in the request state."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
        keyed_paths: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.keyed_paths = frozenset(keyed_paths)  # paths outside API_PREFIX that need a key too
        self.keys = {owner_of(k): k for k in keys if k}
        self.allowed_origins = frozenset(allowed_origins)

    def owner(self, scope: Scope) -> str | None:
        """The caller's owner id, ``""`` when keys are off, None when the key is missing or wrong."""
        if not self.keys:
            return ""
        key = presented_key(scope)
        if key is None:
            return None
        owner = owner_of(key)
        stored = self.keys.get(owner)
        return owner if stored is not None and hmac.compare_digest(stored, key) else None

    def _public(self, path: str) -> bool:
        # Every API route lives under /v1/; the rest is probes and the demo page's static files.
        if path in self.keyed_paths:
            return False
        return path in PUBLIC_PATHS or not path.startswith(API_PREFIX)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        owner = self.owner(scope)
        if scope["type"] == "websocket":
            if not origin_allowed(scope, self.allowed_origins) or owner is None:
                await receive()  # websocket.connect
                await send({"type": "websocket.close", "code": 1008, "reason": "forbidden"})
                return
        elif owner is None and not self._public(scope["path"]):
            body = json.dumps(
                {
                    "error": {
                        "message": "missing or invalid API key: send Authorization: Bearer <key>",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "invalid_api_key",
                    }
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        scope.setdefault("state", {})["owner"] = owner if owner is not None else ""
        await self.app(scope, receive, send)
