"""Engine work goes earliest deadline first: a session running dry, a new one, then one with audio ahead."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncGenerator

import numpy as np
from voxgate.engine.base import AudioChunk, SynthesisRequest
from voxgate.engine.fake import FakeEngine
from voxgate.engine.workers import DeadlineWorkers
from voxgate.gateway.session.jobs import Playback, Segment, Utterance
from voxgate.protocol.messages import SessionConfig

from tests.conftest import TIMEOUT_S

RATE = 16000


class PooledEngine(FakeEngine):
    """Runs each request as one job on shared deadline workers, as Piper does, and records the order."""

    def __init__(self, workers: DeadlineWorkers) -> None:
        super().__init__(sample_rate=RATE)
        self.pool = workers
        self.ran: list[str] = []
        self.submitted = 0
        self.all_submitted = asyncio.Event()
        self.expected = 0

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        self.requests.append(req)
        job = self.pool.submit(req.deadline, lambda: self.ran.append(req.text))
        self.submitted += 1
        if self.submitted == self.expected:
            self.all_submitted.set()
        await asyncio.wrap_future(job)
        yield AudioChunk(np.zeros(RATE // 10, dtype=np.float32), RATE)


def utterance(engine: FakeEngine, index: int = 0) -> Utterance:
    return Utterance(index, SessionConfig(), engine, "tone", None, {})


def test_playback_deadline_is_now_before_audio_then_when_the_queued_audio_ends() -> None:
    playback = Playback()
    assert playback.deadline(now=50.0) == 50.0
    playback.add(1.5, now=10.0)
    playback.add(2.0, now=11.0)
    assert playback.deadline(now=50.0) == 13.5


def test_a_segment_opened_ahead_gets_its_deadline_when_read_after_the_earlier_audio() -> None:
    async def scenario() -> tuple[list[SynthesisRequest], Playback]:
        engine = FakeEngine(sample_rate=RATE, chunk_s=0.5)
        u = utterance(engine)
        first, second = Segment(u, 0, "Hello there."), Segment(u, 1, "And more.")
        before = time.monotonic()
        first_stream = first.open()
        second.open()  # opened ahead, while the first streams (gateway.transport.socket does this)
        assert engine.requests == []  # a lazy engine is called only when read
        async for _ in first_stream:
            pass
        async for _ in second.open():
            pass
        assert engine.requests[0].deadline >= before  # a first segment is due at once
        return engine.requests, u.playback

    requests, playback = asyncio.run(scenario())
    assert playback.start is not None
    # The second is due when the first's audio (12 characters at 60 ms) has played from its start.
    assert requests[1].deadline == playback.start + 12 * 0.06


def test_workers_take_the_starving_session_then_the_new_one_then_the_buffered_one() -> None:
    async def scenario() -> list[str]:
        workers = DeadlineWorkers(1, "test")
        gate = threading.Event()
        blocker = workers.submit(-math.inf, gate.wait)  # holds the only worker while the others queue
        engine = PooledEngine(workers)
        engine.expected = 3
        now = time.monotonic()
        buffered, new, starving = utterance(engine), utterance(engine), utterance(engine)
        buffered.playback.add(10 * TIMEOUT_S, now)  # minutes of audio still to play
        starving.playback.add(2.0, now - 10.0)  # its audio ran out 8 s ago
        segments = [
            Segment(buffered, 4, "buffered"),
            Segment(new, 0, "new"),
            Segment(starving, 2, "starving"),
        ]

        async def read(seg: Segment) -> None:
            async for _ in seg.open():
                pass

        tasks = [asyncio.create_task(read(seg)) for seg in segments]
        await asyncio.wait_for(engine.all_submitted.wait(), TIMEOUT_S)
        gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT_S)
        await asyncio.wrap_future(blocker)
        workers.shutdown()
        return engine.ran

    assert asyncio.run(scenario()) == ["starving", "new", "buffered"]
