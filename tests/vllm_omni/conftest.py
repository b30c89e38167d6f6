"""One vllm-omni server per checkpoint kind for the whole test session: each takes seconds to start."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from tests.vllm_omni.upstream import Kind, RealUpstream, real_upstream

#: ``real(kind, async_chunk=True)``: the shared server of that kind, started on first use.
RealUpstreams = Callable[..., RealUpstream]


@pytest.fixture(scope="session")
def real() -> Iterator[RealUpstreams]:
    running: dict[tuple[Kind, bool], RealUpstream] = {}
    with contextlib.ExitStack() as stack:

        def get(kind: Kind = "CustomVoice", async_chunk: bool = True) -> RealUpstream:
            if (kind, async_chunk) not in running:
                running[kind, async_chunk] = stack.enter_context(real_upstream(kind, async_chunk))
            return running[kind, async_chunk]

        yield get
