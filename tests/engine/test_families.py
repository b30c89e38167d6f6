"""The remote engine shapes each request by the upstream's model family (engine/families.py).

Detection and the pure rules are checked directly; the rest through gateway B (remote engine on a real
uvicorn) in front of a recording ``StubUpstream`` that lists a family's model id and refuses nothing, so
what voxgate sends, and what it refuses before sending anything, is what is asserted. Whether vllm-omni's
own adapter for each family accepts those requests is tests/vllm_omni/test_families_real.py.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from voxgate.engine.base import RequestRefused, UnsupportedOption, VoiceReference
from voxgate.engine.families import FAMILIES, GENERIC, Clip, detect
from voxgate.engine.remote import RemoteEngine
from voxgate.engine.remote_settings import DEFAULT_REFERENCE_TEXT, RemoteSettings, invalid

from tests.conftest import TIMEOUT_S, recv, send, session, voxgate_connect
from tests.engine.test_remote import URL, clip, gateway, post_speech, ref_audio, speak, stubs, upload
from tests.engine.upstream_stub import StubUpstream


@pytest.mark.parametrize(
    ("model_id", "family"),
    [
        ("Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", "qwen3_tts_customvoice"),
        ("Qwen/Qwen3-TTS-12Hz-0.6B-Base", "qwen3_tts_base"),
        ("/models/Qwen3-TTS-12Hz-1.7B-VoiceDesign", "qwen3_tts_voicedesign"),
        ("fishaudio/s2-pro", "fish_tts"),
        ("FunAudioLLM/Fun-CosyVoice3-0.5B-2512", "cosyvoice3"),
        ("zai-org/GLM-TTS", "glm_tts"),
        ("bosonai/higgs-audio-v2-generation-3B-base", "higgs_audio_v2"),
        ("inclusionAI/Ming-flash-omni-2.0", "ming_flash_omni_tts"),
        ("OpenMOSS-Team/MOSS-TTS", "moss_tts"),
        ("k2-fsa/OmniVoice", "omnivoice"),
        ("mistralai/Voxtral-4B-TTS-2603", "voxtral_tts"),
        ("openbmb/VoxCPM2", "voxcpm2"),
    ],
)
def test_the_family_is_detected_from_the_model_id_or_path(model_id: str, family: str) -> None:
    found = detect(["tts", model_id])  # a served name that names nothing, then the checkpoint path
    assert found is not None and found.name == family


def test_a_model_id_that_names_no_family_is_not_detected() -> None:
    assert detect(["my-speech-server", "", "Qwen/Qwen3-TTS"]) is None


def _clip(rate: int, seconds: float = 1.5) -> VoiceReference:
    audio = np.random.default_rng(0).uniform(-0.5, 0.5, int(rate * seconds)).astype(np.float32)
    return VoiceReference(name="v", audio=audio, sample_rate=rate, ref_text="Some words.")


@pytest.mark.parametrize(("family", "rate"), [("fish_tts", 44100), ("qwen3_tts_base", 24000)])
def test_a_reference_keeps_its_rate_up_to_the_familys(family: str, rate: int) -> None:
    engine = RemoteEngine(["http://127.0.0.1:9"], family=family)
    body = engine._body("Hello.", "v", {}, reference=_clip(44100))
    assert ref_audio(body)[1] == rate
    assert len(ref_audio(body)[0]) == pytest.approx(1.5 * rate, abs=2)


def test_every_family_refuses_what_its_adapter_cannot_take() -> None:
    fish, higgs, custom = FAMILIES["fish_tts"], FAMILIES["higgs_audio_v2"], FAMILIES["qwen3_tts_customvoice"]
    untranscribed = VoiceReference(name="v", audio=np.zeros(24000, np.float32), sample_rate=24000)
    embedding = VoiceReference(name="e", embedding=np.zeros(1024, np.float32))
    with pytest.raises(UnsupportedOption) as refused:
        fish.check_request(untranscribed, {})
    assert refused.value.field == "ref_text"
    with pytest.raises(UnsupportedOption) as refused:
        fish.check_request(embedding, {})
    assert refused.value.field == "speaker_embedding"
    with pytest.raises(UnsupportedOption) as refused:
        custom.check_request(_clip(24000), {})
    assert refused.value.field == "ref_audio"
    for field in ("task_type", "language", "instructions", "speed", "x_vector_only_mode"):
        with pytest.raises(UnsupportedOption) as refused:
            higgs.check({field: "x"})
        assert refused.value.field == field
    with pytest.raises(RequestRefused) as missing:
        FAMILIES["qwen3_tts_voicedesign"].check_request(None, {})
    assert missing.value.field == "instructions"
    assert GENERIC.clip is Clip.X_VECTOR and GENERIC.embedding  # an unknown upstream: as before families


def test_settings_name_a_known_family_and_a_reference_with_its_transcript() -> None:
    assert invalid(RemoteSettings(upstreams=("http://a",), upstream_family="fish_tts")) is None
    assert "upstream_family" in str(invalid(RemoteSettings(upstreams=("http://a",), upstream_family="fish")))
    lone = RemoteSettings(upstreams=("http://a",), upstream_reference_audio="/clip.wav")
    assert "go together" in str(invalid(lone))


def _refused_at_config(address: str, **config: object) -> dict[str, object]:
    with voxgate_connect(f"ws://{address}{URL}", max_size=None, open_timeout=TIMEOUT_S) as ws:
        send(ws, type="session.config", **config)
        got = recv(ws)
    assert isinstance(got, dict) and got["type"] == "error", got
    return got


def test_fish_speech_clones_only_with_a_transcript_and_is_told_no_qwen_fields() -> None:
    stub = StubUpstream(model_id="fishaudio/s2-pro")
    with stubs(stub) as urls, gateway(*urls) as b:
        upload(b, "told", clip(seed=1))
        upload(b, "untold", clip(seed=2), ref_text=None)
        with session(b, voice="told") as ws:
            told = speak(ws, "In my voice.")
        untold = _refused_at_config(b, voice="untold")  # at the config, not at the first segment
        rest = post_speech(b, "Nor here.", voice="untold")
        plain = post_speech(b, "A plain request.", voice="alloy")
        language = _refused_at_config(b, language="German")
    assert told.frames() and not told.messages("error")
    assert (untold["code"], untold["field"]) == ("unsupported_option", "$.ref_text")
    assert "transcript" in str(untold["message"])
    assert rest.status_code == 400 and rest.json()["error"]["param"] == "ref_text", rest.text
    assert plain.status_code == 200, plain.text
    assert (language["code"], language["field"]) == ("unsupported_option", "$.language")
    # Only the transcribed clone and the plain request went up: no voice name, no Qwen3-TTS field.
    cloned, spoken = stub.speech_requests()
    assert cloned["ref_text"] == "The quick brown fox." and "ref_audio" in cloned
    for body in (cloned, spoken):
        assert not {"voice", "task_type", "x_vector_only_mode"} & set(body), body


@pytest.mark.parametrize("model_id", ["FunAudioLLM/Fun-CosyVoice3-0.5B-2512", "zai-org/GLM-TTS"])
def test_a_reference_only_family_speaks_a_plain_request_with_the_default_reference(model_id: str) -> None:
    stub = StubUpstream(model_id=model_id)
    with stubs(stub) as urls, gateway(*urls) as b:
        with session(b, voice="alloy") as ws:
            got = speak(ws, "Hello from the default voice.")
        rest = post_speech(b, "And over REST.")
    assert got.frames() and not got.messages("error")
    assert rest.status_code == 200, rest.text
    for body in stub.speech_requests():
        assert body["ref_text"] == DEFAULT_REFERENCE_TEXT and "voice" not in body and "task_type" not in body
        audio, rate = ref_audio(body)
        assert rate == 24000 and 3.0 < len(audio) / rate < 4.5


def test_a_custom_voice_checkpoint_refuses_a_clone_itself() -> None:
    stub = StubUpstream(kind="CustomVoice")
    with stubs(stub) as urls, gateway(*urls) as b:
        upload(b, "mine", clip(seed=1))
        error = _refused_at_config(b, voice="mine")  # at the config, not at the first segment
    assert (error["code"], error["field"]) == ("unsupported_option", "$.ref_audio")
    assert "Qwen3-TTS CustomVoice" in str(error["message"])
    assert stub.speech_requests() == []


def test_the_family_setting_overrides_detection() -> None:
    stub = StubUpstream(model_id="speech")  # a served name that names no family
    with stubs(stub) as urls, gateway(*urls, upstream_family="higgs_audio_v2") as b:
        refused = _refused_at_config(b, language="German")
        # Instructions change neither words nor voice: dropped (and listed back as ignored), not sent.
        with session(b, instructions="whisper") as ws:
            got = speak(ws, "Plain.")
        ok = httpx.post(
            f"http://{b}/v1/audio/speech",
            json={"input": "Plain.", "voice": "alloy", "response_format": "pcm"},
            timeout=TIMEOUT_S,
        )
    assert refused["code"] == "unsupported_option" and refused["field"] == "$.language"
    assert got.frames() and not got.messages("error")
    assert ok.status_code == 200, ok.text
    for body in stub.speech_requests():
        assert not {"voice", "task_type", "language", "instructions"} & set(body), body
