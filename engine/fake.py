"""A deterministic engine for gateway unit tests: a tone whose length follows the text.

Timing is under the test's control: ``delay_s`` before each chunk, or ``gate`` (an
``asyncio.Event``) that holds synthesis until the test sets it. ``started`` / ``closed`` count the
synthesize calls that began and those whose iterator was closed, so a test can check that a cancel
or a disconnect stopped the work.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator
from typing import Annotated

import msgspec
import numpy as np
import numpy.typing as npt

from .base import (
    AudioChunk,
    EngineError,
    SynthesisRequest,
    UnknownVoice,
    UnsupportedOption,
    Voice,
    demands,
)
from .options import option

# 60 ms of audio per character is close to natural speech (about 15 characters a second).
SECONDS_PER_CHAR = 0.06


@functools.lru_cache(maxsize=16)
def _tone(pitch: int, sample_rate: int, chunk: int) -> npt.NDArray[np.float32]:
    """One second of the tone plus one chunk, read-only: a whole number of cycles, so it repeats
    seamlessly and any chunk is a slice of it. Computing the sine per request cost the load benchmark
    (bench/load.py) a sixth of the gateway's CPU, which is not the gateway's cost."""
    t = np.arange(sample_rate + chunk, dtype=np.float64) / sample_rate
    tone = (0.5 * np.sin(2 * np.pi * pitch * t)).astype(np.float32)
    tone.flags.writeable = False
    return tone


class FakeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Engine ``fake``'s one setting: its pace, so that tests of real servers can catch it mid-stream."""

    fake_delay_s: Annotated[
        float, option("seconds slept before each 250 ms chunk of the tone", flag=True)
    ] = 0.0


class FakeEngine:
    """Speaks a 220 Hz tone, ``SECONDS_PER_CHAR`` per character, in chunks of ``chunk_s``.

    Args:
        sample_rate: native rate of the tone.
        chunk_s: audio per yielded chunk.
        delay_s: sleep before each chunk.
        fail_on: text that makes synthesis raise ``failure`` ...
        fail_after_chunks: ... after this many chunks (0: before any audio).
        failure: the exception class raised (``ValueError`` stands for an engine's bug).
        supported: options it honours (others are refused by name).
        clones: whether it accepts uploaded voices (it then speaks them as a 330 Hz tone).
        name: registry name, so that tests can configure two fake engines.
    """

    default_voice = "tone"

    reads_numbers = True  # it reads nothing: normalization is tested on the text it is sent
    ipa_symbols: frozenset[str] = frozenset()  # no phoneme input: an ipa entry is said by its alias

    def __init__(
        self,
        *,
        sample_rate: int = 16000,
        chunk_s: float = 0.25,
        delay_s: float = 0.0,
        fail_on: str | None = None,
        fail_after_chunks: int = 1,
        failure: type[Exception] = EngineError,
        supported: frozenset[str] = frozenset({"speed", "seed", "language"}),
        clones: bool = False,
        name: str = "fake",
    ) -> None:
        self.name = name
        self.clones = clones
        self.sample_rate = sample_rate
        self.chunk_s = chunk_s
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.fail_after_chunks = fail_after_chunks
        self.failure = failure
        self.supported = supported
        self.gate: asyncio.Event | None = None
        self.requests: list[SynthesisRequest] = []
        self.started = 0
        self.closed = 0
        self.finished = 0

    async def start(self) -> None:
        return None

    async def voices(self) -> list[Voice]:
        return [Voice(name=self.default_voice, engine=self.name, language="en", sample_rate=self.sample_rate)]

    def check(self, voice: str, options: dict[str, object]) -> None:
        if voice != self.default_voice:
            raise UnknownVoice(voice, self.name, ["tone"])
        for field in demands(options):
            if field not in self.supported:
                raise UnsupportedOption(field, self.name)

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        self.requests.append(req)
        self.started += 1
        total = int(len(req.text) * SECONDS_PER_CHAR / req.speed * self.sample_rate)
        step = max(1, int(self.chunk_s * self.sample_rate))
        tone = _tone(330 if req.reference is not None else 220, self.sample_rate, step)
        try:
            failing = self.fail_on is not None and self.fail_on in req.text
            for n, i in enumerate(range(0, total, step)):
                if failing and n == self.fail_after_chunks:
                    raise self.failure(f"fake failure on {self.fail_on!r}")
                if self.gate is not None:
                    await self.gate.wait()
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                offset = i % self.sample_rate
                yield AudioChunk(tone[offset : offset + min(step, total - i)], self.sample_rate)
            self.finished += 1
        finally:
            self.closed += 1

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


def create(settings: FakeSettings) -> FakeEngine:
    """The engine ``--engine fake`` runs: a test tone."""
    return FakeEngine(delay_s=settings.fake_delay_s)
