"""In-process vllm-omni: any TTS model vllm-omni serves, on ``vllm_omni.AsyncOmni`` inside the gateway (the
``vllm`` extra).

One segment, in vllm-omni 0.30.0's names:

- ``synthesize()`` submits at once: a task builds the request and calls ``AsyncOmni.generate`` before the
  caller reads, so a caller may open segment k+1 while reading segment k and vLLM batches both (as it
  batches sessions).
- The request is built by vllm-omni's own speech serving code (``engine.omni_requests``): its serving
  object, made over this ``AsyncOmni`` as its server makes it, detects the model family from the stage
  configs and its adapter validates the request and builds the prompt and sampling parameters (Qwen3-TTS's
  placeholder ids and ``additional_information``, Fish Speech's token ids, CosyVoice3's multimodal audio,
  ...), exactly as vllm-omni's server would submit them. Which options, voices and clones a family takes
  is its row in ``engine.families``, checked when a session is configured. (Tests that pass stand-in
  ``tools_factory`` helpers get ``engine.qwen3_tts``'s own Qwen3-TTS prompt building instead.)
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

Families differ in data (``engine.families``; Qwen3-TTS's checkpoint kinds also in ``PROFILES``). vllm-omni
and torch are imported only in ``start()``, so the module imports without the extra; tests pass stand-ins
as ``omni_factory`` and ``tools_factory``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import numpy as np
import soundfile

from .base import (
    AudioChunk,
    EngineError,
    SynthesisRequest,
    UnknownVoice,
    UnsupportedOption,
    Voice,
    VoiceReference,
    demands,
)
from .families import FAMILIES, Clip, Family, Presets
from .omni_audio import AudioReader, to_samples, with_words
from .omni_requests import DEFAULT_VOICE, ServingTools, Submission, presets_named
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
    build_info,
    cache_salt,
    qwen_language,
    variant_of,
    with_request_params,
)
from .vllm_omni_launch import Launch
from .vllm_omni_settings import VllmOmniSettings

__all__ = ["AudioReader", "OmniClient", "VllmOmniEngine", "VllmOmniSettings", "create", "to_samples"]

logger = logging.getLogger(__name__)

# vllm-omni's engine speaks at the model's own rate; its HTTP server time-stretches the audio afterwards.
_NO_SPEED = (
    "vllm-omni's engine does not change {label}'s speaking rate (its HTTP server stretches the audio "
    "afterwards); leave speed at 1.0"
)


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


@dataclass(frozen=True, slots=True)
class _Running:
    """A started engine's vllm-omni and its helpers (``VllmOmniEngine.start``)."""

    omni: OmniClient
    tools: Qwen3Tools | ServingTools


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
        submission: Submission | None = None
        try:
            running = self._engine._running
            outputs, snapshots, submission = await self._engine._submit(req, self.request_id)
            assert running is not None  # _submit checked
            tools = running.tools
            self._submitted = True
            words = bool(req.options.get("word_timestamps"))
            reader = AudioReader(self._engine.sample_rate, snapshots=snapshots)
            held: list[AudioChunk] = []  # with words: the segment's audio, until the aligner has timed it
            timed: list[tuple[str, int, int]] | None = None
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    if submission is not None:
                        submission.observe(output)
                    if words and tools.is_words(output):
                        language = req.options.get("language")
                        timed = tools.words(output, req.text, language if isinstance(language, str) else None)
                        continue
                    for chunk in reader.read(output):
                        self._engine.sample_rate = chunk.sample_rate
                        if words:
                            held.append(chunk)
                        else:
                            self._queue.put_nowait(chunk)
            finished, submission = submission, None  # finished: not to be finished again as failed
            if finished is not None:
                finished.finish(ok=True)
            if held:
                self._queue.put_nowait(with_words(req.text, held, timed, self.request_id))
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
            if submission is not None:
                submission.finish(ok=False)
            self._engine._streams.discard(self)


class VllmOmniEngine:
    """A TTS model on vllm-omni's ``AsyncOmni``, in this process.

    Args:
        model: Hugging Face id or local path of a checkpoint vllm-omni serves speech from.
        deploy_config: vllm-omni deploy YAML (a name under ``vllm_omni/deploy/`` or a path).
        stage_init_timeout_s: how long each stage may take to start.
        forced_aligner: vllm-omni's ``--forced-aligner`` model (word timestamps); empty: none.
        omni_factory: builds the ``AsyncOmni`` (tests pass a stand-in); default: the real one.
        tools_factory: binds vllm-omni's helpers to it (tests pass Qwen3-TTS stand-ins); default: its speech
            serving object (``omni_requests.ServingTools``).
    """

    name = "vllm-omni"
    reads_numbers = True  # a speech model's own text front end
    ipa_symbols: frozenset[str] = frozenset()  # text in, no phoneme input

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        deploy_config: str = DEFAULT_DEPLOY_CONFIG,
        stage_init_timeout_s: float = DEFAULT_STAGE_INIT_TIMEOUT_S,
        forced_aligner: str = "",
        omni_factory: Callable[[], OmniClient] | None = None,
        tools_factory: Callable[[OmniClient], Qwen3Tools | ServingTools] | None = None,
    ) -> None:
        self._launch = Launch(model, deploy_config, stage_init_timeout_s, forced_aligner)
        self._omni_factory = omni_factory or self._launch.omni
        self._tools_factory = tools_factory or self._launch.tools
        self._use_profile(PROFILES[variant_of(model) or "CustomVoice"])
        self._running: _Running | None = None
        self._speakers: list[str] = []
        self._languages = DEFAULT_LANGUAGES
        self._native_speed = False
        self._reference: VoiceReference | None = None
        self._streams: set[_Stream] = set()

    def _use_profile(self, profile: Profile) -> None:
        self.profile = profile
        self.family: Family = FAMILIES[f"qwen3_tts_{profile.task_type.lower()}"]
        self.sample_rate = profile.sample_rate
        self.default_voice = profile.default_voice
        self.clones = profile.clones

    def _use_family(self, tools: ServingTools) -> None:
        if tools.variant is not None:
            self._use_profile(PROFILES[tools.variant])
        else:
            self.default_voice = DEFAULT_VOICE
        rules = self.family = tools.family
        self.clones = rules.clip is not Clip.NONE or rules.embedding
        self._native_speed = tools.native_speed

    async def start(self) -> None:
        # AsyncOmni starts its stage processes in its constructor and blocks until they are up (minutes).
        # vllm-omni's own server builds it the same way, on the event loop before it serves; nothing is
        # served here either until the lifespan's start-up returns.
        omni = self._omni_factory()
        tools: Qwen3Tools | ServingTools | None = None
        try:
            tools = self._tools_factory(omni)
            if isinstance(tools, ServingTools):
                await tools.warmup()  # as vllm-omni's server, before serving (CUDA graphs, compilation)
                self._use_family(tools)
            elif tools.variant is not None:
                self._use_profile(PROFILES[tools.variant])
            self._speakers = [s.lower() for s in tools.speakers]
            self._languages = tools.languages or DEFAULT_LANGUAGES
            if self.family.presets is Presets.LISTED and self._speakers:
                self.default_voice = self._speakers[0]
            elif self.profile.task_type == "CustomVoice" and self.family.task_type == "CustomVoice":
                raise EngineError(
                    f"{self._launch.model} is a CustomVoice model whose config lists no speakers"
                )
            if self.family.reference_only:
                self._default_reference()  # a missing or unreadable file fails the start, not a request
        except BaseException:
            if isinstance(tools, ServingTools):
                tools.shutdown()
            omni.shutdown()  # its stage processes hold the GPU
            raise
        self._running = _Running(omni, tools)
        logger.info("vllm-omni %s: %s, voices %s", self._launch.model, self.family.label, self._speakers)

    def _default_reference(self) -> VoiceReference:
        """The reference a plain request carries to a family that speaks only from one (read once)."""
        if self._reference is None:
            from .remote_settings import DEFAULT_REFERENCE_AUDIO, DEFAULT_REFERENCE_TEXT

            audio, rate = soundfile.read(DEFAULT_REFERENCE_AUDIO, dtype="float32", always_2d=True)
            self._reference = VoiceReference(
                name="default",
                audio=np.ascontiguousarray(audio.mean(axis=1), dtype=np.float32),
                sample_rate=int(rate),
                ref_text=DEFAULT_REFERENCE_TEXT,
            )
        return self._reference

    async def voices(self) -> list[Voice]:
        if self.family.presets is not Presets.LISTED:
            return []
        return [
            Voice(
                name=s,
                engine=self.name,
                sample_rate=self.sample_rate,
                description=f"{self.family.label} speaker",
            )
            for s in self._speakers
        ]

    def check(self, voice: str, options: dict[str, object]) -> None:
        rules = self.family
        if rules.presets is Presets.LISTED and (self._speakers or rules.task_type == "CustomVoice"):
            if voice.lower() not in self._speakers:
                raise UnknownVoice(voice, self.name, self._speakers)
        elif rules.presets is Presets.NONE and voice != self.default_voice:
            raise UnknownVoice(voice, self.name, [self.default_voice])
        for field in demands(options):
            if (
                field == "word_timestamps"
                and self._running is not None
                and self._running.tools.word_timestamps
            ):
                continue
            if field == "speed" and not self._native_speed:
                raise UnsupportedOption(field, self.name, _NO_SPEED.format(label=rules.label))
            if field not in rules.options or field == "word_timestamps":
                detail = REFUSALS.get(field) or f"{rules.label} does not take {field!r}"
                raise UnsupportedOption(field, self.name, detail)
        if rules.needs_instructions and not options.get("instructions"):
            raise UnsupportedOption("instructions", self.name, f"a {rules.label} model needs it set")
        task = options.get("task_type")
        if task is not None and task != rules.task_type:
            raise UnsupportedOption("task_type", self.name, f"the model runs only {rules.task_type}")
        language = options.get("language")
        if (
            rules.qwen_languages
            and isinstance(language, str)
            and qwen_language(language) not in self._languages
        ):
            raise UnsupportedOption("language", self.name, f"it speaks {', '.join(sorted(self._languages))}")

    def check_reference(self, reference: VoiceReference) -> None:
        """Refuse a clone the model's family cannot make, when the session is configured."""
        try:
            self.family.check_reference(reference)
        except UnsupportedOption as exc:  # the family table names engine 'remote'
            raise UnsupportedOption(exc.field, self.name, str(exc).split(": ", 1)[-1]) from None

    def synthesize(self, req: SynthesisRequest) -> _Stream:
        """Submit ``req`` now and return its audio stream; closing the stream aborts the request."""
        return _Stream(self, req)

    async def _submit(
        self, req: SynthesisRequest, request_id: str
    ) -> tuple[AsyncGenerator[Any, None], bool, Submission | None]:
        """Submit ``req``: its outputs, whether they are cumulative snapshots, and its serving bookkeeping."""
        running = self._running
        if running is None:
            raise EngineError("the vllm-omni engine is not started")
        tools = running.tools
        if not isinstance(tools, ServingTools):
            omni, prompt, params, snapshots = self._prepare(req, running.omni, tools)
            outputs = omni.generate(
                prompt,
                request_id=request_id,
                sampling_params_list=params,
                output_modalities=tools.modalities(bool(req.options.get("word_timestamps"))),
            )
            return outputs, snapshots, None
        rules, options = self.family, req.options
        self.family.check_request(req.reference, dict(options))
        reference = req.reference
        if reference is None and rules.reference_only and options.get("speaker_embedding") is None:
            reference = self._default_reference()
        submission = await tools.submit(
            request_id,
            req.text,
            req.voice,
            {k: v for k, v in options.items() if k in rules.options},
            seed=req.seed,
            reference=reference,
            named=presets_named(rules, req.voice, self.default_voice, self._speakers),
        )
        return submission.outputs, not tools.streaming, submission

    def _prepare(
        self, req: SynthesisRequest, omni: OmniClient, tools: Qwen3Tools
    ) -> tuple[OmniClient, dict[str, Any], list[Any], bool]:
        """With stand-in helpers: the client, prompt and per-stage params for ``req`` (``engine.qwen3_tts``'s
        building), and whether its audio comes as snapshots."""
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
        if self._running is None:
            return
        try:
            await self._running.omni.abort(request_id)
        # Cleanup of a closed stream: a failed abort must not turn a cancel into a session error.
        except Exception as exc:
            logger.warning("vllm-omni abort of %s failed: %r", request_id, exc)

    async def ready(self) -> bool:
        return self._running is not None and not getattr(self._running.omni, "errored", False)

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        running, self._running = self._running, None
        if running is None:
            return
        if isinstance(running.tools, ServingTools):
            running.tools.shutdown()  # its request-building thread
        running.omni.shutdown()


def create(settings: VllmOmniSettings) -> VllmOmniEngine:
    """The engine ``--engine vllm-omni`` runs."""
    return VllmOmniEngine(
        model=settings.vllm_model,
        deploy_config=settings.vllm_deploy_config,
        stage_init_timeout_s=settings.vllm_stage_init_timeout_s,
        forced_aligner=settings.vllm_forced_aligner,
    )
