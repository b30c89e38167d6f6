"""Hostile WebSocket messages against a real uvicorn server: structured errors, fast closes, no tracebacks."""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from websockets.exceptions import ConnectionClosed

from engine.fake import FakeEngine
from gateway.app import create_app
from gateway.cli import ws_max_size
from gateway.settings import Settings
from tests.conftest import recv, recv_message, recv_until, send, serve, serve_engine, session, voxgate_connect

URL = "/v1/audio/speech/stream"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def problems() -> Iterator[list[logging.LogRecord]]:
    """Records at WARNING or above, or with a traceback, that any logger emits while the block runs."""
    handler = _Records()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.access")]
    for logger in loggers:
        logger.addHandler(handler)
    found: list[logging.LogRecord] = []
    try:
        yield found
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        found.extend(r for r in handler.records if r.levelno >= logging.WARNING or r.exc_info)


def test_deeply_nested_json_after_config_is_a_non_fatal_invalid_json_without_a_traceback() -> None:
    deep = '{"type": "input.text", "text": ' + "[" * 1000 + "]" * 1000 + "}"
    with problems() as found, serve_engine(FakeEngine()) as address, session(address) as ws:
        for _ in range(3):
            ws.send(deep)
            error = recv_message(ws)
            assert error["type"] == "error" and error["code"] == "invalid_json" and error["fatal"] is False
        send(ws, type="input.text", text="Still here.")
        send(ws, type="input.done")
        got = recv_until(ws, "session.done")
    assert got.frames()
    assert not found, [r.getMessage() for r in found]


@pytest.mark.parametrize("fragmented", [False, True])
def test_a_50_mb_config_closes_with_1009_as_served_by_the_cli(fragmented: bool) -> None:
    big = json.dumps({"type": "session.config", "instructions": "x" * 50_000_000})
    with tempfile.TemporaryDirectory() as voices_dir:
        # A long config timeout: a close for any other reason than the size would show as 4008 much later.
        settings = Settings(config_timeout_s=600.0, voices_dir=voices_dir)
        app = create_app(settings, engine=FakeEngine())
        with serve(app, ws_max_size=ws_max_size(settings)) as address:
            with voxgate_connect(f"ws://{address}{URL}", max_size=None) as ws:
                try:
                    if fragmented:
                        ws.send(big[i : i + 65536] for i in range(0, len(big), 65536))
                    else:
                        ws.send(big)
                    while True:
                        item = recv(ws)
                        assert isinstance(item, dict) and item["code"] == "message_too_large", item
                except ConnectionClosed as closed:
                    if fragmented and closed.rcvd is None:
                        # uvicorn fails the connection at the fragment that passes the limit and closes TCP
                        # while this client still has 45 MB to send: the reset can beat the close frame.
                        # Either way the session ended at once, not at the (10 min) config timeout.
                        return
                    assert closed.rcvd is not None and closed.rcvd.code == 1009, closed
                except OSError:  # the same reset, seen while sending
                    assert fragmented
