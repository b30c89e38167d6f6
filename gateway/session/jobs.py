"""The synthesizer's work: the segments to speak, and the queue that orders them.

Segments carry their own engine stream once it is opened. The synthesizer opens the stream of the
next queued segment while it still reads the current one (``JobQueue.peek``), so an engine that
starts work when ``synthesize`` is called (vllm-omni) gets segment k+1 submitted ahead and can batch
it; lazy engines (Piper, remote) simply start it when it is read. What happens to their audio (framing,
timings, cancel, ``session.done``) is ``protocol.core``'s.

Each request carries a deadline (``SynthesisRequest.deadline``) that engines sharing workers between
sessions (Piper) use to take the most urgent work first. It is computed here from what the gateway
knows (``Playback``): a first segment is due now; a later one when its utterance's audio queued so far
runs out if the client plays it in real time from the moment its first audio was queued. Audio is
queued for the client as soon as the engine gives it, so a client that reads slower than real time
makes the deadlines early, never late. A lazy engine (``synthesize`` is an async generator function,
which does nothing until read) is called only when its stream is first read, so the deadline counts
every earlier segment's audio even when the stream was opened ahead.

Every engine stream is capped (``CappedStream``): a segment's audio is at most ``AudioCap.seconds`` of
its text, whatever the engine, so an engine that runs away cannot stream minutes of audio for a word.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType

import msgspec

from ...engine.base import AudioChunk, SynthesisRequest, TTSEngine, VoiceReference
from ...protocol.errors import ErrorCode, ProtocolError
from ...protocol.messages import SessionConfig
from ...protocol.pronounce import phonemes


@dataclass(frozen=True, slots=True)
class AudioCap:
    """The most audio a segment may have: ``(base_s + per_char_s * characters) / speed`` seconds."""

    base_s: float = 10.0
    per_char_s: float = 0.3

    def seconds(self, text: str, speed: float = 1.0) -> float:
        return (self.base_s + self.per_char_s * len(text)) / speed


@dataclass(slots=True)
class Playback:
    """An utterance's audio as a client playing it in real time would hear it."""

    start: float | None = None  #: when its first audio was queued (``time.monotonic()``)
    audio_s: float = 0.0  #: audio queued so far

    def add(self, seconds: float, now: float) -> None:
        """``seconds`` of audio queued for the client at ``now``."""
        if self.start is None:
            self.start = now
        self.audio_s += seconds

    def deadline(self, now: float) -> float:
        """When the next audio is needed: ``now`` before the first audio, else when the queued audio ends."""
        return now if self.start is None else self.start + self.audio_s

    def ahead_s(self, now: float, latest_s: float = 0.0) -> float:
        """How long the audio queued before the latest ``latest_s`` seconds still plays at ``now`` (0 when
        the listener has heard it all: it waits for what comes next)."""
        if self.start is None:
            return 0.0
        return max(0.0, self.start + self.audio_s - latest_s - now)


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
    playback: Playback = field(default_factory=Playback)


class CappedStream(AsyncGenerator[AudioChunk, None]):
    """An engine stream that ends once it has given ``max_s`` seconds of audio.

    The chunk that crosses the cap is cut to it, the engine's stream is closed (its work stops), and
    ``truncated`` is set. Closing this stream closes the engine's, whether it was read or not.

    Args:
        chunks: the engine's stream, or a function that opens it when it is first read.
        max_s: the audio it may give, in seconds.
        playback: counts the audio it gives, if given.
    """

    def __init__(
        self,
        chunks: AsyncGenerator[AudioChunk, None] | Callable[[], AsyncGenerator[AudioChunk, None]],
        max_s: float,
        playback: Playback | None = None,
    ) -> None:
        self._chunks = chunks if isinstance(chunks, AsyncGenerator) else None
        self._opener = None if isinstance(chunks, AsyncGenerator) else chunks
        self.max_s = max_s
        self.audio_s = 0.0
        self.truncated = False
        self._closed = False
        self._playback = playback

    async def __anext__(self) -> AudioChunk:
        if self.truncated or self._closed:
            raise StopAsyncIteration
        if self._chunks is None:
            assert self._opener is not None
            self._chunks = self._opener()
        chunk = await anext(self._chunks)
        rate = chunk.sample_rate
        if len(chunk.samples) > (room := round((self.max_s - self.audio_s) * rate)):
            self.truncated = True
            await self._chunks.aclose()
            if room <= 0:
                raise StopAsyncIteration
            chunk = msgspec.structs.replace(chunk, samples=chunk.samples[:room])
        seconds = len(chunk.samples) / rate
        self.audio_s += seconds
        if self._playback is not None:
            self._playback.add(seconds, time.monotonic())
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
        await self.aclose()
        raise typ if isinstance(typ, BaseException) else typ()

    async def aclose(self) -> None:
        self._closed = True  # read no more (an unopened stream is never opened)
        if self._chunks is not None:
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
            deadline=u.playback.deadline(time.monotonic()),
            max_audio_s=u.cap.seconds(self.text, u.config.speed),
            phonemes=phonemes(u.config.pronunciations, u.engine.ipa_symbols, u.config.text_normalization),
        )

    def open(self) -> CappedStream:
        """The segment's engine stream, opened on first use, capped to ``Utterance.cap``.

        An engine that may start work on the call is called now; a lazy one when the stream is read.
        """
        if self.stream is None:
            u = self.utterance
            max_s = u.cap.seconds(self.text, u.config.speed)
            lazy = inspect.isasyncgenfunction(u.engine.synthesize)
            chunks = self._call if lazy else self._call()
            self.stream = CappedStream(chunks, max_s, u.playback)
        return self.stream

    def _call(self) -> AsyncGenerator[AudioChunk, None]:
        return self.utterance.engine.synthesize(self.request())

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
    """FIFO of segments that the synthesizer can peek into and a cancel can empty.

    Segments are kept per utterance, with one queue of utterance indices giving their order: a cancel
    takes its utterances' segments out at their own cost, and leaves their places in the order to be
    skipped (an utterance's index is never used again), however many other segments wait.
    """

    def __init__(self) -> None:
        self._order: collections.deque[int] = collections.deque()  # one entry per segment put
        self._by_utterance: dict[int, collections.deque[Segment]] = {}
        self._len = 0
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return self._len

    def put(self, job: Segment) -> None:
        index = job.utterance.index
        self._by_utterance.setdefault(index, collections.deque()).append(job)
        self._order.append(index)
        self._len += 1
        self._ready.set()

    async def get(self) -> Segment:
        while not self._len:
            self._ready.clear()
            await self._ready.wait()
        self._skip()
        index = self._order.popleft()
        jobs = self._by_utterance[index]
        job = jobs.popleft()
        if not jobs:
            del self._by_utterance[index]
        self._len -= 1
        return job

    def peek(self) -> Segment | None:
        if not self._len:
            return None
        self._skip()
        return self._by_utterance[self._order[0]][0]

    def drain(self, utterances: Iterable[int] | None = None) -> list[Segment]:
        """Remove and return the queued segments of ``utterances`` (all of them when None)."""
        if utterances is None:
            jobs = [self._by_utterance[i].popleft() for i in self._order if i in self._by_utterance]
            self._order.clear()
            self._by_utterance.clear()
            self._len = 0
            return jobs
        drained: list[Segment] = []
        for index in utterances:
            drained.extend(self._by_utterance.pop(index, ()))
        self._len -= len(drained)
        if not self._len:
            self._order.clear()
        elif len(self._order) > 2 * self._len + 64:  # mostly skipped places: rebuild, amortised
            self._order = collections.deque(i for i in self._order if i in self._by_utterance)
        return drained

    def _skip(self) -> None:
        """Drop the places of cancelled utterances from the head of the order."""
        while self._order[0] not in self._by_utterance:
            self._order.popleft()
