"""The generic top-level names ``protocol``, ``engine`` and ``gateway`` resolve to this repository.

An installed distribution with one of these names would otherwise shadow ours without a sound.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["protocol", "engine", "gateway"])
def test_package_is_this_repos(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__file__ is not None, f"{name} is a namespace package, not this repo's package"
    assert Path(module.__file__).resolve() == REPO_ROOT / name / "__init__.py"
