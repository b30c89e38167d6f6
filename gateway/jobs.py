"""The synthesizer's work: the segments to speak, and the queue that orders them.

Segments carry their own engine stream once it is opened. The synthesizer opens the stream of the
next queued segment while it still reads the current one (``JobQueue.peek``), so an engine that
starts work when ``synthesize`` is called (vllm-omni) gets segment k+1 submitted ahead and can batch
it; lazy engines (Piper, remote) simply start it when it is read. What happens to their audio (framing,
timings, cancel, ``session.done``) is ``protocol.core``'s.

Every engine stream is capped (``CappedStream``): a segment's audio is at most ``AudioCap.seconds`` of
its text, whatever the engine, so an engine that runs away cannot stream minutes of audio for a word.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from types import TracebackType

import msgspec

from voxgate.engine.base import AudioChunk, SynthesisRequest, TTSEngine, VoiceReference
from voxgate.protocol.errors import ErrorCode, ProtocolError
from voxgate.protocol.messages import SessionConfig


@dataclass(frozen=True, slots=True)
class AudioCap:
    """The most audio a segment may have: ``(base_s + per_char_s * characters) / speed`` seconds."""

    base_s: float = 10.0
    per_char_s: float = 0.3

    def seconds(self, text: str, speed: float = 1.0) -> float:
        return (self.base_s + self.per_char_s * len(text)) / speed


@dataclass(slots=True)
class Utterance:
    """The config, engine and voice an utterance started under."""

    index: int
    config: SessionConfig
    engine: TTSEngine
    voice: str
    reference: VoiceReference | None
    options: dict[str, object]
    cap: AudioCap = field(default_factory=AudioCap)


class CappedStream(AsyncGenerator[AudioChunk, None]):
    """An engine stream that ends once it has given ``max_s`` seconds of audio.

    The chunk that crosses the cap is cut to it, the engine's stream is closed (its work stops), and
    ``truncated`` is set. Closing this stream closes the engine's, whether it was read or not.

    Args:
        chunks: the engine's stream.
        max_s: the audio it may give, in seconds.
    """

    def __init__(self, chunks: AsyncGenerator[AudioChunk, None], max_s: float) -> None:
        self._chunks = chunks
        self.max_s = max_s
        self.audio_s = 0.0
        self.truncated = False

    async def __anext__(self) -> AudioChunk:
        if self.truncated:
            raise StopAsyncIteration
        chunk = await anext(self._chunks)
        rate = chunk.sample_rate
        if len(chunk.samples) > (room := round((self.max_s - self.audio_s) * rate)):
            self.truncated = True
            await self._chunks.aclose()
            if room <= 0:
                raise StopAsyncIteration
            chunk = msgspec.structs.replace(chunk, samples=chunk.samples[:room])
        self.audio_s += len(chunk.samples) / rate
        return chunk

    async def asend(self, value: None) -> AudioChunk:
        return await self.__anext__()

    async def athrow(
        self,
        typ: type[BaseException] | BaseException,
        val: object = None,
        tb: TracebackType | None = None,
        /,
    ) -> AudioChunk:
        await self._chunks.aclose()
        raise typ if isinstance(typ, BaseException) else typ()

    async def aclose(self) -> None:
        await self._chunks.aclose()


@dataclass(slots=True)
class Segment:
    """A segment to speak and, once opened, its engine stream."""

    utterance: Utterance
    sentence_index: int
    text: str
    stream: CappedStream | None = None

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

    def open(self) -> CappedStream:
        """The segment's engine stream, opened on first use, capped to ``Utterance.cap``."""
        if self.stream is None:
            u = self.utterance
            max_s = u.cap.seconds(self.text, u.config.speed)
            self.stream = CappedStream(u.engine.synthesize(self.request()), max_s)
        return self.stream

    def truncation(self) -> ProtocolError | None:
        """The non-fatal error to report when the engine's audio was cut, else None."""
        if self.stream is None or not self.stream.truncated:
            return None
        return ProtocolError(
            ErrorCode.AUDIO_TRUNCATED,
            f"segment {self.sentence_index}: the engine gave more than {self.stream.max_s:g} s of audio "
            f"for {len(self.text)} characters; the rest was cut",
        )


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
