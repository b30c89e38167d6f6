"""The synthesizer's work: the segments to speak, and the queue that orders them.

Segments carry their own engine stream once it is opened. The synthesizer opens the stream of the
next queued segment while it still reads the current one (``JobQueue.peek``), so an engine that
starts work when ``synthesize`` is called (vllm-omni) gets segment k+1 submitted ahead and can batch
it; lazy engines (Piper, remote) simply start it when it is read. What happens to their audio (framing,
timings, cancel, ``session.done``) is ``protocol.core``'s.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from voxgate.engine.base import AudioChunk, SynthesisRequest, TTSEngine, VoiceReference
from voxgate.protocol.messages import SessionConfig


@dataclass(slots=True)
class Utterance:
    """The config, engine and voice an utterance started under."""

    index: int
    config: SessionConfig
    engine: TTSEngine
    voice: str
    reference: VoiceReference | None
    options: dict[str, object]


@dataclass(slots=True)
class Segment:
    """A segment to speak and, once opened, its engine stream."""

    utterance: Utterance
    sentence_index: int
    text: str
    stream: AsyncGenerator[AudioChunk, None] | None = None

    def request(self) -> SynthesisRequest:
        u = self.utterance
        return SynthesisRequest(
            text=self.text,
            voice=u.voice,
            speed=u.config.speed,
            seed=u.config.seed,
            options=u.options,
            reference=u.reference,
            priority=self.sentence_index,
        )

    def open(self) -> AsyncGenerator[AudioChunk, None]:
        """The segment's engine stream, opened on first use."""
        if self.stream is None:
            self.stream = self.utterance.engine.synthesize(self.request())
        return self.stream


class JobQueue:
    """FIFO of segments that the synthesizer can peek into and a cancel can empty."""

    def __init__(self) -> None:
        self._jobs: collections.deque[Segment] = collections.deque()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._jobs)

    def put(self, job: Segment) -> None:
        self._jobs.append(job)
        self._ready.set()

    async def get(self) -> Segment:
        while not self._jobs:
            self._ready.clear()
            await self._ready.wait()
        return self._jobs.popleft()

    def peek(self) -> Segment | None:
        return self._jobs[0] if self._jobs else None

    def drain(self) -> list[Segment]:
        jobs, self._jobs = list(self._jobs), collections.deque()
        return jobs
