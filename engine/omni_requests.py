"""In-process requests built by vllm-omni's own speech serving code, for every model family it serves.

vllm-omni 0.30 turns a speech request into an engine request in ``OmniOpenAIServingSpeech``
(``entrypoints/openai/serving_speech.py``): ``_prepare_speech_generation`` copies the deploy's per-stage
sampling parameters and coerces them for streaming, hands the request to the family's serving adapter
(``tts_adapters/<family>.py``: ``validate``, then ``build``, which resolves the reference clip and makes the
prompt: Qwen3-TTS's placeholder ids and ``additional_information``, Fish Speech's token ids, CosyVoice3's
multimodal audio, ...), applies ``extra_params``, the adapter's sampling overrides and the seed, adds the
aligner's modality for word timestamps, and calls ``engine_client.generate``. The adapter reads the serving
object's state (its speaker storage, reference cache, tokenizer, executor), so ``ServingTools`` builds that
object the way vllm-omni's server does (``omni_init_app_state``: ``OpenAIServingModels`` over the engine
client, then the speech serving object, which detects the family from the stage configs and resolves its
adapter), without a server, and calls ``_prepare_speech_generation`` on it: the prompt and parameters that
reach ``AsyncOmni.generate`` are the ones vllm-omni's own server submits for the same request.

voxgate's side is only the request: ``speech_fields`` shapes a segment as the family's adapter takes it,
by the family's row in ``engine.families`` (presets, how a clone travels, Qwen3-TTS's ``task_type`` and
language names, the default reference of families that speak only from one). A reference clip goes as a
lossless float WAV data URL at its own rate; vllm-omni decodes it and the adapter passes the rate on.

After the audio, ``Submission.finish`` does what the server does after its stream: the adapter's check of
the finished generation (Qwen3-TTS Base's codec budget), then the reference-artifact bookkeeping.
vllm-omni is imported only when ``ServingTools`` is built (``VllmOmniEngine.start``).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import msgspec
import numpy as np

from ..protocol.audio import float_wav
from .base import EngineError, RequestRefused, VoiceReference
from .families import FAMILIES, GENERIC, Clip, Family, Presets
from .qwen3_tts import qwen_language, variant_of, word_triples

#: vllm-omni's name for a voice a request leaves to the model (``_DEFAULT_VOICE_NAME``).
DEFAULT_VOICE = "default"
# A handful of voices are in use at a time; their data URLs are kept so each is encoded once.
_MAX_URLS = 64


def reference_data_url(reference: VoiceReference, cache: dict[tuple[bytes, int], str] | None = None) -> str:
    """The clip as a float32 WAV data URL at its own rate: what vllm-omni decodes, sample for sample."""
    assert reference.audio is not None
    audio = np.ascontiguousarray(reference.audio, dtype=np.float32)
    key = (hashlib.blake2b(audio.tobytes(), digest_size=16).digest(), reference.sample_rate)
    if cache is not None and key in cache:
        return cache[key]
    url = "data:audio/wav;base64," + base64.b64encode(float_wav(audio, reference.sample_rate)).decode()
    if cache is not None:
        if len(cache) >= _MAX_URLS:
            cache.clear()
        cache[key] = url
    return url


def family_of(adapter: str | None, variant: str | None) -> Family:
    """voxgate's rules for vllm-omni's detected adapter (``qwen3_tts`` by checkpoint kind).

    An adapter voxgate has no row for gets every option, and its own ``validate`` refuses what it does not
    take (with vllm-omni's message, as ``RequestRefused``).

    Raises:
        EngineError: no speech adapter (not a TTS model, or a diffusion one vllm-omni serves elsewhere).
    """
    if adapter is None:
        raise EngineError(
            "vllm-omni found no speech stage in this model's pipeline: it serves /v1/audio/speech only for "
            "TTS models, and a diffusion TTS model (OmniVoice) through its diffusion engine, which this "
            "engine does not drive"
        )
    if adapter == "qwen3_tts":
        return FAMILIES[f"qwen3_tts_{(variant or 'CustomVoice').lower()}"]
    if adapter in FAMILIES:
        return FAMILIES[adapter]
    return msgspec.structs.replace(
        GENERIC, name=adapter, label=adapter, clone_task_type=None, qwen_languages=False
    )


def speech_fields(
    rules: Family,
    text: str,
    voice: str,
    options: Mapping[str, object],
    *,
    seed: int | None,
    reference: VoiceReference | None,
    named: bool,
    urls: dict[tuple[bytes, int], str] | None = None,
) -> dict[str, object]:
    """The fields of vllm-omni's ``OpenAICreateSpeechRequest`` for one segment, as ``rules``' adapter takes
    them: a raw PCM stream (the streaming coercion of the server's streamed answers); ``voice`` when it
    names a preset (``named``) and no reference is sent; options as they are; a clone inline."""
    fields: dict[str, object] = {
        "input": text,
        "stream": True,
        "stream_format": "audio",
        "response_format": "pcm",
    }
    if reference is None and named:
        fields["voice"] = voice
    fields.update(options)
    if seed is not None:
        fields["seed"] = seed
    task_type = rules.task_type or (rules.clone_task_type if reference is not None else None)
    if task_type is not None:
        fields.setdefault("task_type", task_type)
    language = fields.get("language")
    if rules.qwen_languages and isinstance(language, str):
        fields["language"] = qwen_language(language)
    if reference is not None and reference.audio is not None:
        fields["ref_audio"] = reference_data_url(reference, urls)
        if reference.ref_text:
            fields["ref_text"] = reference.ref_text
        elif rules.clip is Clip.X_VECTOR:
            fields.setdefault("x_vector_only_mode", True)
    elif reference is not None and reference.embedding is not None:
        fields["speaker_embedding"] = [float(x) for x in reference.embedding]
    return fields


class Submission:
    """One request submitted through vllm-omni's serving object: its outputs, and what follows them."""

    def __init__(self, serving: Any, request_id: str, outputs: Any, tts_params: Any, counter: Any) -> None:
        self._serving = serving
        self.request_id = request_id
        self.outputs: AsyncGenerator[Any, None] = outputs
        self._tts_params = tts_params
        self._counter = counter

    def observe(self, output: Any) -> None:
        """Note an output's stage metrics (the generated codec tokens, the talker's finish reason)."""
        if self._counter is not None:
            self._counter.observe(output)

    def finish(self, ok: bool) -> None:
        """After the last output (``ok``) or a failure: the server's checks and bookkeeping.

        Raises:
            EngineError: the adapter found the finished generation invalid (Qwen3-TTS Base ran out of its
                codec budget without an end).
        """
        serving = self._serving
        try:
            if ok:
                if self._counter is not None:
                    serving._validate_tts_generation(self._tts_params, self._counter)
                serving._mark_ref_audio_artifact_ready_for_request(self.request_id)
        except RuntimeError as exc:  # vllm-omni's TTSGenerationError
            raise EngineError(f"vllm-omni: {exc}") from exc
        finally:
            serving._discard_ref_audio_artifact_warmup(self.request_id)


class ServingTools:
    """vllm-omni's speech serving object over a started ``AsyncOmni``, and what the engine reads of it.

    Attributes:
        family: voxgate's rules for the adapter vllm-omni detected.
        variant: Qwen3-TTS's checkpoint kind (a ``qwen3_tts.PROFILES`` key), None for other families.
        speakers: the adapter's preset voices, its default first.
        languages: the languages it names (Qwen3-TTS's from the model config), None when it names none.
        streaming: False when Qwen3-TTS runs with ``async_chunk`` off: its audio then comes as cumulative
            snapshots (FINAL_ONLY), which the server keeps for streamed answers too.
        native_speed: the adapter speaks ``speed`` itself (vllm-omni's HTTP server time-stretches the
            others' audio after the engine, which an in-process engine does not do).
        word_timestamps: the pipeline ends with vllm-omni's forced-aligner stage.
    """

    def __init__(self, omni: Any, model: str) -> None:
        from vllm.entrypoints.openai.models.protocol import BaseModelPath
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels
        from vllm_omni.entrypoints.openai.protocol.audio import OpenAICreateSpeechRequest
        from vllm_omni.entrypoints.openai.serving_speech import OmniOpenAIServingSpeech
        from vllm_omni.entrypoints.openai.speech_usage import SpeechOutputTokenCounter
        from vllm_omni.model_executor.stage_input_processors.forced_aligner import TIMESTAMPS_MODALITY
        from vllm_omni.utils.forced_aligner import extract_word_timestamps

        self._request_type = OpenAICreateSpeechRequest
        self._counter_type = SpeechOutputTokenCounter
        self._timestamps = TIMESTAMPS_MODALITY
        self._extract_words = extract_word_timestamps
        # AsyncOmni lists each stage's final output type; --forced-aligner appends a "timestamps" stage.
        self.word_timestamps = TIMESTAMPS_MODALITY in list(getattr(omni, "output_modalities", None) or [])
        models = OpenAIServingModels(
            engine_client=omni,
            base_model_paths=[BaseModelPath(name=model, model_path=model)],
            lora_modules=None,
        )
        self.serving = OmniOpenAIServingSpeech(
            omni, models, request_logger=None, model_name=model, forced_aligner_enabled=self.word_timestamps
        )
        adapter = self.serving._get_tts_adapter()
        config = omni.model_config
        name = self.serving._tts_model_type if adapter is not None else None
        tts_model_type = getattr(config.hf_config, "tts_model_type", None)
        self.variant = (
            (variant_of(str(tts_model_type or "")) or variant_of(model)) if name == "qwen3_tts" else None
        )
        self.family = family_of(name, self.variant)
        caps = adapter.capabilities
        default = caps.default_speaker
        self.speakers = ([default] if default else []) + sorted(set(caps.supported_speakers) - {default})
        self.languages: frozenset[str] | None = frozenset(caps.supported_languages)
        self.codec_frame_rate: float | None = caps.codec_frame_rate
        self.native_speed = bool(adapter.native_speed_control)
        self.validates = bool(adapter.validates_generation)
        # As the server: only Qwen3-TTS without async_chunk keeps FINAL_ONLY (cumulative) output.
        self.streaming = not (name == "qwen3_tts" and not bool(getattr(config, "async_chunk", True)))
        self._urls: dict[tuple[bytes, int], str] = {}

    async def warmup(self) -> None:
        """The adapter's start-up warm-up, as vllm-omni's server runs it before serving."""
        await self.serving.warmup()

    def shutdown(self) -> None:
        self.serving.shutdown()

    async def submit(
        self,
        request_id: str,
        text: str,
        voice: str,
        options: Mapping[str, object],
        *,
        seed: int | None,
        reference: VoiceReference | None,
        named: bool,
    ) -> Submission:
        """Build the request with vllm-omni's own preparation and submit it to the engine.

        Raises:
            RequestRefused: vllm-omni's validation refused it (its server answers 400).
        """
        fields = speech_fields(
            self.family, text, voice, options, seed=seed, reference=reference, named=named, urls=self._urls
        )
        try:
            request = self._request_type(**fields)
            _, outputs, tts_params = await self.serving._prepare_speech_generation(
                request, request_id=request_id
            )
        except ValueError as exc:  # pydantic's ValidationError too: what the server answers with a 400
            raise RequestRefused(f"vllm-omni refused the request: {exc}") from exc
        counter = self._counter_type() if self.validates else None
        return Submission(self.serving, request_id, outputs, tts_params, counter)

    def modalities(self, words: bool) -> list[str]:
        return ["audio", self._timestamps] if words else ["audio"]

    def is_words(self, output: Any) -> bool:
        return bool(getattr(output, "final_output_type", None) == self._timestamps)

    def words(self, output: Any, text: str, language: str | None) -> list[tuple[str, int, int]] | None:
        found = self._extract_words(output, text, language)
        return None if found is None else word_triples(found)


def presets_named(rules: Family, voice: str, default_voice: str, speakers: list[str]) -> bool:
    """Whether ``voice`` goes to vllm-omni as a preset name."""
    return {
        Presets.LISTED: bool(speakers),
        Presets.NAMED: voice != default_voice,
        Presets.NONE: False,
    }[rules.presets]
