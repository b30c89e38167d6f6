"""The bounded queue of core outputs waiting to be written to one WebSocket (or a REST body).

It is the session's backpressure, and it bounds everything a session queues, whatever its kind:

- audio is counted in seconds: once more than ``max_audio_s`` waits, ``room`` waits, so synthesis pauses
  for a client that reads slowly (a phone bridge reading at playback pace) instead of running ahead;
- every other output (messages, errors, acks, timing reports) is counted in items and in bytes (its JSON
  size). Once more than ``max_messages`` or ``max_message_bytes`` of them wait, ``room_to_read`` waits: the
  reader stops taking client messages, the server's socket buffer fills, and TCP pushes back on the
  client. The producer of audio waits at half those (``room``), so the engine's own messages alone never
  stop the reader: a cancel is read while audio fills the outbox. Only a client that floods messages
  faster than it reads their answers is stopped, and one that reads nothing at all is then ended by the
  writer's send timeout (``SlowConsumer``).

A cancel (``drop``) costs what it cancels, not what is queued: each output is counted on its utterance's
tally, and dropping an utterance takes its tally off the totals at once and marks it; ``get`` skips the
marked outputs as it meets them. What is skipped still holds memory until then, so once it outweighs the
live outputs the queue is rebuilt without it (at most as often as that much was queued: amortised
constant per output). Items are typed outputs of ``protocol.core``; the writer renders them.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass

import msgspec

from ...protocol.output import Audio, Message, Output, Report

#: Non-audio outputs a session may queue: far more than a segment's messages (``audio.start``, word
#: timings, ``audio.done``) for the whole audio bound, far less than a flood of refusals.
MAX_MESSAGES = 1024
#: ... and their bytes, as JSON: a few hundred bytes each on average, with room for a long one.
MAX_MESSAGE_BYTES = 1024 * 1024
#: What a ``Report`` weighs before ``Core.sending`` renders it: an ``audio.done`` or ``session.done``.
REPORT_BYTES = 256
#: Skipped outputs kept before a rebuild is considered: a rebuild of a short queue is not worth it.
_MIN_COMPACT = 64

_encode = msgspec.json.Encoder().encode


class SlowConsumer(Exception):
    """The client stopped reading: a write made no progress for the send timeout."""


@dataclass(slots=True)
class _Tally:
    """Outputs queued: in the whole outbox, or of one utterance (``dropped``: cancelled, they are skipped)."""

    utterance: int = -1  # -1: the whole outbox
    audio: int = 0
    audio_bytes: int = 0
    audio_s: float = 0.0
    messages: int = 0
    message_bytes: int = 0
    dropped: bool = False

    @property
    def items(self) -> int:
        return self.audio + self.messages

    def add(self, item: Output, size: int, sign: int = 1) -> None:
        if isinstance(item, Audio):
            self.audio += sign
            self.audio_bytes += sign * size
            self.audio_s += sign * item.audio_s
        else:
            self.messages += sign
            self.message_bytes += sign * size

    def take(self, other: _Tally) -> None:
        self.audio -= other.audio
        self.audio_bytes -= other.audio_bytes
        self.audio_s -= other.audio_s
        self.messages -= other.messages
        self.message_bytes -= other.message_bytes


_Entry = tuple[Output, int, "_Tally | None"]  # an output, its size in bytes, its utterance's tally


def _utterance(item: Output) -> int | None:
    return item.utterance if isinstance(item, Audio | Message | Report) else None


def _size(item: Output) -> int:
    match item:
        case Audio(data=data):
            return len(data)
        case Message(msg=msg):
            return len(_encode(msg))
        case Report():
            return REPORT_BYTES
    return 0


class Outbox:
    """FIFO of outputs, bounded in audio seconds, and in count and bytes for the rest.

    Args:
        max_audio_s: audio queued before ``room`` waits.
        max_messages: other outputs queued before ``room_to_read`` waits (``room`` waits at half).
        max_message_bytes: ... and their bytes.
    """

    def __init__(
        self,
        max_audio_s: float,
        *,
        max_messages: int = MAX_MESSAGES,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.max_audio_s = max_audio_s
        self.max_messages = max_messages
        self.max_message_bytes = max_message_bytes
        self.queued = _Tally()  # what is queued and not dropped
        self._items: collections.deque[_Entry] = collections.deque()  # dropped ones included
        self._tallies: dict[int, _Tally] = {}  # utterance -> what it has queued
        self._ready = asyncio.Event()
        self._space = asyncio.Event()
        self._idle = asyncio.Event()  # the writer waits in ``get`` with nothing queued
        self._reader_stopped = asyncio.Event()  # the reader waits in ``room_to_read``: it takes no message

    def __len__(self) -> int:
        return self.queued.items

    @property
    def audio_s(self) -> float:
        """Audio queued, in seconds."""
        return self.queued.audio_s

    def put(self, item: Output) -> None:
        """Queue an output now, in order; its producer then awaits ``room`` (or ``room_to_read``)."""
        size = _size(item)
        tally: _Tally | None = None
        if (utterance := _utterance(item)) is not None:
            tally = self._tallies.get(utterance)
            if tally is None:
                tally = self._tallies[utterance] = _Tally(utterance)
            tally.add(item, size)
        self.queued.add(item, size)
        self._items.append((item, size, tally))
        self._idle.clear()
        self._ready.set()

    def full(self, share: float = 1.0) -> bool:
        """Whether the non-audio outputs queued exceed ``share`` of their bounds."""
        q = self.queued
        return q.messages > self.max_messages * share or q.message_bytes > self.max_message_bytes * share

    async def room(self) -> None:
        """Wait until the audio queued is within its bound, and the other outputs within half theirs
        (the producer of audio: the engine pump)."""
        while self.queued.audio_s > self.max_audio_s or self.full(0.5):
            self._space.clear()
            await self._space.wait()

    async def room_to_read(self) -> None:
        """Wait until the non-audio outputs queued are within their bounds (the reader, before it takes
        the next client message). Audio never holds the reader: a cancel must be read to make room."""
        if not self.full():
            return
        self._reader_stopped.set()
        try:
            while self.full():
                self._space.clear()
                await self._space.wait()
        finally:
            self._reader_stopped.clear()

    async def unless_reader_stops(self, wait: Coroutine[object, object, object]) -> None:
        """Await ``wait`` (the writer's wait for read receipts) while the reader takes messages, and no
        longer: a client's receipts come in on the read side, behind its own messages, which a stopped
        reader does not take. The writer then writes on, paced by TCP, and so makes room for the reader
        (waiting for receipts instead would wait for ever)."""
        if self._reader_stopped.is_set():
            wait.close()
            return
        waiting = asyncio.ensure_future(wait)
        stopped = asyncio.ensure_future(self._reader_stopped.wait())
        try:
            await asyncio.wait([waiting, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
            stopped.cancel()
        if waiting.done() and not waiting.cancelled():
            waiting.result()

    async def drained(self) -> None:
        """Wait until the writer has written everything queued and asks for more (it calls ``get`` only
        once it has written what it took before)."""
        await self._idle.wait()

    async def get(self) -> Output:
        """Wait for and take the next output (those of dropped utterances are skipped)."""
        while True:
            while not self.queued.items:
                self._idle.set()
                self._ready.clear()
                await self._ready.wait()
            item, size, tally = self._items.popleft()
            if tally is not None:
                if tally.dropped:
                    continue  # ``drop`` took it off the totals
                tally.add(item, size, -1)
                if not tally.items:
                    del self._tallies[tally.utterance]
            self.queued.add(item, size, -1)
            self._settle()
            return item

    def drop(self, utterances: Iterable[int]) -> None:
        """Discard every queued output of ``utterances``, at the cost of those utterances alone."""
        for utterance in utterances:
            tally = self._tallies.pop(utterance, None)
            if tally is not None:
                tally.dropped = True
                self.queued.take(tally)
        if len(self._items) - self.queued.items > max(self.queued.items, _MIN_COMPACT):
            self._items = collections.deque(e for e in self._items if e[2] is None or not e[2].dropped)
        self._settle()

    def _settle(self) -> None:
        if not self.queued.items:
            self._items.clear()  # only dropped outputs are left
            self.queued = _Tally()  # no float drift survives an empty queue
        self._space.set()
