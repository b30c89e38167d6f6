"""``Deadline``: one task's repeated timed waits, with a single lazily armed timer (the WebSocket shell's)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class Deadline:
    """``asyncio.timeout`` for one task's repeated waits, with its timer armed lazily.

    ``asyncio.timeout`` puts a timer in the loop's heap on every wait and cancels it after: a reader and a
    writer paying that on every message and every frame spent 8-12% of the server's CPU at 200 sessions.
    Here one timer handle at most is pending per ``Deadline``, and it is kept while the deadlines only move
    later, as they do when every send or message pushes them on: when it fires early it re-arms itself
    for the current deadline, and a wait that completes costs two attribute writes. When the deadline of a
    wait in progress passes, the task is cancelled and ``within`` raises ``TimeoutError``; a cancel that
    came from elsewhere at the same time still propagates (the counting of ``asyncio.timeout``).
    """

    __slots__ = ("_at", "_cancelling", "_deadline", "_fired", "_handle", "_task")

    def __init__(self) -> None:
        self._deadline: float | None = None  # loop.time() of the wait in progress; None: no wait
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0  # when ``_handle`` fires
        self._task: asyncio.Task[Any] | None = None
        self._fired = False
        self._cancelling = 0

    async def within(self, awaitable: Awaitable[T], timeout_s: float) -> T:
        """``await awaitable``, or ``TimeoutError`` once ``timeout_s`` passed (from the current task)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._deadline = deadline
        if self._handle is None or self._at > deadline:
            if self._handle is not None:
                self._handle.cancel()
            self._task = asyncio.current_task()
            self._at = deadline
            self._handle = loop.call_at(deadline, self._fire)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self._expired():
                raise TimeoutError from None
            raise
        finally:
            self._deadline = None
            self._expired()

    def extend(self, timeout_s: float) -> None:
        """Move the deadline of the wait in progress, if any, to ``timeout_s`` from now, when that is later:
        progress was seen elsewhere (a blocked send's read receipts). The pending timer re-arms itself."""
        if self._deadline is not None:
            self._deadline = max(self._deadline, asyncio.get_running_loop().time() + timeout_s)

    def close(self) -> None:
        """Drop the pending timer (the task is ending)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _expired(self) -> bool:
        """Whether this wait was cancelled by its deadline, and nothing else cancelled it too."""
        if not self._fired:
            return False
        self._fired = False
        assert self._task is not None
        return self._task.uncancel() <= self._cancelling

    def _fire(self) -> None:
        self._handle = None
        deadline, task = self._deadline, self._task
        if deadline is None or task is None or task.done():
            return  # no wait in progress: the next one arms a timer again
        loop = asyncio.get_running_loop()
        if loop.time() < deadline:  # the deadline moved on since this timer was armed
            self._at = deadline
            self._handle = loop.call_at(deadline, self._fire)
            return
        self._fired = True
        self._cancelling = task.cancelling()
        task.cancel()
