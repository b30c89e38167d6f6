"""``protocol/`` stays sans-I/O: no module in it imports an event loop, a server, a socket or the shells."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROTOCOL_DIR = Path(__file__).resolve().parents[2] / "protocol"
# Event loops, servers, sockets and threads belong to the gateway shell; engine and gateway sit above
# the protocol and must never be imported by it (that would also make an import cycle).
FORBIDDEN = frozenset(
    {"asyncio", "anyio", "starlette", "uvicorn", "websockets", "voxgate.engine", "voxgate.gateway"}
    | {"socket", "threading"}
)
MODULES = sorted(PROTOCOL_DIR.rglob("*.py"))


def forbidden_imports(source: str, package: tuple[str, ...] = ("voxgate", "protocol")) -> list[str]:
    """Return the forbidden modules imported anywhere in ``source`` (functions and ``TYPE_CHECKING`` too),
    a module of ``package`` (where its relative imports count from)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names = [node.module]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            names = _resolved(node, package)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
            in ("__import__", "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        found.extend(name for name in names if any(name == f or name.startswith(f"{f}.") for f in FORBIDDEN))
    return found


def package_of(path: Path) -> tuple[str, ...]:
    """The package a module of protocol/ is in, inside the installed package: relative imports count from
    here (``protocol/codecs/x.py`` is in ``voxgate.protocol.codecs``)."""
    return ("voxgate", "protocol", *path.relative_to(PROTOCOL_DIR).parent.parts)


def _resolved(node: ast.ImportFrom, package: tuple[str, ...]) -> list[str]:
    """The absolute names a relative import of a protocol/ module names (``from ..engine import x`` is
    ``voxgate.engine``; ``from .. import gateway`` is ``voxgate.gateway``)."""
    base = ".".join(package[: len(package) + 1 - node.level])
    if node.module is not None:
        return [f"{base}.{node.module}" if base else node.module]
    return [f"{base}.{alias.name}" if base else alias.name for alias in node.names]


def test_protocol_modules_are_found() -> None:
    names = {path.name for path in MODULES}
    assert {"__init__.py", "errors.py", "frames.py", "audio.py", "messages.py", "session.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PROTOCOL_DIR)))
def test_module_imports_no_io(path: Path) -> None:
    assert forbidden_imports(path.read_text(encoding="utf-8"), package_of(path)) == []


def test_relative_imports_count_from_the_module_s_own_package() -> None:
    """``from ...gateway import x`` in protocol/codecs/ reaches the shell; ``from ..errors`` does not."""
    codecs = package_of(PROTOCOL_DIR / "codecs" / "stream.py")
    assert codecs == ("voxgate", "protocol", "codecs")
    assert forbidden_imports("from ...gateway.app import create_app", codecs) == ["voxgate.gateway.app"]
    assert forbidden_imports("from ..errors import ProtocolError", codecs) == []
    assert forbidden_imports("from ..engine import x", codecs) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import asyncio", ["asyncio"]),
        ("import os, socket", ["socket"]),
        ("import starlette.websockets as ws", ["starlette.websockets"]),
        ("from voxgate.gateway.app import create_app", ["voxgate.gateway.app"]),
        ("from voxgate.engine import ENGINES", ["voxgate.engine"]),
        ("def f():\n    import threading\n", ["threading"]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import anyio\n", ["anyio"]),
        ("import importlib\nimportlib.import_module('uvicorn')", ["uvicorn"]),
        ("__import__('websockets')", ["websockets"]),
        ("from ..engine.base import TTSEngine", ["voxgate.engine.base"]),
        ("from ..gateway import app", ["voxgate.gateway"]),
        ("from .. import gateway", ["voxgate.gateway"]),
        ("def f():\n    from ..engine import ENGINES\n", ["voxgate.engine"]),
    ],
)
def test_checker_catches_forbidden_imports(source: str, expected: list[str]) -> None:
    assert forbidden_imports(source) == expected


@pytest.mark.parametrize(
    "source",
    [
        "import msgspec, numpy, soxr, struct",
        "from voxgate.protocol.errors import ProtocolError",
        "import voxgate.engineering",  # only whole module names count
        "from . import errors",
        "from .engine import x",  # relative: inside protocol/, not the top-level engine package
        "import asyncio_compat",  # only whole module names count
        "import importlib\nimportlib.import_module(name)",
    ],
)
def test_checker_allows_pure_imports(source: str) -> None:
    assert forbidden_imports(source) == []
