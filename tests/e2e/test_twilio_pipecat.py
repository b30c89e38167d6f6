"""voxgate's Twilio framing read and written by real third-party Twilio code: pipecat's TwilioFrameSerializer.

No Twilio can be reached from here, so the simulated call (test_twilio_bridge.py) is our own reading of
Twilio's docs. pipecat's serializer is code that runs against real Twilio calls (from PyPI, unmodified):
what it writes is what Twilio takes, and what it reads is what Twilio sends. voxgate's `clear` must be
the one pipecat writes, its `media` must have the shape pipecat writes and carry G.711 mu-law at 8 kHz
that pipecat's own codec reproduces byte for byte, and pipecat must read it as Twilio media.
"""

from __future__ import annotations

import asyncio
import base64
import json
from types import SimpleNamespace
from typing import Any, cast

from pipecat.audio.utils import create_stream_resampler, ulaw_to_pcm
from pipecat.frames.frames import InputAudioRawFrame, InterruptionFrame, OutputAudioRawFrame
from pipecat.serializers.twilio import TwilioFrameSerializer
from voxgate.engine.fake import FakeEngine

from tests.conftest import recv_message, send, serve_engine, session

SID = "MZ0123456789abcdef0123456789abcdef"


def voxgate_call() -> list[dict[str, Any]]:
    """voxgate's messages for a sentence, then a cancel: media, a mark, the clear."""
    engine = FakeEngine(chunk_s=0.05, delay_s=0.05)
    with serve_engine(engine) as address, session(address, framing="twilio", stream_sid=SID) as ws:
        send(ws, type="input.text", text="Short one. Then a long sentence that takes a while to say.")
        send(ws, type="input.done")
        got: list[dict[str, Any]] = []
        while not got or got[-1].get("event") != "mark":
            got.append(recv_message(ws))
        send(ws, type="input.cancel")
        while got[-1].get("type") != "audio.cancelled":
            got.append(recv_message(ws))
    return got


def test_pipecats_twilio_serializer_writes_and_reads_what_voxgate_sends() -> None:
    got = voxgate_call()
    media = [m for m in got if m.get("event") == "media"]
    (clear,) = [m for m in got if m.get("event") == "clear"]

    async def check() -> None:
        params = TwilioFrameSerializer.InputParams(
            twilio_sample_rate=8000, sample_rate=8000, auto_hang_up=False
        )
        serializer = TwilioFrameSerializer(stream_sid=SID, params=params)
        # As a pipeline would call it; with params.sample_rate set, setup reads nothing else.
        await serializer.setup(cast(Any, SimpleNamespace()))
        # The clear: exactly the message pipecat sends Twilio on an interruption.
        assert json.loads(str(await serializer.serialize(InterruptionFrame()))) == clear
        for message in media[:10]:
            payload = base64.b64decode(message["media"]["payload"])
            pcm = await ulaw_to_pcm(payload, 8000, 8000, create_stream_resampler())
            # pipecat writes the same audio as the same message: shape, stream and mu-law bytes.
            written = await serializer.serialize(
                OutputAudioRawFrame(audio=pcm, sample_rate=8000, num_channels=1)
            )
            assert json.loads(str(written)) == message
            # pipecat reads voxgate's media as Twilio media: 160 samples (20 ms) of that audio.
            frame = await serializer.deserialize(json.dumps(message))
            assert isinstance(frame, InputAudioRawFrame) and frame.audio == pcm and len(pcm) == 2 * 160

    asyncio.run(check())
