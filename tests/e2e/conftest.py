"""End-to-end fixtures: one gateway with the real Piper engine for the whole test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import serve_engine


@pytest.fixture(scope="session")
def piper_gateway() -> Iterator[str]:
    """Address of a real uvicorn gateway running the embedded Piper engine."""
    with serve_engine(None, engine="piper", piper_workers=2) as address:
        yield address
