"""Speech through the gateway is intelligible: Whisper tiny.en (shipped in a wheel) transcribes it back."""

from __future__ import annotations

import numpy as np
import pytest
from voxgate.protocol.audio import decode

from tests.conftest import recv_until, send, session
from tests.speech_check import load_whisper, word_error_rate

pytestmark = pytest.mark.slow

SENTENCES = [
    "Hello, and welcome to the voice gateway.",
    "The quick brown fox jumps over the lazy dog.",
    "Your appointment is on the fourth of June at three thirty.",
    "Please hold while I transfer your call to a specialist.",
]


@pytest.fixture(scope="module")
def whisper() -> object:
    return load_whisper()


def test_word_error_rate_through_the_gateway(piper_gateway: str, whisper: object) -> None:
    # seed: Piper runs noise-free, so the audio, and Whisper's transcript of it, are the same every run.
    with session(
        piper_gateway, response_format="f32", sample_rate=16000, split_granularity="sentence", seed=7
    ) as ws:
        for sentence in SENTENCES:
            # Stream it as an LLM would: a few characters at a time.
            for start in range(0, len(sentence), 4):
                send(ws, type="input.text", text=sentence[start : start + 4])
            send(ws, type="input.text", text=" ")
        send(ws, type="input.done")
        got = recv_until(ws, "session.done")
    audio = decode(b"".join(got.frames()), "f32")
    assert len(audio) > 16000 * 6
    error, hypothesis = word_error_rate(whisper, audio, 16000, " ".join(SENTENCES))
    assert error < 0.15, (error, hypothesis)


def test_resampled_telephony_audio_is_still_intelligible(piper_gateway: str, whisper: object) -> None:
    sentence = SENTENCES[3]
    with session(piper_gateway, response_format="mulaw", sample_rate=8000, seed=7) as ws:
        send(ws, type="input.text", text=sentence)
        send(ws, type="input.done")
        got = recv_until(ws, "session.done")
    audio = decode(b"".join(got.frames()), "mulaw").astype(np.float32)
    error, hypothesis = word_error_rate(whisper, audio, 8000, sentence)
    assert error < 0.15, hypothesis
