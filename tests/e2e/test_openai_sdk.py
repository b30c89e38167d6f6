"""The real OpenAI Python SDK against the gateway's /v1/audio/speech, with the real Piper engine."""

from __future__ import annotations

import io

import numpy as np
import openai
import pytest
import soundfile

pytestmark = pytest.mark.slow

TEXT = "Thanks for calling. Your order has shipped and will arrive on Friday."


def client(address: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{address}/v1", api_key="unused", max_retries=0)


def test_create_wav_with_openai_names(piper_gateway: str) -> None:
    with client(piper_gateway) as sdk:
        response = sdk.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="wav")
    data, rate = soundfile.read(io.BytesIO(response.content), dtype="float32")
    assert rate == 24000 and 3.0 < len(data) / rate < 8.0
    assert np.sqrt(np.mean(data**2)) > 0.02  # speech, not silence


def test_streaming_pcm_arrives_in_several_chunks(piper_gateway: str) -> None:
    with (
        client(piper_gateway) as sdk,
        sdk.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="coral", input=TEXT, response_format="pcm"
        ) as response,
    ):
        assert response.headers["content-type"] == "audio/pcm"
        chunks = [c for c in response.iter_bytes() if c]
    audio = b"".join(chunks)
    assert len(chunks) >= 2  # segments are sent as they are made, not in one piece
    assert 3.0 < len(audio) / 2 / 24000 < 8.0


def test_sdk_sees_client_errors_as_4xx(piper_gateway: str) -> None:
    with client(piper_gateway) as sdk, pytest.raises(openai.BadRequestError) as error:
        sdk.audio.speech.create(model="tts-1", voice="nobody", input=TEXT)
    assert error.value.status_code == 400 and "nobody" in str(error.value)


def test_sdk_instructions_piper_cannot_follow_are_ignored(piper_gateway: str) -> None:
    with client(piper_gateway) as sdk:
        audio = sdk.audio.speech.create(
            model="tts-1",
            voice="alloy",
            input=TEXT,
            instructions="Speak like a pirate",
            response_format="pcm",
        ).content
    assert len(audio) / 2 / 24000 > 1.0
