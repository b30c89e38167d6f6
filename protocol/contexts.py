"""The contexts of one session: one table, which its text side and its core share (one owner of the state).

A context is one stream of utterances: the default one (number 0, no id), always there, and the named ones a
client opens (``context_id``; docs/protocol.md). ``Contexts`` alone knows which exist, and each one's record
holds all of its state: the text side (``protocol.session``) opens and ends them and keeps each one's
segmenter and open utterance; the core (``protocol.core``) keeps each one's timers, and removes a context
once it is closed. Neither keeps a list of its own, so they cannot disagree about which contexts are open.

The life of a named context::

    open ──context.close / session.close──▶ ended, closing ──last session.done──▶ removed
    open ──input.cancel / idle timeout─────▶ ended ──▶ removed (at once)

``utterance_index`` is one counter for the whole session, so an index names one utterance whatever its
context. A named context opens at the first ``input.text`` / ``input.done`` / ``input.commit`` /
``keepalive`` naming it (``ContextStarted``; past the session's cap, ``too_many_contexts``) and ends at
``context.close`` (gracefully, ``ContextEnded``), at ``input.cancel`` naming it (``ContextCancelled``) or
not (``UtteranceCancelled``: every context), at ``session.close``, or when the core finds it idle
(``Session.expire``). An ended context's id is free at once (a message naming it opens a new context,
with a new number), while its audio may still go out under its old number.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec

from .messages import wire_context_id
from .normalize import Normalizer
from .segmenter import Segmenter


@dataclass(slots=True, eq=False)
class Context:
    """One context: its text side (the session's) and its timers (the core's)."""

    context_id: str | None  # None: the default context
    number: int  # numbers it in the session (frames carry it); never reused
    segmenter: Segmenter
    normalizer: Normalizer = field(default_factory=Normalizer)  # before the segmenter: text as spoken
    # The text side's (``protocol.session``):
    utterance: int | None = None  # the open utterance's index
    sentences: int = 0  # segments of the open utterance so far
    # The core's timers (``protocol.core``): timed cuts, the listener clock, idleness.
    active_t: float = 0.0  # the last message naming it, or its last audio.done written
    closing: bool = False  # a graceful close waits for its utterances' session.done
    deadline: float | None = None  # when a first segment's text has waited enough
    parked: bool = False  # the deadline passed but the text allowed no cut: wait for more text
    play_end: float | None = None  # when the audio written so far ends, played in real time

    def idle_at(self, limit_s: float) -> float | None:
        """When a named context is idle: ``limit_s`` after the last message naming it (or its last audio.done
        written); None for the default context, one closing, or no limit (0)."""
        if self.context_id is None or self.closing or limit_s <= 0:
            return None
        return self.active_t + limit_s


class Contexts:
    """Every context of a session, by number, and the open ones (that text may name) by id."""

    def __init__(self) -> None:
        self.default = Context(None, 0, Segmenter())
        self._all: dict[int, Context] = {0: self.default}
        self._open: dict[str, Context] = {}
        self._numbers = 0  # context numbers handed out

    def __iter__(self) -> Iterator[Context]:
        """Every context, open or closing, in the order they opened (a copy: callers may remove some)."""
        return iter(list(self._all.values()))

    def __contains__(self, number: object) -> bool:
        return number in self._all

    def __getitem__(self, number: int) -> Context:
        return self._all[number]

    def get(self, number: int) -> Context | None:
        """The context of that number, open or closing; None once removed."""
        return self._all.get(number)

    def named(self, context_id: str) -> Context | None:
        """The open context of that id."""
        return self._open.get(context_id)

    def texts(self) -> list[Context]:
        """The contexts text may go to: the default one, then the open named ones in the order they opened."""
        return [self.default, *self._open.values()]

    def text_of(self, number: int) -> Context | None:
        """The context of that number if text may go to it (the default, or an open named one)."""
        ctx = self._all.get(number)
        return ctx if ctx is not None and self._is_open(ctx) else None

    @property
    def open_count(self) -> int:
        """Named contexts open."""
        return len(self._open)

    def open(self, context_id: str, segmenter: Segmenter, normalizer: Normalizer) -> Context:
        """Open a named context, with the next number."""
        self._numbers += 1
        ctx = self._all[self._numbers] = self._open[context_id] = Context(
            context_id, self._numbers, segmenter, normalizer
        )
        return ctx

    def end(self, context_id: str) -> Context | None:
        """No more text to the open context of that id (its id is free); it stays until ``remove``."""
        return self._open.pop(context_id, None)

    def end_all(self) -> list[Context]:
        """``end`` every open named context; they are returned in the order they opened."""
        ended = list(self._open.values())
        self._open.clear()
        return ended

    def remove(self, number: int) -> None:
        """Forget a named context: closed, nothing of it goes out any more (ended too, if it was open)."""
        ctx = self._all.pop(number, None)
        if ctx is not None and ctx.context_id is not None and self._is_open(ctx):
            del self._open[ctx.context_id]

    def wire_id(self, number: int) -> str | msgspec.UnsetType:
        """The id of the context of that number as server messages carry it (``wire_context_id``)."""
        ctx = self._all.get(number)
        return wire_context_id(None if ctx is None else ctx.context_id)

    def _is_open(self, ctx: Context) -> bool:
        return ctx is self.default or (ctx.context_id is not None and self._open.get(ctx.context_id) is ctx)
