"""API keys and the WebSocket Origin check, as one ASGI middleware.

When keys are configured, every route except the public ones needs a key: ``Authorization: Bearer
KEY``, or for browsers (which cannot set headers on a WebSocket) an ``api_key`` query parameter or a
``Sec-WebSocket-Protocol`` entry ``voxgate.key.KEY``; ElevenLabs clients send theirs as ElevenLabs
wants it, an ``xi-api-key`` header or query parameter (``xi_api_key`` too), which counts the same.
The caller's identity, ``owner``, is a hash of the key (never the key itself) and is what uploaded
voices belong to; with no keys configured every caller is the same anonymous owner ``""``.

Browsers are also checked against an Origin allowlist (cross-site WebSocket hijacking, DNS rebinding,
cross-site form posts): loopback origins (``localhost``, ``127.0.0.1``, ``[::1]``, any port), the
gateway's own configured ``host:port`` when it binds one specific host, and ``allowed_origins``. The
request's ``Host`` header is never trusted for this. The check covers WebSockets and the REST requests
that may change state (any method but GET, HEAD and OPTIONS under ``/v1/``); requests without an Origin
header (SDKs, curl) are not browsers and pass. Refused WebSockets are closed before they are accepted,
which the server answers with HTTP 403; refused REST requests get a 403 ``origin_not_allowed``.

Wrong keys are rate-limited per client address (``FailedAuth``): past ``FAILED_AUTH_BURST`` failures a
caller gets 429 ``rate_limited`` with ``Retry-After`` until a failure's token is back (one every
``1 / FAILED_AUTH_PER_S`` seconds), so keys cannot be guessed at the speed of the server (2,441 a second
before). A valid key is checked first and never counted nor slowed down, from any address.

Keys never reach the logs: ``install_redaction`` redacts every log record the process makes. A configured
key is redacted where it stands as a whole token, not inside a longer word: redacting the letters of a
short key inside ``site-packages`` would tell a log reader which letters the key holds.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs, quote, quote_plus, unquote_plus, urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from ..logs import rewrite_record

#: Routes that never need a key: the probes; everything outside API_PREFIX (the demo page) is public too.
PUBLIC_PATHS = frozenset({"/healthz", "/health", "/readyz"})
#: Where the API routes live: under /v1/ (voxgate, OpenAI, ElevenLabs, Deepgram), and Cartesia's /tts/.
API_PREFIX = ("/v1/", "/tts/")
SUBPROTOCOL = "voxgate"
KEY_SUBPROTOCOL_PREFIX = "voxgate.key."
_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_ANY_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
#: Methods that may change state: from a browser they need an allowed Origin (a "simple" cross-site POST,
#: a form or multipart upload, is sent without a CORS preflight).
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Failed key checks (a wrong or missing key) a client address may make at once, and how fast that
#: allowance comes back: 20 at once, then one every 5 s (12 a minute) instead of thousands a second.
FAILED_AUTH_BURST = 20
FAILED_AUTH_PER_S = 0.2


KEY_PARAM = "api_key"
#: ElevenLabs' names for the key, as a header and as query parameters (``gateway/routes/elevenlabs_ws.py``).
XI_KEY_HEADER = "xi-api-key"
KEY_PARAMS = (KEY_PARAM, "xi-api-key", "xi_api_key")
#: ``Authorization`` schemes that carry a key: ``Token`` is Deepgram's.
AUTH_SCHEMES = ("bearer", "token")
#: Headers that carry a key: ElevenLabs' and Cartesia's (``X-API-Key``).
KEY_HEADERS = (XI_KEY_HEADER, "x-api-key")
REDACTED = "***"

# ``name=value`` in a query string or a log line; the name is judged once percent-decoded (below).
_PARAM = re.compile(r"(^|[?&\s;,\"'(\[])([^=?/&#\s;,\"'()\[\]]+)=([^&#\s;,\"')\]]*)")
_JSON_KEY = re.compile(r"(?i)(\b(?:xi[-_])?api(?:_|%5f|-)key[\"']?\s*:\s*[\"']?)[^\s,\"'&}]+")
_BEARER = re.compile(r"(?i)(\bbearer\s+)[^\s,\"')\]]+")
_KEY_PROTOCOL = re.compile(r"(?i)(\bvoxgate\.key\.)[^\s,\"')\]]+")
_known: set[str] = set()
_known_pattern: re.Pattern[str] | None = None
_factory_installed = False


def _secret_param(name: str, value: str) -> bool:
    return _is_key_param(name) or unquote_plus(value) in _known


def _is_key_param(name: str) -> bool:
    for _ in range(4):  # percent-encoded names, also encoded twice (``api%255Fkey``)
        decoded = unquote_plus(name)
        if decoded == name:
            break
        name = decoded
    return name.strip().lower() in KEY_PARAMS


def redact(text: str) -> str:
    """``text`` with every API key in it replaced by ``***``: the configured keys wherever they appear
    (also percent-encoded), and whatever follows ``api_key=`` or ``xi-api-key=`` (any case,
    percent-encoded name),
    ``Bearer`` or the subprotocol prefix ``voxgate.key.``."""
    if _known_pattern is not None:
        text = _known_pattern.sub(REDACTED, text)
    text = _PARAM.sub(lambda m: f"{m[1]}{m[2]}={REDACTED}" if _secret_param(m[2], m[3]) else m[0], text)
    text = _JSON_KEY.sub(rf"\g<1>{REDACTED}", text)
    text = _BEARER.sub(rf"\g<1>{REDACTED}", text)
    return _KEY_PROTOCOL.sub(rf"\g<1>{REDACTED}", text)


def _redact_arg(arg: object) -> object:
    if arg is None or isinstance(arg, (int, float)):
        return arg
    if isinstance(arg, str):
        return redact(arg)
    try:
        text = str(arg)
    except Exception:  # an argument that cannot render itself is left to the formatter
        return arg
    redacted = redact(text)
    return arg if redacted == text else redacted


def redact_record(record: logging.LogRecord) -> None:
    """Redact keys from a record's message, arguments, traceback and stack, keeping the arguments' shape
    (uvicorn's access formatter unpacks them)."""
    rewrite_record(record, redact, _redact_arg, redact)


class RedactKeys(logging.Filter):
    """Hides API keys in log records (uvicorn logs request paths with their query string)."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


def install_redaction(keys: Iterable[str] = ()) -> None:
    """Redact API keys from every log record made in this process, by any logger, whatever handlers
    are configured later (uvicorn configures its own): a log record factory redacts each record as it
    is made. ``keys`` are also redacted wherever they appear, plain or percent-encoded."""
    global _known_pattern, _factory_installed
    new = {k for key in keys if key for k in (key, quote(key, safe=""), quote_plus(key))} - _known
    if new:
        _known.update(new)
        alternatives = sorted(_known, key=len, reverse=True)
        # Whole tokens only: not inside a longer word (``site-packages`` keeps its ``ka``), but right
        # after a percent-escape (``%20KEY``) too.
        either = "|".join(re.escape(k) for k in alternatives)
        _known_pattern = re.compile(rf"(?:(?<=%[0-9A-Fa-f]{{2}})|(?<!\w))(?:{either})(?!\w)")
    if not _factory_installed:
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            redact_record(record)
            return record

        logging.setLogRecordFactory(factory)
        _factory_installed = True


def owner_of(key: str) -> str:
    """The stable, non-reversible identity of an API key."""
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def presented_key(scope: Scope) -> str | None:
    """The API key a request carries, wherever it put it."""
    headers = _headers(scope)
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    if scheme.lower() in AUTH_SCHEMES and credentials.strip():
        return credentials.strip()
    for name in KEY_HEADERS:
        if headers.get(name):
            return headers[name].strip()
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    for name in KEY_PARAMS:
        if query.get(name):  # parse_qs decodes names, so ``api%5Fkey`` is the same parameter
            return str(query[name][0])
    for proto in scope.get("subprotocols", []) or []:
        if proto.startswith(KEY_SUBPROTOCOL_PREFIX):
            return str(proto[len(KEY_SUBPROTOCOL_PREFIX) :])
    return None


def canonical_origin(origin: str) -> str | None:
    """``scheme://host[:port]`` in lower case without a default port, as browsers send it; None if it is
    not an http(s) origin (``null``, ``file://``, garbage)."""
    try:
        parts = urlsplit(origin.strip().rstrip("/"))
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host or parts.path or parts.query or parts.username:
        return None
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        netloc = f"{netloc}:{port}"
    return f"{scheme}://{netloc}"


def server_origins(host: str, port: int) -> frozenset[str]:
    """The origins of the gateway's own configured address, when it binds one specific host (behind
    ``0.0.0.0`` or ``::`` the address browsers use is unknown: list it in ``allowed_origins``)."""
    if host in _ANY_HOSTS:
        return frozenset()
    netloc = f"[{host}]" if ":" in host and not host.startswith("[") else host
    found = (canonical_origin(f"{scheme}://{netloc}:{port}") for scheme in _DEFAULT_PORTS)
    return frozenset(o for o in found if o is not None)


def origin_allowed(origin: str | None, allowed: frozenset[str]) -> bool:
    """Whether a browser request from ``origin`` may go on: no Origin (not a browser), a loopback origin,
    or one in ``allowed`` (canonical origins; ``*`` allows all). The request's own ``Host`` header is never
    trusted: under DNS rebinding an attacker's name points at this server, and Host says that name too."""
    if origin is None or "*" in allowed:
        return True
    canonical = canonical_origin(origin)
    if canonical is None:
        return False
    host = urlsplit(canonical).hostname or ""
    return host in _LOOPBACK_HOSTS or canonical in allowed


class AuthMiddleware:
    """Checks keys and origins, then records ``owner`` in the request state."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
        server: tuple[str, int] | None = None,
        keyed_paths: Iterable[str] = (),
        failed_auth_burst: int = FAILED_AUTH_BURST,
        failed_auth_per_s: float = FAILED_AUTH_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from .ratelimit import TokenBuckets

        self.app = app
        #: Failed key checks per client address (``FAILED_AUTH_*``); valid keys never take from it.
        self.failures = TokenBuckets(failed_auth_per_s, failed_auth_burst)
        self.clock = clock
        self.keyed_paths = frozenset(keyed_paths)  # paths outside API_PREFIX that need a key too
        self.keys = {owner_of(k): k for k in keys if k}
        install_redaction(self.keys.values())
        listed = {"*" if o.strip() == "*" else canonical_origin(o) for o in allowed_origins}
        own = server_origins(*server) if server is not None else frozenset()
        self.allowed_origins = frozenset(o for o in listed if o is not None) | own

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

    def _failed(self, scope: Scope) -> int:
        """Count a failed key check from the scope's client address; the seconds to wait (``Retry-After``)
        once the address is past its allowance, else 0. The address is the ASGI ``client``: the TCP peer's,
        or the ``X-Forwarded-For`` one only behind a trusted proxy (``gateway.server.config``)."""
        from .ratelimit import retry_after

        client = scope.get("client")
        wait_s = self.failures.take(str(client[0]) if client else "", self.clock())
        return retry_after(wait_s) if wait_s else 0

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
        origin_ok = origin_allowed(_headers(scope).get("origin"), self.allowed_origins)
        if scope["type"] == "websocket":
            if not origin_ok or owner is None:
                await receive()  # websocket.connect
                if "websocket.http.response" not in scope.get("extensions", {}):
                    await send({"type": "websocket.close", "code": 1008, "reason": "forbidden"})
                    return
                # The ASGI denial response: a 403 with the reason and the security headers, as on REST.
                if not origin_ok:
                    await _refuse(send, 403, _ORIGIN_REFUSED, "origin_not_allowed", kind="websocket.http")
                elif wait := self._failed(scope):
                    await _too_many(send, wait, kind="websocket.http")
                else:
                    await _refuse(send, 403, _KEY_REFUSED, "invalid_api_key", kind="websocket.http")
                return
        elif not origin_ok and scope["method"] not in _SAFE_METHODS and not self._public(scope["path"]):
            await _refuse(send, 403, _ORIGIN_REFUSED, "origin_not_allowed")
            return
        elif owner is None and not self._public(scope["path"]):
            if wait := self._failed(scope):
                await _too_many(send, wait)
            else:
                await _refuse(send, 401, _KEY_REFUSED, "invalid_api_key", [(b"www-authenticate", b"Bearer")])
            return
        scope.setdefault("state", {})["owner"] = owner if owner is not None else ""
        await self.app(scope, receive, send)


_ORIGIN_REFUSED = "this origin may not call this route: add it to VOXGATE_ALLOWED_ORIGINS"
_KEY_REFUSED = "missing or invalid API key: send Authorization: Bearer <key>"


async def _too_many(send: Send, wait_s: int, *, kind: str = "http") -> None:
    """429 ``rate_limited`` with ``Retry-After``: the address tried too many wrong keys."""
    message = f"too many failed API key checks from this address: retry in {wait_s} s"
    headers = [(b"retry-after", str(wait_s).encode())]
    await _refuse(send, 429, message, "rate_limited", headers, kind=kind)


async def _refuse(
    send: Send,
    status: int,
    message: str,
    code: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    kind: str = "http",
) -> None:
    """An OpenAI-style JSON error; ``kind`` ``websocket.http`` sends it as a WebSocket denial response."""
    body = json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    ).encode()
    start_headers = [(b"content-type", b"application/json"), *(headers or [])]
    if kind != "http":  # the security headers middleware sees only HTTP scopes
        start_headers.append((b"x-content-type-options", b"nosniff"))
    await send({"type": f"{kind}.response.start", "status": status, "headers": start_headers})
    await send({"type": f"{kind}.response.body", "body": body})
