"""In-process vllm-omni: Qwen3-TTS served by ``vllm_omni.AsyncOmni`` inside the gateway (the ``vllm`` extra).

One segment, in vllm-omni 0.30.0's names:

- ``synthesize()`` submits at once: a task calls ``AsyncOmni.generate`` before the caller reads, so a
  caller may open segment k+1 while reading segment k and vLLM batches both (as it batches sessions).
- The prompt is what vllm-omni's Qwen3-TTS serving adapter builds: placeholder token ids, whose length
  comes from vllm-omni's ``Qwen3TTSPromptEmbedsBuilder``, plus ``additional_information``, from which the
  talker rebuilds its embeddings. The adapter class needs vllm-omni's whole HTTP serving object, so
  ``build_info`` fills ``additional_information`` and ``VllmOmniTools`` wraps the helpers that stand alone.
- Audio arrives as ``OmniRequestOutput.multimodal_output["audio"]``, one tensor per step (DELTA, the
  streaming default) or a growing list (CUMULATIVE); ``AudioReader`` reads both. With ``async_chunk: false``
  in the deploy config the request stays FINAL_ONLY and its audio is cumulative snapshots (each one all the
  audio so far; vllm-omni's speech server keeps the last); ``AudioReader(snapshots=True)`` emits each
  sample once.
- Closing the stream (cancel, disconnect) calls ``AsyncOmni.abort(request_id)``.
- Word timestamps (``vllm_forced_aligner``: vllm-omni's ``--forced-aligner``, which appends the
  Qwen3-ForcedAligner stage after code2wav) are asked for as vllm-omni's speech server asks: the output
  modalities add the aligner's ``"timestamps"``, the streamed audio becomes CUMULATIVE, and the aligner's
  output, which comes after the segment's audio, is read with vllm-omni's ``extract_word_timestamps``. The
  segment's audio is held until then and goes out as one chunk carrying its words, so they come first.

Checkpoints differ in data (``PROFILES``, kept with the prompt building in ``engine.qwen3_tts``).
vllm-omni and torch are imported only in ``start()``, so the module imports without the extra; tests
pass stand-ins as ``omni_factory`` and ``tools_factory``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from .base import (
    AudioChunk,
    EngineError,
    SynthesisRequest,
    UnknownVoice,
    UnsupportedOption,
    Voice,
    demands,
)

if TYPE_CHECKING:
    pass

from .options import option
from .qwen3_tts import (
    CODEC_FRAMES_PER_TEXT_TOKEN,
    DEFAULT_DEPLOY_CONFIG,
    DEFAULT_LANGUAGES,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MODEL,
    DEFAULT_STAGE_INIT_TIMEOUT_S,
    MIN_CODEC_FRAMES,
    PROFILES,
    REFUSALS,
    Profile,
    Qwen3Tools,
    VllmOmniTools,
    build_info,
    cache_salt,
    qwen_language,
    variant_of,
    with_request_params,
    word_timings,
)

logger = logging.getLogger(__name__)


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


class OmniClient(Protocol):
    """The part of ``vllm_omni.AsyncOmni`` (0.30.0) this engine uses."""

    def generate(
        self,
        prompt: Any,
        sampling_params: Any = None,
        request_id: str = "",
        *,
        sampling_params_list: Sequence[Any] | None = None,
        output_modalities: list[str] | None = None,
    ) -> AsyncGenerator[Any, None]: ...

    async def abort(self, request_id: str) -> None: ...

    def shutdown(self) -> None: ...


def to_samples(item: Any) -> npt.NDArray[np.float32]:
    """``tensor.float().cpu().numpy().squeeze()`` for a tensor, arrays as they are; mono only."""
    value = item
    for method in ("float", "detach", "cpu", "numpy"):  # float() first: bfloat16 has no numpy dtype
        if hasattr(value, method):
            value = getattr(value, method)()
    samples = np.squeeze(np.asarray(value, dtype=np.float32))
    if samples.ndim > 1:
        raise EngineError(f"expected mono audio, got an array of shape {samples.shape}")
    return samples.reshape(-1)


class AudioReader:
    """Turns one request's ``OmniRequestOutput``s into ``AudioChunk``s.

    It reads what vllm-omni's speech server reads: ``multimodal_output["audio"]`` as one tensor per output
    (DELTA) or a growing list (CUMULATIVE: new items only), ``"sr"`` as a tensor or a list (its last item).
    Outputs without audio (other stages, the end marker) are skipped.

    With ``snapshots`` (``async_chunk`` off), each output's audio is all the audio so far: a tensor, or a
    history list whose last non-empty item is the latest snapshot (what vllm-omni's speech server keeps).
    Only the samples past those already emitted come out, so a snapshot sent again adds nothing.
    """

    def __init__(self, default_rate: int, *, snapshots: bool = False) -> None:
        self._default_rate = default_rate
        self._snapshots = snapshots
        self._rate: int | None = None
        self._seen = 0
        self._emitted = 0

    def read(self, output: Any) -> list[AudioChunk]:
        """The new audio in ``output``; EngineError for an output error or a rate change mid-stream."""
        if error := getattr(output, "error", None):
            raise EngineError(f"vllm-omni: {error}")
        mm = getattr(output, "multimodal_output", None)
        key = next((k for k in ("audio", "model_outputs") if mm and k in mm), None)
        if mm is None or key is None:
            return []
        audio = mm[key]
        if self._snapshots:
            return self._read_snapshot(audio, mm)
        if isinstance(audio, list):
            new, self._seen = audio[self._seen :], len(audio)
        else:
            # Counted as vllm-omni counts it: a cumulative stream's first output is one tensor, not a list.
            new, self._seen = ([], self._seen) if audio is None else ([audio], self._seen + 1)
        samples = [s for s in (to_samples(item) for item in new) if s.size]
        if not samples:
            return []
        rate = self._sample_rate(mm.get("sr"))
        return [AudioChunk(s, rate) for s in samples]

    def _read_snapshot(self, audio: Any, mm: Any) -> list[AudioChunk]:
        history = audio if isinstance(audio, list) else [audio]
        latest = next((s for s in map(to_samples, reversed(history)) if s.size), None)
        if latest is None or latest.size <= self._emitted:
            return []
        new, self._emitted = latest[self._emitted :], latest.size
        return [AudioChunk(new, self._sample_rate(mm.get("sr")))]

    def _sample_rate(self, raw: Any) -> int:
        if isinstance(raw, list):
            raw = raw[-1] if raw else None
        if raw is None:
            rate = self._rate or self._default_rate
        else:
            rate = int(raw.item() if hasattr(raw, "item") else raw)
        if self._rate is not None and rate != self._rate:
            raise EngineError(f"the sample rate changed mid-stream from {self._rate} Hz to {rate} Hz")
        self._rate = rate
        return rate


def _with_words(
    text: str, chunks: list[AudioChunk], words: list[tuple[str, int, int]] | None, request_id: str
) -> AudioChunk:
    """A segment's audio as one chunk, with the aligner's words (ms from its start) in samples."""
    samples = np.concatenate([c.samples for c in chunks])
    rate = chunks[0].sample_rate
    if not words:
        # vllm-omni's "timestamps: null": the aligner timed nothing (no word in the text, or a mismatch).
        logger.warning("vllm-omni's aligner timed no word of request %s", request_id)
        return AudioChunk(samples, rate)
    return AudioChunk(samples, rate, word_timings(text, words, rate, len(samples)))


class _Stream(AsyncGenerator[AudioChunk, None]):
    """One request in flight. Generation starts when the stream is made, not when it is first read."""

    def __init__(self, engine: VllmOmniEngine, req: SynthesisRequest) -> None:
        self.request_id = f"voxgate-{uuid.uuid4().hex}"
        self._engine = engine
        self._queue: asyncio.Queue[AudioChunk | EngineError | None] = asyncio.Queue()
        self._submitted = self._closed = False
        engine._streams.add(self)
        self._task = asyncio.get_running_loop().create_task(self._pump(req), name=self.request_id)

    async def asend(self, value: None) -> AudioChunk:
        if self._closed:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self._closed = True
            raise StopAsyncIteration
        if isinstance(item, EngineError):
            self._closed = True
            raise item
        return item

    async def athrow(
        self, typ: type[BaseException] | BaseException, val: object = None, tb: TracebackType | None = None, /
    ) -> AudioChunk:
        await self.aclose()
        raise typ if isinstance(typ, BaseException) else typ()

    async def aclose(self) -> None:
        """End the task that reads the request; it aborts the request if it is still generating."""
        self._closed = True
        self._engine._streams.discard(self)
        if self._task.done():
            return
        self._task.cancel()
        await asyncio.wait([self._task])

    async def _pump(self, req: SynthesisRequest) -> None:
        try:
            omni, prompt, params, snapshots = self._engine._prepare(req)
            tools = self._engine._tools
            assert tools is not None  # _prepare checked
            words = bool(req.options.get("word_timestamps"))
            reader = AudioReader(self._engine.sample_rate, snapshots=snapshots)
            self._submitted = True
            outputs = omni.generate(
                prompt,
                request_id=self.request_id,
                sampling_params_list=params,
                output_modalities=tools.modalities(words),
            )
            held: list[AudioChunk] = []  # with words: the segment's audio, until the aligner has timed it
            timed: list[tuple[str, int, int]] | None = None
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    if words and tools.is_words(output):
                        language = req.options.get("language")
                        timed = tools.words(output, req.text, language if isinstance(language, str) else None)
                        continue
                    for chunk in reader.read(output):
                        if words:
                            held.append(chunk)
                        else:
                            self._queue.put_nowait(chunk)
            if held:
                self._queue.put_nowait(_with_words(req.text, held, timed, self.request_id))
            self._queue.put_nowait(None)
        except asyncio.CancelledError:
            # Closed before the end (cancel, disconnect): the engine must stop too. The abort is its own
            # task, so a second cancel of this one cannot interrupt it halfway.
            if self._submitted:
                await asyncio.shield(asyncio.ensure_future(self._engine._abort(self.request_id)))
            raise
        except EngineError as exc:
            self._queue.put_nowait(exc)
        # The library boundary: vllm-omni raises ValueError, RuntimeError, EngineDeadError and more.
        except Exception as exc:
            logger.warning("vllm-omni request %s failed: %r", self.request_id, exc)
            self._queue.put_nowait(EngineError(f"vllm-omni failed: {exc}"))
        finally:
            self._engine._streams.discard(self)


class VllmOmniEngine:
    """Qwen3-TTS on vllm-omni's ``AsyncOmni``, in this process.

    Args:
        model: Hugging Face id or local path of a Qwen3-TTS checkpoint.
        deploy_config: vllm-omni deploy YAML (a name under ``vllm_omni/deploy/`` or a path).
        stage_init_timeout_s: how long each stage may take to start.
        forced_aligner: vllm-omni's ``--forced-aligner`` model (word timestamps); empty: none.
        omni_factory: builds the ``AsyncOmni`` (tests pass a stand-in); default: the real one.
        tools_factory: binds vllm-omni's prompt helpers to it (tests pass a stand-in); default: the real ones.
    """

    name = "vllm-omni"

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        deploy_config: str = DEFAULT_DEPLOY_CONFIG,
        stage_init_timeout_s: float = DEFAULT_STAGE_INIT_TIMEOUT_S,
        forced_aligner: str = "",
        omni_factory: Callable[[], OmniClient] | None = None,
        tools_factory: Callable[[OmniClient], Qwen3Tools] | None = None,
    ) -> None:
        self.model = model
        self.deploy_config = deploy_config
        self.stage_init_timeout_s = stage_init_timeout_s
        self.forced_aligner = forced_aligner
        self._omni_factory = omni_factory or self._build_omni
        self._tools_factory: Callable[[OmniClient], Qwen3Tools] = tools_factory or VllmOmniTools
        self._use_profile(PROFILES[variant_of(model) or "CustomVoice"])
        self._omni: OmniClient | None = None
        self._tools: Qwen3Tools | None = None
        self._speakers: list[str] = []
        self._languages = DEFAULT_LANGUAGES
        self._streams: set[_Stream] = set()

    def _use_profile(self, profile: Profile) -> None:
        self.profile = profile
        self.sample_rate = profile.sample_rate
        self.default_voice = profile.default_voice
        self.clones = profile.clones

    def _build_omni(self) -> OmniClient:
        try:
            from vllm_omni import AsyncOmni
        except ImportError as exc:
            raise EngineError(
                "engine 'vllm-omni' needs the vllm extra (pip install 'voxgate[vllm]') and an NVIDIA GPU"
            ) from exc
        # vllm-omni 0.30.0 refuses stage_configs_path; deploy_config replaced it. Its other keywords are
        # the serve command's options (``forced_aligner`` is ``--forced-aligner``).
        extra: dict[str, Any] = {"forced_aligner": self.forced_aligner} if self.forced_aligner else {}
        try:
            omni: OmniClient = AsyncOmni(
                model=self.model,
                deploy_config=self.deploy_config,
                stage_init_timeout=int(self.stage_init_timeout_s),
                log_stats=False,
                **extra,
            )
        # The library boundary. Without a GPU platform 0.30.0 raises RuntimeError("Orchestrator
        # initialization failed: ") caused by a bare NotImplementedError from get_omni_ar_worker_cls;
        # the engine has shut its orchestrator down by then, and no object is left to shut down.
        except Exception as exc:
            root: BaseException = exc
            while root.__cause__ is not None or root.__context__ is not None:
                root = root.__cause__ or root.__context__  # type: ignore[assignment]
            raise EngineError(f"vllm-omni could not start {self.model}: {exc!r}, caused by {root!r}") from exc
        return omni

    async def start(self) -> None:
        # AsyncOmni starts its stage processes in its constructor and blocks until they are up (minutes).
        # vllm-omni's own server builds it the same way, on the event loop before it serves; nothing is
        # served here either until the lifespan's start-up returns.
        omni = self._omni_factory()
        try:
            tools = self._tools_factory(omni)
            if tools.variant is not None:
                self._use_profile(PROFILES[tools.variant])
            self._speakers = [s.lower() for s in tools.speakers]
            self._languages = tools.languages or DEFAULT_LANGUAGES
            if self.profile.task_type == "CustomVoice":
                if not self._speakers:
                    raise EngineError(f"{self.model} is a CustomVoice model whose config lists no speakers")
                self.default_voice = self._speakers[0]
        except BaseException:
            omni.shutdown()  # its stage processes hold the GPU
            raise
        self._omni, self._tools = omni, tools
        logger.info("vllm-omni %s: %s task, voices %s", self.model, self.profile.task_type, self._speakers)

    async def voices(self) -> list[Voice]:
        if self.profile.task_type != "CustomVoice":
            return []
        return [
            Voice(name=s, engine=self.name, sample_rate=self.sample_rate, description="Qwen3-TTS speaker")
            for s in self._speakers
        ]

    def check(self, voice: str, options: dict[str, object]) -> None:
        profile = self.profile
        if profile.task_type == "CustomVoice":
            if voice.lower() not in self._speakers:
                raise UnknownVoice(voice, self.name, self._speakers)
        elif voice != self.default_voice:
            raise UnknownVoice(voice, self.name, [self.default_voice])
        for field in demands(options):
            if field == "word_timestamps" and self._tools is not None and self._tools.word_timestamps:
                continue
            if field not in profile.options:
                raise UnsupportedOption(field, self.name, REFUSALS.get(field, ""))
        for field in profile.requires:
            if not options.get(field):
                raise UnsupportedOption(field, self.name, f"a {profile.task_type} model needs it set")
        task = options.get("task_type")
        if task is not None and task != profile.task_type:
            raise UnsupportedOption("task_type", self.name, f"the model runs only {profile.task_type}")
        language = options.get("language")
        if isinstance(language, str) and qwen_language(language) not in self._languages:
            raise UnsupportedOption("language", self.name, f"it speaks {', '.join(sorted(self._languages))}")

    def synthesize(self, req: SynthesisRequest) -> _Stream:
        """Submit ``req`` now and return its audio stream; closing the stream aborts the request."""
        return _Stream(self, req)

    def _prepare(self, req: SynthesisRequest) -> tuple[OmniClient, dict[str, Any], list[Any], bool]:
        """The client, prompt and per-stage params for ``req``, and whether its audio comes as snapshots."""
        omni, tools = self._omni, self._tools
        if omni is None or tools is None:
            raise EngineError("the vllm-omni engine is not started")
        profile, options = self.profile, req.options
        language = options.get("language")
        info = build_info(
            req.text,
            profile=profile,
            speaker=req.voice.lower(),
            options=options,
            language=qwen_language(language) if isinstance(language, str) else "Auto",
            reference=req.reference,
            codec_frame_rate=tools.codec_frame_rate,
        )
        prompt = tools.prompt(info, profile.task_type, cache_salt(info, req.reference))
        params = tools.stream_params(words=bool(options.get("word_timestamps")))
        budget = options.get("max_new_tokens")
        if not isinstance(budget, int) and profile.codec_frames_per_char is not None and params:
            configured = getattr(params[0], "max_tokens", None) or DEFAULT_MAX_NEW_TOKENS
            tokens = tools.text_tokens(req.text)
            if tokens:  # as vllm-omni's adapter: 12 codec frames per text token
                by_length = tokens * CODEC_FRAMES_PER_TEXT_TOKEN
            else:
                by_length = math.ceil(len(req.text) * profile.codec_frames_per_char)
            budget = min(configured, max(MIN_CODEC_FRAMES, by_length))
        budget = budget if isinstance(budget, int) else None
        params = with_request_params(params, seed=req.seed, max_tokens=budget)
        return omni, prompt, params, not tools.streaming

    async def _abort(self, request_id: str) -> None:
        if self._omni is None:
            return
        try:
            await self._omni.abort(request_id)
        # Cleanup of a closed stream: a failed abort must not turn a cancel into a session error.
        except Exception as exc:
            logger.warning("vllm-omni abort of %s failed: %r", request_id, exc)

    async def ready(self) -> bool:
        return self._omni is not None and not getattr(self._omni, "errored", False)

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        omni, self._omni, self._tools = self._omni, None, None
        if omni is not None:
            omni.shutdown()


def create(settings: VllmOmniSettings) -> VllmOmniEngine:
    """The engine ``--engine vllm-omni`` runs."""
    return VllmOmniEngine(
        model=settings.vllm_model,
        deploy_config=settings.vllm_deploy_config,
        stage_init_timeout_s=settings.vllm_stage_init_timeout_s,
        forced_aligner=settings.vllm_forced_aligner,
    )
