"""The stub upstream against vllm-omni 0.30.0's own serving layer: same requests, same kinds of answer.

tests/engine/upstream_stub.py stands in for vllm-omni where the real layer cannot fail on demand. For
everything else it claims to follow 0.30.0's rules; this sends one list of requests to both and
compares status codes, content types and what the body is, so a rule that drifts shows here.
"""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
import soundfile

from tests.conftest import TIMEOUT_S
from tests.engine.upstream_stub import Kind, StubUpstream, serve_stub
from tests.vllm_omni.conftest import RealUpstreams

pytestmark = pytest.mark.slow


def _clip() -> str:
    t = np.arange(16000) / 16000
    out = io.BytesIO()
    soundfile.write(out, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000, format="WAV")
    return "data:audio/wav;base64," + base64.b64encode(out.getvalue()).decode()


HI = {"input": "Hi there."}
RAW = {"stream": True, "stream_format": "audio"}
REQUESTS: dict[Kind, list[dict[str, object]]] = {
    "CustomVoice": [
        {**HI, "stream": True, "response_format": "pcm"},  # SSE since vllm-omni PR #4679
        {**HI, **RAW, "response_format": "pcm"},
        {**HI, **RAW, "response_format": "wav"},
        {**HI, "stream_format": "audio", "response_format": "wav"},
        {**HI, "response_format": "wav"},
        {**HI, "response_format": "pcm"},
        {**HI, **RAW, "response_format": "wav", "speed": 1.5},
        {**HI, "response_format": "wav", "speed": 1.5},
        {**HI, **RAW, "response_format": "mp3"},
        {**HI, **RAW, "response_format": "wav", "language": "en"},
        {**HI, **RAW, "response_format": "wav", "language": "english"},
        {**HI, **RAW, "response_format": "wav", "voice": "nobody"},
        {**HI, **RAW, "response_format": "wav", "voice": "Ryan"},
        {**HI, **RAW, "response_format": "wav", "voice": "default"},
        {**HI, **RAW, "response_format": "wav", "task_type": "Base"},
        {**HI, **RAW, "response_format": "wav", "ref_text": "Hello."},
        {**HI, **RAW, "response_format": "wav", "x_vector_only_mode": True},
        {"input": "   ", **RAW, "response_format": "wav"},
        # Word timestamps need --forced-aligner, which this server was launched without.
        {**HI, "response_format": "wav", "word_timestamps": True},
        {**HI, **RAW, "response_format": "wav", "word_timestamps": True},
        {"input": "", "word_timestamps": True},  # the remote engine's probe
    ],
    "Base": [
        {**HI, **RAW, "response_format": "wav"},
        {**HI, **RAW, "response_format": "wav", "ref_audio": _clip()},
        {**HI, **RAW, "response_format": "wav", "ref_audio": _clip(), "x_vector_only_mode": True},
        {**HI, **RAW, "response_format": "wav", "ref_audio": _clip(), "ref_text": "A tone."},
        {**HI, **RAW, "response_format": "wav", "voice": "vivian"},
    ],
    "VoiceDesign": [
        {**HI, **RAW, "response_format": "wav"},
        {**HI, **RAW, "response_format": "wav", "instructions": "A calm voice."},
    ],
}


def kind_of(response: httpx.Response) -> tuple[int, str, str]:
    """(status, media type, what the body is): the parts of an answer a client branches on."""
    media = response.headers.get("content-type", "").split(";")[0]
    body = response.content
    if response.status_code != 200:
        what = "error" if "error" in response.json() else "other json"
    elif media == "text/event-stream":
        what = "sse"
    elif body[:4] == b"RIFF":
        what = "wav"
    elif media == "audio/pcm" and len(body) % 2 == 0 and body:
        what = "pcm"
    else:
        what = f"unknown {body[:20]!r}"
    return response.status_code, media, what


def answers(url: str, requests: list[dict[str, object]]) -> list[tuple[int, str, str]]:
    return [kind_of(httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)) for body in requests]


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_the_stub_answers_as_the_real_layer_does(kind: Kind, real: RealUpstreams) -> None:
    upstream = real(kind)
    with serve_stub(StubUpstream(kind=kind)) as stub:
        real_voices = httpx.get(f"{upstream.url}/v1/audio/voices", timeout=TIMEOUT_S).json()
        stub_voices = httpx.get(f"{stub}/v1/audio/voices", timeout=TIMEOUT_S).json()
        expected, got = answers(upstream.url, REQUESTS[kind]), answers(stub, REQUESTS[kind])
    assert set(real_voices) == set(stub_voices)
    assert ("default" in real_voices["voices"]) == ("default" in stub_voices["voices"])
    drift = [
        (body, want, have)
        for body, want, have in zip(REQUESTS[kind], expected, got, strict=True)
        if want != have
    ]
    assert not drift, "\n".join(f"{str(b)[:160]}: real {w}, stub {h}" for b, w, h in drift)


WORDS = {"input": "It costs $3.50 on 5/12, Dr. Smith said.", "word_timestamps": True}
ALIGNED_REQUESTS: list[dict[str, object]] = [
    {**WORDS, "response_format": "wav"},
    {**WORDS, "response_format": "pcm"},
    {**WORDS, **RAW, "response_format": "wav"},
    {**WORDS, "stream": True, "response_format": "pcm"},
    {"input": "", "word_timestamps": True},  # the remote engine's probe
    {"input": " ".join(["a"] * 140), "word_timestamps": True, "response_format": "wav"},  # over 4 KB
]


def words_kind(response: httpx.Response) -> tuple[tuple[int, str, str], list[str] | str | None]:
    """The answer's kind, and the words of its ``X-Word-Timestamps`` (or that they were left out)."""
    header = response.headers.get("x-word-timestamps")
    if header is not None:
        words: list[str] | str | None = [w["word"] for w in json.loads(header)]
    else:
        words = "omitted" if response.headers.get("x-word-timestamps-omitted") else None
    return kind_of(response), words


def test_the_stub_times_words_as_the_real_layer_with_its_aligner_does(real: RealUpstreams) -> None:
    upstream = real("CustomVoice", forced_aligner=True)
    with serve_stub(StubUpstream(forced_aligner=True)) as stub:
        expected = [
            words_kind(httpx.post(f"{upstream.url}/v1/audio/speech", json=body, timeout=120))
            for body in ALIGNED_REQUESTS
        ]
        got = [
            words_kind(httpx.post(f"{stub}/v1/audio/speech", json=body, timeout=120))
            for body in ALIGNED_REQUESTS
        ]
    assert expected[0][1] == ["It", "costs", "350", "on", "512", "Dr", "Smith", "said"]
    drift = [(b, w, h) for b, w, h in zip(ALIGNED_REQUESTS, expected, got, strict=True) if w != h]
    assert not drift, "\n".join(f"{str(b)[:160]}: real {w}, stub {h}" for b, w, h in drift)
