"""voxgate installs one import name, ``voxgate``, and it resolves to this repository.

Generic top-level names (``engine``, ``gateway``, ``protocol``) would collide in site-packages and with a
user's own ``engine.py``; the parts live in the repository's top-level folders, mapped under ``voxgate`` by
``pyproject.toml`` (no symlinks: a checkout without them installs, and the sdist is the repository's tree).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
PARTS = ("protocol", "engine", "gateway")
PACKAGE_FOLDERS = ("voxgate", *PARTS, "web")
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
    for part in ("pyproject.toml", "README.md", *PACKAGE_FOLDERS):
        if (REPO_ROOT / part).is_dir():
            shutil.copytree(REPO_ROOT / part, source / part, ignore=IGNORED)
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
    assert "voxgate/engine/data/reference.wav" in names  # the remote engine's default reference voice
    assert "voxgate/engine/piper.py" in names and not any(n.startswith("voxgate/tests") for n in names)


def _tracked(root: Path) -> set[str]:
    """The package folders' files that git tracks in ``root``."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "--", *PACKAGE_FOLDERS],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return set(listed)


def _clone(into: Path, *options: str) -> Path:
    subprocess.run(["git", *options, "clone", "-q", str(REPO_ROOT), str(into)], check=True, timeout=120)
    return into


def _backend(hook: str, source: Path, out: Path) -> Path:
    """Run a PEP 517 hook of the backend pyproject.toml names in ``source``; the file it wrote."""
    out.mkdir(parents=True, exist_ok=True)
    script = f"from setuptools import build_meta; print(build_meta.{hook}({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=source, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out / done.stdout.split()[-1]


def _wheel(source: Path, out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out)]
        + [str(source)],
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("voxgate-*.whl")
    return wheel


def _contents(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {n: z.read(n) for n in z.namelist() if ".dist-info/" not in n}


def test_no_symlinks_in_the_repository() -> None:
    links = [p for p in _tracked(REPO_ROOT) if (REPO_ROOT / p).is_symlink()]
    assert links == []


@pytest.mark.slow
def test_a_checkout_without_symlinks_installs_and_imports(tmp_path: Path) -> None:
    clone = _clone(tmp_path / "clone", "-c", "core.symlinks=false")
    # What ``pip install -e .`` builds, then a regular wheel, imported from where it unpacks.
    assert _backend("build_editable", clone, tmp_path / "editable").suffix == ".whl"
    wheel = _wheel(clone, tmp_path / "wheel")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    script = (
        "import voxgate.gateway.app as app, voxgate.protocol.core as core; "
        "print(core.__file__); print(sorted(p.name for p in app.WEB_DIR.iterdir()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[0] == str(site / "voxgate" / "protocol" / "core.py")
    assert "index.html" in done.stdout


@pytest.mark.slow
def test_the_sdist_is_the_repositorys_tree_and_builds_the_same_wheel(tmp_path: Path) -> None:
    clone = _clone(tmp_path / "clone")
    sdist = _backend("build_sdist", clone, tmp_path / "dist")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
        top = f"{sdist.name.removesuffix('.tar.gz')}/"
        in_sdist = {
            m.name.removeprefix(top)
            for m in tar.getmembers()
            if m.isfile() and m.name.removeprefix(top).split("/")[0] in PACKAGE_FOLDERS
        }
    # Every package file the repository tracks is in the sdist at the same path, and nothing else is.
    assert in_sdist == _tracked(clone)
    from_sdist = _contents(_wheel(tmp_path / "unpacked" / top, tmp_path / "w1"))
    from_repo = _contents(_wheel(clone, tmp_path / "w2"))
    assert from_sdist == from_repo
