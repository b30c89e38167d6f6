"""Every OpenAI format streams from ``POST /v1/audio/speech``: its audio arrives, decodable, while the rest
is still being synthesized, in the body and in SSE deltas alike."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import AsyncGenerator, Iterator

import httpx
import numpy as np
import pytest
from voxgate.engine.base import AudioChunk, SynthesisRequest
from voxgate.engine.fake import SECONDS_PER_CHAR, FakeEngine

from tests.conftest import serve_engine
from tests.decoding import decoded

FIRST, SECOND = "The first sentence is here.", "The second one waits for the gate."
TEXT = f"{FIRST} {SECOND}"
FORMATS = ["pcm", "wav", "mp3", "opus", "aac", "flac"]
TIMEOUT_S = 30.0


class GatedEngine(FakeEngine):
    """The fake tone, but a segment of ``SECOND`` waits until the test opens ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_open = threading.Event()

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        if "second" in req.text:
            await asyncio.to_thread(self.gate_open.wait, TIMEOUT_S)
        async for chunk in super().synthesize(req):
            yield chunk


def audio_of(fmt: str, data: bytes) -> tuple[np.ndarray, int]:
    if fmt == "pcm":
        return np.frombuffer(data[: len(data) // 2 * 2], "<i2").astype(np.float32) / 32768.0, 24000
    return decoded(data)


def body_pieces(response: httpx.Response, sse: bool) -> Iterator[bytes]:
    if not sse:
        yield from response.iter_bytes()
        return
    for line in response.iter_lines():
        if line.startswith("data: "):
            event = json.loads(line[6:])
            if event["type"] == "speech.audio.delta":
                yield base64.b64decode(event["audio"])


@pytest.mark.parametrize("sse", [False, True], ids=["body", "sse"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_first_sentence_arrives_decodable_before_the_second_is_made(fmt: str, sse: bool) -> None:
    engine = GatedEngine()
    body = {
        "input": TEXT,
        "voice": "tone",
        "response_format": fmt,
        "stream_format": "sse" if sse else "audio",
    }
    first_s = len(FIRST) * SECONDS_PER_CHAR
    with serve_engine(engine) as address:
        with httpx.stream(
            "POST", f"http://{address}/v1/audio/speech", json=body, timeout=TIMEOUT_S
        ) as response:
            assert response.status_code == 200
            received = b""
            pieces = body_pieces(response, sse)
            # The whole first sentence, its codec delay aside, comes while the second is held at the gate.
            while len(audio_of(fmt, received)[0]) < (first_s - 0.15) * 24000:
                received += next(pieces)
            assert not engine.gate_open.is_set()
            engine.gate_open.set()
            for piece in pieces:
                received += piece
    samples, rate = audio_of(fmt, received)
    expected_s = (len(FIRST) + len(SECOND)) * SECONDS_PER_CHAR
    assert rate in (24000, 48000)  # an Ogg Opus decoder speaks at 48 kHz
    assert abs(len(samples) / rate - expected_s) < 0.1
    # The fake engine's 220 Hz tone is what is heard.
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(np.argmax(spectrum) * rate / len(samples) - 220) < 5


def test_an_unknown_format_is_refused_naming_it() -> None:
    with serve_engine(FakeEngine()) as address:
        response = httpx.post(
            f"http://{address}/v1/audio/speech",
            json={"input": "Hi.", "response_format": "ogg"},
            timeout=TIMEOUT_S,
        )
    assert response.status_code == 400 and response.json()["error"]["param"] == "response_format"


def test_a_rate_the_encoder_cannot_take_is_refused_naming_the_rates() -> None:
    with serve_engine(FakeEngine()) as address:
        body = {"input": "Hi.", "response_format": "opus", "sample_rate": 44100}
        response = httpx.post(f"http://{address}/v1/audio/speech", json=body, timeout=TIMEOUT_S)
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "unsupported_rate" and "48000" in error["message"]


@pytest.mark.parametrize("text", ["...", "?!", "  -- "])
def test_input_with_nothing_to_say_is_empty_input(text: str) -> None:
    with serve_engine(FakeEngine()) as address:
        response = httpx.post(f"http://{address}/v1/audio/speech", json={"input": text}, timeout=TIMEOUT_S)
    assert response.status_code == 400 and response.json()["error"]["code"] == "empty_input"
