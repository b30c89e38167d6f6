"""One vllm-omni server per checkpoint kind for the whole test session: each takes seconds to start."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from tests.vllm_omni.upstream import Kind, RealUpstream, real_upstream

#: ``real(kind, async_chunk=True, forced_aligner=False, family=None)``: the shared server of that kind (or of
#: that other model family), started when first used.
RealUpstreams = Callable[..., RealUpstream]


@pytest.fixture(scope="session")
def real() -> Iterator[RealUpstreams]:
    running: dict[tuple[Kind, bool, bool, str | None], RealUpstream] = {}
    with contextlib.ExitStack() as stack:

        def get(
            kind: Kind = "CustomVoice",
            async_chunk: bool = True,
            forced_aligner: bool = False,
            family: str | None = None,
        ) -> RealUpstream:
            key = (kind, async_chunk, forced_aligner, family)
            if key not in running:
                upstream = real_upstream(kind, async_chunk, forced_aligner, family=family)
                running[key] = stack.enter_context(upstream)
            return running[key]

        yield get
