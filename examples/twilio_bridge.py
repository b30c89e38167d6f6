"""A Twilio Media Streams bridge that speaks through voxgate and stops when the caller talks over it.

Twilio connects to ``/twilio`` (TwiML ``<Connect><Stream url="wss://…/twilio"/></Connect>``). For each
call the bridge opens one voxgate session with ``"framing": "twilio"`` and the call's ``streamSid``,
so voxgate writes Twilio's own ``media`` and ``mark`` messages: the bridge forwards them as they are,
never decoding or re-encoding audio. What it does besides forwarding:

- text: it streams the tokens of a pluggable ``TextSource`` (here ``FakeLLM``) to voxgate as
  ``input.text``, then ``input.done``;
- marks: Twilio echoes each mark once the audio before it has played; the bridge relays the echo to
  voxgate, which answers with ``playback.position`` (which segment, and its text, was heard), kept
  in ``Call.heard``;
- barge-in: an energy detector on the caller's decoded mu-law audio; when the caller starts talking
  the bridge sends ``clear`` to Twilio (it drops the audio it buffered) and to voxgate (it cancels
  synthesis and answers ``audio.cancelled``), and drops what voxgate sent in between;
- pacing (``pace=True``): voxgate sends audio as fast as it is made and Twilio buffers it, so a
  bridge to the real Twilio need not pace (marks tell what was played). A simulated call has no
  jitter buffer, so for it the bridge releases one 20 ms frame every 20 ms; a barge-in then drops
  the bridge's own queue at once.

Run it: ``python examples/twilio_bridge.py --voxgate ws://127.0.0.1:8000/v1/audio/speech/stream``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from voxgate.protocol.audio import mulaw_decode
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

logger = logging.getLogger(__name__)

#: Audio per Twilio media message: Twilio sends 20 ms inbound, and voxgate's Twilio framing sends 20 ms.
FRAME_S = 0.020

#: Given the call's ``customParameters``, yields the reply's text as it is generated.
TextSource = Callable[[Mapping[str, str]], AsyncIterator[str]]


@dataclass
class FakeLLM:
    """Stands in for a language model: streams ``reply`` word by word, ``token_delay_s`` apart.

    A ``reply`` in the call's custom parameters (``<Parameter name="reply" …/>``) replaces it.
    """

    reply: str = "Hello, thanks for calling. How can I help you today?"
    token_delay_s: float = 0.01

    async def __call__(self, params: Mapping[str, str]) -> AsyncIterator[str]:
        words = params.get("reply", self.reply).split(" ")
        for i, word in enumerate(words):
            yield word if i == len(words) - 1 else word + " "
            await asyncio.sleep(self.token_delay_s)


class SpeechDetector:
    """The caller started talking: ``frames`` inbound frames in a row with an RMS over ``threshold``.

    Args:
        threshold: RMS on the -1..1 scale; 0.05 is about -26 dBFS, well above line noise.
        frames: loud frames in a row before it counts (3 frames, 60 ms: a click is not speech).
    """

    def __init__(self, threshold: float = 0.05, frames: int = 3) -> None:
        self.threshold = threshold
        self.frames = frames
        self._loud = 0

    def feed(self, mulaw: bytes) -> bool:
        """Take one inbound frame; True once, on the frame that makes the caller's speech start."""
        samples = mulaw_decode(mulaw)
        rms = float(np.sqrt(np.mean(np.square(samples)))) if len(samples) else 0.0
        self._loud = self._loud + 1 if rms > self.threshold else 0
        return self._loud == self.frames


@dataclass
class BridgeConfig:
    """How the bridge reaches voxgate and what it says.

    Args:
        voxgate_url: voxgate's WebSocket, ``ws://host:port/v1/audio/speech/stream``.
        text_source: the text to speak on each call.
        voice: voxgate's voice (None: the engine's default).
        api_key: voxgate's API key, when it has keys.
        pace: release media at 20 ms per frame (for a simulated call; Twilio buffers by itself).
        detector: makes the caller's speech detector of each call.
        options: more ``session.config`` fields (``seed``, ``speed``, ...).
    """

    voxgate_url: str
    text_source: TextSource = field(default_factory=FakeLLM)
    voice: str | None = None
    options: Mapping[str, object] = field(default_factory=dict)
    api_key: str | None = None
    pace: bool = False
    detector: Callable[[], SpeechDetector] = SpeechDetector


@dataclass
class Call:
    """One Twilio call bridged to one voxgate session; what it did is kept for inspection.

    ``sent`` holds ``(event, time.perf_counter())`` for each message sent to Twilio, ``heard`` the
    ``playback.position`` events voxgate reported, ``speech_at`` when the caller's speech was detected.
    """

    twilio: WebSocket
    config: BridgeConfig
    stream_sid: str = ""
    sent: list[tuple[str, float]] = field(default_factory=list)
    heard: list[dict[str, object]] = field(default_factory=list)
    speech_at: list[float] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)  # voxgate confirmed the last barge-in
    _voxgate: ClientConnection | None = None
    _queue: asyncio.Queue[tuple[int, str, str]] = field(default_factory=asyncio.Queue)
    _generation: int = 0  # bumped by each clear: queued media of an older generation is dropped
    _discarding: bool = False  # between a barge-in and voxgate's audio.cancelled
    _speaking: asyncio.Task[None] | None = None

    async def run(self) -> None:
        await self.twilio.accept()
        params = await self._start()
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else None
        async with connect(
            self.config.voxgate_url,
            subprotocols=[Subprotocol("voxgate.v1")],
            additional_headers=headers,
            max_size=None,
        ) as voxgate:
            self._voxgate = voxgate
            config = {**self.config.options, "type": "session.config", "framing": "twilio"}
            config["stream_sid"] = self.stream_sid
            if self.config.voice is not None:
                config["voice"] = self.config.voice
            await voxgate.send(json.dumps(config))
            ready = json.loads(await voxgate.recv())
            if ready.get("type") != "session.ready":
                raise RuntimeError(f"voxgate refused the session: {ready}")
            try:
                async with asyncio.TaskGroup() as tg:
                    self._speaking = tg.create_task(self._speak(params))
                    tg.create_task(self._from_twilio())
                    tg.create_task(self._from_voxgate())
                    if self.config.pace:
                        tg.create_task(self._pace())
            except* _Hangup:
                pass  # the call is over; closing voxgate's socket stops its work

    async def _start(self) -> Mapping[str, str]:
        """Read Twilio's ``connected`` and ``start``; returns the call's custom parameters."""
        while True:
            msg = json.loads(await self.twilio.receive_text())
            if msg.get("event") == "start":
                self.stream_sid = msg["streamSid"]
                params: dict[str, str] = msg["start"].get("customParameters") or {}
                return params

    async def _speak(self, params: Mapping[str, str]) -> None:
        voxgate = self._voxgate
        assert voxgate is not None
        async for token in self.config.text_source(params):
            await voxgate.send(json.dumps({"type": "input.text", "text": token}))
        await voxgate.send(json.dumps({"type": "input.done"}))

    async def _from_twilio(self) -> None:
        voxgate = self._voxgate
        assert voxgate is not None
        detector = self.config.detector()
        try:
            while True:
                text = await self.twilio.receive_text()
                try:
                    msg = json.loads(text)
                    event = msg.get("event")
                    speech = event == "media" and msg["media"].get("track", "inbound") == "inbound"
                    loud = speech and detector.feed(base64.b64decode(msg["media"]["payload"]))
                except (ValueError, TypeError, KeyError, AttributeError) as exc:
                    logger.warning("ignored a malformed Twilio message (%s): %.200s", exc, text)
                    continue
                if loud:
                    await self._barge_in()
                elif event == "mark":
                    await voxgate.send(text)  # the echo as Twilio wrote it: voxgate reads its shape
                elif event == "stop":
                    raise _Hangup()
        except WebSocketDisconnect:
            raise _Hangup() from None

    async def _barge_in(self) -> None:
        """The caller talks over the reply: Twilio drops its buffer, voxgate cancels, and so do we."""
        self.speech_at.append(time.perf_counter())
        self._generation += 1
        self._discarding = True
        self.cancelled.clear()
        clear = json.dumps({"event": "clear", "streamSid": self.stream_sid})
        await self._to_twilio("clear", clear)
        if self._speaking is not None:
            self._speaking.cancel()  # no more tokens of this reply
        assert self._voxgate is not None
        await self._voxgate.send(clear)  # voxgate takes Twilio's clear as input.cancel

    async def _from_voxgate(self) -> None:
        voxgate = self._voxgate
        assert voxgate is not None
        try:
            async for text in voxgate:
                msg = json.loads(text)
                event = msg.get("event")
                if event is not None:
                    await self._forward(event, str(text))
                    continue
                match msg.get("type"):
                    case "playback.position":
                        self.heard.append(msg)
                    case "audio.cancelled":
                        self._discarding = False  # nothing of the cancelled audio follows
                        self.cancelled.set()
                    case "error":
                        logger.warning("voxgate: %s", msg)
        except ConnectionClosed:
            pass
        raise _Hangup()

    async def _forward(self, event: str, text: str) -> None:
        """A Twilio message voxgate wrote: sent on as it is (media and marks paced when asked)."""
        if self._discarding:
            return  # written before voxgate took the barge-in
        if event == "clear":  # voxgate was cancelled by someone else (input.cancel)
            self._generation += 1
            await self._to_twilio(event, text)
        elif self.config.pace:
            self._queue.put_nowait((self._generation, event, text))
        else:
            await self._to_twilio(event, text)

    async def _pace(self) -> None:
        """Release queued media one frame per 20 ms, on a clock that does not drift; marks in order."""
        due: float | None = None
        while True:
            generation, event, text = await self._queue.get()
            if event == "media":
                now = time.perf_counter()
                if due is None or due < now - FRAME_S:
                    due = now  # a gap in the audio (or a late start): the clock restarts
                await asyncio.sleep(max(0.0, due - now))
                due += FRAME_S
            if generation == self._generation:  # a clear since it was queued drops it
                await self._to_twilio(event, text)

    async def _to_twilio(self, event: str, text: str) -> None:
        self.sent.append((event, time.perf_counter()))
        await self.twilio.send_text(text)


class _Hangup(Exception):
    """The call ended: Twilio's ``stop``, or either side closed."""


def create_bridge(config: BridgeConfig) -> Starlette:
    """The app; ``app.state.calls`` lists its calls (newest last), ``.config`` its config."""
    calls: list[Call] = []

    async def twilio(ws: WebSocket) -> None:
        call = Call(ws, config)
        calls.append(call)
        try:
            await call.run()
        finally:
            with contextlib.suppress(RuntimeError):
                await ws.close()

    app = Starlette(routes=[WebSocketRoute("/twilio", twilio)])
    app.state.calls = calls
    app.state.config = config
    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--voxgate", default="ws://127.0.0.1:8000/v1/audio/speech/stream")
    parser.add_argument("--voice", default=None)
    parser.add_argument("--pace", action="store_true", help="release audio at real-time pace")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    app = create_bridge(BridgeConfig(args.voxgate, voice=args.voice, pace=args.pace))
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
