"""One vllm-omni server per checkpoint kind for the whole test session: each takes seconds to start."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from tests.vllm_omni.upstream import Kind, RealUpstream, real_upstream

#: ``real(kind, async_chunk=True, forced_aligner=False)``: the shared server of that kind, started when first
#: used.
RealUpstreams = Callable[..., RealUpstream]


@pytest.fixture(scope="session")
def real() -> Iterator[RealUpstreams]:
    running: dict[tuple[Kind, bool, bool], RealUpstream] = {}
    with contextlib.ExitStack() as stack:

        def get(
            kind: Kind = "CustomVoice", async_chunk: bool = True, forced_aligner: bool = False
        ) -> RealUpstream:
            key = (kind, async_chunk, forced_aligner)
            if key not in running:
                running[key] = stack.enter_context(real_upstream(kind, async_chunk, forced_aligner))
            return running[key]

        yield get
