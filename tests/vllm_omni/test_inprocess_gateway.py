"""The whole gateway on the in-process engine (``--engine vllm-omni``), over vllm-omni 0.30.0's own request
building.

tests/vllm_omni/inprocess_gateway.py runs ``voxgate.cli.serve`` in the vllm-omni env with the engine of
engine/vllm_omni.py, whose ``AsyncOmni`` is server.py's CPU engine client (the one stand-in: a GPU cannot
run here). Every request is built by vllm-omni's own speech serving code in the gateway's process; the
client logs each ``generate`` and ``abort`` in the gateway's log. test_inprocess_engine.py compares the
requests field by field; here a real WebSocket client and a real HTTP client go through uvicorn, the
session core and the pump to that engine, and Whisper checks the words.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import openai
import pytest
from voxgate.protocol.audio import decode
from websockets.sync.client import connect

from tests.conftest import TIMEOUT_S, recv, recv_until, send, session
from tests.decoding import decoded
from tests.speech_check import load_whisper
from tests.vllm_omni.test_remote_real import SENTENCES, assert_says, stream_text, wait_for_log, wav_audio
from tests.vllm_omni.upstream import RealUpstream, inprocess_gateway

pytestmark = pytest.mark.slow

URL = "/v1/audio/speech/stream"
LONG = " ".join(["This sentence keeps the engine busy for a while, so that a stop comes in the middle."] * 4)


@pytest.fixture(scope="module")
def gateway() -> Iterator[RealUpstream]:
    with inprocess_gateway("CustomVoice") as running:
        yield running


@pytest.fixture(scope="module")
def whisper() -> object:
    return load_whisper()


def address(gateway: RealUpstream) -> str:
    return gateway.url.removeprefix("http://")


def test_a_session_speaks_through_vllm_omnis_request_building(gateway: RealUpstream, whisper: object) -> None:
    since = len(gateway.log())
    with session(address(gateway), voice="vivian", response_format="pcm") as ws:
        got = stream_text(ws, SENTENCES)
    assert not got.messages("error") and not any(m["error"] for m in got.messages("audio.done"))
    starts = got.messages("audio.start")
    assert len(starts) >= 2 and all(m["sample_rate"] == 24000 for m in starts)
    assert_says(whisper, decode(b"".join(got.frames()), "pcm"), 24000, SENTENCES)
    # One engine request per segment, each prepared by vllm-omni's serving code for the voice asked for.
    requests = re.findall(r"generate (voxgate-[0-9a-f]+):", gateway.log()[since:])  # logged before its audio
    assert len(requests) == len(starts)
    assert "TTS speech request" in gateway.log()[since:]


def test_a_cancel_aborts_the_engine_request(gateway: RealUpstream) -> None:
    since = len(gateway.log())
    with session(address(gateway), eager_first_segment=False) as ws:
        send(ws, type="input.text", text=LONG)
        while not isinstance(recv(ws, timeout=120), bytes):
            pass
        send(ws, type="input.cancel")
        got = recv_until(ws, "audio.cancelled", timeout=TIMEOUT_S)
        assert got.messages("audio.cancelled")
        # The session goes on: the next utterance is spoken.
        send(ws, type="input.text", text="Still here.")
        send(ws, type="input.done")
        after = recv_until(ws, "session.done", timeout=120)
    assert after.frames() and not after.messages("error")
    (started,) = re.findall(r"generate (voxgate-[0-9a-f]+):", gateway.log()[since:])[:1]
    wait_for_log(gateway, rf"abort {started}\b", since)


def test_a_disconnect_aborts_the_engine_request(gateway: RealUpstream) -> None:
    since = len(gateway.log())
    with connect(f"ws://{address(gateway)}{URL}", max_size=None) as ws:  # vllm-omni's dialect
        send(ws, type="session.config", eager_first_segment=False)
        send(ws, type="input.text", text=LONG)
        while not isinstance(recv(ws, timeout=120), bytes):
            pass
    wait_for_log(gateway, r"abort voxgate-[0-9a-f]+", since)


def test_the_openai_route_speaks_on_the_same_engine(gateway: RealUpstream, whisper: object) -> None:
    text = "Please hold while I transfer your call."
    response = httpx.post(
        f"{gateway.url}/v1/audio/speech",
        json={"model": "tts-1", "voice": "vivian", "input": text, "response_format": "wav"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    audio, rate = wav_audio(response.content)
    assert rate == 24000
    assert_says(whisper, audio, rate, text)


def test_the_openai_sdk_streams_its_default_mp3_from_the_same_engine(
    gateway: RealUpstream, whisper: object
) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    sdk = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    with (
        sdk,
        sdk.audio.speech.with_streaming_response.create(
            model="tts-1", voice="vivian", input=text
        ) as response,
    ):
        assert response.headers["content-type"] == "audio/mpeg"  # the SDK sent no response_format
        chunks = [c for c in response.iter_bytes() if c]
    audio, rate = decoded(b"".join(chunks))
    assert rate == 24000
    assert_says(whisper, audio, rate, text)
