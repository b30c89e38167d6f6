"""The gateways the Cartesia and Deepgram clients' tests speak to (``test_cartesia_clients``,
``test_deepgram_clients``), as module fixtures: Piper where hearing is the point, the fake engine's tone where
it is not. Each needs the module's API key."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import pytest
from livekit.agents import tts
from voxgate.engine.fake import FakeEngine

from tests.conftest import serve_engine
from tests.speech_check import load_whisper

#: A module fixture that yields a gateway's address.
Gateway = Callable[[], Iterator[str]]


def piper_gateway(key: str) -> Gateway:
    """A fixture: a gateway with the Piper engine that needs ``key``."""

    def gateway() -> Iterator[str]:
        with serve_engine(None, engine="piper", piper_workers=1, api_keys=key) as address:
            yield address

    return pytest.fixture(scope="module", name="gateway")(gateway)


def tone_gateway(key: str) -> Gateway:
    """A fixture: a gateway with the fake engine (a tone, 60 ms a character, in 0.1 s chunks) that needs
    ``key``."""

    def tone() -> Iterator[str]:
        with serve_engine(FakeEngine(sample_rate=16000, chunk_s=0.1), api_keys=key) as address:
            yield address

    return pytest.fixture(scope="module", name="tone")(tone)


@pytest.fixture(scope="module")
def whisper() -> object:
    return load_whisper()


async def livekit_speaks(
    make: Callable[[aiohttp.ClientSession], tts.TTS[Any]], text: str
) -> tuple[bytes, bytes, int]:
    """What a livekit TTS plugin (``make`` builds it on an HTTP session) says for ``text``: streamed as an
    LLM streams it (5 characters at a time; the sockets), then whole (``synthesize``: the REST routes); and
    the stream's rate."""
    async with aiohttp.ClientSession() as http:
        plugin = make(http)
        stream = plugin.stream()
        for start in range(0, len(text), 5):
            stream.push_text(text[start : start + 5])
        stream.end_input()
        streamed, rate = bytearray(), 0
        async for event in stream:
            streamed += event.frame.data.tobytes()
            rate = event.frame.sample_rate
        await stream.aclose()
        whole = bytearray()
        async for event in plugin.synthesize(text):
            whole += event.frame.data.tobytes()
        await plugin.aclose()
        return bytes(streamed), bytes(whole), rate
