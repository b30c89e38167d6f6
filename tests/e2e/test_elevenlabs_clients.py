"""The real ElevenLabs clients from PyPI speak through voxgate, unchanged apart from the address.

pipecat's ``ElevenLabsTTSService`` (driven as pipecat's own tests drive a service, with
``pipecat.tests.utils.run_test``), livekit-plugins-elevenlabs' ``TTS`` and the ``elevenlabs`` SDK, against a
real gateway with the Piper engine and an API key, which each client sends its own way (``xi-api-key``).
Each is set up by the code docs/agents.md shows (the blocks marked ``test:``). The SDK is also run with its
default format (mp3_44100_128), streamed and through its realtime helper (behind TLS: it always uses wss://).
pipecat's service has no compressed format: it asks for ``pcm_<rate>`` of its pipeline's rate (24 kHz by
default). Whisper checks that what comes back is the text.
"""

from __future__ import annotations

import asyncio
import base64
import io
import re
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import pytest
import soundfile
from elevenlabs.client import ElevenLabs
from livekit.plugins import elevenlabs as livekit_elevenlabs
from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame, TTSTextFrame
from pipecat.services.elevenlabs.tts import ElevenLabsTTSService
from pipecat.tests.utils import run_test
from voxgate.gateway.app import create_app
from voxgate.gateway.settings import Settings
from voxgate.protocol.audio import decode

from tests.conftest import TIMEOUT_S, self_signed_certificate, serve, serve_engine
from tests.decoding import decoded
from tests.speech_check import load_whisper, word_error_rate

pytestmark = pytest.mark.slow

KEY = "eleven-test-key"
SENTENCE = "The quick brown fox jumps over the lazy dog."
# Two sentences: REST sends mp3 one whole file a sentence, so a single one would come in one piece.
SENTENCES = "Hello, and welcome to the voice gateway. Please hold while I transfer your call."
DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    """A gateway with the Piper engine that needs an API key."""
    with serve_engine(None, engine="piper", piper_workers=1, api_keys=KEY) as address:
        yield address


@pytest.fixture(scope="module")
def whisper() -> object:
    return load_whisper()


@pytest.fixture
def client(gateway: str) -> Iterator[ElevenLabs]:
    """The SDK pointed at the gateway (with an HTTP client the test closes; the SDK's own is never closed)."""
    with httpx.Client(timeout=TIMEOUT_S) as http:
        yield ElevenLabs(base_url=f"http://{gateway}", api_key=KEY, httpx_client=http)


def _doc_code(name: str, address: str) -> dict[str, Any]:
    """Run the block of docs/agents.md marked ``<!-- test: name -->`` against ``address``; its names."""
    found = re.search(rf"<!-- test: {name} -->\n```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert found, f"docs/agents.md has no block marked test: {name}"
    code = found[1].replace("127.0.0.1:8000", address).replace("your-voxgate-key", KEY)
    names: dict[str, Any] = {}
    exec(compile(code, f"docs/agents.md ({name})", "exec"), names)
    return names


def _pcm(data: bytes) -> np.ndarray:
    return decode(data, "pcm")


def _words(text: str) -> list[str]:
    return text.split()


def test_pipecat_service_speaks_with_word_timestamps(gateway: str, whisper: object) -> None:
    tts = _doc_code("pipecat", gateway)["tts"]
    assert isinstance(tts, ElevenLabsTTSService)
    down, _ = asyncio.run(run_test(tts, frames_to_send=[TTSSpeakFrame(SENTENCE)]))
    audio = b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame))
    assert len(audio) > 2 * 24000 * 1.5  # more than 1.5 s of speech
    # Word timestamps: pipecat turns the character alignment into one TTSTextFrame per word, with
    # presentation times that follow the audio.
    words = [f for f in down if isinstance(f, TTSTextFrame)]
    assert [f.text for f in words] == _words(SENTENCE)
    times = [f.pts for f in words if f.pts is not None]
    assert len(times) == len(words)
    assert times == sorted(times) and len(set(times)) == len(times)
    spread_ns = times[-1] - times[0]
    duration_ns = len(audio) / 2 / 24000 * 1e9
    assert 0.5 * duration_ns < spread_ns < duration_ns
    error, heard = word_error_rate(whisper, _pcm(audio), 24000, SENTENCE)
    assert error < 0.25, heard


def test_livekit_plugin_streams_audio(gateway: str, whisper: object) -> None:
    async def speak() -> tuple[bytes, int]:
        async with aiohttp.ClientSession() as http:
            tts = _doc_code("livekit", gateway)["voxgate_tts"](http)
            assert isinstance(tts, livekit_elevenlabs.TTS)
            stream = tts.stream()
            for start in range(0, len(SENTENCE), 5):  # as an LLM streams it
                stream.push_text(SENTENCE[start : start + 5])
            stream.end_input()
            audio, rate = bytearray(), 0
            async for event in stream:
                audio += event.frame.data.tobytes()
                rate = event.frame.sample_rate
            await stream.aclose()
            voices = await tts.list_voices()
            await tts.aclose()
            assert "joe" in [v.id for v in voices]
            return bytes(audio), rate

    audio, rate = asyncio.run(speak())
    assert rate == 24000
    assert len(audio) > 2 * 24000 * 1.5
    error, heard = word_error_rate(whisper, _pcm(audio), 24000, SENTENCE)
    assert error < 0.25, heard


def test_sdk_as_documented(gateway: str, whisper: object) -> None:
    names = _doc_code("sdk", gateway)
    names["client"]._client_wrapper.httpx_client.httpx_client.close()  # the SDK never closes its own
    error, heard = word_error_rate(
        whisper, _pcm(names["audio"]), 16000, "Hello, and welcome to the voice gateway."
    )
    assert error < 0.15, heard


def test_sdk_convert_is_intelligible(client: ElevenLabs, whisper: object) -> None:
    sentences = "Hello, and welcome to the voice gateway. Please hold while I transfer your call."
    audio = b"".join(
        client.text_to_speech.convert(
            "joe", text=sentences, output_format="pcm_16000", model_id="eleven_flash_v2_5", seed=7
        )
    )
    error, heard = word_error_rate(whisper, _pcm(audio), 16000, sentences)
    assert error < 0.15, heard


def test_sdk_default_format_is_mp3(client: ElevenLabs, whisper: object) -> None:
    answer = b"".join(client.text_to_speech.convert("joe", text=SENTENCE, seed=7))  # mp3_44100_128
    audio, rate = soundfile.read(io.BytesIO(answer), dtype="float32")
    assert rate == 44100
    error, heard = word_error_rate(whisper, audio, rate, SENTENCE)
    assert error < 0.25, heard


def test_sdk_stream_in_telephony_format(client: ElevenLabs, whisper: object) -> None:
    chunks = list(client.text_to_speech.stream("joe", text=SENTENCE, output_format="ulaw_8000", seed=7))
    audio = decode(b"".join(chunks), "mulaw").astype(np.float32)
    assert len(audio) > 8000 * 1.5
    error, heard = word_error_rate(whisper, audio, 8000, SENTENCE)
    assert error < 0.25, heard


def test_sdk_timestamps_cover_the_audio(client: ElevenLabs) -> None:
    text = "Good morning. See you soon."
    whole = client.text_to_speech.convert_with_timestamps("joe", text=text, output_format="pcm_24000", seed=7)
    audio = base64.b64decode(whole.audio_base_64)
    alignment = whole.alignment
    assert alignment is not None
    assert "".join(alignment.characters).split() == text.split()
    starts, ends = alignment.character_start_times_seconds, alignment.character_end_times_seconds
    assert starts == sorted(starts) and ends == sorted(ends)
    assert ends[-1] == pytest.approx(len(audio) / 2 / 24000, abs=0.002)

    streamed = list(
        client.text_to_speech.stream_with_timestamps("joe", text=text, output_format="pcm_24000", seed=7)
    )
    assert len(streamed) == 2  # one chunk a sentence, each with its characters
    assert [re.sub(r"\s", "", "".join(c.alignment.characters)) for c in streamed if c.alignment] == [
        "Goodmorning.",
        "Seeyousoon.",
    ]
    offsets = [c.alignment.character_start_times_seconds[0] for c in streamed if c.alignment]
    first = base64.b64decode(streamed[0].audio_base_64 or "")
    # Times run from the start of the response: the second sentence's first word starts after the first
    # sentence's audio (Piper's words start after its short leading silence).
    first_s = len(first) / 2 / 24000
    assert 0.0 <= offsets[0] < 0.2 and first_s <= offsets[1] < first_s + 0.2
    # Piper times its words, and the characters follow them: a long word lasts longer than a short one.
    durations = [e - s for s, e in zip(starts, ends, strict=True)]
    assert len({round(d, 3) for d in durations[: len("Good morning. ")]}) > 2  # spread: at most 2


@dataclass
class _Exchange:
    """One request of the SDK's HTTP client, and the body of its answer as the network gave it."""

    url: httpx.URL
    content_type: str
    pieces: list[bytes] = field(default_factory=list)


class _Recorded(httpx.SyncByteStream):
    """A response body that keeps each piece as it passes on to the client (the SDK re-cuts the body into
    1024-byte chunks, so its own chunks say nothing about how the audio came)."""

    def __init__(self, body: httpx.SyncByteStream, pieces: list[bytes]) -> None:
        self._body, self._pieces = body, pieces

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._body:
            self._pieces.append(piece)
            yield piece

    def close(self) -> None:
        self._body.close()


def test_sdk_stream_default_format_is_mp3(gateway: str, whisper: object) -> None:
    exchanges: list[_Exchange] = []

    def record(response: httpx.Response) -> None:
        assert isinstance(response.stream, httpx.SyncByteStream)
        exchanges.append(_Exchange(response.request.url, response.headers["content-type"]))
        response.stream = _Recorded(response.stream, exchanges[-1].pieces)

    with httpx.Client(timeout=TIMEOUT_S, event_hooks={"response": [record]}) as http:
        client = ElevenLabs(base_url=f"http://{gateway}", api_key=KEY, httpx_client=http)
        answer = b"".join(client.text_to_speech.stream("joe", text=SENTENCES, seed=7))  # mp3_44100_128
    [exchange] = exchanges
    assert exchange.url.path == "/v1/text-to-speech/joe/stream"
    assert "output_format" not in exchange.url.params  # the SDK's default is the server's: mp3_44100_128
    assert exchange.content_type == "audio/mpeg"
    assert len([p for p in exchange.pieces if p]) >= 2  # each sentence sent as it is made
    assert b"".join(exchange.pieces) == answer
    audio, rate = decoded(answer)
    assert rate == 44100 and 2.5 < len(audio) / rate < 8.0
    error, heard = word_error_rate(whisper, audio, rate, SENTENCES)
    assert error < 0.15, heard


@pytest.fixture(scope="module")
def tls_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The Piper gateway behind TLS with a self-signed certificate for 127.0.0.1 (the SDK's realtime helper
    always connects with wss://); yields its address and the certificate."""
    cert, key = self_signed_certificate(tmp_path_factory.mktemp("tls"))
    with tempfile.TemporaryDirectory(prefix="voxgate-voices-") as voices:
        settings = Settings.from_env({}, engine="piper", piper_workers=1, api_keys=KEY, voices_dir=voices)
        # uvicorn's default WebSocket protocol: voxgate serve does not terminate TLS (docs/deploy.md: a proxy
        # does), so its own protocol never runs under TLS.
        with serve(create_app(settings), ws="auto", ssl_certfile=str(cert), ssl_keyfile=str(key)) as address:
            yield address, cert


# The SDK reads ConnectionClosed.code, which websockets 14+ deprecates, when the server closes normally.
@pytest.mark.filterwarnings("ignore:ConnectionClosed.code is deprecated:DeprecationWarning")
def test_sdk_realtime_default_format_is_mp3(
    tls_gateway: tuple[str, Path], whisper: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    address, cert = tls_gateway
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trust the test certificate, as a deployment's CA
    tokens = iter(
        ["Hello, and wel", "come to the voice", " gateway. Please hold while", " I transfer your call."]
    )
    with httpx.Client(verify=ssl.create_default_context(cafile=str(cert)), timeout=TIMEOUT_S) as http:
        client = ElevenLabs(base_url=f"https://{address}", api_key=KEY, httpx_client=http)
        chunks = list(client.text_to_speech.convert_realtime("joe", text=tokens))  # mp3_44100_128
    assert len([c for c in chunks if c]) >= 2  # each sentence sent as it is made
    audio, rate = decoded(b"".join(chunks))
    assert rate == 44100 and 2.5 < len(audio) / rate < 8.0
    error, heard = word_error_rate(whisper, audio, rate, SENTENCES)
    assert error < 0.15, heard
