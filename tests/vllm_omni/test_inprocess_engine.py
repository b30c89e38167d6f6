"""voxgate's in-process engine (engine/vllm_omni.py) against the installed vllm-omni 0.30.0, not a look-alike.

tests/vllm_omni/inprocess_probe.py runs in the vllm-omni env (the main venv has no vllm) and prints JSON:

- the same requests built by vllm-omni's own speech server (``_prepare_speech_generation``: the Qwen3-TTS
  adapter, ``coerce_param_message_types``, the seed) and by voxgate's engine (which runs that serving code
  in-process, ``engine.omni_requests``), on one CPU engine client per checkpoint kind; compared here per
  input kind and field (other families: test_inprocess_families.py);
- with ``async_chunk`` off, real ``OmniRequestOutput``s carrying cumulative snapshots through voxgate's
  engine;
- ``AsyncOmni`` construction and teardown as voxgate's engine does them, on this CPU.

Without the env the tests skip, except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_omni.upstream import require_vllm_python

pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("inprocess_probe.py")
ROOT = PROBE.parents[2]
# Imports (vLLM, transformers, torch) take 10-20 s on a 2-core machine, then three engine clients start.
PROBE_TIMEOUT_S = 600
INPUTS = ("CustomVoice", "VoiceDesign", "Base with transcript", "Base x-vector only", "speaker embedding")


def run_probe(mode: str, *, new_session: bool = False) -> tuple[dict[str, Any], int]:
    """The probe's JSON and its process id."""
    python = require_vllm_python()
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen(
        [python, str(PROBE), mode],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=new_session,
    )
    try:
        stdout, stderr = proc.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    if proc.returncode != 0 or not stdout.strip():
        pytest.fail(f"probe {mode} exited {proc.returncode}:\n{stderr[-6000:]}", pytrace=False)
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result, proc.pid


@pytest.fixture(scope="module")
def compared() -> dict[str, Any]:
    return run_probe("compare")[0]


def both(compared: dict[str, Any], kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    case = compared["cases"][kind]
    return case["vllm_omni"], case["voxgate"]


@pytest.mark.parametrize("kind", INPUTS)
def test_prompt_lengths_match(compared: dict[str, Any], kind: str) -> None:
    upstream, ours = both(compared, kind)
    assert ours["prompt_len"] == upstream["prompt_len"]


@pytest.mark.parametrize("stage", [0, 1], ids=["talker", "code2wav"])
@pytest.mark.parametrize("kind", INPUTS)
def test_sampling_parameters_match(compared: dict[str, Any], kind: str, stage: int) -> None:
    upstream, ours = both(compared, kind)
    assert len(ours["params"]) == len(upstream["params"]) == 2
    assert ours["params"][stage] == upstream["params"][stage]
    if stage == 0:  # the request's seed reaches the talker and its code predictor on both sides
        assert upstream["params"][0]["seed"] == 1234
        assert upstream["params"][0]["extra_args"] == {"tts_local_seed": 1234}
    if stage == 0 and kind.startswith(("Base", "speaker")):  # budget by text tokens, above the floor
        assert upstream["params"][0]["max_tokens"] > 192


@pytest.mark.parametrize("kind", INPUTS)
def test_output_modalities_match(compared: dict[str, Any], kind: str) -> None:
    upstream, ours = both(compared, kind)
    assert ours["modalities"] == upstream["modalities"] == ["audio"]


@pytest.mark.parametrize("kind", INPUTS)
def test_additional_information_matches(compared: dict[str, Any], kind: str) -> None:
    upstream, ours = both(compared, kind)
    # Key for key, vllm-omni's own bookkeeping included: both sides run its serving code.
    assert ours["info"] == upstream["info"]


def test_without_async_chunk_both_sides_ask_for_final_only(compared: dict[str, Any]) -> None:
    result = compared["cumulative"]
    assert result["vllm_omni_output_kinds"] == result["voxgate_output_kinds"] == ["FINAL_ONLY", "FINAL_ONLY"]


@pytest.mark.parametrize("shape", ["final history list", "final list, repeated", "growing tensors"])
def test_cumulative_snapshots_are_not_duplicated(compared: dict[str, Any], shape: str) -> None:
    result = compared["cumulative"]
    assert result[shape]["samples"] == result["samples_expected"]
    assert result[shape]["equal"]


def test_word_timestamp_requests_match(compared: dict[str, Any]) -> None:
    # With --forced-aligner vllm-omni appends the aligner stage; both sides ask for its "timestamps" output
    # and keep the audio CUMULATIVE (the aligner reads the whole waveform), with the pooling stage's params.
    result = compared["words"]
    assert result["stages"] == [None, "audio", "timestamps"]
    upstream, ours = result["vllm_omni"], result["voxgate"]
    assert ours["modalities"] == upstream["modalities"] == ["audio", "timestamps"]
    assert len(ours["params"]) == len(upstream["params"]) == 3
    assert ours["params"] == upstream["params"]
    assert [p["output_kind"] for p in ours["params"][:2]] == ["CUMULATIVE", "CUMULATIVE"]
    assert ours["prompt_len"] == upstream["prompt_len"]
    assert ours["info"] == upstream["info"]


def test_words_reach_the_in_process_engine_from_the_aligner_stage(compared: dict[str, Any]) -> None:
    # Read by vllm-omni's extract_word_timestamps from the aligner stage's output (the stand-in model's
    # logits through vllm-omni's decoder), named as written, held with the audio they describe.
    (chunk,) = compared["words"]["chunks"]
    words = chunk["words"]
    assert [w[0] for w in words] == "It costs $3.50 on 5/12, Dr. Smith said.".split()
    bounds = [t for _, start, end in words for t in (start, end)]
    assert bounds == sorted(bounds) and bounds[0] >= 0 and bounds[-1] <= chunk["samples"]
    # Piper's words tile the audio; the aligner's 80 ms bins put the last end within a bin of its end.
    assert chunk["samples"] - bounds[-1] <= 0.08 * chunk["rate"]


def test_without_the_aligner_stage_word_timestamps_are_refused_by_name(compared: dict[str, Any]) -> None:
    refused = compared["words"]["refused"]
    assert refused is not None and refused["field"] == "word_timestamps"
    assert "forced-aligner" in refused["message"] and "VOXGATE_VLLM_FORCED_ALIGNER" in refused["message"]


def _session_members(sid: int) -> list[str]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # field 6 of /proc/<pid>/stat: the session id
                members.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()[:200]!r}")
        except (OSError, IndexError, ValueError):
            continue
    return members


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_async_omni_stops_at_the_missing_cpu_platform_and_leaves_nothing_behind() -> None:
    # vllm-omni 0.30.0 has no CPU platform. AsyncOmni's engine starts its orchestrator thread, which plans
    # the stages and asks the platform for the talker's worker class: OmniPlatform.get_omni_ar_worker_cls
    # raises a bare NotImplementedError (vllm_omni/platforms/interface.py), before any stage process is
    # spawned. The constructor re-raises it as RuntimeError("Orchestrator initialization failed: ").
    # voxgate's engine turns that into an EngineError naming both. A version that gets further fails here.
    result, pid = run_probe("construct", new_session=True)
    assert result["started"] is False, result
    errors = [(e["type"], e["function"]) for e in result["error"]]
    assert errors[0][0] == "EngineError"
    assert ("RuntimeError", "__get_result") in errors or errors[1][0] == "RuntimeError", errors
    assert errors[-1] == ("NotImplementedError", "get_omni_ar_worker_cls"), errors
    assert "NotImplementedError" in result["error"][0]["message"]
    frames = result["error"][1]["frames"]  # where AsyncOmni waited for its orchestrator
    assert any(f.endswith("omni_engine_base.py:_wait_for_orchestrator_init") for f in frames), frames
    # Teardown: nothing left, in the probe before it exited nor in its session after.
    assert result["children_left"] == [] and result["threads_left"] == []
    assert _session_members(pid) == []
