"""The real Cartesia clients from PyPI speak through voxgate, unchanged apart from the address and key.

The ``cartesia`` SDK (its WebSocket and ``/tts/bytes``), pipecat's ``CartesiaTTSService`` (driven as
pipecat's own tests drive a service, ``pipecat.tests.utils.run_test``) and livekit-plugins-cartesia's
``TTS``, each at its defaults (the clients' default voice id is an alias of the default voice), against a
real gateway with an API key, which each client sends its own way (``Authorization: Bearer``,
``X-API-Key``). Piper speaks where hearing is the point (Whisper checks the words); the fake engine where
it is not (a cancel, timestamps' clock).
"""

from __future__ import annotations

import asyncio
import base64
import json

import aiohttp
import pytest
from cartesia import AsyncCartesia
from cartesia.types import GenerationRequestParam, RawOutputFormatParam
from cartesia.types.websocket_client_event_param import CancelContextRequest
from livekit.plugins import cartesia as livekit_cartesia
from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame, TTSTextFrame
from pipecat.services.cartesia.tts import CartesiaTTSService
from pipecat.tests.utils import run_test
from voxgate.protocol.audio import decode

from tests.e2e.vendors import livekit_speaks, piper_gateway, tone_gateway
from tests.e2e.vendors import whisper as whisper_fixture
from tests.speech_check import word_error_rate

pytestmark = pytest.mark.slow

KEY = "cartesia-test-key"
#: livekit's default voice (Katie); pipecat's and the SDK's examples name one, none is built in.
KATIE = "f786b574-daa5-4673-aa0c-cbe3e8534c02"
SENTENCE = "The quick brown fox jumps over the lazy dog."
FIRST, SECOND = "Hello, and welcome to the voice gateway. ", "Please hold while I transfer your call."
PCM_16K: RawOutputFormatParam = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000}


gateway = piper_gateway(KEY)
tone = tone_gateway(KEY)
whisper = whisper_fixture


def sdk(address: str) -> AsyncCartesia:
    """The SDK as the issue's setup line points it at the gateway."""
    return AsyncCartesia(api_key=KEY, base_url=f"http://{address}", websocket_base_url=f"ws://{address}")


def test_sdk_websocket_streams_audio_before_the_last_text_with_monotonic_timestamps(
    gateway: str, whisper: object
) -> None:
    async def speak() -> tuple[bytes, list[float], list[str], list[str]]:
        client = sdk(gateway)
        async with client.tts.websocket_connect() as connection:
            ctx = connection.context(
                model_id="sonic-3",
                voice={"id": KATIE},
                output_format=PCM_16K,
                add_timestamps=True,
            )
            await ctx.push(FIRST, flush=True)
            audio, starts, words = bytearray(), list[float](), list[str]()
            kinds: list[str] = []
            events = ctx.receive()
            async for event in events:
                kinds.append(event.type)
                if event.type == "chunk":
                    audio += event.audio or b""
                    if len(kinds) == 1 or kinds[-2] != "chunk":
                        break  # the first audio came: only now does the rest of the text go
                elif event.type == "timestamps" and event.word_timestamps is not None:
                    starts += event.word_timestamps.start
                    words += event.word_timestamps.words
            await ctx.push(SECOND)
            await ctx.no_more_inputs()
            async for event in events:
                kinds.append(event.type)
                if event.type == "chunk":
                    audio += event.audio or b""
                elif event.type == "timestamps" and event.word_timestamps is not None:
                    starts += event.word_timestamps.start
                    words += event.word_timestamps.words
        await client.close()
        return bytes(audio), starts, words, kinds

    audio, starts, words, kinds = asyncio.run(speak())
    assert "chunk" in kinds and kinds[-1] == "done" and "flush_done" in kinds
    assert " ".join(words).split() == (FIRST + SECOND).split()
    # One clock over the whole context: the second utterance's words follow the first's.
    assert starts == sorted(starts) and starts[-1] < len(audio) / 2 / 16000
    error, heard = word_error_rate(whisper, decode(audio, "pcm"), 16000, FIRST + SECOND)
    assert error < 0.15, heard


def test_sdk_bytes_is_intelligible(gateway: str, whisper: object) -> None:
    async def speak() -> bytes:
        client = sdk(gateway)
        answer = await client.tts.generate(
            model_id="sonic-3", transcript=SENTENCE, voice=KATIE, output_format=PCM_16K, language="en"
        )
        data = await answer.read()
        await client.close()
        return data

    error, heard = word_error_rate(whisper, decode(asyncio.run(speak()), "pcm"), 16000, SENTENCE)
    assert error < 0.25, heard


def test_sdk_sse_and_an_unknown_voice(tone: str) -> None:
    async def speak() -> tuple[list[str], int, str]:
        client = sdk(tone)
        stream = await client.tts.generate_sse(
            model_id="sonic-3", transcript="Hi there.", voice=KATIE, output_format=PCM_16K, context_id="sse-1"
        )
        kinds: list[str] = [event.type async for event in stream]
        async with aiohttp.ClientSession() as http:
            body = {
                "transcript": "Hi.",
                "voice": {"mode": "id", "id": "no-such-voice"},
                "model_id": "sonic-3",
            }
            async with http.post(
                f"http://{tone}/tts/bytes", json=body, headers={"X-API-Key": KEY}
            ) as refused:
                status, error = refused.status, (await refused.json())["message"]
        await client.close()
        return kinds, status, error

    kinds, status, error = asyncio.run(speak())
    assert kinds[0] == "chunk" and kinds[-1] == "done"
    assert (
        status == 400 and "no-such-voice" in error and "'tone'" in error and "VOXGATE_VOICE_ALIASES" in error
    )


def request(context: str, transcript: str) -> GenerationRequestParam:
    """A whole context in one message (its input ends with it), as the SDK's one-shot sends it."""
    return {
        "context_id": context,
        "model_id": "sonic-3",
        "voice": KATIE,
        "output_format": PCM_16K,
        "transcript": transcript,
        "continue": False,
    }


def test_sdk_cancel_stops_a_context_and_the_socket_goes_on(tone: str) -> None:
    """After ``{"context_id", "cancel": true}`` no audio of that context comes, and the same socket
    speaks the next context to its end."""

    async def run() -> tuple[int, list[tuple[str, str]], int]:
        client = sdk(tone)
        seen: list[tuple[str, str]] = []
        async with client.tts.websocket_connect() as connection:
            long_text = "This sentence goes on and on. " * 8  # 14 s of tone
            await connection.send(request("long", long_text))
            long_audio = 0
            while True:
                event = json.loads(await connection.recv_bytes())
                if event["type"] == "chunk":
                    long_audio += len(base64.b64decode(event["data"]))
                    break
            cancel: CancelContextRequest = {"context_id": "long", "cancel": True}
            await connection.send(cancel)
            await connection.send(request("next", "Short."))
            next_audio = 0
            while True:
                event = json.loads(await connection.recv_bytes())
                seen.append((event["type"], event["context_id"]))
                if event["context_id"] == "long" and event["type"] == "chunk":
                    long_audio += len(base64.b64decode(event["data"]))
                if event["context_id"] == "next" and event["type"] == "chunk":
                    next_audio += len(base64.b64decode(event["data"]))
                if event == {"type": "done", "context_id": "next", "done": True, "status_code": 200}:
                    break
        await client.close()
        return long_audio, seen, next_audio

    long_audio, seen, next_audio = asyncio.run(run())
    first_next = seen.index(("chunk", "next"))
    assert ("chunk", "long") not in seen[first_next:]  # nothing of the cancelled context after the next one
    assert ("done", "long") not in seen  # a cancelled context has no done
    assert long_audio < 2 * 16000 * 14 / 2  # cut well before its end
    assert next_audio == 2 * round(16000 * len("Short.") * 0.06)  # the next context whole


def test_pipecat_service_speaks_with_word_timestamps(gateway: str, whisper: object) -> None:
    tts = CartesiaTTSService(api_key=KEY, url=f"ws://{gateway}/tts/websocket")
    down, _ = asyncio.run(run_test(tts, frames_to_send=[TTSSpeakFrame(SENTENCE)]))
    audio = b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame))
    assert len(audio) > 2 * 24000 * 1.5
    words = [f for f in down if isinstance(f, TTSTextFrame)]
    assert " ".join(f.text for f in words).split() == SENTENCE.split()
    assert len(words) > 1  # word by word, from the timestamps
    times = [f.pts for f in words if f.pts is not None]
    assert times == sorted(times)
    error, heard = word_error_rate(whisper, decode(audio, "pcm"), 24000, SENTENCE)
    assert error < 0.25, heard


def test_livekit_plugin_streams_and_synthesizes(gateway: str, whisper: object) -> None:
    def make(http: aiohttp.ClientSession) -> livekit_cartesia.TTS:
        return livekit_cartesia.TTS(api_key=KEY, base_url=f"http://{gateway}", http_session=http)

    streamed, whole, rate = asyncio.run(livekit_speaks(make, SENTENCE))
    assert rate == 24000
    for audio in (streamed, whole):
        error, heard = word_error_rate(whisper, decode(audio, "pcm"), 24000, SENTENCE)
        assert error < 0.25, heard
