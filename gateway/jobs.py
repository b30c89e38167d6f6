"""The synthesizer's work: utterances in flight, their segments, and the queue that orders them.

Segments carry their own engine stream once it is opened. The synthesizer opens the stream of the
next queued segment while it still reads the current one (``JobQueue.peek``), so an engine that
starts work when ``synthesize`` is called (vllm-omni) gets segment k+1 submitted ahead and can batch
it; lazy engines (Piper, remote) simply start it when it is read.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from voxgate.engine.base import AudioChunk, SynthesisRequest, TTSEngine, VoiceReference
from voxgate.protocol.messages import SessionConfig
from voxgate.protocol.packer import AudioPacker


@dataclass(slots=True)
class Utterance:
    """An utterance in flight, with the config, engine and voice it started under."""

    index: int
    config: SessionConfig
    engine: TTSEngine
    voice: str
    reference: VoiceReference | None
    options: dict[str, object]
    packer: AudioPacker
    first_text_t: float | None
    first_audio_t: float | None = None
    synthesis_s: float = 0.0
    cancelled: bool = False


@dataclass(slots=True)
class Segment:
    """A segment to speak, with its timing and, once opened, its engine stream."""

    utterance: Utterance
    sentence_index: int
    text: str
    ready_t: float
    first_sent_t: float | None = None
    synthesis_s: float = 0.0
    counted: int = 0  # utterance samples already accounted in the outbox
    error: bool = False
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

    def sent(self) -> None:
        """Stamp the first frame's send time (segment and utterance)."""
        if self.first_sent_t is None:
            self.first_sent_t = time.perf_counter()
            if self.utterance.first_audio_t is None:
                self.utterance.first_audio_t = self.first_sent_t


@dataclass(slots=True)
class End:
    """The utterance's text is all segmented: report ``session.done`` after its audio."""

    utterance: Utterance
    total_sentences: int


@dataclass(slots=True)
class Close:
    """``session.close``: close the socket once everything before it is sent."""


Job = Segment | End | Close


class JobQueue:
    """FIFO of jobs that the synthesizer can peek into and a cancel can empty."""

    def __init__(self) -> None:
        self._jobs: collections.deque[Job] = collections.deque()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._jobs)

    def put(self, job: Job) -> None:
        self._jobs.append(job)
        self._ready.set()

    async def get(self) -> Job:
        while not self._jobs:
            self._ready.clear()
            await self._ready.wait()
        return self._jobs.popleft()

    def peek(self) -> Job | None:
        return self._jobs[0] if self._jobs else None

    def drain(self) -> list[Job]:
        jobs, self._jobs = list(self._jobs), collections.deque()
        return jobs
