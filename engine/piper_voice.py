"""Piper's voice as it is loaded: its ONNX Runtime sessions, its language, its one gain and its phonemes.

``engine.piper`` builds a voice from these once, at start: ``inference_session`` for each session of the
model (one per thread count), ``language_of`` from the voice's config, ``calibrate`` for the gain every piece
gets, and ``phoneme_symbols``, the phonemes a client's ``ipa`` may use (those the voice has an id for).
"""

from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnxruntime
    from piper import PiperVoice

#: Text whose loudest sample sets the voice's one gain (``calibrate``): a greeting, an exclamation, a
#: long sentence with a clause and a question, in the range of loudness the voice has (joe's raw peaks are
#: 0.34-0.63 over such sentences, its voiced RMS -21 to -23 dBFS).
CALIBRATION = (
    "Sure! I can definitely help you reschedule that appointment, and I will check the calendar. "
    "Hello there. Does the weather today look good to you?"
)
#: Where the calibration's loudest sample lands with the voice's gain: louder text has room above it.
CALIBRATED_PEAK = 0.8

# Symbols of Piper's id map that are no phoneme: a sentence's start and end, and the pad between phonemes.
_FRAMING = frozenset("^$_")


def inference_session(model: str | bytes, threads: int, arena: bool = False) -> onnxruntime.InferenceSession:
    """An ONNX Runtime session of the voice's ``model`` with ``threads`` intra-op threads, and its memory
    arena when asked (``piper_arena``, ``piper_wide_arena``)."""
    import onnxruntime

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
    # after ``piper._ARENA_IDLE_S`` without work.
    options.enable_cpu_mem_arena = arena
    options.enable_mem_pattern = False
    if threads > 1:
        # The wide session's pool threads wait for work without spinning: it runs when no other
        # inference does, but one may start beside it, and spinning threads then take CPU the
        # other needs (bench/piper_cpu.py: 2 threads, 120-128 ms of CPU per audio s instead of
        # 153-168, at the same or a better wall time; first audio alone no slower).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])


def language_of(config: dict[str, object]) -> tuple[str, str]:
    """The voice's language from its config: a BCP 47 tag (``en-US``, from ``language.code`` or else
    ``espeak.voice``) and its English name (``English``)."""
    language = config.get("language")
    espeak = config.get("espeak")
    info = language if isinstance(language, dict) else {}
    code = info.get("code") or (espeak.get("voice") if isinstance(espeak, dict) else None) or "en-US"
    parts = str(code).replace("_", "-").split("-")
    tag = "-".join([parts[0].lower(), *(p.upper() if len(p) == 2 else p for p in parts[1:])])
    return tag, str(info.get("name_english") or tag)


def calibrate(voice: PiperVoice) -> float:
    """The voice's one gain: ``CALIBRATED_PEAK`` over the loudest sample of ``CALIBRATION``, spoken without
    sampling noise (the same every start). Measured once, at start; about 0.2 s of one core."""
    from piper import SynthesisConfig

    config = SynthesisConfig()
    config.noise_scale = 0.0
    config.noise_w_scale = 0.0
    peak = 0.0
    for phonemes in voice.phonemize(CALIBRATION):
        audio = np.asarray(voice.phoneme_ids_to_audio(voice.phonemes_to_ids(phonemes), config))
        peak = max(peak, float(np.max(np.abs(audio))) if audio.size else 0.0)
    return CALIBRATED_PEAK / peak if peak > 1e-8 else 1.0


def phoneme_symbols(voice: PiperVoice) -> frozenset[str]:
    """The phoneme symbols (IPA, one code point each, decomposed as espeak's are) the voice has an id for:
    those a client's ``ipa`` may use. Brackets are never among them (``[[...]]`` frames piper's phonemes)."""
    symbols = {unicodedata.normalize("NFD", s) for s in voice.config.phoneme_id_map}
    return frozenset(s for s in symbols if len(s) == 1 and s not in _FRAMING and s not in "[]")
