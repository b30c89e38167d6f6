"""The one engine pump: every surface's segments reach the engine through it, and only through it.

A ``Pump`` belongs to one session core (``protocol.core``), whatever the surface: the WebSocket
connection (vllm-omni and voxgate.v1 dialects, ElevenLabs, phone carriers) and the REST routes (OpenAI,
ElevenLabs) all build one. It owns what every surface must get the same:

- routing of the core's outputs (``flush``): ``Speak`` queues a segment, ``Drop`` stops the work of
  the cancelled utterances and discards what waits for them, everything else goes to the outbox;
- look-ahead: while segment k streams, segment k+1's engine stream is opened, so an engine that starts
  work on the call (vllm-omni) has it submitted ahead (``Segment.open``);
- the audio cap (``CappedStream``): a segment's audio is at most ``AudioCap.seconds`` of its text, and a
  cut is reported as ``audio_truncated``;
- deadlines (``SynthesisRequest.deadline``, from the utterance's ``Playback``);
- cancel: a ``Drop`` of the utterance being spoken cancels its task, which closes the engine stream; a
  ``Drop`` costs what it cancels, not what is queued (``Outbox.drop``, ``JobQueue.drain``);
- backpressure: after each chunk the pump waits for room in the outbox (``Outbox.room``: its audio bound,
  and half its bound on other outputs, so that the reader, which waits at the whole, is never held by the
  engine's own messages);
- first bytes first: when the listener waits (nothing is queued, and the utterance's audio written so far
  has played out, or is within ``FIRST_SLICE_S`` of it: ``Playback.ahead_s``), a long chunk's first
  ``FIRST_SLICE_S`` goes to the writer before the rest is encoded, so a compressed format's encoder (about
  8 ms of CPU per second of audio for mp3 and Opus) delays the first byte by a slice's encoding, not a
  sentence's. A listener with audio still to play gets the chunk in one piece, in one write: an engine that
  is faster than real time (vllm-omni's 0.5 s chunks) costs one burst of frames per chunk, not two;
- metrics: engine time and failures (``SessionMeter.timed``).

The surface keeps only its transport: it reads its wire into the core, calls ``flush``, runs ``run``
beside its writer, and writes what the outbox gives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from ...engine.base import EngineError
from ...protocol.codecs.stream import sends
from ...protocol.core import Core
from ...protocol.errors import ProtocolError
from ...protocol.output import Configure, Drop, Message, Output, Speak
from ..metrics import SessionMeter
from .failures import error_for
from .jobs import JobQueue, Segment, Utterance
from .outbox import Outbox

#: Audio the pump hands the writer first when the listener waits: the rest of the chunk is encoded after.
FIRST_SLICE_S = 0.2
#: Called with a ``Configure`` the core produced (only the WebSocket reader's messages hold one).
Configurer = Callable[[Configure], Awaitable[None]]


class Pump:
    """Drives the engine for one session's segments, in order, one at a time with one opened ahead.

    Args:
        core: the session's core; its outputs are routed by ``flush``.
        outbox: where every output but ``Speak`` / ``Drop`` goes, bounded in audio seconds.
        meter: the session's metrics.
        utterance: the engine, voice and config an utterance speaks with, by its index (called once, at
            its first segment: no config can change mid-utterance).
        log: the session's logger.
        extensions: the client's dialect takes voxgate's own messages (``protocol.codecs.stream.sends``).
        configure: handles a ``Configure`` output; None where no config can arrive (REST).
        dropped: called after a ``Drop`` is applied (a phone carrier's ``clear``).
        changed: called after each ``flush``: the core's state moved (its next deadline may be sooner).
    """

    def __init__(
        self,
        core: Core,
        outbox: Outbox,
        meter: SessionMeter,
        utterance: Callable[[int], Utterance],
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
        *,
        extensions: bool = True,
        configure: Configurer | None = None,
        dropped: Callable[[], None] | None = None,
        changed: Callable[[], None] | None = None,
    ) -> None:
        self.core, self.outbox, self.meter, self.log = core, outbox, meter, log
        self.extensions = extensions
        self._utterance_for = utterance
        self._configure = configure
        self._dropped = dropped
        self._changed = changed
        self.jobs = JobQueue()
        self._speaking: Utterance | None = None  # the utterance whose segments are being queued
        self._current: asyncio.Task[None] | None = None
        self._current_utterance: int | None = None  # the utterance of the segment being spoken
        self.failure: ProtocolError | None = None  # the last segment's failure, as reported

    @property
    def busy(self) -> bool:
        """Whether a segment is being spoken or waits to be."""
        return bool(len(self.jobs) or self._current is not None)

    async def flush(self) -> None:
        """Move the core's outputs, in order, to the job queue and the outbox (never waits on room)."""
        await self.route(self.core.data_to_send())
        if self._changed is not None:
            self._changed()

    async def route(self, outputs: list[Output]) -> None:
        """Move ``outputs`` (taken from the core by the caller) as ``flush`` does."""
        dropped: list[Segment] = []
        for output in outputs:
            match output:
                case Configure() if self._configure is not None:
                    await self._configure(output)
                case Speak(utterance=u, sentence=s, text=text):
                    if self._speaking is None or self._speaking.index != u:
                        self._speaking = self._utterance_for(u)
                    self.jobs.put(Segment(self._speaking, s, text))
                    # A segment is streaming: the next one's engine work starts now, as when it was
                    # queued before that segment opened (see ``_speak``), however the two raced.
                    if self._current is not None and (following := self.jobs.peek()) is not None:
                        following.open()
                case Drop(utterances=victims):
                    # Only the victims' segments: a cancel of one context leaves the others queued. A cancel
                    # costs what it cancels (a flood of cancels with nothing in flight costs nothing here).
                    if victims:
                        dropped.extend(self.jobs.drain(victims))
                        if self._current is not None and self._current_utterance in victims:
                            self._current.cancel()
                        self.outbox.drop(victims)
                        self.log.info("cancelled utterances %s", list(victims))
                    if self._dropped is not None:
                        self._dropped()
                case Message(msg=msg) if not sends(msg, extensions=self.extensions):
                    pass
                case _:
                    self.outbox.put(output)
        await close_streams(dropped)

    async def run(self) -> None:
        """Speak queued segments until cancelled; an unexpected failure of a segment ends it (raised)."""
        while True:
            seg = await self.jobs.get()
            self._current = task = asyncio.create_task(self._speak(seg))
            self._current_utterance = seg.utterance.index
            try:
                await asyncio.wait([task])
            finally:
                task.cancel()  # a no-op once done; stops the segment when the session ends
                self._current = self._current_utterance = None
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc

    async def aclose(self) -> None:
        """Close the engine streams opened ahead for segments that will not be spoken."""
        await close_streams(self.jobs.drain())

    async def _speak(self, seg: Segment) -> None:
        u, s = seg.utterance.index, seg.sentence_index
        self.core.segment_started(u, s)
        await self.flush()
        failure: EngineError | None = None
        synthesis_s = 0.0
        playback = seg.utterance.playback
        try:
            async with contextlib.aclosing(self.meter.timed(seg.open())) as chunks:
                # Open the next segment's stream now: an engine that starts work on the call
                # (vllm-omni) gets it submitted while this one streams, and can batch the two.
                if (following := self.jobs.peek()) is not None:
                    following.open()
                t = time.perf_counter()
                async for chunk in chunks:
                    synthesis_s += time.perf_counter() - t
                    samples, rate = chunk.samples, chunk.sample_rate
                    head = round(FIRST_SLICE_S * rate)
                    if (
                        len(samples) > 2 * head
                        and not chunk.words
                        and self.outbox.audio_s == 0
                        and playback.ahead_s(time.monotonic(), len(samples) / rate) < FIRST_SLICE_S
                    ):
                        # The listener waits for this audio. Its first slice goes out before the rest is
                        # encoded (a compressed format's encoder takes about 8 ms per second of audio,
                        # 40 ms for an engine's 5 s sentence).
                        self.core.audio(u, s, samples[:head], rate)
                        await self.flush()
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(FIRST_SLICE_S):
                                await self.outbox.drained()
                        samples = samples[head:]
                    self.core.audio(u, s, samples, rate, chunk.words)
                    await self.flush()
                    await self.outbox.room()
                    t = time.perf_counter()
        except EngineError as exc:
            failure = exc
            self.log.warning("engine failed on segment %d/%d: %s", u, s, exc)
        if (cut := seg.truncation()) is not None:
            self.core.report(u, cut)
        error = error_for(failure) if failure is not None else None
        self.failure = error or self.failure
        self.core.segment_done(u, s, synthesis_s=synthesis_s, error=error)
        await self.flush()
        await self.outbox.room()


async def close_streams(jobs: list[Segment]) -> None:
    """Close engine streams opened ahead for segments that will not be spoken."""
    for job in jobs:
        if job.stream is not None:
            await job.stream.aclose()
