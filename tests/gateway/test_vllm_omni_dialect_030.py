"""vllm-omni 0.30's WebSocket additions, through a real gateway, to a vllm-omni dialect client.

With ``word_timestamps`` vllm-omni sends the audio itself inside ``audio.chunk`` messages (base64 PCM): a
vllm-omni client plays ``audio_b64`` and would hear silence if the audio came in binary frames instead. A
segment that fails after some audio gets vllm-omni's ``error`` with ``partial_audio`` / ``action`` before its
``audio.done``.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator
from typing import cast

import numpy as np
from voxgate.engine.base import AudioChunk, SynthesisRequest, WordTiming
from voxgate.engine.fake import FakeEngine
from websockets.sync.client import connect

from tests.conftest import TIMEOUT_S, Received, recv_until, send, serve_engine

URL = "/v1/audio/speech/stream"
RATE = 24000


class TimedFake(FakeEngine):
    """The fake tone, with its words timed evenly over the first chunk's audio (as Piper times a sentence)."""

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        first = True
        async for chunk in super().synthesize(req):
            words = req.text.split()
            if first and words and req.options.get("word_timestamps"):
                step = len(chunk.samples) // len(words)
                timed = tuple(WordTiming(w, i * step, (i + 1) * step) for i, w in enumerate(words))
                chunk = AudioChunk(chunk.samples, chunk.sample_rate, timed)
            first = False
            yield chunk


def speak(address: str, text: str, **config: object) -> Received:
    with connect(f"ws://{address}{URL}", max_size=None, open_timeout=TIMEOUT_S) as ws:
        assert ws.subprotocol is None  # vllm-omni's dialect
        send(ws, type="session.config", **config)
        send(ws, type="input.text", text=text)
        send(ws, type="input.done")
        return recv_until(ws, "session.done")


def test_word_timestamps_carry_the_audio_in_base64_audio_chunks() -> None:
    engine = TimedFake(
        sample_rate=RATE, supported=frozenset({"speed", "seed", "language", "word_timestamps"})
    )
    with serve_engine(engine) as address:
        got = speak(
            address, "Hello there world.", response_format="pcm", stream_audio=True, word_timestamps=True
        )
    assert not got.frames(), "no binary frame: vllm-omni's client reads audio_b64"
    assert got.types()[0] == "audio.start" and got.types()[-2:] == ["audio.done", "session.done"]
    start = got.messages("audio.start")[0]
    assert start["word_timestamps"] is True and start["sample_rate"] == RATE
    chunks = got.messages("audio.chunk")
    audio, last = chunks[:-1], chunks[-1]
    pcm = b"".join(base64.b64decode(str(c["audio_b64"])) for c in audio)
    samples = np.frombuffer(pcm, "<i2")
    # FakeEngine speaks 60 ms a character: the whole sentence, and the tone, not silence.
    assert len(samples) == int(len("Hello there world.") * 0.06 * RATE)
    assert float(np.sqrt(np.mean((samples / 32768.0) ** 2))) > 0.1
    assert all(c["timestamps"] is None for c in audio)
    assert last["audio_b64"] == "" and last["chunk_end_ms"] == round(len(samples) * 1000 / RATE)
    words = cast(list[dict[str, object]], last["timestamps"])
    assert [w["word"] for w in words] == ["Hello", "there", "world."]
    assert [c["chunk_id"] for c in chunks] == list(range(len(chunks)))
    assert got.messages("audio.done")[0]["total_bytes"] == len(pcm)


def test_a_segment_failing_after_audio_gets_partial_audio_before_its_audio_done() -> None:
    with serve_engine(FakeEngine(sample_rate=RATE, fail_on="boom", fail_after_chunks=1)) as address:
        got = speak(address, "Say boom now.", response_format="pcm", stream_audio=True)
    assert got.frames(), "the audio before the failure was sent"
    types = [t for t in got.types() if t != "<audio>"]
    assert types == ["audio.start", "error", "audio.done", "session.done"]
    error = got.messages("error")[0]
    assert set(error) == {"type", "message", "partial_audio", "action"}
    assert error["partial_audio"] is True and error["action"] == "discard"
    assert got.messages("audio.done")[0]["error"] is True
