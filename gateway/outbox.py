"""The bounded queue of core outputs waiting to be written to one WebSocket.

It is the session's backpressure: the audio it holds is counted in seconds, and once more than
``max_audio_s`` waits, ``room`` waits too, so synthesis pauses for a client that reads slowly (a phone
bridge reading at playback pace) instead of running ahead without bound. A client that stops reading
altogether is the writer's to detect (``SlowConsumer``). The outbox can also drop everything queued
for given utterances (barge-in). Items are typed outputs of ``protocol.core``; the writer renders them.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable

from ..protocol.output import Audio, Message, Output, Report


class SlowConsumer(Exception):
    """The client stopped reading: a write made no progress for the send timeout."""


def _utterance(item: Output) -> int | None:
    return item.utterance if isinstance(item, Audio | Message | Report) else None


class Outbox:
    """FIFO of outputs with an audio-seconds bound."""

    def __init__(self, max_audio_s: float) -> None:
        self.max_audio_s = max_audio_s
        self.audio_s = 0.0
        self._items: collections.deque[Output] = collections.deque()
        self._ready = asyncio.Event()
        self._space = asyncio.Event()
        self._idle = asyncio.Event()  # the writer waits in ``get`` with nothing queued

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Output) -> None:
        """Queue an output now, in order; the producer of audio then awaits ``room``."""
        self._items.append(item)
        self._idle.clear()
        if isinstance(item, Audio):
            self.audio_s += item.audio_s
        self._ready.set()

    async def room(self) -> None:
        """Wait until the audio queued is within the bound."""
        while self.audio_s > self.max_audio_s:
            self._space.clear()
            await self._space.wait()

    async def drained(self) -> None:
        """Wait until the writer has written everything queued and asks for more (it calls ``get`` only
        once it has written what it took before)."""
        await self._idle.wait()

    async def get(self) -> Output:
        """Wait for and take the next output."""
        while not self._items:
            self._idle.set()
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if isinstance(item, Audio):
            self.audio_s -= item.audio_s
            self._space.set()
        return item

    def drop(self, utterances: Iterable[int]) -> None:
        """Remove every queued output that belongs to one of ``utterances``."""
        doomed = set(utterances)
        kept = [i for i in self._items if _utterance(i) not in doomed]
        self._items = collections.deque(kept)
        self.audio_s = sum(i.audio_s for i in kept if isinstance(i, Audio))
        self._space.set()
