"""The real OpenAI clients against the gateway's /v1/audio/speech, with the real Piper engine.

The OpenAI Python SDK, and livekit's OpenAI TTS plugin (livekit-plugins-openai 1.8.9) with the settings its
users leave at default: mp3, and for ``gpt-4o-mini-tts`` SSE (``stream_format: "sse"``). Whisper checks that
what comes back is the text.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx2
import numpy as np
import openai
import pytest
import soundfile
from livekit.agents import tts as livekit_tts
from livekit.plugins import openai as livekit_openai
from voxgate.protocol.audio import decode

from tests.decoding import decoded
from tests.speech_check import load_whisper, word_error_rate

pytestmark = pytest.mark.slow

TEXT = "Thanks for calling. Your order has shipped and will arrive on Friday."


def client(address: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{address}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def whisper() -> object:
    return load_whisper()


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


def test_streaming_default_format_is_mp3(piper_gateway: str, whisper: object) -> None:
    with (
        client(piper_gateway) as sdk,
        sdk.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input=TEXT) as response,
    ):
        assert response.headers["content-type"] == "audio/mpeg"  # the SDK sent no response_format
        chunks = [c for c in response.iter_bytes() if c]
    assert len(chunks) >= 2  # encoded and sent as it is made, not in one piece
    audio, rate = decoded(b"".join(chunks))
    assert rate == 24000 and 3.0 < len(audio) / rate < 8.0
    error, heard = word_error_rate(whisper, audio, rate, TEXT)
    assert error < 0.25, heard


@dataclass
class _Exchange:
    """One request of the plugin's own HTTP client, and the body of its answer piece by piece."""

    body: dict[str, object]
    content_type: str
    pieces: list[bytes] = field(default_factory=list)

    def events(self) -> list[dict[str, object]]:
        lines = b"".join(self.pieces).decode().splitlines()
        return [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]


class _Recorded(httpx2.AsyncByteStream):
    """A response body that keeps each piece as it passes on to the client."""

    def __init__(self, body: httpx2.AsyncByteStream, pieces: list[bytes]) -> None:
        self._body, self._pieces = body, pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in self._body:
            self._pieces.append(piece)
            yield piece

    async def aclose(self) -> None:
        await self._body.aclose()


def test_livekit_plugin_defaults_stream_mp3_over_sse(piper_gateway: str, whisper: object) -> None:
    exchanges: list[_Exchange] = []

    async def record(response: httpx2.Response) -> None:
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        exchange = _Exchange(json.loads(response.request.content), response.headers["content-type"])
        exchanges.append(exchange)
        response.stream = _Recorded(response.stream, exchange.pieces)

    async def speak() -> tuple[bytes, int, int]:
        plugin = livekit_openai.TTS(base_url=f"http://{piper_gateway}/v1", api_key="unused")
        plugin._client._client.event_hooks["response"].append(record)  # watch the plugin's own client
        # The plugin cannot stream text in; an agent wraps it in a StreamAdapter, as here.
        assert not plugin.capabilities.streaming
        tts = livekit_tts.StreamAdapter(tts=plugin)
        stream = tts.stream()
        for start in range(0, len(TEXT), 5):  # as an LLM streams it
            stream.push_text(TEXT[start : start + 5])
        stream.end_input()
        audio, rate, frames = bytearray(), 0, 0
        async for event in stream:
            audio += event.frame.data.tobytes()
            rate = event.frame.sample_rate
            frames += 1
        await stream.aclose()
        await tts.aclose()
        await plugin.aclose()
        return bytes(audio), rate, frames

    audio, rate, frames = asyncio.run(speak())
    assert exchanges, "the plugin sent no request"
    for exchange in exchanges:
        # What the plugin sends by default: mp3 over SSE, its model and voice.
        assert {k: exchange.body[k] for k in ("model", "voice", "response_format", "stream_format")} == {
            "model": "gpt-4o-mini-tts",
            "voice": "ash",
            "response_format": "mp3",
            "stream_format": "sse",
        }
        assert exchange.content_type.startswith("text/event-stream")
        events = exchange.events()
        assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
        assert events[-1]["type"] == "speech.audio.done"
    # The deltas carry one mp3 stream a request, decodable on its own.
    deltas = [[base64.b64decode(str(e["audio"])) for e in x.events()[:-1]] for x in exchanges]
    assert sum(len(d) for d in deltas) >= 2  # sent as it is made, not in one piece
    wire_s = 0.0
    for delta in deltas:
        samples, wire_rate = decoded(b"".join(delta))
        assert wire_rate == 24000
        wire_s += len(samples) / wire_rate
    assert rate == 24000 and frames > 1
    speech = decode(audio, "pcm")
    assert 3.0 < len(speech) / rate < 8.0
    assert len(speech) / rate == pytest.approx(wire_s, abs=0.1)  # the plugin played all that came
    error, heard = word_error_rate(whisper, speech, rate, TEXT)
    assert error < 0.25, heard
