"""voxgate installs one import name, ``voxgate``, and it resolves to this repository.

Generic top-level names (``engine``, ``gateway``, ``protocol``) would collide in site-packages and with a
user's own ``engine.py``; the parts live in the repository's top-level folders, linked from ``voxgate/``.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
PARTS = ("protocol", "engine", "gateway")
IGNORED = shutil.ignore_patterns("__pycache__")


@pytest.mark.parametrize("name", PARTS)
def test_each_part_is_this_repos_folder(name: str) -> None:
    module = importlib.import_module(f"voxgate.{name}")
    assert module.__file__ is not None
    assert Path(module.__file__).resolve() == REPO_ROOT / name / "__init__.py"


def test_a_users_own_engine_module_does_not_shadow_ours(tmp_path: Path) -> None:
    (tmp_path / "engine.py").write_text("raise SystemExit('the user module was imported')\n")
    (tmp_path / "gateway.py").write_text("raise SystemExit('the user module was imported')\n")
    script = "import voxgate.gateway.app, voxgate.engine; print(voxgate.engine.__name__)"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "voxgate.engine", done.stderr


@pytest.mark.slow
def test_the_wheel_holds_only_voxgate_with_its_page_and_types(tmp_path: Path) -> None:
    # Built from a copy: setuptools writes build/ beside pyproject.toml.
    source = tmp_path / "src"
    for part in ("pyproject.toml", "README.md", "voxgate", *PARTS, "web"):
        if (REPO_ROOT / part).is_dir():
            shutil.copytree(REPO_ROOT / part, source / part, symlinks=True, ignore=IGNORED)
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(REPO_ROOT / part, source / part)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
        + [str(source)],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("voxgate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"voxgate"}
    assert {"voxgate/py.typed", "voxgate/web/index.html", "voxgate/protocol/core.py"} <= set(names)
    assert "voxgate/engine/piper.py" in names and not any(n.startswith("voxgate/tests") for n in names)
