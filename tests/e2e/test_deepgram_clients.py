"""The real Deepgram Aura clients from PyPI speak through voxgate, unchanged apart from the address and key.

The ``deepgram-sdk`` (its WebSocket and REST), pipecat's ``DeepgramTTSService`` (driven as pipecat's own
tests drive a service, ``pipecat.tests.utils.run_test``) and livekit-plugins-deepgram's ``TTS``, each at its
defaults (their default models are aliases of the default voice; the SDK sends no model at all), against a
real gateway with an API key sent as ``Authorization: Token``. Piper speaks where hearing is the point
(Whisper checks the words); the fake engine where it is not (a Clear, Warnings).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from deepgram import AsyncDeepgramClient
from deepgram.core.api_error import ApiError
from deepgram.environment import DeepgramClientEnvironment
from deepgram.speak.v1.types import SpeakV1Clear, SpeakV1Close, SpeakV1Flush, SpeakV1Text
from livekit.plugins import deepgram as livekit_deepgram
from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame
from pipecat.services.deepgram.tts import DeepgramTTSService
from pipecat.tests.utils import run_test
from voxgate.engine.fake import SECONDS_PER_CHAR
from voxgate.protocol.audio import decode
from websockets.exceptions import InvalidStatus

from tests.decoding import decoded
from tests.e2e.vendors import livekit_speaks, piper_gateway, tone_gateway
from tests.e2e.vendors import whisper as whisper_fixture
from tests.speech_check import word_error_rate

pytestmark = pytest.mark.slow

KEY = "deepgram-test-key"
SENTENCE = "The quick brown fox jumps over the lazy dog."
FIRST, SECOND = "Hello, and welcome to the voice gateway. ", "Please hold while I transfer your call."


gateway = piper_gateway(KEY)
tone = tone_gateway(KEY)
whisper = whisper_fixture


def sdk(address: str) -> AsyncDeepgramClient:
    """The SDK as the issue's setup line points it at the gateway."""
    environment = DeepgramClientEnvironment(
        base=f"http://{address}",
        production=f"ws://{address}",
        agent=f"ws://{address}",
        agent_rest=f"http://{address}",
    )
    return AsyncDeepgramClient(api_key=KEY, environment=environment)


def test_sdk_websocket_speaks_before_the_flush(gateway: str, whisper: object) -> None:
    """Metadata first; audio of the first sentence comes before the last text and its Flush; Flushed after
    the audio; Close ends the socket once the audio is out."""

    async def speak() -> tuple[list[str], bytes]:
        kinds: list[str] = []
        audio = bytearray()
        async with sdk(gateway).speak.v1.connect() as socket:
            await socket.send_text(SpeakV1Text(type="Speak", text=FIRST))
            while not audio:  # no Flush yet: the segmenter cuts the first sentence by itself
                message = await socket.recv()
                if isinstance(message, bytes):
                    audio += message
                else:
                    kinds.append(message.type)
            await socket.send_text(SpeakV1Text(type="Speak", text=SECOND))
            await socket.send_flush(SpeakV1Flush(type="Flush"))
            while True:
                message = await socket.recv()
                if isinstance(message, bytes):
                    audio += message
                    continue
                kinds.append(message.type)
                if message.type == "Flushed":
                    break
            await socket.send_close(SpeakV1Close(type="Close"))
        return kinds, bytes(audio)

    kinds, audio = asyncio.run(speak())
    assert kinds == ["Metadata", "Flushed"]
    error, heard = word_error_rate(whisper, decode(audio, "pcm"), 24000, FIRST + SECOND)
    assert error < 0.15, heard


def test_sdk_rest_default_is_mp3(gateway: str, whisper: object) -> None:
    async def speak() -> bytes:
        client = sdk(gateway)
        audio = b"".join([piece async for piece in client.speak.v1.audio.generate(text=SENTENCE)])
        await client._client_wrapper.httpx_client.httpx_client.aclose()  # the SDK never closes its own
        return audio

    audio, rate = decoded(asyncio.run(speak()))
    assert rate == 22050
    error, heard = word_error_rate(whisper, audio, rate, SENTENCE)
    assert error < 0.25, heard


def test_sdk_clear_stops_the_audio_and_the_socket_goes_on(tone: str) -> None:
    """``Clear`` is answered by ``Cleared``; no audio of what was cleared follows it, and the same socket
    speaks the next text whole."""

    async def run() -> tuple[int, int, list[str]]:
        kinds: list[str] = []
        async with sdk(tone).speak.v1.connect(sample_rate=16000) as socket:
            await socket.send_text(SpeakV1Text(type="Speak", text="This sentence goes on and on. " * 8))
            await socket.send_flush(SpeakV1Flush(type="Flush"))
            before = 0
            while not before:
                message = await socket.recv()
                if isinstance(message, bytes):
                    before += len(message)
            await socket.send_clear(SpeakV1Clear(type="Clear"))
            while True:
                message = await socket.recv()
                if isinstance(message, bytes):
                    before += len(message)  # sent before the Clear was taken
                elif message.type == "Cleared":
                    break
            await socket.send_text(SpeakV1Text(type="Speak", text="Short."))
            await socket.send_flush(SpeakV1Flush(type="Flush"))
            after = 0
            while True:
                message = await socket.recv()
                if isinstance(message, bytes):
                    after += len(message)
                    continue
                kinds.append(message.type)
                if message.type == "Flushed":
                    break
        return before, after, kinds

    before, after, kinds = asyncio.run(run())
    assert before < 2 * 16000 * 14 / 2  # cut well before the end of its 14 s
    assert after == 2 * round(16000 * len("Short.") * SECONDS_PER_CHAR)  # only the new text, whole
    assert kinds == ["Flushed"]


def test_bad_messages_are_warnings_and_bad_queries_are_refused(tone: str) -> None:
    async def run() -> tuple[list[dict[str, Any]], int, int, dict[str, Any]]:
        socket_url = f"ws://{tone}/v1/speak?mip_opt_out=true"
        headers = {"Authorization": f"Token {KEY}"}
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(socket_url, headers=headers) as ws:
                warnings: list[dict[str, Any]] = []
                await ws.send_str('{"type": "Shout", "text": "hi"}')
                await ws.send_str("not json")
                await ws.send_str(json.dumps({"type": "Speak", "text": "Hi."}))
                await ws.send_str(json.dumps({"type": "Flush"}))
                while True:
                    message = await ws.receive()
                    if message.type == aiohttp.WSMsgType.TEXT:
                        data = json.loads(message.data)
                        if data["type"] == "Warning":
                            warnings.append(data)
                        if data["type"] == "Flushed":
                            break
                await ws.send_str(json.dumps({"type": "Close"}))
                closed = await ws.receive()
                close_code = ws.close_code or 0
                assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            async with http.post(
                f"http://{tone}/v1/speak?model=aura-luna-en", json={"text": "Hi."}, headers=headers
            ) as refused:
                status, body = refused.status, await refused.json()
        return warnings, close_code, status, body

    warnings, close_code, status, body = asyncio.run(run())
    assert [w["code"] for w in warnings] == ["unknown_type", "invalid_json"]
    assert close_code == 1000
    assert status == 400 and body["err_code"] == "VOICE_NOT_FOUND"
    assert "aura-luna-en" in body["err_msg"] and "'tone'" in body["err_msg"]

    async def handshake() -> None:
        async with sdk(tone).speak.v1.connect(model="aura-luna-en"):
            pass

    with pytest.raises((InvalidStatus, ApiError)) as refused_socket:
        asyncio.run(handshake())
    assert "400" in str(refused_socket.value)


def test_pipecat_service_speaks(gateway: str, whisper: object) -> None:
    tts = DeepgramTTSService(api_key=KEY, base_url=f"ws://{gateway}")
    down, _ = asyncio.run(run_test(tts, frames_to_send=[TTSSpeakFrame(SENTENCE)]))
    audio = b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame))
    assert len(audio) > 2 * 24000 * 1.5
    error, heard = word_error_rate(whisper, decode(audio, "pcm"), 24000, SENTENCE)
    assert error < 0.25, heard


def test_livekit_plugin_streams_and_synthesizes(gateway: str, whisper: object) -> None:
    def make(http: aiohttp.ClientSession) -> livekit_deepgram.TTS:
        return livekit_deepgram.TTS(api_key=KEY, base_url=f"http://{gateway}/v1/speak", http_session=http)

    streamed, whole, rate = asyncio.run(livekit_speaks(make, SENTENCE))
    assert rate == 24000
    for audio in (streamed, whole):
        error, heard = word_error_rate(whisper, decode(audio, "pcm"), 24000, SENTENCE)
        assert error < 0.25, heard
