"""The C-heap tuning Piper does for memory is safe to call anywhere (a no-op off glibc)."""

from __future__ import annotations

import asyncio
import platform
import threading

import pytest
from voxgate.engine import piper, piper_memory
from voxgate.engine.base import SynthesisRequest

from tests.conftest import TIMEOUT_S


def test_malloc_tuning_and_trim_run_and_find_glibc_where_it_is() -> None:
    piper_memory.tune_malloc()
    piper_memory.release_freed_memory()
    assert (piper_memory._LIBC is not None) == (platform.libc_ver()[0] == "glibc")


@pytest.mark.slow
def test_the_wide_arena_is_freed_once_the_engine_is_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(piper, "_ARENA_IDLE_S", 0.0)

    async def scenario() -> int:
        engine = piper.PiperEngine(threads=1, workers=2, wide_threads=2, wide_arena=True)
        await engine.start()
        try:
            shrunk, shrink = threading.Event(), engine._shrink

            def observed(jobs: int) -> None:
                shrink(jobs)
                shrunk.set()

            monkeypatch.setattr(engine, "_shrink", observed)
            request = SynthesisRequest(text="Hello there.", voice="joe", seed=1)
            assert [c async for c in engine.synthesize(request)]
            assert await asyncio.to_thread(shrunk.wait, TIMEOUT_S)
            return engine.shrinks
        finally:
            await engine.aclose()

    assert asyncio.run(scenario()) == 1
