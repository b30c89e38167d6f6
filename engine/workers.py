"""A small thread pool that runs the job with the earliest deadline first (then arrival).

The embedded engine runs blocking inference on a few threads shared by every session. With a
first-come queue, the first segment of a new utterance waits behind the later segments of others,
and time to first audio grows with load; ranking by segment index instead (first segments first)
starves the later segments of running utterances, whose listeners then hear gaps. A deadline says
what each job is really waiting for: a first segment is due now, a later one when the audio its
client already has runs out (``SynthesisRequest.deadline``). Earliest deadline first serves a new
session at once while a session with seconds of audio buffered waits, and serves a session about
to run dry before either.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import math
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")
_Job = tuple[float, int, Callable[[], object] | None, Future[object] | None]
# prctl(2)'s PR_SET_NAME: the calling thread's name as the kernel shows it (15 bytes).
_PR_SET_NAME = 15


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` in the kernel's view too (``/proc/PID/task/TID/comm``, ``top -H``).

    Threads it starts later inherit the name: an ONNX Runtime session created on a worker names its pool
    threads after it, so a benchmark can tell the engine's CPU from the rest of a process's (Linux only;
    elsewhere nothing happens).
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


class DeadlineWorkers:
    """``workers`` daemon threads taking jobs from one queue ordered by deadline.

    Args:
        workers: threads, each running one job at a time.
        name: thread name prefix.
    """

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._running = 0
        self._threads = [
            threading.Thread(target=self._run, args=(f"{name}-{i}",), name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def running(self) -> int:
        """Jobs running now (a job may read it to see whether it has the machine to itself)."""
        return self._running

    def submit(self, deadline: float, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn``; the earliest ``deadline`` runs first, equal deadlines in arrival order."""
        future: Future[T] = Future()
        self._queue.put((deadline, next(self._order), fn, future))  # type: ignore[arg-type]
        return future

    def _run(self, name: str) -> None:
        name_os_thread(name)
        while True:
            _, _, fn, future = self._queue.get()
            if fn is None or future is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            self._count(+1)
            try:
                result = fn()
            except BaseException as exc:  # the thread boundary: the awaiting side gets the failure
                self._count(-1)  # before the waiter wakes, so it sees this job over
                future.set_exception(exc)
            else:
                self._count(-1)
                future.set_result(result)

    def _count(self, change: int) -> None:
        with self._lock:
            self._running += change

    def shutdown(self) -> None:
        """Stop the threads once the jobs already queued have run (they should check their own stop flags)."""
        for _ in self._threads:
            self._queue.put((math.inf, next(self._order), None, None))
