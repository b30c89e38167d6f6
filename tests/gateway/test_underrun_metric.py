"""``voxgate_underrun_seconds``: the silence a real-time listener hears inside utterances, per surface."""

from __future__ import annotations

from voxgate.engine.fake import FakeEngine

from tests.conftest import serve_engine
from tests.gateway.test_metrics import settle, speak, value

NAME = "voxgate_underrun_seconds_total"


def test_an_engine_slower_than_real_time_is_heard_as_underruns_and_a_fast_one_is_not() -> None:
    # 250 ms chunks, each 350 ms after the one before: every chunk after the first comes 100 ms late.
    with serve_engine(FakeEngine(delay_s=0.35)) as address:
        speak(address, "One short sentence here.")
        series = settle(address, "voxgate_sessions_active", engine="fake", dialect="voxgate.v1")
    assert value(series, NAME, engine="fake", dialect="voxgate.v1") >= 0.1 * 4
    with serve_engine(FakeEngine()) as address:
        speak(address, "One short sentence here.")
        series = settle(address, "voxgate_sessions_active", engine="fake", dialect="voxgate.v1")
    assert value(series, NAME, engine="fake", dialect="voxgate.v1") == 0.0
