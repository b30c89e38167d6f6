"""DeadlineWorkers runs the queued job with the earliest deadline first."""

from __future__ import annotations

import functools
import threading

import pytest
from voxgate.engine.workers import DeadlineWorkers


def test_queued_jobs_run_by_deadline_then_arrival() -> None:
    workers = DeadlineWorkers(1, "test")
    gate = threading.Event()
    ran: list[str] = []
    blocker = workers.submit(0, gate.wait)  # occupies the only thread while the others queue up
    jobs = [
        (103.0, "late segment"),
        (100.0, "first segment A"),
        (101.5, "second"),
        (100.0, "first segment B"),
    ]
    futures = [workers.submit(d, functools.partial(ran.append, name)) for d, name in jobs]
    gate.set()
    blocker.result(timeout=10)
    for future in futures:
        future.result(timeout=10)
    workers.shutdown()
    assert ran == ["first segment A", "first segment B", "second", "late segment"]


def test_running_counts_the_jobs_in_progress() -> None:
    workers = DeadlineWorkers(2, "test")
    gate, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        gate.wait()

    assert workers.running == 0
    held = workers.submit(0, hold)
    started.wait(10)
    assert workers.submit(0, lambda: workers.running).result(timeout=10) == 2
    gate.set()
    held.result(timeout=10)
    assert workers.submit(0, lambda: workers.running).result(timeout=10) == 1
    workers.shutdown()


def test_failures_reach_the_caller_and_the_thread_survives() -> None:
    workers = DeadlineWorkers(1, "test")

    def boom() -> None:
        raise RuntimeError("model failed")

    with pytest.raises(RuntimeError, match="model failed"):
        workers.submit(0, boom).result(timeout=10)
    assert workers.submit(0, lambda: 42).result(timeout=10) == 42
    workers.shutdown()


def test_a_cancelled_job_is_skipped() -> None:
    workers = DeadlineWorkers(1, "test")
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
