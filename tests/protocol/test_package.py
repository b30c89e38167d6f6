"""``voxgate.protocol`` names its public API, and importing the package alone loads none of its modules."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import voxgate.protocol as protocol


def _loaded_after(statement: str) -> set[str]:
    """The top-level names of the modules a fresh interpreter has loaded after ``statement``."""
    script = f"import sys; {statement}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


def test_importing_the_package_loads_neither_pyav_nor_numpy() -> None:
    loaded = _loaded_after("import voxgate.protocol")
    assert "voxgate" in loaded and not {"av", "numpy", "soxr"} & loaded


def test_a_name_loads_only_what_its_module_needs() -> None:
    """The error table needs no audio: taking ``ProtocolError`` loads no PyAV; ``Core`` does load it."""
    assert "av" not in _loaded_after("from voxgate.protocol import ErrorCode, ProtocolError")
    assert "av" in _loaded_after("from voxgate.protocol import Core")


@pytest.mark.parametrize("name", protocol.__all__)
def test_every_public_name_is_its_module_s_own(name: str) -> None:
    home = importlib.import_module(f"voxgate.protocol.{protocol._HOMES[name]}")
    assert getattr(protocol, name) is getattr(home, name)
    assert name in dir(protocol)


def test_the_public_names_are_the_table_s_and_others_are_missing() -> None:
    assert sorted(protocol._HOMES) == protocol.__all__
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        protocol.Nothing  # noqa: B018
    from voxgate.protocol import messages  # a module still imports as before

    assert messages.SessionConfig is protocol.SessionConfig
