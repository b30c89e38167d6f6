"""The command-line client and the server share only the wire protocol.

``voxgate/client.py`` (with the ``say`` and ``voices`` subcommands of ``voxgate/cli.py``) is a client of a
running gateway, outside the server package: no server module imports it, and it imports nothing of the
server. ``voxgate/cli.py`` reaches the server only inside ``serve``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "gateway"
CLIENT_MODULES = {"voxgate.client", "voxgate.voice_client", "voxgate.cli"}
SERVER_MODULES = sorted(
    str(p.relative_to(GATEWAY).with_suffix("")) for p in GATEWAY.rglob("*.py") if p.stem != "__init__"
)


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("module", SERVER_MODULES)
def test_no_server_module_imports_the_client(module: str) -> None:
    assert not imported(GATEWAY / f"{module}.py") & CLIENT_MODULES


@pytest.mark.parametrize("name", ["client.py", "voice_client.py"])
def test_the_client_imports_nothing_of_the_server(name: str) -> None:
    found = imported(ROOT / "voxgate" / name)
    assert not {n for n in found if n.startswith(("voxgate.gateway", "voxgate.engine"))}, found
