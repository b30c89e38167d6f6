"""A sentence pause on a real socket (protocol/pauses.py): after "Sure!", with more text come but not enough
to cut, the gateway writes silence as audio frames, just in time, instead of letting the client run dry;
the sentence's audio.done follows its pause and counts it, and the next segment starts after it.

A real uvicorn and a real client; the fake engine speaks at once, so "Sure!" (0.3 s of its tone) has
played long before the client sends the rest, 2 s later: the pause runs to its cap.
"""

from __future__ import annotations

import time

import numpy as np
from voxgate.engine.fake import FakeEngine
from voxgate.protocol import pauses

from ..conftest import recv_until, send, serve_engine, session

RATE = 24000


def _silent(frame: bytes) -> bool:
    return not np.frombuffer(frame, dtype="<i2").any()


def test_a_sentence_pause_reaches_the_client_as_silence_before_the_sentences_audio_done() -> None:
    with (
        serve_engine(FakeEngine()) as address,
        session(address, response_format="pcm", sample_rate=RATE) as ws,
    ):
        send(ws, type="input.text", text="Sure! I")  # "I" alone cannot be cut: the next segment waits
        t0 = time.monotonic()
        first = recv_until(ws, "audio.done")  # Sure!'s: held while a pause may follow
        frames = first.frames()
        pause = 0
        while pause < len(frames) and _silent(frames[-1 - pause]):
            pause += 1
        speech = frames[: len(frames) - pause]
        assert speech and not any(_silent(f) for f in speech)  # its tone, then the pause
        paused_s = sum(len(f) for f in frames[len(frames) - pause :]) / 2 / RATE
        assert 0 < paused_s <= pauses.MAX_S + 1e-9
        (done,) = first.messages("audio.done")
        assert done["duration_ms"] == sum(len(f) for f in frames) / 2 / RATE * 1000  # the pause counts
        time.sleep(max(0.0, 2.0 - (time.monotonic() - t0)))
        send(ws, type="input.text", text=" can help.")
        send(ws, type="input.done")
        rest = recv_until(ws, "session.done")
    (start,) = rest.messages("audio.start")
    assert start["sentence_text"] == "I can help."
    assert start["start_sample"] == sum(len(f) for f in frames) // 2  # it starts after the pause
    assert not any(_silent(f) for f in rest.frames())  # no pause after the last sentence
