"""``word_timestamps`` through the gateway: engines that cannot time words refuse it by name."""

from __future__ import annotations

import pytest
from voxgate.engine.fake import FakeEngine
from websockets.sync.client import connect

from tests.conftest import TIMEOUT_S, recv, send, serve_engine


@pytest.mark.parametrize("value", [True])
def test_an_engine_without_word_timings_refuses_them_by_name(value: bool) -> None:
    with serve_engine(FakeEngine()) as address:
        with connect(f"ws://{address}/v1/audio/speech/stream", open_timeout=TIMEOUT_S) as ws:
            send(ws, type="session.config", word_timestamps=value)
            refused = recv(ws)
    assert isinstance(refused, dict) and refused["type"] == "error", refused
    assert "word_timestamps" in str(refused["message"]) and "fake" in str(refused["message"])


def test_false_is_accepted_by_an_engine_without_them() -> None:
    with serve_engine(FakeEngine()) as address:
        with connect(f"ws://{address}/v1/audio/speech/stream", open_timeout=TIMEOUT_S) as ws:
            send(ws, type="session.config", word_timestamps=False)
            send(ws, type="input.text", text="Hi.")
            send(ws, type="input.done")
            types: list[str] = []
            while not types or types[-1] != "session.done":
                item = recv(ws)
                types.append("<audio>" if isinstance(item, bytes) else str(item["type"]))
    assert "error" not in types and "audio.chunk" not in types and "<audio>" in types
