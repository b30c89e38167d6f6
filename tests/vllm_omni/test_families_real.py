"""``--engine remote`` speaks each model family's dialect, proven against vllm-omni 0.30.0's own adapters.

One vllm-omni server per family (tests/vllm_omni/server.py ``--family``): its engine client stands in for
the model (Piper speech) and presents the family to vllm-omni's own detection, a checkpoint folder whose
config.json declares the family's ``model_type``, from which vllm-omni's resolver builds the family's stage
configs with its deploy config, so the serving layer resolves that family's adapter (the server logs
``Resolved TTS serving adapter: FishSpeechAdapter``), and every request gateway B sends is validated and
prepared by that adapter. For each family, over WebSocket and REST: a plain request, a clone from a
transcribed upload, from an untranscribed one, and from an embedding voice. Each either speaks, or is
refused by voxgate itself (``unsupported_option`` with the field that says why) without reaching the
upstream; which is decided by the family's row in engine/families.py.

Where the adapter accepts a request but its prompt builder needs the model's own files (a processor, an
audio encoder), the stand-in cannot go further on CPU: for those cases (``BUILD_NEEDS_MODEL``) the test
asserts that vllm-omni's validation passed what voxgate sent (its log shows the build's error, not a
``bad_request``). Qwen3-TTS's three checkpoint kinds are proven in test_remote_real.py and
test_speech_api_real.py. Families not made detectable here, and why:

- MOSS-TTS: vllm-omni's resolver needs the checkpoint's real config (variant, codec) to pick a pipeline.
- OmniVoice: a diffusion pipeline, served by vllm-omni's diffusion engine (``_create_diffusion_speech``),
  not by the engine client this stand-in replaces.
- Ming TTS (dense): its pipeline resolves only from the model's own config (``dense``, no architectures).
- Covo Audio: ``covo_audio`` is unknown to transformers, and its deploy config needs ``--no-async-chunk``.

Their rules are covered against the stub upstream in tests/engine/test_families.py.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import soundfile
from voxgate.engine.families import FAMILIES, Clip, Family

from tests.conftest import TIMEOUT_S, recv_message, recv_until, send, serve_engine, session, voxgate_connect
from tests.vllm_omni.conftest import RealUpstreams
from tests.vllm_omni.upstream import RealUpstream

pytestmark = pytest.mark.slow

# Each server is vllm-omni's own stack; a loaded 2-core machine starts a request slowly.
READ_TIMEOUT_S = 60.0
TEXT = "Hello there."
TRANSCRIPT = "The quick brown fox jumps over the lazy dog."
#: Families whose every case runs here (see the module docstring for the others).
PROVEN = (
    "fish_tts",
    "cosyvoice3",
    "glm_tts",
    "higgs_audio_v2",
    "ming_flash_omni_tts",
    "voxtral_tts",
    "voxcpm2",
)
#: Cases vllm-omni's adapter validates, whose prompt build then needs the model's files: what its log says.
BUILD_NEEDS_MODEL: dict[tuple[str, str], str] = {
    ("higgs_audio_v2", "plain"): "Can't load feature extractor",  # AutoProcessor of the checkpoint
    ("higgs_audio_v2", "transcribed"): "Can't load feature extractor",
    ("voxtral_tts", "plain"): "collective_rpc",  # presets and references are encoded by the model's workers
    ("voxtral_tts", "transcribed"): "collective_rpc",
    ("voxtral_tts", "untranscribed"): "collective_rpc",
    ("voxcpm2", "transcribed"): "encoder_rates",  # the audio VAE's config
    ("voxcpm2", "untranscribed"): "encoder_rates",
}
CASES = ("plain", "transcribed", "untranscribed", "embedding")
#: A studio clip's rate: Fish Speech's codec runs at it, the other families condition on 24 kHz.
HIFI_HZ = 44100
#: Families whose prompt carries the reference's rate where the stand-in reads it (its ``ref_sr=``).
RATE_SHOWN = ("fish_tts", "cosyvoice3")


def _clip(seconds: float = 2.0, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2).astype(np.float32)
    out = io.BytesIO()
    soundfile.write(out, audio, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


@pytest.fixture(scope="module", params=PROVEN)
def family(request: pytest.FixtureRequest, real: RealUpstreams) -> Iterator[tuple[Family, RealUpstream, str]]:
    upstream = real(family=request.param)
    with (
        serve_engine(
            None,
            engine="remote",
            upstreams=(upstream.url,),
            upstream_read_timeout_s=READ_TIMEOUT_S,
            upstream_first_byte_timeout_s=READ_TIMEOUT_S,
            upstream_segment_timeout_s=READ_TIMEOUT_S,
            # A case the stand-in cannot build is a 500: it must not open the circuit for the next ones.
            upstream_breaker_failures=1000,
            max_clip_rate_hz=48000,  # uploads keep their own rate (Fish Speech's 44.1 kHz)
        ) as address,
    ):
        _upload(address, "told", audio=_clip(), ref_text=TRANSCRIPT)
        _upload(address, "hifi", audio=_clip(rate=HIFI_HZ), ref_text=TRANSCRIPT)
        _upload(address, "untold", audio=_clip())
        _upload(address, "vector", speaker_embedding=[0.01] * 192)
        yield FAMILIES[request.param], upstream, address


def _upload(address: str, name: str, *, audio: bytes | None = None, **fields: object) -> None:
    form: dict[str, str] = {"name": name, "consent": "the speaker agreed on 2024-05-01"}
    for key, value in fields.items():
        form[key] = str(value).replace(" ", "") if isinstance(value, list) else str(value)
    files = {"audio_sample": ("clip.wav", audio, "audio/wav")} if audio else None
    response = httpx.post(f"http://{address}/v1/audio/voices", data=form, files=files, timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text


def _refusal(family: Family, case: str) -> str | None:
    """The field voxgate refuses ``case`` with for ``family`` (None: it speaks)."""
    if case == "transcribed" and family.clip is Clip.NONE:
        return "ref_audio"
    if case == "untranscribed" and family.clip in (Clip.NONE, Clip.TRANSCRIPT):
        return "ref_audio" if family.clip is Clip.NONE else "ref_text"
    if case == "embedding" and not family.embedding:
        return "speaker_embedding"
    return None


_VOICES = {"plain": "alloy", "transcribed": "told", "untranscribed": "untold", "embedding": "vector"}


def _requests(upstream: RealUpstream) -> int:
    return upstream.log().count('"POST /v1/audio/speech HTTP/1.1"')


def _validated(rules: Family, case: str, upstream: RealUpstream, since: int) -> bool:
    """Whether ``case`` is one the stand-in cannot build, after vllm-omni's adapter accepted it."""
    log = upstream.log()[since:]
    assert "status=bad_request" not in log, (rules.name, case, log[-3000:])  # the adapter took every request
    expected = BUILD_NEEDS_MODEL.get((rules.name, case))
    if expected is not None:
        assert "status=error" in log and expected in log, (rules.name, case, log[-3000:])
    return expected is not None


@pytest.mark.parametrize("case", CASES)
def test_each_case_speaks_over_websocket_or_is_refused_by_voxgate(
    family: tuple[Family, RealUpstream, str], case: str
) -> None:
    rules, upstream, address = family
    before, since = _requests(upstream), len(upstream.log())
    field = _refusal(rules, case)
    if field is not None:  # refused at the config, before any upstream call
        with voxgate_connect(f"ws://{address}/v1/audio/speech/stream", open_timeout=TIMEOUT_S) as ws:
            send(ws, type="session.config", voice=_VOICES[case], response_format="pcm")
            error = recv_message(ws)
        assert (error["code"], error["field"]) == ("unsupported_option", f"$.{field}"), error
        assert rules.label in str(error["message"])
        assert _requests(upstream) == before
        return
    with session(address, voice=_VOICES[case], response_format="pcm") as ws:
        send(ws, type="input.text", text=TEXT)
        send(ws, type="input.done")
        got = recv_until(ws, "session.done", timeout=120)
    if _validated(rules, case, upstream, since):
        assert _requests(upstream) > before
    else:
        assert not got.messages("error"), (rules.name, case, got.messages("error"), upstream.log()[-3000:])
        assert len(b"".join(got.frames())) > 24000, (rules.name, case)  # over half a second of speech
        assert _requests(upstream) > before


@pytest.mark.parametrize("case", CASES)
def test_each_case_speaks_over_rest_or_is_refused_by_voxgate(
    family: tuple[Family, RealUpstream, str], case: str
) -> None:
    rules, upstream, address = family
    before, since = _requests(upstream), len(upstream.log())
    response = httpx.post(
        f"http://{address}/v1/audio/speech",
        json={"input": TEXT, "voice": _VOICES[case], "response_format": "wav"},
        timeout=120,
    )
    field = _refusal(rules, case)
    if field is None and _validated(rules, case, upstream, since):
        assert _requests(upstream) > before
    elif field is None:
        assert response.status_code == 200, (rules.name, case, response.text, upstream.log()[-3000:])
        with contextlib.closing(soundfile.SoundFile(io.BytesIO(response.content))) as wav:
            assert wav.frames > wav.samplerate // 2
    else:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("unsupported_option", field), error
        assert _requests(upstream) == before


@pytest.mark.parametrize(
    "family",
    # The families whose transcribed clone reaches the model here (see the cases above).
    [
        name
        for name in PROVEN
        if _refusal(FAMILIES[name], "transcribed") is None and (name, "transcribed") not in BUILD_NEEDS_MODEL
    ],
    indirect=True,
)
def test_a_reference_reaches_the_model_at_the_familys_rate(family: tuple[Family, RealUpstream, str]) -> None:
    # A 44.1 kHz upload, with uploads kept up to 48 kHz: vllm-omni decodes the data URL voxgate sends and
    # its adapter hands the model the rate it found. Fish Speech gets the clip at 44.1 kHz, the families
    # that condition on 24 kHz get it resampled to that, before it leaves voxgate.
    rules, upstream, address = family
    since = len(upstream.log())
    response = httpx.post(
        f"http://{address}/v1/audio/speech",
        json={"input": TEXT, "voice": "hifi", "response_format": "wav"},
        timeout=120,
    )
    assert response.status_code == 200, (rules.name, response.text, upstream.log()[-3000:])
    rates = re.findall(r"generate \S+:.* ref_sr=(\w+)", upstream.log()[since:])
    assert rates, upstream.log()[since:][-3000:]
    if rules.name in RATE_SHOWN:
        assert set(rates) == {str(min(HIFI_HZ, rules.reference_rate_hz))}, (rules.name, rates)
    else:  # the prompt keeps the clip where the stand-in does not look: no rate, never a wrong one
        assert set(rates) <= {"None", str(min(HIFI_HZ, rules.reference_rate_hz))}, (rules.name, rates)
