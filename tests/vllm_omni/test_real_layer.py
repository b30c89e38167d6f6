"""Smoke tests of the test upstream itself: vllm-omni 0.30.0's own serving layer with the CPU engine client.

If these fail, the tests of our remote engine against the real layer (test_remote_real.py, test_stub_drift.py)
cannot be trusted either.
"""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.vllm_omni.conftest import RealUpstreams
from tests.vllm_omni.upstream import RealUpstream

pytestmark = pytest.mark.slow

TIMEOUT_S = 60.0
TEXT = "Hello there. This is the real vllm-omni serving layer, speaking with Piper on a CPU."
SPEAKERS = {"vivian", "ryan", "serena", "aiden"}


@pytest.fixture(scope="module")
def upstream(real: RealUpstreams) -> RealUpstream:
    return real("CustomVoice")


def plausible_seconds(text: str) -> tuple[float, float]:
    # Piper's joe voice speaks about 177 words a minute; allow for pauses and a slower or faster read.
    words = len(text.split())
    return words / 177 * 60 * 0.5, words / 177 * 60 * 2.0 + 1.0


def speech(upstream: RealUpstream, **body: object) -> httpx.Response:
    payload = {"model": upstream.model, "input": TEXT, "voice": "vivian", **body}
    return httpx.post(f"{upstream.url}/v1/audio/speech", json=payload, timeout=TIMEOUT_S)


def test_health(upstream: RealUpstream) -> None:
    response = httpx.get(f"{upstream.url}/health", timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "healthy"}


def test_voices_list_the_speakers_and_default(upstream: RealUpstream) -> None:
    response = httpx.get(f"{upstream.url}/v1/audio/voices", timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text
    voices = set(response.json()["voices"])
    assert SPEAKERS | {"default"} <= voices


def test_wav_is_24khz_speech_of_plausible_length(upstream: RealUpstream) -> None:
    response = speech(upstream, response_format="wav")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("audio/wav")
    audio, rate = sf.read(io.BytesIO(response.content), dtype="float32")
    assert rate == 24000
    low, high = plausible_seconds(TEXT)
    assert low < audio.shape[0] / rate < high
    assert float(np.sqrt(np.mean(audio**2))) > 0.01  # not silence
    assert "generate speech-" in upstream.log()


def test_stream_answers_server_sent_events(upstream: RealUpstream) -> None:
    pcm = bytearray()
    events = []
    body = {"model": upstream.model, "input": TEXT, "voice": "ryan", "stream": True, "response_format": "pcm"}
    with httpx.stream("POST", f"{upstream.url}/v1/audio/speech", json=body, timeout=TIMEOUT_S) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                event = json.loads(line[5:])
                events.append(event["type"])
                if event["type"] == "speech.audio.delta":
                    pcm += base64.b64decode(event["audio"])
    assert events.count("speech.audio.delta") >= 2, events
    low, high = plausible_seconds(TEXT)
    assert low < len(pcm) / 2 / 24000 < high


def test_stream_format_audio_answers_raw_pcm_in_chunks(upstream: RealUpstream) -> None:
    body = {
        "model": upstream.model,
        "input": TEXT,
        "voice": "serena",
        "stream": True,
        "stream_format": "audio",
        "response_format": "pcm",
    }
    chunks: list[bytes] = []
    with httpx.stream("POST", f"{upstream.url}/v1/audio/speech", json=body, timeout=TIMEOUT_S) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("audio/pcm")
        chunks.extend(response.iter_raw())
    pcm = b"".join(chunks)
    assert len(chunks) >= 2
    assert len(pcm) % 2 == 0
    low, high = plausible_seconds(TEXT)
    assert low < len(pcm) / 2 / 24000 < high
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768
    assert float(np.sqrt(np.mean(samples**2))) > 0.01


def test_without_async_chunk_the_whole_waveform_comes_at_once(real: RealUpstreams) -> None:
    # vllm-omni keeps FINAL_ONLY for Qwen3-TTS without async_chunk, streamed or not: one waveform at the end.
    server = real("CustomVoice", async_chunk=False)
    since = len(server.log())
    low, high = plausible_seconds(TEXT)
    for body in (
        {"response_format": "pcm"},
        {"response_format": "pcm", "stream": True, "stream_format": "audio"},
    ):
        response = speech(server, **body)
        assert response.status_code == 200, response.text
        assert low < len(response.content) / 2 / 24000 < high
    assert server.log()[since:].count("output_kind=FINAL_ONLY") == 2
