"""The bounded queue of payloads waiting to be written to one WebSocket.

It is the session's backpressure: the audio it holds is counted in seconds, and once ``max_audio_s``
waits, ``put_audio`` waits too, so synthesis pauses for a client that reads slowly (a phone bridge
reading at playback pace) instead of running ahead without bound. A client that stops reading
altogether is the writer's to detect (``SlowConsumer``). The outbox can also drop everything queued
for given utterances (barge-in).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass

#: A payload, or a function that builds it at send time (messages that report send-time timing).
Payload = str | bytes | Callable[[], str]


class SlowConsumer(Exception):
    """The client stopped reading: a write made no progress for the send timeout."""


@dataclass(slots=True)
class Item:
    """One queued payload; ``utterance`` marks what a cancel drops, ``on_sent`` stamps timings."""

    payload: Payload | None  # None is the close marker
    utterance: int | None = None
    audio_s: float = 0.0
    on_sent: Callable[[], None] | None = None


class Outbox:
    """FIFO of ``Item`` with an audio-seconds bound."""

    def __init__(self, max_audio_s: float) -> None:
        self.max_audio_s = max_audio_s
        self.audio_s = 0.0
        self._items: collections.deque[Item] = collections.deque()
        self._ready = asyncio.Event()
        self._space = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Item) -> None:
        """Queue an item now (messages; audio goes through ``put_audio``)."""
        self._items.append(item)
        self.audio_s += item.audio_s
        self._ready.set()

    async def put_audio(self, item: Item) -> None:
        """Queue audio once it fits under the bound (an empty outbox always takes one item)."""
        while self.audio_s > 0 and self.audio_s + item.audio_s > self.max_audio_s:
            self._space.clear()
            await self._space.wait()
        self.put(item)

    async def get(self) -> Item:
        """Wait for and take the next item."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if item.audio_s:
            self.audio_s -= item.audio_s
            self._space.set()
        return item

    def drop(self, utterances: Iterable[int]) -> None:
        """Remove every queued item that belongs to one of ``utterances``."""
        doomed = set(utterances)
        kept = [i for i in self._items if i.utterance is None or i.utterance not in doomed]
        self._items = collections.deque(kept)
        self.audio_s = sum(i.audio_s for i in kept)
        self._space.set()
