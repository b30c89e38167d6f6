"""An engine's audio per segment is capped by the segment's text: the excess is cut and reported once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np
import pytest
from voxgate.engine.base import AudioChunk
from voxgate.engine.fake import SECONDS_PER_CHAR, FakeEngine
from voxgate.gateway.session.jobs import AudioCap, CappedStream

from tests.conftest import recv_until, send, serve_engine, session

RATE = 16000


async def _tone(seconds: list[float], closed: list[bool]) -> AsyncGenerator[AudioChunk, None]:
    try:
        for s in seconds:
            yield AudioChunk(np.zeros(round(s * RATE), dtype=np.float32), RATE)
    finally:
        closed.append(True)


def test_the_cap_grows_with_the_text_and_shrinks_with_speed() -> None:
    cap = AudioCap(base_s=2.0, per_char_s=0.5)
    assert cap.seconds("abcd") == 4.0
    assert cap.seconds("abcd", speed=2.0) == 2.0


def test_the_chunk_that_crosses_the_cap_is_cut_and_the_engine_stream_closed() -> None:
    async def scenario() -> tuple[list[int], bool, list[bool]]:
        closed: list[bool] = []
        stream = CappedStream(_tone([0.5, 0.5, 0.5, 0.5], closed), max_s=1.25)
        got = [len(chunk.samples) async for chunk in stream]
        return got, stream.truncated, closed

    got, truncated, closed = asyncio.run(scenario())
    assert got == [8000, 8000, 4000]
    assert truncated and closed == [True]


def test_audio_that_ends_at_the_cap_is_not_truncated() -> None:
    async def scenario() -> tuple[list[int], bool]:
        stream = CappedStream(_tone([0.5, 0.5], []), max_s=1.0)
        return [len(chunk.samples) async for chunk in stream], stream.truncated

    assert asyncio.run(scenario()) == ([8000, 8000], False)


def test_closing_an_unread_stream_closes_the_engine_stream() -> None:
    async def scenario() -> list[bool]:
        closed: list[bool] = []
        inner = _tone([0.5], closed)
        await anext(inner)  # an engine that started work when called (vllm-omni submits at once)
        await CappedStream(inner, max_s=1.0).aclose()
        return closed

    assert asyncio.run(scenario()) == [True]


def test_too_much_audio_is_cut_at_the_cap_and_reported_once_without_ending_the_session() -> None:
    engine = FakeEngine(sample_rate=RATE, chunk_s=0.1)
    text = "Hello there, this is a sentence."  # 32 characters: the fake speaks 1.92 s of it
    base_s, per_char_s = 0.2, 0.01  # a cap of 0.52 s
    with serve_engine(
        engine, max_segment_audio_base_s=base_s, max_segment_audio_per_char_s=per_char_s
    ) as address:
        with session(address, response_format="f32", sample_rate=RATE) as ws:
            send(ws, type="input.text", text=text)
            send(ws, type="input.done")
            got = recv_until(ws, "session.done")
            # The session goes on: a short text after it is spoken whole.
            send(ws, type="input.text", text="Hi.")
            send(ws, type="input.done")
            after = recv_until(ws, "session.done")
    cap_s = base_s + per_char_s * len(text)
    assert len(text) * SECONDS_PER_CHAR > 3 * cap_s
    errors = got.messages("error")
    assert [(e["code"], e["fatal"], e["utterance_index"]) for e in errors] == [("audio_truncated", False, 0)]
    assert got.types().index("error") < got.types().index("audio.done")
    samples = sum(len(frame) for frame in got.frames()) // 4
    assert samples == round(cap_s * RATE)
    assert got.messages("session.done")[0]["audio_ms"] == pytest.approx(cap_s * 1000)
    assert engine.finished == 1 and engine.closed == engine.started == 2  # only "Hi." ran to its end
    assert after.messages("error") == []
    assert after.messages("session.done")[0]["audio_ms"] == pytest.approx(3 * SECONDS_PER_CHAR * 1000)


def test_session_ready_publishes_the_cap() -> None:
    with serve_engine(
        FakeEngine(), max_segment_audio_base_s=7.0, max_segment_audio_per_char_s=0.4
    ) as address:
        with session(address) as ws:
            send(ws, type="session.config")
            ready = recv_until(ws, "session.ready").messages("session.ready")[0]
    limits = ready["limits"]
    assert isinstance(limits, dict)
    assert limits["max_segment_audio_base_s"] == 7.0
    assert limits["max_segment_audio_per_char_s"] == 0.4


def test_a_lazy_stream_closed_before_it_is_read_never_calls_the_engine() -> None:
    calls: list[int] = []

    def opener() -> AsyncGenerator[AudioChunk, None]:
        calls.append(1)
        return _tone([0.5], [])

    async def scenario() -> None:
        stream = CappedStream(opener, max_s=1.0)
        await stream.aclose()
        with pytest.raises(StopAsyncIteration):
            await anext(stream)

    asyncio.run(scenario())
    assert calls == []
