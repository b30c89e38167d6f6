"""HTTP helpers shared by the REST routes: OpenAI-style error bodies, bounded bodies, request ids."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import TypeVar

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...protocol.errors import FAILURES, ErrorCode, ProtocolError, field_path

_T = TypeVar("_T")

_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class Rejected(Exception):
    """A client error of the voice routes, clips and forms, answered with ``api_error``: its code is a row of
    the error table (``protocol.errors.FAILURES``), which gives its HTTP status."""

    def __init__(self, code: ErrorCode, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param
        self.status = FAILURES[code].http_status


class BodyTooLarge(Exception):
    """The request body is over the route's limit."""


def api_error(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: ErrorCode | None = None,
    kind: str | None = None,
) -> JSONResponse:
    """An error in OpenAI's shape: ``{"error": {message, type, param, code}}``."""
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status
    )


def error_response(err: ProtocolError) -> JSONResponse:
    """A ``ProtocolError`` as an HTTP error: its status and code from ``protocol.errors.FAILURES``, and
    its ``Retry-After`` when it has one (``upstream_busy``)."""
    response = api_error(err.status, err.message, param=err.param, code=err.code)
    if err.retry_after is not None:
        response.headers["retry-after"] = str(err.retry_after)
    return response


async def read_body(request: Request, limit: int) -> bytes:
    """Read the body, refusing it as soon as it passes ``limit`` bytes (it is never buffered whole)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"body of {declared} bytes is over the {limit} byte limit")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body is over the {limit} byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, limit: int, decode: Callable[[bytes], _T]) -> _T:
    """Read the body (``read_body``) and decode it with ``decode`` (a msgspec decoder).

    Raises:
        ProtocolError: ``request_too_large``, ``invalid_message`` (with the field at fault) or
            ``invalid_json``.
    """
    try:
        return decode(await read_body(request, limit))
    except BodyTooLarge as exc:
        raise ProtocolError(ErrorCode.REQUEST_TOO_LARGE, str(exc), field="$") from exc
    except msgspec.ValidationError as exc:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, str(exc), field=field_path(exc)) from exc
    except msgspec.DecodeError as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"invalid JSON body: {exc}") from exc


class RequestIdMiddleware:
    """Gives every HTTP response an ``x-request-id``: the caller's when sane, else a new one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers", [])).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _SAFE_ID.match(given) else f"req_{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        await self.app(scope, receive, send_with_id)


async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """What a path no route serves gets: a 404 in OpenAI's error shape, over HTTP and WebSocket alike.

    A WebSocket is denied before it is accepted, with the 404 as its HTTP response (ASGI's
    ``websocket.http.response`` extension, which uvicorn supports); a server without the extension can
    only close it, which its client sees as a 403.
    """
    response = api_error(404, f"no route for {scope.get('path', '')!r}", code=ErrorCode.NOT_FOUND)
    if scope["type"] == "websocket":
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        await receive()  # websocket.connect
    await response(scope, receive, send)


#: The ``code`` of the router's own refusals (``HTTPException``), in OpenAI's error shape.
_HTTP_CODES = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}


async def http_error(request: Request, exc: Exception) -> Response:
    """A route's or the static files' 404 or 405 (an ``HTTPException``), in OpenAI's error shape."""
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    if status == 405:
        message = f"method {request.method} is not allowed on {request.url.path!r}"
    else:
        message = f"no route for {request.url.path!r}"
    response = api_error(status, message, code=_HTTP_CODES.get(status, ErrorCode.NOT_FOUND))
    if isinstance(exc, HTTPException) and exc.headers:
        response.headers.update(exc.headers)
    if status == 405:
        # Starlette's 405 names the methods of the first route of the path; routes of one path by method
        # (GET and POST /v1/audio/voices) each have their own, so Allow names them all.
        path = request.url.path
        routes = [r for r in request.app.routes if isinstance(r, Route) and r.path_regex.match(path)]
        methods = {m for r in routes for m in r.methods or ()}
        if methods:
            response.headers["allow"] = ", ".join(sorted(methods))
    return response


class WebFiles:
    """What the router does with a path no route serves: the demo page's files, or a 404.

    GET and HEAD get the file (or the 404). Another method gets the 404 too, unless the file exists: then
    the static files' 405 (``Allow: GET, HEAD``); both in OpenAI's error shape (``http_error``). A WebSocket,
    or any request when the page is not installed, gets ``not_found``.
    """

    def __init__(self, files: ASGIApp | None) -> None:
        self.files = files

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.files is None:
            await not_found(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD") and not await self._serves(scope, receive):
            raise HTTPException(404)
        await self.files(scope, receive, send)

    async def _serves(self, scope: Scope, receive: Receive) -> bool:
        """Whether a GET of the path would find a file: a HEAD of it, with the answer thrown away."""
        assert self.files is not None
        statuses: list[int] = []

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        try:
            await self.files({**scope, "method": "HEAD"}, receive, capture)
        except HTTPException:
            return False
        return bool(statuses) and statuses[0] < 400
