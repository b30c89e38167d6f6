"""voxgate's in-process engine submits, for each detectable model family, what vllm-omni's server submits.

tests/vllm_omni/inprocess_probe.py ``families`` runs in the vllm-omni env. For each family that
test_families_real.py makes detectable (server.py ``FAMILIES``: the checkpoint folder whose config.json
declares the family's ``model_type``, and the family's deploy config, from which vllm-omni's resolver builds
the stage configs its serving layer detects the adapter from), it starts one CPU engine client and, on it,
vllm-omni's speech serving object (``_prepare_speech_generation``, as its server calls it) and voxgate's
``VllmOmniEngine`` (which builds its own serving object over the client, ``engine.omni_requests``); also
for Qwen3-TTS's Base and CustomVoice checkpoints. Per case (a plain request, a clone from a transcribed
44.1 kHz clip, from an untranscribed one, from an embedding, a budget past vllm-omni's limit) each side ends
at ``engine_client.generate``, recorded whole: the prompt (token ids, ``additional_information``,
multimodal audio, cache salt), each stage's sampling parameters and the output modalities; or at the error
its preparation stopped at; or, on voxgate's side, at a refusal by the family's row in engine/families.py.

Families that cannot run this way on CPU (none of them runs its model here; these cannot even be detected):

- MOSS-TTS: vllm-omni's resolver needs the checkpoint's real config (variant, codec) to pick a pipeline.
- OmniVoice: a diffusion pipeline, served by vllm-omni's diffusion engine (``_create_diffusion_speech``), not
  through ``AsyncOmni``'s speech preparation; the in-process engine refuses it at start.
- Ming TTS (dense): its pipeline resolves only from the model's own config (``dense``, no architectures).
- Covo Audio: ``covo_audio`` is unknown to transformers, and its deploy config needs ``--no-async-chunk``.

And cases whose preparation needs the model's own files (``NEEDS_MODEL``): both sides stop at the same error.
"""

from __future__ import annotations

from typing import Any

import pytest
from voxgate.engine.families import FAMILIES, Clip, Family

from tests.vllm_omni.inprocess_probe import CLIP_RATE_HZ, DETECTABLE, FAMILY_CASES
from tests.vllm_omni.test_inprocess_engine import run_probe

pytestmark = pytest.mark.slow

# The families (as test_families_real.py ``PROVEN``), the cases and the clips' rate the probe runs.
CASES = FAMILY_CASES
#: Cases whose preparation needs the checkpoint's own files on both sides, and what vllm-omni says then.
NEEDS_MODEL: dict[tuple[str, str], str] = {
    # The checkpoint's AutoProcessor (feature extractor) builds Higgs Audio's prompt.
    ("higgs_audio_v2", "plain"): "Can't load feature extractor",
    ("higgs_audio_v2", "transcribed"): "Can't load feature extractor",
    ("higgs_audio_v2", "over budget"): "Can't load feature extractor",
    # Voxtral's presets and references are encoded by the model's workers (``collective_rpc``).
    ("voxtral_tts", "plain"): "collective_rpc",
    ("voxtral_tts", "transcribed"): "collective_rpc",
    ("voxtral_tts", "untranscribed"): "collective_rpc",
    # VoxCPM2 encodes a reference with its audio VAE, whose config the stand-in folder lacks.
    ("voxcpm2", "transcribed"): "encoder_rates",
    ("voxcpm2", "untranscribed"): "encoder_rates",
}
#: Clones vllm-omni takes and speaks without cloning (it ignores the embedding, or the clip of a CustomVoice
#: request): voxgate refuses them.
UNCLONED = frozenset(
    {("fish_tts", "embedding"), ("voxcpm2", "embedding"), ("qwen3_tts_customvoice", "untranscribed")}
)


@pytest.fixture(scope="module")
def families() -> dict[str, Any]:
    return run_probe("families")[0]


def _refusal(rules: Family, case: str) -> str | None:
    """The field voxgate refuses ``case`` with (None: it goes to vllm-omni), by the family's row."""
    if case == "transcribed" and rules.clip is Clip.NONE:
        return "ref_audio"
    if case == "untranscribed" and rules.clip in (Clip.NONE, Clip.TRANSCRIPT):
        return "ref_audio" if rules.clip is Clip.NONE else "ref_text"
    if case == "embedding" and not rules.embedding:
        return "speaker_embedding"
    return None


def _case(families: dict[str, Any], family: str, case: str) -> tuple[dict[str, Any], dict[str, Any]]:
    result = families[family]["cases"][case]
    return result["vllm_omni"], result["voxgate"]


@pytest.mark.parametrize("family", DETECTABLE)
def test_the_engine_serves_the_family_vllm_omni_detects(families: dict[str, Any], family: str) -> None:
    result = families[family]
    assert "start" not in result, result.get("start")  # the engine started on the family's pipeline
    assert result["family"] == family
    # vllm-omni has one adapter for Qwen3-TTS; voxgate's rows tell its checkpoint kinds apart.
    assert result["adapter"] == ("qwen3_tts" if family.startswith("qwen3_tts_") else family)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("family", DETECTABLE)
def test_each_case_reaches_the_engine_as_vllm_omni_submits_it(
    families: dict[str, Any], family: str, case: str
) -> None:
    upstream, ours = _case(families, family, case)
    field = _refusal(FAMILIES[family], case)
    if field is not None:
        # Refused by voxgate before anything is built; vllm-omni's own adapter refuses it too, or takes it
        # and speaks without the clone.
        assert ours.get("refused") == field, ours
        assert upstream.get("error") == "ValueError" or ((family, case) in UNCLONED and "prompt" in upstream)
        return
    expected = NEEDS_MODEL.get((family, case))
    if expected is not None:
        assert expected in upstream["message"], upstream
        assert ours == {"error": "EngineError", "message": f"vllm-omni failed: {upstream['message']}"}
        return
    if upstream.get("error") == "ValueError":  # vllm-omni's validation, which voxgate's engine runs too
        assert ours == {"refused_by_vllm_omni": f"vllm-omni refused the request: {upstream['message']}"}
        return
    assert "error" not in upstream, upstream
    # The whole prompt (token ids, additional_information, audio, cache salt), every stage's sampling
    # parameters (the seed on the talker) and the output modalities.
    assert ours == upstream
    assert ours["params"][0]["seed"] == 1234
    if case != "plain":  # the clone, or the budget, changed what was submitted
        plain = families[family]["cases"]["plain"]["voxgate"]
        assert ours != plain


def test_most_cases_are_compared_whole(families: dict[str, Any]) -> None:
    whole = [
        (family, case)
        for family in DETECTABLE
        for case in CASES
        if "prompt" in families[family]["cases"][case]["voxgate"]
    ]
    # plain and transcribed for Fish Speech, CosyVoice3 and GLM-TTS; Ming's plain, embedding and budget;
    # VoxCPM2's plain.
    assert len(whole) >= 10, whole


def test_a_reference_clip_reaches_vllm_omni_at_its_own_rate(families: dict[str, Any]) -> None:
    # Fish Speech's adapter hands the clip's rate to its model (which runs at 44.1 kHz); CosyVoice3's is
    # multimodal audio with its rate. Neither is resampled on the way.
    fish, _ = _case(families, "fish_tts", "transcribed")
    assert fish["prompt"]["additional_information"]["ref_audio_sr"] == CLIP_RATE_HZ
    cosy, _ = _case(families, "cosyvoice3", "transcribed")
    assert cosy["prompt"]["multi_modal_data"]["audio"][1] == CLIP_RATE_HZ
    assert cosy["prompt"]["mm_processor_kwargs"]["sample_rate"] == CLIP_RATE_HZ


@pytest.mark.parametrize("family", ["cosyvoice3", "glm_tts", "qwen3_tts_base"])
def test_a_plain_request_to_a_reference_only_family_carries_the_default_voice(
    families: dict[str, Any], family: str
) -> None:
    upstream, ours = _case(families, family, "plain")
    assert ours == upstream
    prompt = ours["prompt"]
    assert "multi_modal_data" in prompt or prompt["additional_information"]["ref_text"] == [
        "The quick brown fox jumps over the lazy dog, and then it rests."
    ]


def test_vllm_omni_checks_an_embedding_against_the_model_in_process(families: dict[str, Any]) -> None:
    # Qwen3-TTS Base takes a speaker embedding as long as its talker's hidden size (1024 here): vllm-omni's
    # own validation refuses a 192-value one, in voxgate's engine as in its server.
    upstream, ours = _case(families, "qwen3_tts_base", "embedding")
    assert "expected 1024" in upstream["message"]
    assert ours == {"refused_by_vllm_omni": f"vllm-omni refused the request: {upstream['message']}"}
