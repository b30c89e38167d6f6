"""Whose ``X-Forwarded-For`` the gateway believes: nobody's by default, only ``trusted_proxies``'.

uvicorn believes the header from 127.0.0.1 unless told otherwise, so a local client (or one behind a
proxy that passes the header through) picked a new address, and a fresh rate-limit bucket, with each
request (issue 18 #17: 300/300 requests passed a limit that let 53/120 through). The server here runs
with the uvicorn options of ``voxgate serve`` (``voxgate.gateway.server.config.uvicorn_http_options``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.app import create_app
from voxgate.gateway.server.config import uvicorn_http_options
from voxgate.gateway.settings import Settings

from tests.conftest import TIMEOUT_S, serve

#: Low enough that no token comes back during the test, however slow the machine.
LIMITS: dict[str, object] = {"rate_limit_per_s": 0.001, "rate_limit_burst": 2}


@contextmanager
def cli_server(**settings: object) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as voices_dir:
        config = Settings.from_env({}, voices_dir=voices_dir, **LIMITS, **settings)
        with serve(create_app(config, engine=FakeEngine()), **uvicorn_http_options(config)) as address:
            yield f"http://{address}"


def _statuses(base: str, forwarded: list[str]) -> list[int]:
    with httpx.Client(base_url=base, timeout=TIMEOUT_S) as client:
        return [
            client.get("/v1/audio/voices", headers={"X-Forwarded-For": address}).status_code
            for address in forwarded
        ]


def test_a_spoofed_forwarded_address_does_not_escape_the_rate_limit_by_default() -> None:
    with cli_server() as base:
        spoofed = [f"203.0.113.{i}" for i in range(1, 7)]
        assert _statuses(base, spoofed) == [200, 200, 429, 429, 429, 429]


def test_a_trusted_proxy_s_forwarded_address_is_the_client_s() -> None:
    with cli_server(trusted_proxies=("127.0.0.1",)) as base:
        first = _statuses(base, ["203.0.113.1"] * 3)
        second = _statuses(base, ["203.0.113.2"] * 3)
    assert first == [200, 200, 429]
    assert second == [200, 200, 429]  # a client of its own, with its own bucket


def test_a_proxy_not_in_the_trusted_networks_is_not_believed() -> None:
    with cli_server(trusted_proxies=("10.0.0.0/8",)) as base:
        assert _statuses(base, [f"203.0.113.{i}" for i in range(1, 5)]) == [200, 200, 429, 429]


def test_the_serve_options_trust_nobody_without_the_setting() -> None:
    options = uvicorn_http_options(Settings.from_env({}))
    assert options["proxy_headers"] is False and options["forwarded_allow_ips"] == []
    trusted = uvicorn_http_options(Settings.from_env({"VOXGATE_TRUSTED_PROXIES": "10.0.0.1, 10.1.0.0/16"}))
    assert trusted["proxy_headers"] is True
    assert trusted["forwarded_allow_ips"] == ["10.0.0.1", "10.1.0.0/16"]
