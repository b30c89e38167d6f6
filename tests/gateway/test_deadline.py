"""``connection.Deadline``: asyncio.timeout's behaviour for repeated waits, with a lazily armed timer."""

from __future__ import annotations

import asyncio

import pytest
from voxgate.gateway.transport.socket import Deadline


async def _forever() -> None:
    await asyncio.Event().wait()


def test_a_wait_that_completes_returns_its_value_and_later_waits_still_time_out() -> None:
    async def main() -> None:
        deadline = Deadline()
        done = asyncio.Event()
        done.set()
        for _ in range(3):
            assert await deadline.within(done.wait(), 60.0) is True
        # The 60 s timer is still pending; a shorter wait arms its own, earlier one.
        with pytest.raises(TimeoutError):
            await deadline.within(_forever(), 0.01)
        assert asyncio.current_task() is not None and asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        deadline.close()

    asyncio.run(main())


def test_a_timer_that_fires_before_the_deadline_rearms_for_it() -> None:
    """A short wait's timer is kept for a later, longer wait: firing early it re-arms, and the long
    wait ends by its value, not by the short wait's time."""

    async def main() -> None:
        deadline = Deadline()
        with pytest.raises(TimeoutError):
            await deadline.within(_forever(), 0.0)
        gate = asyncio.Event()
        ready = asyncio.Event()
        ready.set()
        assert await deadline.within(ready.wait(), 0.01) is True  # arms a timer at +10 ms, kept below
        loop = asyncio.get_running_loop()
        fired = loop.create_future()
        loop.call_later(0.05, fired.set_result, None)  # after that timer has fired

        async def release() -> None:
            await fired
            gate.set()

        opener = asyncio.create_task(release())
        assert await deadline.within(gate.wait(), 60.0) is True
        await opener
        deadline.close()

    asyncio.run(main())


def test_a_cancel_from_elsewhere_is_not_turned_into_a_timeout() -> None:
    async def main() -> None:
        deadline = Deadline()
        started = asyncio.Event()

        async def waiter() -> None:
            started.set()
            await deadline.within(_forever(), 60.0)

        task = asyncio.create_task(waiter())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline.close()

    asyncio.run(main())


def test_a_cancel_that_comes_with_the_deadline_still_propagates() -> None:
    async def main() -> None:
        deadline = Deadline()
        outcome: list[str] = []

        async def waiter() -> None:
            try:
                await deadline.within(_forever(), 0.0)
            except TimeoutError:
                outcome.append("timeout")
                raise

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)  # the waiter is inside its wait, its timer due now
        deadline._fire()  # the deadline's cancel ...
        task.cancel()  # ... and the task group's, before the task runs again
        with pytest.raises(asyncio.CancelledError):
            await task
        assert outcome == []
        deadline.close()

    asyncio.run(main())
