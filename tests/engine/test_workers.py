"""PriorityWorkers runs the most urgent queued job first."""

from __future__ import annotations

import functools
import threading

import pytest

from voxgate.engine.workers import PriorityWorkers


def test_queued_jobs_run_by_priority_then_arrival() -> None:
    workers = PriorityWorkers(1, "test")
    gate = threading.Event()
    ran: list[str] = []
    blocker = workers.submit(0, gate.wait)  # occupies the only thread while the others queue up
    jobs = [(3, "late segment"), (0, "first segment A"), (1, "second"), (0, "first segment B")]
    futures = [workers.submit(p, functools.partial(ran.append, name)) for p, name in jobs]
    gate.set()
    blocker.result(timeout=10)
    for future in futures:
        future.result(timeout=10)
    workers.shutdown()
    assert ran == ["first segment A", "first segment B", "second", "late segment"]


def test_failures_reach_the_caller_and_the_thread_survives() -> None:
    workers = PriorityWorkers(1, "test")

    def boom() -> None:
        raise RuntimeError("model failed")

    with pytest.raises(RuntimeError, match="model failed"):
        workers.submit(0, boom).result(timeout=10)
    assert workers.submit(0, lambda: 42).result(timeout=10) == 42
    workers.shutdown()


def test_a_cancelled_job_is_skipped() -> None:
    workers = PriorityWorkers(1, "test")
    gate = threading.Event()
    ran: list[int] = []
    blocker = workers.submit(0, gate.wait)
    doomed = workers.submit(0, lambda: ran.append(1))
    assert doomed.cancel()
    gate.set()
    blocker.result(timeout=10)
    assert workers.submit(1, lambda: ran.append(2)).result(timeout=10) is None
    workers.shutdown()
    assert ran == [2]
