"""Issue 35 L1: every ``bitrate`` the protocol documents (6000-320000) opens a session, opus included.

libopus takes at most 256 kbit/s for mono audio; above that the session used to end with
``internal_error`` (1011) and a traceback. It is now encoded at 256 kbit/s, as ``session.ready`` says.
"""

from __future__ import annotations

import pytest
from voxgate.engine.fake import FakeEngine

from tests.conftest import recv, recv_until, send, serve_engine, voxgate_connect

URL = "/v1/audio/speech/stream"


@pytest.mark.parametrize(("asked", "used"), [(256_001, 256_000), (320_000, 256_000), (64_000, 64_000)])
def test_an_opus_bitrate_in_the_documented_range_speaks(asked: int, used: int) -> None:
    with serve_engine(FakeEngine()) as address, voxgate_connect(f"ws://{address}{URL}") as ws:
        send(ws, type="session.config", response_format="opus", sample_rate=24000, bitrate=asked)
        ready = recv(ws)
        assert isinstance(ready, dict) and ready["type"] == "session.ready", ready
        config = ready["config"]
        assert isinstance(config, dict) and config["bitrate"] == used
        send(ws, type="input.text", text="Hello there.")
        send(ws, type="input.done")
        got = recv_until(ws, "session.done")
    assert got.frames() and not got.messages("error")
