"""``--engine remote`` in front of vllm-omni 0.30.0's own serving layer (CPU engine client, Piper speech).

Gateway B runs the remote engine on a real uvicorn; its upstream is vllm-omni's own HTTP server
(tests/vllm_omni/server.py), whose only stand-in is the engine client. Everything the client of B
gets has gone through vllm-omni's route handlers, validation and audio encoding, and Whisper checks
that it still says the words.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
import time
from collections.abc import Iterator

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import soundfile
from voxgate.protocol.audio import decode
from websockets.sync.client import ClientConnection, connect

from tests.conftest import TIMEOUT_S, Received, recv, recv_until, send, serve_engine, session
from tests.decoding import decoded
from tests.speech_check import load_whisper, word_error_rate
from tests.vllm_omni.conftest import RealUpstreams
from tests.vllm_omni.upstream import RealUpstream

pytestmark = pytest.mark.slow

URL = "/v1/audio/speech/stream"
SENTENCES = "The quick brown fox jumps over the lazy dog. Please hold while I transfer your call."
# vllm-omni's CPU engine client is slow to start a request under load; B waits for it, not for ever.
READ_TIMEOUT_S = 60.0
# Enough for vllm-omni to log the abort of a request whose client went away.
ABORT_S = 10.0


@pytest.fixture(scope="module")
def whisper() -> object:
    return load_whisper()


@pytest.fixture(scope="module")
def custom_voice(real: RealUpstreams) -> RealUpstream:
    return real("CustomVoice")


@pytest.fixture(scope="module")
def gateway(custom_voice: RealUpstream) -> Iterator[str]:
    """Gateway B, the remote engine in front of the CustomVoice upstream."""
    with front(custom_voice) as address:
        yield address


def front(upstream: RealUpstream) -> contextlib.AbstractContextManager[str]:
    """Gateway B (the remote engine) in front of ``upstream``."""
    return serve_engine(
        None,
        engine="remote",
        upstreams=(upstream.url,),
        # A cold GPU's first answer (compilation, warm-up) takes far longer than a warm one's.
        upstream_read_timeout_s=READ_TIMEOUT_S,
        upstream_first_byte_timeout_s=READ_TIMEOUT_S,
        upstream_segment_timeout_s=READ_TIMEOUT_S,
    )


def stream_text(ws: ClientConnection, text: str, size: int = 5) -> Received:
    """Send ``text`` a few characters at a time, as an LLM would, then input.done; wait for session.done."""
    for start in range(0, len(text), size):
        send(ws, type="input.text", text=text[start : start + size])
    send(ws, type="input.done")
    return recv_until(ws, "session.done", timeout=120)


def assert_says(whisper: object, audio: npt.NDArray[np.float32], rate: int, text: str) -> None:
    error, heard = word_error_rate(whisper, audio, rate, text)
    assert error < 0.2, (error, heard)


def wav_audio(data: bytes) -> tuple[npt.NDArray[np.float32], int]:
    audio, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    return audio, rate


def speech(address: str, **body: object) -> httpx.Response:
    return httpx.post(f"http://{address}/v1/audio/speech", json=body, timeout=120)


def wait_for_log(upstream: RealUpstream, pattern: str, since: int, timeout: float = ABORT_S) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := re.search(pattern, upstream.log()[since:]):
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} not in the upstream's log:\n{upstream.log()[since:][-3000:]}")


# -- WebSocket sessions ---------------------------------------------------------------------------


def test_pcm_session_streams_intelligible_speech(gateway: str, whisper: object) -> None:
    with session(gateway, response_format="pcm") as ws:
        got = stream_text(ws, SENTENCES)
    assert not got.messages("error") and not any(m["error"] for m in got.messages("audio.done"))
    starts = got.messages("audio.start")
    assert " ".join(str(m["sentence_text"]) for m in starts) == SENTENCES and len(starts) >= 2
    rate = int(starts[0]["sample_rate"])  # type: ignore[call-overload]
    assert_says(whisper, decode(b"".join(got.frames()), "pcm"), rate, SENTENCES)


def test_mulaw_8k_session_is_intelligible(gateway: str, whisper: object) -> None:
    with session(gateway, response_format="mulaw", sample_rate=8000) as ws:
        got = stream_text(ws, SENTENCES)
    assert not got.messages("error")
    assert all(m["sample_rate"] == 8000 for m in got.messages("audio.start"))
    assert_says(whisper, decode(b"".join(got.frames()), "mulaw"), 8000, SENTENCES)


def test_wav_session_decodes(gateway: str, whisper: object) -> None:
    with session(gateway, response_format="wav", stream_audio=False, sample_rate=16000) as ws:
        got = stream_text(ws, SENTENCES)
    assert not got.messages("error")
    pieces = [wav_audio(frame) for frame in got.frames()]
    assert pieces and all(rate == 16000 for _, rate in pieces)
    assert_says(whisper, np.concatenate([audio for audio, _ in pieces]), 16000, SENTENCES)


def test_language_codes_and_speed_work_on_the_real_layer(gateway: str) -> None:
    with session(gateway, language="en-US", speed=1.25) as ws:
        got = stream_text(ws, "Hello there.")
    assert not got.messages("error"), got.messages("error")
    assert got.frames()


def test_an_invalid_language_is_a_4xx_naming_the_field(gateway: str) -> None:
    response = speech(gateway, input="Hello there.", language="tlh", response_format="pcm")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "request_refused" and error["param"] == "language"
    assert "Invalid language" in error["message"]


def test_the_placeholder_voice_is_not_listed(gateway: str, custom_voice: RealUpstream) -> None:
    upstream = httpx.get(f"{custom_voice.url}/v1/audio/voices", timeout=TIMEOUT_S).json()["voices"]
    ours = httpx.get(f"http://{gateway}/v1/audio/voices", timeout=TIMEOUT_S).json()["voices"]
    assert "default" in upstream and "default" not in ours
    assert set(upstream) - {"default"} <= set(ours)


# -- REST -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "opus", "flac"])
def test_rest_in_every_format(gateway: str, whisper: object, fmt: str) -> None:
    response = speech(gateway, input=SENTENCES, response_format=fmt)
    assert response.status_code == 200, response.text
    if fmt == "pcm":
        audio, rate = decode(response.content, "pcm"), int(response.headers["x-sample-rate"])
    elif fmt == "wav":
        audio, rate = wav_audio(response.content)
    else:  # FFmpeg's decoder: a streamed FLAC states no length, which libsndfile cannot read whole
        audio, rate = decoded(response.content)
    assert_says(whisper, audio.astype(np.float32), rate, SENTENCES)


def test_rest_sse(gateway: str, whisper: object) -> None:
    response = speech(gateway, input=SENTENCES, response_format="pcm", stream_format="sse")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    deltas = [e for e in events if '"speech.audio.delta"' in e]
    assert deltas and '"speech.audio.done"' in events[-1]
    pcm = b"".join(base64.b64decode(json.loads(e)["audio"]) for e in deltas)
    assert_says(whisper, decode(pcm, "pcm"), 24000, SENTENCES)


# -- cancel and disconnect reach vllm-omni ----------------------------------------------------------


LONG = " ".join(["This is a long sentence that keeps the engine busy for a good while, on and on."] * 6)


def test_cancel_aborts_the_upstream_request(gateway: str, custom_voice: RealUpstream) -> None:
    since = len(custom_voice.log())
    with session(gateway, eager_first_segment=False) as ws:
        send(ws, type="input.text", text=LONG)
        first = recv(ws, timeout=120)
        while not isinstance(first, bytes):
            first = recv(ws, timeout=120)
        send(ws, type="input.cancel")
        got = recv_until(ws, "audio.cancelled", timeout=TIMEOUT_S)
    assert got.messages("audio.cancelled")
    wait_for_log(custom_voice, r"abort \S+|cancelled by client", since)


def test_disconnect_aborts_the_upstream_request(gateway: str, custom_voice: RealUpstream) -> None:
    since = len(custom_voice.log())
    with connect(f"ws://{gateway}{URL}", max_size=None) as ws:
        send(ws, type="session.config", eager_first_segment=False)
        send(ws, type="input.text", text=LONG)
        while not isinstance(recv(ws, timeout=120), bytes):
            pass
    wait_for_log(custom_voice, r"abort \S+|cancelled by client", since)


# -- cloning: a Base checkpoint -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_gateway(real: RealUpstreams) -> Iterator[str]:
    with front(real("Base")) as address:
        yield address


def reference_clip(gateway: str) -> bytes:
    """A real voice to clone: Piper speech fetched through the CustomVoice gateway, as WAV."""
    response = speech(gateway, input="The quick brown fox.", response_format="wav", sample_rate=16000)
    assert response.status_code == 200
    return response.content


@pytest.mark.parametrize("transcript", ["The quick brown fox.", None])
def test_cloning_an_uploaded_voice(
    base_gateway: str, gateway: str, whisper: object, transcript: str | None
) -> None:
    form = {"name": f"clone-{transcript is not None}", "consent": "recorded with consent"}
    if transcript is not None:
        form["ref_text"] = transcript
    clip = reference_clip(gateway)
    uploaded = httpx.post(
        f"http://{base_gateway}/v1/audio/voices",
        data=form,
        files={"audio_sample": ("clip.wav", clip, "audio/wav")},
        timeout=TIMEOUT_S,
    )
    assert uploaded.status_code == 200, uploaded.text
    with session(base_gateway, voice=form["name"]) as ws:
        got = stream_text(ws, SENTENCES)
    assert not got.messages("error"), got.messages("error")
    rate = int(got.messages("audio.start")[0]["sample_rate"])  # type: ignore[call-overload]
    assert_says(whisper, decode(b"".join(got.frames()), "pcm"), rate, SENTENCES)
    rest = speech(base_gateway, input="Hello there.", voice=form["name"], response_format="wav")
    assert rest.status_code == 200, rest.text


def test_cloning_with_inline_ref_audio(base_gateway: str, gateway: str, whisper: object) -> None:
    clip = base64.b64encode(reference_clip(gateway)).decode()
    response = speech(
        base_gateway,
        input=SENTENCES,
        response_format="wav",
        ref_audio=f"data:audio/wav;base64,{clip}",
        ref_text="The quick brown fox.",
    )
    assert response.status_code == 200, response.text
    audio, rate = wav_audio(response.content)
    assert_says(whisper, audio, rate, SENTENCES)


# -- other checkpoints and deploy configs ---------------------------------------------------------------


def test_a_voice_design_upstream_is_ready_without_refused_probes(real: RealUpstreams) -> None:
    upstream = real("VoiceDesign")
    since = len(upstream.log())
    with front(upstream) as address:
        ready = httpx.get(f"http://{address}/readyz", timeout=TIMEOUT_S)
        time.sleep(1.0)  # more than one health interval would be; a probe loop would show by now
        assert ready.status_code == 200, ready.text
        # One speech request only: the word-timestamp probe, answered (refused for the missing aligner,
        # before the checkpoint's own checks) and so not repeated; it synthesized nothing.
        log = upstream.log()[since:]
        assert log.count("POST /v1/audio/speech") == 1 and "generate " not in log, log[-3000:]
        with session(address, instructions="A calm, warm voice.") as ws:
            got = stream_text(ws, "Hello there.")
    assert got.frames() and not got.messages("error"), got.messages("error")


def test_cumulative_outputs_are_not_duplicated(whisper: object, gateway: str, real: RealUpstreams) -> None:
    """With ``async_chunk: false`` vllm-omni's outputs are cumulative; each sample still arrives once."""
    with front(real("CustomVoice", async_chunk=False)) as address:
        response = speech(address, input=SENTENCES, response_format="pcm")
    reference = speech(gateway, input=SENTENCES, response_format="pcm")
    assert response.status_code == reference.status_code == 200
    audio, expected = decode(response.content, "pcm"), decode(reference.content, "pcm")
    # Piper's output differs a little run to run (its noise); a duplicated chunk would add seconds.
    assert abs(len(audio) - len(expected)) < 0.15 * len(expected), (len(audio), len(expected))
    assert_says(whisper, audio, 24000, SENTENCES)
