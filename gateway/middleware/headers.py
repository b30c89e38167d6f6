"""Security headers on every HTTP response, and a Content-Security-Policy for the demo page.

``X-Content-Type-Options: nosniff`` goes on every response (API errors, audio, the page's files), so a
browser never runs an upload or an error body as a script or a page. HTML responses (the demo page in
web/) also get ``CONTENT_SECURITY_POLICY``: the page is plain ES modules and an AudioWorklet served by the
gateway itself, with no inline script or style and no CDN, so everything comes from ``'self'``; the voice
preview plays a ``blob:`` URL, and the icon is a ``data:`` URL.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; media-src 'self' blob:; worker-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


class SecurityHeadersMiddleware:
    """Adds ``nosniff`` to every HTTP response and the CSP to HTML ones (headers already set are kept)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                if b"x-content-type-options" not in names:
                    headers.append((b"x-content-type-options", b"nosniff"))
                content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                if content_type.startswith(b"text/html") and b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", CONTENT_SECURITY_POLICY.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
