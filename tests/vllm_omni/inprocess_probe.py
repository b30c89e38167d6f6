"""voxgate's in-process engine against the installed vllm-omni 0.30.0 (the env .ci/vllm_omni_env.sh builds).

Run with that env's python; it prints one JSON object on its last stdout line (logs go to stderr):

    python tests/vllm_omni/inprocess_probe.py compare    # requests built both ways; async_chunk off
    python tests/vllm_omni/inprocess_probe.py families   # the same for each other model family
    python tests/vllm_omni/inprocess_probe.py construct  # how far AsyncOmni gets on this CPU; teardown

``compare`` builds each request twice against one engine client per checkpoint kind (the fake Qwen3-TTS
folder and the CPU engine client of tests/vllm_omni/server.py, whose stage configs and default sampling
parameters come from vllm-omni's own resolver and ``deploy/qwen3_tts.yaml``):

- vllm-omni's side is its own serving path: ``OmniOpenAIServingSpeech._prepare_speech_generation`` (the
  Qwen3-TTS adapter's validate/build/apply_sampling_overrides, ``coerce_param_message_types``, the seed);
- voxgate's side is ``engine.vllm_omni.VllmOmniEngine`` with its real helpers (``engine.omni_requests``:
  vllm-omni's serving object over the same engine client, fed the request voxgate shapes for the family).

``families`` does the same for each model family tests/vllm_omni/test_families_real.py makes detectable: the
family's checkpoint folder and deploy config (server.py ``FAMILIES``), so that vllm-omni's own detection
picks the family's adapter on both sides, and per case (a plain request, a clone from a transcribed clip,
from an untranscribed one, from an embedding) the whole prompt, the per-stage parameters and the output
modalities each side submits, or the error each side's preparation stopped at, or voxgate's refusal.

Both end in ``engine_client.generate(...)``, which records the prompt, the per-stage sampling parameters
and the output modalities. With ``async_chunk`` off it also feeds real ``OmniRequestOutput`` objects
carrying cumulative snapshots (FINAL_ONLY: one finished output whose audio is a history list; the same
sent again; growing tensors) through voxgate's engine, and counts the samples that come out.

``construct`` calls ``AsyncOmni(...)`` as voxgate's engine does, records the exception and the frame it was
raised in, calls ``shutdown()`` when an object exists, and lists the child processes left behind.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import sys
import tempfile
import traceback
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.vllm_omni.server import (  # noqa: E402
    ALIGNER_MODEL,
    FAMILIES,
    SAMPLE_RATE,
    CpuTtsEngineClient,
    deploy_config_path,
    install_import_shims,
    omni_output,
    repository_voxgate,
    write_family_dir,
    write_model_dir,
)

repository_voxgate()

# Long enough that a Base budget (12 codec frames per text token) is above vllm-omni's floor of 192.
TEXT = (
    "Good morning, and thank you for calling the support line. Your order left our warehouse yesterday "
    "afternoon and should reach you by Friday. Is there anything else I can help you with today?"
)
REF_TEXT = "This is the voice that the clone should sound like."
REF_SECONDS = 3.2
SEED = 1234
#: The fields of vLLM's SamplingParams compared between the two sides (all the ones a TTS request sets).
PARAM_FIELDS = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "max_tokens",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "detokenize",
    "output_kind",
    "extra_args",
    "logprobs",
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class RecordingClient(CpuTtsEngineClient):
    """The CPU engine client, recording each ``generate`` call; it yields the outputs in ``self.script``, or
    with no script (``None``) generates as the CPU engine client does (Piper, and the stand-in aligner)."""

    def __init__(
        self,
        model_dir: Path,
        async_chunk: bool,
        deploy_config: str,
        forced_aligner: str | None = None,
        family: str | None = None,
    ) -> None:
        super().__init__(model_dir, async_chunk, deploy_config, forced_aligner, family)
        self.calls: list[dict[str, Any]] = []
        self.script: Callable[[str], list[Any]] | None = lambda request_id: []

    def generate(
        self,
        prompt: Any,
        sampling_params: Any = None,
        request_id: str = "",
        *,
        sampling_params_list: Sequence[Any] | None = None,
        output_modalities: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[Any, None]:
        self.calls.append(
            {"prompt": prompt, "params": list(sampling_params_list or []), "modalities": output_modalities}
        )
        if self.script is None:
            return super().generate(
                prompt,
                sampling_params,
                request_id,
                sampling_params_list=sampling_params_list,
                output_modalities=output_modalities,
                **kwargs,
            )
        outputs = self.script(request_id)

        async def stream() -> AsyncGenerator[Any, None]:
            for output in outputs:
                yield output

        return stream()


def reference_clip(rate: int = SAMPLE_RATE) -> Any:
    import numpy as np

    t = np.arange(int(rate * REF_SECONDS)) / rate
    return (0.3 * np.sin(2 * np.pi * 180 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)


def wav_data_url(clip: Any, rate: int = SAMPLE_RATE) -> str:
    """The clip as a client sends it: a float WAV data URL at its own rate.

    Written as voxgate writes it (``float_wav``): the request's data URL is part of vllm-omni's cache
    salt, so both sides must send the same bytes, and libsndfile's own float WAV stamps the time of
    writing into them.
    """
    from voxgate.protocol.audio import float_wav

    return "data:audio/wav;base64," + base64.b64encode(float_wav(clip, rate)).decode()


def params_view(params: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in PARAM_FIELDS:
        value = getattr(params, name, None)
        if value is not None and hasattr(value, "name"):  # RequestOutputKind
            value = value.name
        elif isinstance(value, set | frozenset):
            value = sorted(value)
        out[name] = json.loads(json.dumps(value, default=repr))
    return out


def info_view(info: dict[str, Any]) -> dict[str, Any]:
    """additional_information with the reference audio summarised (length, rate, checksum)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key == "ref_audio":
            (wav, sr), *_ = value
            out[key] = {"samples": len(wav), "sr": int(sr), "sum": round(float(sum(wav)), 4)}
        elif key == "voice_clone_prompt":
            embedding = value[0]["ref_spk_embedding"]
            out[key] = {"dims": len(embedding), "sum": round(float(sum(embedding)), 4)}
        else:
            out[key] = json.loads(json.dumps(value, default=repr))
    return out


def call_view(call: dict[str, Any]) -> dict[str, Any]:
    prompt = call["prompt"]
    return {
        "prompt_len": len(prompt["prompt_token_ids"]),
        "params": [params_view(p) for p in call["params"]],
        "modalities": call["modalities"],
        "info": info_view(prompt["additional_information"]),
        "cache_salt": prompt.get("cache_salt"),
    }


def cases(kind: str, clip: Any, hidden_size: int) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Input kind -> (vllm-omni request fields, voxgate SynthesisRequest fields)."""
    from voxgate.engine.base import VoiceReference

    stream = {"stream": True, "stream_format": "audio", "response_format": "pcm", "seed": SEED}
    url = wav_data_url(clip)
    if kind == "CustomVoice":
        return {
            "CustomVoice": (
                {**stream, "voice": "Ryan", "language": "English", "instructions": "Speak warmly."},
                {"voice": "Ryan", "options": {"language": "en", "instructions": "Speak warmly."}},
            ),
        }
    if kind == "VoiceDesign":
        design = "A calm, low female voice with a slight rasp."
        return {
            "VoiceDesign": (
                {**stream, "task_type": "VoiceDesign", "instructions": design},
                {"voice": "designed", "options": {"instructions": design}},
            ),
        }
    embedding = [((i % 7) - 3) / 10.0 for i in range(hidden_size)]
    return {
        "Base with transcript": (
            {**stream, "task_type": "Base", "ref_audio": url, "ref_text": REF_TEXT, "language": "English"},
            {
                "voice": "reference",
                "options": {"language": "English"},
                "reference": VoiceReference(
                    name="alice", audio=clip, sample_rate=SAMPLE_RATE, ref_text=REF_TEXT
                ),
            },
        ),
        "Base x-vector only": (
            {**stream, "task_type": "Base", "ref_audio": url, "x_vector_only_mode": True},
            {
                "voice": "reference",
                "reference": VoiceReference(name="bob", audio=clip, sample_rate=SAMPLE_RATE),
            },
        ),
        "speaker embedding": (
            {**stream, "task_type": "Base", "speaker_embedding": embedding},
            {"voice": "reference", "options": {"speaker_embedding": embedding}},
        ),
    }


async def serving_layer(client: RecordingClient, model_dir: Path) -> Any:
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels
    from vllm_omni.entrypoints.openai.serving_speech import OmniOpenAIServingSpeech

    models = OpenAIServingModels(
        engine_client=client,
        base_model_paths=[BaseModelPath(name=str(model_dir), model_path=str(model_dir))],
        lora_modules=None,
    )
    return OmniOpenAIServingSpeech(client, models, request_logger=None, model_name=str(model_dir))


async def compare_kind(kind: str, root: Path) -> dict[str, Any]:
    from vllm_omni.entrypoints.openai.protocol.audio import OpenAICreateSpeechRequest
    from voxgate.engine.base import SynthesisRequest
    from voxgate.engine.vllm_omni import VllmOmniEngine

    model_dir = write_model_dir(kind, root / f"Qwen3-TTS-12Hz-0.6B-{kind}")
    client = RecordingClient(model_dir, True, deploy_config_path())
    server = await serving_layer(client, model_dir)
    engine = VllmOmniEngine(model=str(model_dir), omni_factory=lambda: client)
    await engine.start()
    clip = reference_clip()
    hidden = int(client.model_config.hf_config.talker_config.hidden_size)
    results: dict[str, Any] = {}
    try:
        for name, (upstream_fields, ours) in cases(kind, clip, hidden).items():
            request = OpenAICreateSpeechRequest(input=TEXT, **upstream_fields)
            del client.calls[:]
            _, generator, _ = await server._prepare_speech_generation(request)
            await generator.aclose()
            (upstream_call,) = client.calls
            del client.calls[:]
            options = dict(ours.get("options", {}))
            options["seed"] = SEED
            req = SynthesisRequest(
                text=TEXT, voice=ours["voice"], seed=SEED, options=options, reference=ours.get("reference")
            )
            engine.check(req.voice, req.options)
            async with contextlib.aclosing(engine.synthesize(req)) as chunks:
                async for _ in chunks:
                    pass
            (voxgate_call,) = client.calls
            results[name] = {"vllm_omni": call_view(upstream_call), "voxgate": call_view(voxgate_call)}
    finally:
        await engine.aclose()
        server.shutdown()
    return results


async def cumulative(root: Path) -> dict[str, Any]:
    """async_chunk off: the coerced output kind on both sides, and the samples voxgate's engine emits."""
    import torch
    from vllm_omni.entrypoints.openai.protocol.audio import OpenAICreateSpeechRequest
    from voxgate.engine.base import SynthesisRequest
    from voxgate.engine.vllm_omni import VllmOmniEngine

    model_dir = write_model_dir("CustomVoice", root / "Qwen3-TTS-12Hz-0.6B-CustomVoice")
    client = RecordingClient(model_dir, False, deploy_config_path())
    server = await serving_layer(client, model_dir)
    engine = VllmOmniEngine(model=str(model_dir), omni_factory=lambda: client)
    await engine.start()
    full = torch.linspace(-0.5, 0.5, 4800, dtype=torch.float32)
    # Cumulative snapshots: each one is all the audio so far (serving_speech.py keeps the last non-empty one).
    snapshots = [full[:1200].clone(), full[:3000].clone(), full.clone()]
    scripts: dict[str, Callable[[str], list[Any]]] = {
        # FINAL_ONLY, as the output processor sends it: one finished output, the history as a list.
        "final history list": lambda rid: [omni_output(rid, list(snapshots), True)],
        # The same snapshot again after it (a terminal re-send), and an empty tail entry.
        "final list, repeated": lambda rid: [
            omni_output(rid, list(snapshots), True),
            omni_output(rid, [*snapshots, torch.zeros(0)], True),
        ],
        # One growing tensor per output (CUMULATIVE kind).
        "growing tensors": lambda rid: [omni_output(rid, s, i == 2) for i, s in enumerate(snapshots)],
    }
    out: dict[str, Any] = {"samples_expected": int(full.numel())}
    try:
        request = OpenAICreateSpeechRequest(
            input=TEXT, voice="vivian", stream=True, stream_format="audio", response_format="pcm"
        )
        del client.calls[:]
        _, generator, _ = await server._prepare_speech_generation(request)
        await generator.aclose()
        out["vllm_omni_output_kinds"] = [params_view(p)["output_kind"] for p in client.calls[0]["params"]]
        for name, script in scripts.items():
            client.script = script
            del client.calls[:]
            req = SynthesisRequest(text=TEXT, voice="vivian")
            got = []
            async with contextlib.aclosing(engine.synthesize(req)) as chunks:
                async for chunk in chunks:
                    got.append(chunk.samples)
            samples = [float(x) for chunk in got for x in chunk]
            out.setdefault(
                "voxgate_output_kinds", [params_view(p)["output_kind"] for p in client.calls[0]["params"]]
            )
            out[name] = {
                "chunks": len(got),
                "samples": len(samples),
                "equal": len(samples) == full.numel() and bool(torch.allclose(torch.tensor(samples), full)),
            }
    finally:
        await engine.aclose()
        server.shutdown()
    return out


WRITTEN = "It costs $3.50 on 5/12, Dr. Smith said."


async def words(root: Path) -> dict[str, Any]:
    """Word timestamps with the aligner stage (``--forced-aligner``), and without it.

    The request as vllm-omni's WebSocket route builds it for ``word_timestamps`` (``stream_audio`` and
    ``pcm``: ``_prepare_speech_generation`` with a streamed request) against voxgate's; then voxgate's
    engine on the CPU engine client's real generation (Piper audio, then the aligner stage's output from
    vllm-omni's own input processor and decoder around the stand-in model).
    """
    from vllm_omni.entrypoints.openai.protocol.audio import OpenAICreateSpeechRequest
    from voxgate.engine.base import SynthesisRequest, UnsupportedOption
    from voxgate.engine.vllm_omni import VllmOmniEngine

    model_dir = write_model_dir("CustomVoice", root / "aligned" / "Qwen3-TTS-12Hz-0.6B-CustomVoice")
    client = RecordingClient(model_dir, True, deploy_config_path(), ALIGNER_MODEL)
    await client.start()
    server = await serving_layer(client, model_dir)
    engine = VllmOmniEngine(model=str(model_dir), omni_factory=lambda: client)
    await engine.start()
    out: dict[str, Any] = {"stages": list(client.output_modalities)}
    try:
        request = OpenAICreateSpeechRequest(
            input=WRITTEN,
            voice="vivian",
            stream=True,
            stream_format="audio",
            response_format="pcm",
            word_timestamps=True,
        )
        del client.calls[:]
        _, generator, _ = await server._prepare_speech_generation(request)
        await generator.aclose()
        (upstream_call,) = client.calls
        client.script = None  # from here on the CPU engine client generates
        del client.calls[:]
        req = SynthesisRequest(text=WRITTEN, voice="vivian", options={"word_timestamps": True})
        engine.check(req.voice, req.options)
        chunks = []
        async with contextlib.aclosing(engine.synthesize(req)) as stream:
            async for chunk in stream:
                chunks.append(chunk)
        (voxgate_call,) = client.calls
        out["vllm_omni"] = call_view(upstream_call)
        out["voxgate"] = call_view(voxgate_call)
        out["chunks"] = [
            {"samples": len(c.samples), "rate": c.sample_rate, "words": [list(w) for w in c.words]}
            for c in chunks
        ]
    finally:
        await engine.aclose()
        server.shutdown()
        await client.aclose()
    # The same checkpoint without --forced-aligner.
    plain_dir = write_model_dir("CustomVoice", root / "plain" / "Qwen3-TTS-12Hz-0.6B-CustomVoice")
    plain_client = RecordingClient(plain_dir, True, deploy_config_path())
    plain = VllmOmniEngine(model=str(plain_dir), omni_factory=lambda: plain_client)
    await plain.start()
    try:
        plain.check("vivian", {"word_timestamps": True})
        out["refused"] = None
    except UnsupportedOption as exc:
        out["refused"] = {"field": exc.field, "message": str(exc)}
    finally:
        await plain.aclose()
    return out


#: The families test_families_real.py makes detectable (server.py ``FAMILIES``), by voxgate's name.
DETECTABLE = (
    "fish_tts",
    "cosyvoice3",
    "glm_tts",
    "higgs_audio_v2",
    "ming_flash_omni_tts",
    "voxtral_tts",
    "voxcpm2",
    # and two Qwen3-TTS checkpoint kinds (the fake Qwen3-TTS folder and qwen3_tts.yaml)
    "qwen3_tts_base",
    "qwen3_tts_customvoice",
)
FAMILY_CASES = ("plain", "transcribed", "untranscribed", "embedding", "over budget")
#: What "over budget" asks for: past vllm-omni's limit (``max_new_tokens_max``), which voxgate leaves to it.
OVER_BUDGET = 5000
#: The rate of the clips cloned from: in process, a reference reaches vllm-omni's preparation at its own rate
#: (Fish Speech's codec runs at 44.1 kHz); uploads are stored at most at 24 kHz (gateway/voices/clips.py).
CLIP_RATE_HZ = 44100
#: The length of an uploaded speaker embedding (as test_families_real.py uploads).
EMBEDDING_DIMS = 192
#: A list longer than this is compared by its length and a digest of its values (waveforms, token ids).
_LISTED = 64


def view(value: Any) -> Any:
    """A prompt as JSON, exactly: arrays and long lists become their shape and a digest of their data."""
    import hashlib

    import numpy as np

    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        digest = hashlib.sha1(data.tobytes()).hexdigest()[:16]
        return {"array": list(data.shape), "dtype": str(data.dtype), "sha1": digest}
    if isinstance(value, dict):
        return {str(k): view(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if len(value) > _LISTED and all(isinstance(x, int | float) for x in value):
            digest = hashlib.sha1(repr(list(value)).encode()).hexdigest()[:16]
            return {"list": len(value), "sha1": digest}
        return [view(x) for x in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)


def family_call_view(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt": view(call["prompt"]),
        "params": [params_view(p) for p in call["params"]],
        "modalities": call["modalities"],
    }


def _error(exc: BaseException) -> dict[str, Any]:
    return {"error": type(exc).__name__, "message": str(exc)[:600]}


def family_case(case: str, engine: Any, clip: Any, default: Any) -> tuple[dict[str, Any], Any, str]:
    """``case`` as a vllm-omni client sends it, and voxgate's reference and voice for it."""
    import numpy as np
    from voxgate.engine.base import VoiceReference
    from voxgate.engine.families import Clip, Presets

    rules = engine.family
    # A client names the task its Qwen3-TTS checkpoint runs (as voxgate's remote engine does).
    fields: dict[str, Any] = {"task_type": rules.task_type} if rules.task_type else {}
    voice = engine.default_voice
    reference = None
    if case == "plain":
        if rules.reference_only:  # voxgate's shipped reference voice, as the client would send it
            fields.update(
                ref_audio=wav_data_url(default.audio, default.sample_rate), ref_text=default.ref_text
            )
        elif rules.presets is Presets.LISTED and engine._speakers:
            fields["voice"] = voice
    elif case == "transcribed":
        reference = VoiceReference(name="told", audio=clip, sample_rate=CLIP_RATE_HZ, ref_text=REF_TEXT)
        fields.update(ref_audio=wav_data_url(clip, CLIP_RATE_HZ), ref_text=REF_TEXT)
    elif case == "untranscribed":
        reference = VoiceReference(name="untold", audio=clip, sample_rate=CLIP_RATE_HZ)
        fields["ref_audio"] = wav_data_url(clip, CLIP_RATE_HZ)
        if rules.clip is Clip.X_VECTOR:  # Qwen3-TTS Base clones a clip without transcript only so
            fields["x_vector_only_mode"] = True
    elif case == "over budget":  # a plain request, with a budget past the adapter's limit
        fields, reference, voice = family_case("plain", engine, clip, default)
        return {**fields, "max_new_tokens": OVER_BUDGET}, reference, voice
    else:
        embedding = np.full(EMBEDDING_DIMS, 0.01, dtype=np.float32)
        reference = VoiceReference(name="vector", embedding=embedding)
        fields["speaker_embedding"] = [float(x) for x in embedding]
    return fields, reference, voice


async def compare_family(family: str, root: Path) -> dict[str, Any]:
    """One family's cases, built by vllm-omni's server and by voxgate's engine on one engine client."""
    from vllm_omni.entrypoints.openai.protocol.audio import OpenAICreateSpeechRequest
    from voxgate.engine.base import RequestRefused, SynthesisRequest, UnsupportedOption
    from voxgate.engine.vllm_omni import VllmOmniEngine

    if family.startswith("qwen3_tts_"):
        kind = {"base": "Base", "customvoice": "CustomVoice"}[family.rsplit("_", 1)[1]]
        model_dir = write_model_dir(kind, root / f"Qwen3-TTS-12Hz-0.6B-{kind}")
        client = RecordingClient(model_dir, True, deploy_config_path())
    else:
        _, deploy, served = FAMILIES[family]
        model_dir = write_family_dir(family, root / served.rsplit("/", 1)[-1])
        client = RecordingClient(model_dir, True, deploy_config_path(deploy), None, family)
    server = await serving_layer(client, model_dir)
    engine = VllmOmniEngine(model=str(model_dir), omni_factory=lambda: client)
    out: dict[str, Any] = {"adapter": server._tts_model_type}
    try:
        await engine.start()
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        out["start"] = _error(exc)
        server.shutdown()
        return out
    out.update(family=engine.family.name, default_voice=engine.default_voice, speakers=engine._speakers)
    default = engine._default_reference()
    cases: dict[str, Any] = {}
    try:
        for case in FAMILY_CASES:
            fields, reference, voice = family_case(case, engine, reference_clip(CLIP_RATE_HZ), default)
            result: dict[str, Any] = {}
            del client.calls[:]
            try:
                request = OpenAICreateSpeechRequest(
                    input=TEXT, stream=True, stream_format="audio", response_format="pcm", seed=SEED, **fields
                )
                _, generator, _ = await server._prepare_speech_generation(request)
                await generator.aclose()
                (call,) = client.calls
                result["vllm_omni"] = family_call_view(call)
            except Exception as exc:  # noqa: BLE001 - where vllm-omni's preparation stopped
                result["vllm_omni"] = _error(exc)
            del client.calls[:]
            try:
                options: dict[str, object] = {"seed": SEED}
                if case == "over budget":
                    options["max_new_tokens"] = OVER_BUDGET
                engine.check(voice, options)
                if reference is not None:
                    engine.check_reference(reference)
                req = SynthesisRequest(
                    text=TEXT, voice=voice, seed=SEED, options=options, reference=reference
                )
                async with contextlib.aclosing(engine.synthesize(req)) as chunks:
                    async for _ in chunks:
                        pass
                (call,) = client.calls
                result["voxgate"] = family_call_view(call)
            except UnsupportedOption as exc:
                result["voxgate"] = {"refused": exc.field, "message": str(exc)}
            except RequestRefused as exc:  # vllm-omni's validation, run in voxgate's engine
                result["voxgate"] = {"refused_by_vllm_omni": str(exc)}
            except Exception as exc:  # noqa: BLE001 - where voxgate's engine stopped
                result["voxgate"] = _error(exc)
            cases[case] = result
    finally:
        await engine.aclose()
        server.shutdown()
    out["cases"] = cases
    return out


def families() -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="voxgate-probe-") as tmp:
            results: dict[str, Any] = {}
            for family in DETECTABLE:
                log(f"family {family}")
                results[family] = await compare_family(family, Path(tmp))
            return results

    return asyncio.run(run())


def compare() -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="voxgate-probe-") as tmp:
            results: dict[str, Any] = {}
            for kind in ("CustomVoice", "VoiceDesign", "Base"):
                results.update(await compare_kind(kind, Path(tmp)))
            return {
                "cases": results,
                "cumulative": await cumulative(Path(tmp)),
                "words": await words(Path(tmp)),
            }

    return asyncio.run(run())


def construct() -> dict[str, Any]:
    """AsyncOmni built and torn down as ``VllmOmniEngine`` does it (start, then aclose), on a fake folder."""
    import threading

    import psutil
    from voxgate.engine.vllm_omni import VllmOmniEngine

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="voxgate-probe-") as tmp:
        model_dir = write_model_dir("CustomVoice", Path(tmp) / "Qwen3-TTS-12Hz-0.6B-CustomVoice")
        engine = VllmOmniEngine(model=str(model_dir), stage_init_timeout_s=60)
        try:
            asyncio.run(engine.start())
            out["started"] = True
        except BaseException as exc:  # noqa: BLE001 - the failure is what is being recorded
            out["started"] = False
            out["error"] = _chain(exc)
            out["stack"] = [
                f"{_short(f.filename)}:{f.lineno} {f.name}" for f in traceback.extract_tb(exc.__traceback__)
            ]
        asyncio.run(engine.aclose())
        children = psutil.Process().children(recursive=True)
        psutil.wait_procs(children, timeout=10)
        out["children_left"] = [
            {"pid": p.pid, "cmdline": " ".join(p.cmdline())[:200]} for p in children if p.is_running()
        ]
        out["threads_left"] = [t.name for t in threading.enumerate() if t.is_alive() and not t.daemon][1:]
    return out


def _chain(exc: BaseException) -> list[dict[str, Any]]:
    """The exception and its causes, each with the frame that raised it."""
    chain = []
    cause: BaseException | None = exc
    while cause is not None:
        frames = traceback.extract_tb(cause.__traceback__)[-1:]
        chain.append(
            {
                "type": type(cause).__name__,
                "message": str(cause)[:300],
                "file": _short(frames[0].filename) if frames else None,
                "function": frames[0].name if frames else None,
                "frames": [
                    f"{_short(f.filename)}:{f.name}" for f in traceback.extract_tb(cause.__traceback__)
                ],
            }
        )
        cause = cause.__cause__ or cause.__context__
    return chain


def _short(filename: str) -> str:
    marker = "site-packages/"
    return filename.split(marker, 1)[1] if marker in filename else filename


def main(argv: Sequence[str]) -> None:
    mode = argv[1] if len(argv) > 1 else "compare"
    for name, value in {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_DISABLE_LOG_LOGO": "1",
    }.items():
        os.environ.setdefault(name, value)
    install_import_shims()
    with contextlib.suppress(OSError):  # vllm-omni's speaker store: this run's, not ~/.cache/vllm-omni
        os.environ.setdefault("SPEAKER_SAMPLES_DIR", tempfile.mkdtemp(prefix="voxgate-probe-speakers-"))
    result = {"compare": compare, "families": families, "construct": construct}[mode]()
    print(json.dumps(result, default=repr), flush=True)


if __name__ == "__main__":
    main(sys.argv)
