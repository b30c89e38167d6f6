"""The one uvicorn configuration: what ``voxgate serve``, the tests' servers and the benches run.

``server_config`` builds ``uvicorn.Config`` for an app from the settings: the HTTP protocol with the header
timeout and size limit (``gateway.server.serve.http_protocol``), the proxies believed, and the WebSocket
implementation with its limits (``uvicorn_ws_options``). Whoever runs the gateway passes only what differs
(host and port, a log level, a socket); everything that protects the server comes from here.
"""

from __future__ import annotations

from typing import Any

import uvicorn
from starlette.types import ASGIApp

from ..settings import Settings
from .serve import DRAIN_GRACE_S, http_protocol


def uvicorn_http_options(settings: Settings, impl: str = "auto") -> dict[str, Any]:
    """uvicorn's HTTP protocol (``impl``: ``auto``, ``h11`` or ``httptools``) with the header timeout and
    size limit (``gateway.server.serve.http_protocol``), and whose ``X-Forwarded-*`` headers it believes.

    uvicorn believes them from 127.0.0.1 unless told otherwise (its ``forwarded_allow_ips``): here only
    from ``trusted_proxies``, and with none, from nobody.
    """
    return {
        "http": http_protocol(settings.header_timeout_s, impl, settings.max_header_bytes),
        "proxy_headers": bool(settings.trusted_proxies),
        "forwarded_allow_ips": list(settings.trusted_proxies),
    }


def uvicorn_ws_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's WebSocket implementation, message limit, compression and keepalive.

    The limit sits above ours, so an oversized message gets our error, and far larger ones a 1009 from
    uvicorn as soon as their frame header (or the fragment past the limit) arrives. The sans-I/O
    implementation is chosen by name: uvicorn's legacy ``websockets`` one, "auto" in older releases,
    closes an uncompressed 50 MB message only after the config timeout (10 s). permessage-deflate is
    accepted only with ``ws_compression`` (uvicorn accepts it whenever a client offers it). The keepalive
    is ``ws_ping_interval_s`` / ``ws_ping_timeout_s`` (0: none); with read receipts it pings only a
    connection with nothing in flight (``gateway.session.receipts``), so a client far behind is not cut.
    """
    from uvicorn.config import WS_PROTOCOLS

    options: dict[str, Any] = {
        "ws_max_size": settings.max_config_bytes + 1024 * 1024,
        "ws_per_message_deflate": settings.ws_compression,
        "ws_ping_interval": settings.ws_ping_interval_s or None,
        "ws_ping_timeout": settings.ws_ping_timeout_s or None,
    }
    if "websockets-sansio" in WS_PROTOCOLS:
        from ..session.receipts import ReceiptProtocol

        options["ws"] = ReceiptProtocol  # the sans-I/O one, with read receipts (gateway.session.receipts)
    return options


def server_config(
    app: ASGIApp, settings: Settings, *, impl: str = "auto", **overrides: Any
) -> uvicorn.Config:
    """``uvicorn.Config`` for ``app`` as ``voxgate serve`` runs it (``settings``' host, port, log level, HTTP
    and WebSocket options, a graceful shutdown as long as the drain); ``overrides`` replace any of them."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "lifespan": "on",
        "timeout_graceful_shutdown": int(DRAIN_GRACE_S) + 1,  # then what is left is cancelled
        **uvicorn_http_options(settings, impl),
        **uvicorn_ws_options(settings),
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)
