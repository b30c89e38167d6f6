"""A recording stand-in for a vllm-omni speech server, for the remote engine's tests.

``StubUpstream`` serves ``/health``, ``GET /v1/audio/voices`` (vllm-omni's shape: plain names) and
``POST /v1/audio/speech``. Every speech body is recorded; what the answer is depends on ``mode``, which
a test may switch at any time from its own thread. Each streamed answer gets a ``Stream`` record that
says whether the stream ran to its end or was cut by the client (and when), so a test can check that
a cancel or a failover closed the upstream request.
"""

from __future__ import annotations

import asyncio
import io
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import soundfile
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from tests.conftest import TIMEOUT_S, serve

Mode = Literal["ok", "error500", "garbage", "stall_before", "stall_mid", "refuse400", "unauthorized"]

VOICES = ["vivian", "ryan"]
SAMPLE_RATE = 24000
TONE_HZ = 440.0
REFUSAL = "voice 'nobody' is not supported by this stub"
# Odd on purpose: 16-bit samples then straddle chunk boundaries, as they may over a real network.
PIECE_BYTES = 2401
# Longer than any test waits, so a stall only ends when the client gives up.
STALL_S = 60.0


def tone(seconds: float, rate: int = SAMPLE_RATE) -> np.ndarray:
    """The stub's speech: a 440 Hz sine at a third of full scale, as float32."""
    t = np.arange(round(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)


def pcm16(samples: np.ndarray) -> bytes:
    data: bytes = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    return data


@dataclass
class Stream:
    """One streamed answer, as the stub saw it."""

    body: dict[str, object]
    opened_t: float = field(default_factory=time.monotonic)
    sent_bytes: int = 0
    completed: bool = False
    disconnected_t: float | None = None  # set when the client went away before the end


@dataclass
class StubUpstream:
    """A fake vllm-omni speech server whose behaviour a test switches with ``mode``.

    Args:
        mode: how ``POST /v1/audio/speech`` answers (see the module docstring of the tests).
        seconds: audio per streamed answer.
        pieces_delay_s: sleep between body pieces of a streamed answer.
        voices_html: answer ``GET /v1/audio/voices`` with an HTML page instead of JSON.
    """

    mode: Mode = "ok"
    seconds: float = 0.3
    pieces_delay_s: float = 0.01
    voices_html: bool = False  # answer the voice list with a web page, as a catch-all web app would
    requests: list[dict[str, object]] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health),
                Route("/v1/audio/voices", self._voices),
                Route("/v1/audio/speech", self._speech, methods=["POST"]),
            ]
        )

    def speech_requests(self) -> list[dict[str, object]]:
        """Bodies of streamed synthesis requests (not the engine's start-up probe for the rate)."""
        return [body for body in self.requests if body.get("stream") is True]

    def wait_closed(self, stream: Stream, timeout: float = TIMEOUT_S) -> float:
        """Wait until the client cut ``stream``; returns when (monotonic seconds)."""
        deadline = time.monotonic() + timeout
        while stream.disconnected_t is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"the upstream stream was not closed: {stream}")
            time.sleep(0.01)
        return stream.disconnected_t

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _voices(self, request: Request) -> Response:
        if self.voices_html:
            return HTMLResponse("<html><body>Welcome</body></html>")
        return JSONResponse({"voices": VOICES})

    async def _speech(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        mode = self.mode
        if mode == "refuse400":
            error = {"message": REFUSAL, "type": "BadRequestError", "param": None, "code": 400}
            return JSONResponse({"error": error}, status_code=400)
        if mode == "unauthorized":
            return JSONResponse({"error": {"message": "invalid api key", "code": 401}}, status_code=401)
        if mode == "error500":
            return JSONResponse({"error": {"message": "engine core died", "code": 500}}, status_code=500)
        if mode == "garbage":
            return HTMLResponse("<html><body>502 Bad Gateway (a proxy's page)</body></html>")
        if not body.get("stream"):
            return Response(_wav(tone(0.2)), media_type="audio/wav")
        record = Stream(body)
        self.streams.append(record)
        return _StreamedAudio(self, record, mode)


def _wav(samples: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


class _StreamedAudio(Response):
    """Raw PCM in pieces, written by a task that is cancelled as soon as the client disconnects."""

    def __init__(self, stub: StubUpstream, record: Stream, mode: Mode) -> None:
        self.stub, self.record, self.mode = stub, record, mode

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = asyncio.create_task(self._write(send))
        listener = asyncio.create_task(_disconnected(receive))
        await asyncio.wait({writer, listener}, return_when=asyncio.FIRST_COMPLETED)
        if not self.record.completed:
            self.record.disconnected_t = time.monotonic()
        for task in (writer, listener):
            task.cancel()
        await asyncio.gather(writer, listener, return_exceptions=True)

    async def _write(self, send: Send) -> None:
        if self.mode == "stall_before":
            await asyncio.sleep(STALL_S)
        headers = [(b"content-type", b"audio/pcm")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        data = pcm16(tone(self.stub.seconds))
        pieces = [data[i : i + PIECE_BYTES] for i in range(0, len(data), PIECE_BYTES)]
        for index, piece in enumerate(pieces):
            if self.mode == "stall_mid" and index == 2:
                await asyncio.sleep(STALL_S)
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            self.record.sent_bytes += len(piece)
            await asyncio.sleep(self.stub.pieces_delay_s)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.record.completed = True


async def _disconnected(receive: Receive) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return


@contextmanager
def serve_stub(stub: StubUpstream, sock: socket.socket | None = None) -> Iterator[str]:
    """Run ``stub`` on ``sock`` (a ``bound_socket``) or a fresh one; yields its base URL."""
    with serve(stub.app(), sock) as address:
        yield f"http://{address}"
