"""The settings of engine ``vllm-omni`` (``--engine vllm-omni``: vllm-omni's AsyncOmni in this process)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from .options import option


class VllmOmniSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of engine ``vllm-omni``: AsyncOmni in this process (GPU)."""

    # The Qwen3-TTS checkpoint that AsyncOmni loads, vllm-omni's deploy YAML (a name under
    # vllm_omni/deploy/ or a path), and how long each stage may take to start (a cold start of the 0.6B
    # model, weights plus CUDA graphs, took ~2.5 min; vllm-omni's default is 300 s).
    vllm_model: Annotated[
        str,
        option(
            "Qwen3-TTS checkpoint loaded in this process (GPU)", flag=True, shown="Qwen3-TTS 0.6B CustomVoice"
        ),
    ] = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
    vllm_deploy_config: Annotated[
        str, option("vllm-omni deploy YAML, a name under `vllm_omni/deploy/` or a path", flag=True)
    ] = "qwen3_tts.yaml"
    vllm_stage_init_timeout_s: Annotated[float, option("seconds each vllm-omni stage may take to start")] = (
        300.0
    )
    # vllm-omni's --forced-aligner: appends an aligner model stage (Qwen3-ForcedAligner-0.6B, about 30% of
    # the GPU's memory by vllm-omni's default) that times the words of each segment after its audio.
    vllm_forced_aligner: Annotated[
        str,
        option("forced-aligner model for `word_timestamps` (vllm-omni's `--forced-aligner`); empty: none"),
    ] = ""
