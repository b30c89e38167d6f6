"""A small thread pool that runs the most urgent job first (lowest priority value, then arrival).

The embedded engine runs blocking inference on a couple of threads shared by every session. With a
first-come queue, the first segment of a new utterance waits behind the later segments of others,
and time to first audio grows with load; ranking jobs by their segment index serves first segments
first, while later segments, whose audio is only needed once the earlier ones have played, wait.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")
_Job = tuple[float, int, Callable[[], object] | None, Future[object] | None]


class PriorityWorkers:
    """``workers`` daemon threads taking jobs from one priority queue.

    Args:
        workers: threads, each running one job at a time.
        name: thread name prefix.
    """

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, priority: float, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn``; lower ``priority`` runs sooner, equal priorities in arrival order."""
        future: Future[T] = Future()
        self._queue.put((priority, next(self._order), fn, future))  # type: ignore[arg-type]
        return future

    def _run(self) -> None:
        while True:
            _, _, fn, future = self._queue.get()
            if fn is None or future is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # the thread boundary: the awaiting side gets the failure
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Stop the threads once the jobs already queued have run (they should check their own stop flags)."""
        for _ in self._threads:
            self._queue.put((math.inf, next(self._order), None, None))
