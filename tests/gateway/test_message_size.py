"""A message past the configured size, after the config, closes the session with 1009 (as served by the CLI).

(Before the config: tests/gateway/test_hostile_messages.py, the 50 MB config; between ``max_message_bytes``
and uvicorn's limit, a non-fatal ``message_too_large``: tests/gateway/test_stream.py.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile

import pytest
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.app import create_app
from voxgate.gateway.server.config import uvicorn_ws_options
from voxgate.gateway.settings import Settings
from websockets.exceptions import ConnectionClosed

from tests.conftest import TIMEOUT_S, recv, recv_message, recv_until, send, serve, session, voxgate_connect


@pytest.mark.parametrize("compression", ["deflate", None])
def test_a_message_past_the_limit_after_config_closes_with_1009_and_the_server_serves_on(
    compression: str | None,
) -> None:
    with tempfile.TemporaryDirectory() as voices_dir:
        # A small limit, so the message past it is cheap: uvicorn's frame limit is max_config_bytes + 1 MiB.
        settings = Settings(voices_dir=voices_dir, max_config_bytes=64 * 1024, idle_timeout_s=TIMEOUT_S * 4)
        limit = uvicorn_ws_options(settings)["ws_max_size"]
        big = json.dumps({"type": "input.text", "text": "x" * (limit + 1024)})
        with serve(create_app(settings, engine=FakeEngine()), **uvicorn_ws_options(settings)) as address:
            url = f"ws://{address}/v1/audio/speech/stream"
            with voxgate_connect(url, max_size=None, compression=compression) as ws:
                send(ws, type="session.config")
                assert recv_message(ws)["type"] == "session.ready"
                code: int | None = None
                try:
                    ws.send(big)
                    while True:  # nothing but the close may come: the message is never answered
                        item = recv(ws)
                        pytest.fail(f"answered with {item!r}")
                except ConnectionClosed as closed:
                    code = closed.rcvd.code if closed.rcvd else None
                except OSError:  # the server closed TCP while the client was still writing
                    code = None
                # 1009 from uvicorn; a reset before the close frame is the kernel's race (as for configs).
                assert code in (1009, None), code
            with session(address) as ws:
                send(ws, type="input.text", text="Still serving.")
                send(ws, type="input.done")
                assert recv_until(ws, "session.done").frames()


def test_uvicorn_closing_the_socket_while_audio_streams_ends_the_session_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # uvicorn closes the socket on its own, with 1007 on a text frame of invalid UTF-8 or 1009 on a frame
    # past its limit; the session's writer, still sending audio, then meets a socket closed under it
    # (RuntimeError from uvicorn). That ends the session with an info line, never an ERROR with a traceback.
    with tempfile.TemporaryDirectory() as voices_dir:
        settings = Settings(voices_dir=voices_dir, max_config_bytes=64 * 1024, idle_timeout_s=TIMEOUT_S * 4)
        limit = uvicorn_ws_options(settings)["ws_max_size"]
        big = json.dumps({"type": "input.text", "text": "x" * (limit + 1024)})
        engine = FakeEngine(chunk_s=0.02, delay_s=0.002)
        with caplog.at_level(logging.INFO, logger="voxgate"):
            with serve(create_app(settings, engine=engine), **uvicorn_ws_options(settings)) as address:
                for bad in [b"\xff\xfe invalid UTF-8"] * 5 + [big.encode()] * 2:
                    with voxgate_connect(f"ws://{address}/v1/audio/speech/stream", max_size=None) as ws:
                        send(ws, type="session.config")
                        assert recv_message(ws)["type"] == "session.ready"
                        send(ws, type="input.text", text="A long sentence that keeps the writer busy. " * 40)
                        send(ws, type="input.done")
                        assert isinstance(recv(ws), dict)  # audio.start: the writer is streaming
                        with contextlib.suppress(ConnectionClosed, OSError):
                            ws.send(bad, text=True)
                            while True:
                                recv(ws)
                with session(address) as ws:
                    send(ws, type="input.text", text="Still serving.")
                    send(ws, type="input.done")
                    assert recv_until(ws, "session.done").frames()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
