"""One behaviour, every surface: the audio cap, cancel, errors and formats over each route that speaks.

uvicorn runs one suite over each of its protocol implementations; this module runs one over each of the
gateway's surfaces (issue 17). A surface is an adapter that speaks one exchange on its own wire and
reports it in one shape, ``Outcome``: the audio as sent, the errors as the wire names them, and how the
exchange ended. Each test then states one expectation for all of them. Where a wire cannot say something
(a REST body has nowhere to put a warning) the expectation says what the surface does instead, as
docs/protocol.md and docs/agents.md describe it; a surface that strays from that is an ``xfail`` whose
reason says how.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import tempfile
import threading
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import httpx
import numpy as np
import pytest
from voxgate.engine.base import AudioChunk, SynthesisRequest, TTSEngine
from voxgate.engine.fake import SECONDS_PER_CHAR, FakeEngine
from voxgate.gateway.app import create_app
from voxgate.gateway.settings import Settings
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol
from wyoming import audio as wyoming_audio
from wyoming import error as wyoming_error
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize, SynthesizeVoice

from tests.conftest import TIMEOUT_S, serve
from tests.decoding import decoded

RATE = 16000  # the engine's rate, and the output rate asked for wherever a surface lets a client choose
CHUNK_S = 0.1
VOICE = "tone"
SID = "MZ00000000000000000000000000000017"
UNCODED = "(no code)"  # an error whose wire has no code (vllm-omni's dialect: type and message only)
#: The engine's part of a two-segment text that it holds after its first chunk, until its stream closes.
HELD = "This one is held."
#: Per-segment audio cap of "Hi." (3 characters): 0.97 + 3 x 0.01 = 1.00 s.
CAP = {"max_segment_audio_base_s": 0.97, "max_segment_audio_per_char_s": 0.01}
CAP_S = 1.0
#: What a decoder's output may have beyond the engine's audio: a codec's priming and its last frame's
#: padding (protocol/encoders.py; at 16 kHz mp3 frames are 576 samples, AAC's 1024, after a delay of 1105
#: and 1024; Ogg Opus trims both), mu-law's carrier frame padded to 20 ms, and rounding.
PADDING_S = {"pcm": 0.001, "mulaw": 0.02, "flac": 0.001, "opus": 0.002, "mp3": 0.11, "aac": 0.13}
#: Audio a streaming encoder may hold back until it has more input: a frame and its look-ahead.
LATENCY_S = 0.25


#: Each gateway's Wyoming address, by its HTTP one: every gateway here serves Wyoming too (``serve_engine``).
WYOMING: dict[str, tuple[str, int]] = {}


@contextlib.contextmanager
def serve_engine(tts: TTSEngine, **settings: object) -> Iterator[str]:
    """``tests.conftest.serve_engine``, serving Wyoming too on a port the system picks (``WYOMING``)."""
    with tempfile.TemporaryDirectory(prefix="voxgate-voices-") as voices_dir:
        config = Settings.from_env({}, voices_dir=voices_dir, wyoming="127.0.0.1:0", **settings)
        app = create_app(config, engine=tts)
        with serve(app) as address:
            WYOMING[address] = app.state.wyoming.address
            yield address


def said(text: str) -> float:
    """Seconds of the engine's tone for ``text``'s segments (segments are stripped of their spaces)."""
    return len(text.replace(". ", ".")) * SECONDS_PER_CHAR


def assert_lasts(got: Outcome, seconds: float) -> None:
    """``got`` is ``seconds`` of audio, give or take what its codec adds (never less)."""
    assert seconds - 0.001 <= got.seconds <= seconds + PADDING_S[got.fmt], (got.seconds, seconds)


class Scripted(FakeEngine):
    """The fake tone at ``RATE``, scripted further: ``endless`` (a model that never stops: 20 s for any
    text), and a segment containing ``HELD`` stops after its first chunk until its stream is closed."""

    def __init__(self, *, endless: bool = False) -> None:
        super().__init__(sample_rate=RATE, chunk_s=CHUNK_S)
        self.endless = endless
        self.holding = threading.Event()  # the held segment sent its first chunk and waits
        self.changed = threading.Condition()  # a stream ended (``closed`` and ``finished`` are final)

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        self.requests.append(req)
        self.started += 1
        total = round((20.0 if self.endless else len(req.text) * SECONDS_PER_CHAR) * RATE)
        step = round(CHUNK_S * RATE)
        tone = (0.5 * np.sin(2 * np.pi * 220 * np.arange(step) / RATE)).astype(np.float32)  # whole cycles
        try:
            for n, start in enumerate(range(0, total, step)):
                if n == 1 and HELD in req.text:
                    self.holding.set()
                    await asyncio.Event().wait()  # never set: only a close of the stream ends it
                yield AudioChunk(tone[: total - start], RATE)
            self.finished += 1
        finally:
            with self.changed:
                self.closed += 1
                self.changed.notify_all()

    def settled(self, streams: int) -> None:
        """Wait until ``streams`` engine streams have begun and every one has ended."""
        with self.changed:
            ended = self.changed.wait_for(lambda: self.closed == self.started == streams, TIMEOUT_S)
        assert ended, f"{self.started} streams began, {self.closed} ended; expected {streams} of each"


@dataclass
class Outcome:
    """One exchange as a surface reported it."""

    fmt: str
    rate: int
    audio: list[bytes] = field(default_factory=list)  # as sent: frames, segments' files, body pieces
    errors: list[str] = field(default_factory=list)  # each error's code as the wire names it
    ended: str = ""  # "close 1000", "close 1008 voice_not_found", "http 200", "http 200 speech.audio.done"

    @property
    def seconds(self) -> float:
        data = b"".join(self.audio)
        if self.fmt in ("pcm", "mulaw"):
            return len(data) / (2 if self.fmt == "pcm" else 1) / self.rate
        samples, rate = decoded(data)  # a chain of complete files (one per segment) decodes as one
        return len(samples) / rate if rate else 0.0


class Surface(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def formats(self) -> tuple[str, ...]:
        """The compressed formats it offers."""
        ...

    def speak(self, address: str, text: str, *, voice: str = VOICE, fmt: str = "pcm") -> Outcome:
        """Speak ``text`` whole, then end the exchange as a client that is done would."""
        ...

    def listen(self, address: str, text: str, fmt: str, enough: Callable[[Outcome], bool]) -> Outcome:
        """Start speaking ``text`` whole, read its audio until ``enough`` of it came, then go away."""
        ...


def _closed(ws: ClientConnection, out: Outcome, take: Callable[[str | bytes, Outcome], object]) -> Outcome:
    """Read until the server closes, ``take``-ing each message into ``out``."""
    try:
        while True:
            take(ws.recv(timeout=TIMEOUT_S), out)
    except ConnectionClosed as closed:
        out.ended = f"close {closed.rcvd.code} {closed.rcvd.reason}".strip() if closed.rcvd else "close -"
    return out


def _send(ws: ClientConnection, *messages: Mapping[str, object]) -> None:
    with contextlib.suppress(ConnectionClosed):  # the server may close on the first (a refused config)
        for message in messages:
            ws.send(json.dumps(message))


@dataclass(frozen=True)
class SpeechSocket:
    """``WS /v1/audio/speech/stream``: vllm-omni's dialect, ``voxgate.v1``, or ``voxgate.v1`` framed for
    a phone carrier (its audio as the carrier's ``media`` messages, mu-law at 8 kHz whatever is asked)."""

    name: str
    extensions: bool
    carrier: str | None = None
    formats: tuple[str, ...] = ("mp3", "opus", "aac", "flac")

    @contextlib.contextmanager
    def connect(self, address: str, voice: str = VOICE, fmt: str = "pcm") -> Iterator[ClientConnection]:
        offered = [Subprotocol("voxgate.v1")] if self.extensions else None
        url = f"ws://{address}/v1/audio/speech/stream"
        # max_queue=None: a client that stops reading keeps taking frames, so that it still reads the
        # server's answer to its close (with the default 16, ``close()`` waits 10 s and sees 1006).
        with connect(url, subprotocols=offered, max_size=None, max_queue=None, open_timeout=TIMEOUT_S) as ws:
            config: dict[str, object] = {"type": "session.config", "voice": voice, "response_format": fmt}
            config["sample_rate"] = RATE
            if self.carrier is not None:
                config |= {"framing": self.carrier, "stream_sid": SID}
            _send(ws, config)
            yield ws

    def outcome(self, fmt: str) -> Outcome:
        return Outcome("mulaw", 8000) if self.carrier else Outcome(fmt, RATE)

    def take(self, item: str | bytes, out: Outcome) -> dict[str, object] | None:
        """Note one message's audio or error; the JSON message, None for audio."""
        if isinstance(item, bytes):
            out.audio.append(item)
            return None
        msg: dict[str, object] = json.loads(item)
        if msg.get("event") == "media":
            media = msg["media"]
            assert isinstance(media, dict)
            out.audio.append(base64.b64decode(media["payload"]))
        elif msg.get("type") == "error":
            out.errors.append(str(msg.get("code", UNCODED)))
        return msg

    def until(self, ws: ClientConnection, out: Outcome, kind: str) -> list[str]:
        """Read up to a message of type ``kind``; the types (carrier events) of the messages read."""
        kinds: list[str] = []
        while not kinds or kinds[-1] != kind:
            if (msg := self.take(ws.recv(timeout=TIMEOUT_S), out)) is not None:
                kinds.append(str(msg.get("type", msg.get("event"))))
        return kinds

    def speak(self, address: str, text: str, *, voice: str = VOICE, fmt: str = "pcm") -> Outcome:
        with self.connect(address, voice, fmt) as ws:
            done = [{"type": "input.text", "text": text}, {"type": "input.done"}, {"type": "session.close"}]
            _send(ws, *done)
            return _closed(ws, self.outcome(fmt), self.take)

    def listen(self, address: str, text: str, fmt: str, enough: Callable[[Outcome], bool]) -> Outcome:
        with self.connect(address, fmt=fmt) as ws:
            _send(ws, {"type": "input.text", "text": text}, {"type": "input.done"})
            out = self.outcome(fmt)
            while not enough(out):
                self.take(ws.recv(timeout=TIMEOUT_S), out)
            return out

    def barge_in(self, address: str, engine: Scripted, probe: str) -> tuple[list[str], Outcome]:
        """Speak, cancel while the engine holds a segment, then speak ``probe``. Returns the messages
        from the cancel to its acknowledgement, and the audio after it up to the probe's end."""
        with self.connect(address) as ws:
            _send(ws, {"type": "input.text", "text": f"Hello there. {HELD}"}, {"type": "input.done"})
            heard = self.outcome("pcm")
            while not heard.audio:  # audio went out, so a carrier has some to clear
                self.take(ws.recv(timeout=TIMEOUT_S), heard)
            assert engine.holding.wait(TIMEOUT_S)
            clear = {"event": "clear", "streamSid" if self.carrier == "twilio" else "stream_id": SID}
            _send(ws, clear if self.carrier else {"type": "input.cancel"})
            acks = self.until(ws, self.outcome("pcm"), "audio.cancelled")
            after = self.outcome("pcm")
            _send(ws, {"type": "input.text", "text": probe}, {"type": "input.done"})
            self.until(ws, after, "session.done")
            return acks, after


@dataclass(frozen=True)
class ElevenSocket:
    """ElevenLabs' ``stream-input`` (one context) and ``multi-stream-input`` (a named one here)."""

    name: str
    multi: bool
    formats: tuple[str, ...] = ("mp3", "opus")

    @contextlib.contextmanager
    def connect(self, address: str, voice: str, fmt: str) -> Iterator[ClientConnection]:
        path = "multi-stream-input" if self.multi else "stream-input"
        url = f"ws://{address}/v1/text-to-speech/{voice}/{path}?output_format={ELEVEN_FORMATS[fmt]}"
        with connect(url, max_size=None, open_timeout=TIMEOUT_S) as ws:
            _send(ws, self.message(text=" "))
            yield ws

    def message(self, **fields: object) -> dict[str, object]:
        return {**fields, "context_id": "c1"} if self.multi else fields

    def take(self, item: str | bytes, out: Outcome) -> None:
        msg = json.loads(item)
        if msg.get("audio"):
            out.audio.append(base64.b64decode(msg["audio"]))
        if "error" in msg:
            out.errors.append(str(msg["error"]))

    def speak(self, address: str, text: str, *, voice: str = VOICE, fmt: str = "pcm") -> Outcome:
        with self.connect(address, voice, fmt) as ws:
            end = [self.message(close_context=True), {"close_socket": True}] if self.multi else [{"text": ""}]
            _send(ws, self.message(text=f"{text} "), *end)
            return _closed(ws, eleven_outcome(fmt), self.take)

    def listen(self, address: str, text: str, fmt: str, enough: Callable[[Outcome], bool]) -> Outcome:
        with self.connect(address, VOICE, fmt) as ws:
            _send(ws, self.message(text=f"{text} ", flush=True))
            out = eleven_outcome(fmt)
            while not enough(out):
                self.take(ws.recv(timeout=TIMEOUT_S), out)
            return out


ELEVEN_FORMATS = {"pcm": f"pcm_{RATE}", "mp3": "mp3_44100_128", "opus": "opus_48000_64"}


def eleven_outcome(fmt: str) -> Outcome:
    return Outcome(fmt, int(ELEVEN_FORMATS[fmt].split("_")[1]))


@dataclass(frozen=True)
class ElevenRest:
    """ElevenLabs' ``POST /v1/text-to-speech/{voice_id}`` and ``.../stream`` (one handler, two paths)."""

    name: str
    path: str
    formats: tuple[str, ...] = ("mp3", "opus")

    def request(self, address: str, text: str, voice: str, fmt: str) -> httpx.Request:
        url = f"http://{address}/v1/text-to-speech/{voice}{self.path}?output_format={ELEVEN_FORMATS[fmt]}"
        return httpx.Request("POST", url, json={"text": text})

    def speak(self, address: str, text: str, *, voice: str = VOICE, fmt: str = "pcm") -> Outcome:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            response, body, cut = read_body(client, self.request(address, text, voice, fmt))
        out = eleven_outcome(fmt)
        out.ended = f"http {response.status_code}{cut}"
        if response.status_code == 200:
            out.audio.append(body)
        else:
            out.errors.append(json.loads(body)["detail"]["status"])
        return out

    def listen(self, address: str, text: str, fmt: str, enough: Callable[[Outcome], bool]) -> Outcome:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            response = client.send(self.request(address, text, VOICE, fmt), stream=True)
            return until_enough(response, response.iter_raw(), eleven_outcome(fmt), enough)


@dataclass(frozen=True)
class OpenAIRest:
    """OpenAI's ``POST /v1/audio/speech``: the audio as the body, or as SSE deltas."""

    name: str
    sse: bool
    formats: tuple[str, ...] = ("mp3", "opus", "aac", "flac")

    def request(self, address: str, text: str, voice: str, fmt: str) -> httpx.Request:
        body = {"input": text, "voice": voice, "response_format": fmt, "sample_rate": RATE}
        body["stream_format"] = "sse" if self.sse else "audio"
        return httpx.Request("POST", f"http://{address}/v1/audio/speech", json=body)

    def speak(self, address: str, text: str, *, voice: str = VOICE, fmt: str = "pcm") -> Outcome:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            response, body, cut = read_body(client, self.request(address, text, voice, fmt))
        out = Outcome(fmt, RATE, ended=f"http {response.status_code}{cut}")
        if response.status_code != 200:
            out.errors.append(json.loads(body)["error"]["code"])
        elif not self.sse:
            out.audio.append(body)
        else:
            for line in body.decode().splitlines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    out.ended = f"http 200 {event['type']}"
                    if event["type"] == "speech.audio.delta":
                        out.audio.append(base64.b64decode(event["audio"]))
                    elif event["type"] == "speech.audio.error":
                        out.errors.append(event["error"]["code"])
        return out

    def listen(self, address: str, text: str, fmt: str, enough: Callable[[Outcome], bool]) -> Outcome:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            response = client.send(self.request(address, text, VOICE, fmt), stream=True)
            pieces = self.deltas(response) if self.sse else response.iter_raw()
            return until_enough(response, pieces, Outcome(fmt, RATE), enough)

    @staticmethod
    def deltas(response: httpx.Response) -> Iterator[bytes]:
        for line in response.iter_lines():
            if line.startswith("data: ") and (event := json.loads(line[6:]))["type"] == "speech.audio.delta":
                yield base64.b64decode(event["audio"])


def read_body(client: httpx.Client, request: httpx.Request) -> tuple[httpx.Response, bytes, str]:
    """The response, its body as far as it came, and " cut" when the connection closed before its end."""
    received: list[bytes] = []
    with client.stream(
        request.method, request.url, headers=request.headers, content=request.content
    ) as response:
        try:
            received.extend(response.iter_raw())
        except httpx.RemoteProtocolError:  # the body was cut off: no last chunk
            return response, b"".join(received), " cut"
    return response, b"".join(received), ""


def until_enough(
    response: httpx.Response, pieces: Iterator[bytes], out: Outcome, enough: Callable[[Outcome], bool]
) -> Outcome:
    """Read a streamed response's audio until ``enough`` came, then drop the connection."""
    try:
        assert response.status_code == 200
        while not enough(out):
            out.audio.append(next(pieces))
        return out
    finally:
        response.close()


@dataclass(frozen=True)
class WyomingTcp:
    """Home Assistant's Wyoming over TCP, with the real ``wyoming`` client: a one-shot ``synthesize``, its
    audio as ``audio-chunk``s (pcm at the engine's rate: Wyoming has no other format), errors as ``error``
    events, ended by its ``audio-stop`` or by the server hanging up."""

    name: str = "wyoming"
    formats: tuple[str, ...] = ()

    def speak(self, address: str, text: str, *, voice: str = VOICE, fmt: str = "pcm") -> Outcome:
        return asyncio.run(self.exchange(WYOMING[address], text, voice, lambda got: False))

    def listen(self, address: str, text: str, fmt: str, enough: Callable[[Outcome], bool]) -> Outcome:
        return asyncio.run(self.exchange(WYOMING[address], text, VOICE, enough))

    @staticmethod
    async def exchange(
        wyoming: tuple[str, int], text: str, voice: str, enough: Callable[[Outcome], bool]
    ) -> Outcome:
        out = Outcome("pcm", RATE)
        async with AsyncTcpClient(*wyoming) as client:
            await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice)).event())
            while not enough(out):
                event = await asyncio.wait_for(client.read_event(), TIMEOUT_S)
                if event is None:
                    out.ended = "hang-up"
                    break
                if wyoming_audio.AudioChunk.is_type(event.type):
                    out.audio.append(wyoming_audio.AudioChunk.from_event(event).audio)
                elif wyoming_error.Error.is_type(event.type):
                    out.errors.append(wyoming_error.Error.from_event(event).code or UNCODED)
                elif wyoming_audio.AudioStop.is_type(event.type):
                    out.ended = "audio-stop"
                    break
        return out


@dataclass(frozen=True)
class CartesiaWs:
    """Cartesia's ``WS /tts/websocket``: each exchange one context (``continue: false``), its audio as
    ``chunk`` messages, its errors as ``error`` messages; it ends at its ``done``, or at an error that says
    ``done`` (a refused message), and the client closes the socket (Cartesia's has no close message)."""

    name: str = "cartesia-ws"
    formats: tuple[str, ...] = ()

    @contextlib.contextmanager
    def connect(self, address: str) -> Iterator[ClientConnection]:
        with connect(f"ws://{address}/tts/websocket", max_size=None, open_timeout=TIMEOUT_S) as ws:
            yield ws

    @staticmethod
    def request(context: str, text: str, voice: str = VOICE) -> dict[str, object]:
        output_format = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": RATE}
        fields = {"model_id": "sonic-3", "voice": {"mode": "id", "id": voice}, "output_format": output_format}
        return {"context_id": context, "transcript": text, "continue": False, **fields}

    def take(self, item: str | bytes, out: Outcome) -> dict[str, object]:
        msg: dict[str, object] = json.loads(item)
        if msg["type"] == "chunk":
            out.audio.append(base64.b64decode(str(msg["data"])))
        elif msg["type"] == "error":
            out.errors.append(str(msg["error_code"]))
        if msg["done"]:
            out.ended = str(msg["type"])
        return msg

    def speak(self, address: str, text: str, *, voice: str = VOICE, fmt: str = "pcm") -> Outcome:
        with self.connect(address) as ws:
            _send(ws, self.request("c1", text, voice))
            out = Outcome(fmt, RATE)
            while not out.ended:
                self.take(ws.recv(timeout=TIMEOUT_S), out)
            return out

    def listen(self, address: str, text: str, fmt: str, enough: Callable[[Outcome], bool]) -> Outcome:
        with self.connect(address) as ws:
            _send(ws, self.request("c1", text))
            out = Outcome(fmt, RATE)
            while not enough(out):
                self.take(ws.recv(timeout=TIMEOUT_S), out)
            return out

    def barge_in(self, address: str, engine: Scripted, probe: str) -> tuple[list[str], Outcome]:
        """Cancel context c1 while the engine holds its segment, then speak ``probe`` in c2: c2's audio, and
        any of c1 that comes after c2's first (none may: Cartesia acknowledges no cancel)."""
        with self.connect(address) as ws:
            _send(ws, self.request("c1", f"Hello there. {HELD}"))
            heard = Outcome("pcm", RATE)
            while not heard.audio:
                self.take(ws.recv(timeout=TIMEOUT_S), heard)
            assert engine.holding.wait(TIMEOUT_S)
            _send(ws, {"context_id": "c1", "cancel": True}, self.request("c2", probe))
            after, acks, probing = Outcome("pcm", RATE), ["cancel"], False
            while not after.ended:
                msg = json.loads(ws.recv(timeout=TIMEOUT_S))
                probing = probing or msg["context_id"] == "c2"
                if probing:
                    self.take(json.dumps(msg), after)
                else:
                    acks.append(str(msg["type"]))
            return acks, after


@dataclass(frozen=True)
class DeepgramWs:
    """Deepgram Aura's ``WS /v1/speak``: ``Speak``, ``Flush``, ``Close``; binary audio, errors as
    ``Warning`` (``Error`` when fatal), the voice (``model``) refused at the handshake with HTTP 400."""

    name: str = "deepgram-ws"
    formats: tuple[str, ...] = ()

    @contextlib.contextmanager
    def connect(self, address: str, voice: str = VOICE) -> Iterator[ClientConnection]:
        url = f"ws://{address}/v1/speak?model={voice}&encoding=linear16&sample_rate={RATE}"
        with connect(url, max_size=None, max_queue=None, open_timeout=TIMEOUT_S) as ws:
            yield ws

    def take(self, item: str | bytes, out: Outcome) -> str:
        if isinstance(item, bytes):
            out.audio.append(item)
            return "<audio>"
        msg = json.loads(item)
        if msg["type"] in ("Warning", "Error"):
            out.errors.append(msg.get("code", msg.get("err_code")))
        return str(msg["type"])

    def speak(self, address: str, text: str, *, voice: str = VOICE, fmt: str = "pcm") -> Outcome:
        out = Outcome(fmt, RATE)
        try:
            with self.connect(address, voice) as ws:
                _send(ws, {"type": "Speak", "text": text}, {"type": "Flush"}, {"type": "Close"})
                return _closed(ws, out, self.take)
        except InvalidStatus as refused:
            out.ended = f"http {refused.response.status_code}"
            out.errors.append(json.loads(refused.response.body or b"{}")["err_code"].lower())
            return out

    def listen(self, address: str, text: str, fmt: str, enough: Callable[[Outcome], bool]) -> Outcome:
        with self.connect(address) as ws:
            _send(ws, {"type": "Speak", "text": text}, {"type": "Flush"})
            out = Outcome(fmt, RATE)
            while not enough(out):
                self.take(ws.recv(timeout=TIMEOUT_S), out)
            return out

    def barge_in(self, address: str, engine: Scripted, probe: str) -> tuple[list[str], Outcome]:
        """``Clear`` while the engine holds a segment, then speak ``probe``: the messages up to ``Cleared``,
        and the audio after it up to the probe's ``Flushed``."""
        with self.connect(address) as ws:
            _send(ws, {"type": "Speak", "text": f"Hello there. {HELD}"}, {"type": "Flush"})
            heard = Outcome("pcm", RATE)
            while not heard.audio:
                self.take(ws.recv(timeout=TIMEOUT_S), heard)
            assert engine.holding.wait(TIMEOUT_S)
            _send(ws, {"type": "Clear"})
            acks = [self.take(ws.recv(timeout=TIMEOUT_S), heard)]
            while acks[-1] != "Cleared":
                acks.append(self.take(ws.recv(timeout=TIMEOUT_S), heard))
            after = Outcome("pcm", RATE)
            _send(ws, {"type": "Speak", "text": probe}, {"type": "Flush"})
            while self.take(ws.recv(timeout=TIMEOUT_S), after) != "Flushed":
                pass
            return acks, after


@dataclass(frozen=True)
class CartesiaRest:
    """Cartesia's ``POST /tts/bytes`` (the audio as the body: raw, or mp3) and ``POST /tts/sse`` (``chunk``
    events, then ``done``, or ``error`` once the answer started)."""

    name: str
    sse: bool
    formats: tuple[str, ...] = ()

    def request(self, address: str, text: str, voice: str, fmt: str) -> httpx.Request:
        output_format: dict[str, object] = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": RATE}
        if fmt == "mp3":
            output_format = {"container": "mp3", "sample_rate": RATE, "bit_rate": 64000}
        body = {"transcript": text, "voice": {"mode": "id", "id": voice}, "output_format": output_format}
        url = f"http://{address}/tts/{'sse' if self.sse else 'bytes'}"
        return httpx.Request("POST", url, json={**body, "model_id": "sonic-3"})

    def speak(self, address: str, text: str, *, voice: str = VOICE, fmt: str = "pcm") -> Outcome:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            response, body, cut = read_body(client, self.request(address, text, voice, fmt))
        out = Outcome(fmt, RATE, ended=f"http {response.status_code}{cut}")
        if response.status_code != 200:
            out.errors.append(json.loads(body)["error_code"])
        elif not self.sse:
            out.audio.append(body)
        else:
            for line in body.decode().splitlines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    out.ended = f"http 200 {event['type']}"
                    if event["type"] == "chunk":
                        out.audio.append(base64.b64decode(event["data"]))
                    elif event["type"] == "error":
                        out.errors.append(event["error_code"])
        return out

    def listen(self, address: str, text: str, fmt: str, enough: Callable[[Outcome], bool]) -> Outcome:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            response = client.send(self.request(address, text, VOICE, fmt), stream=True)
            pieces = self.chunks(response) if self.sse else response.iter_raw()
            return until_enough(response, pieces, Outcome(fmt, RATE), enough)

    @staticmethod
    def chunks(response: httpx.Response) -> Iterator[bytes]:
        for line in response.iter_lines():
            if line.startswith("data: ") and (event := json.loads(line[6:]))["type"] == "chunk":
                yield base64.b64decode(event["data"])


@dataclass(frozen=True)
class DeepgramRest:
    """Deepgram Aura's ``POST /v1/speak``: the audio as the body, its format from the query."""

    name: str = "deepgram-rest"
    formats: tuple[str, ...] = ("mp3", "opus", "aac", "flac")

    def request(self, address: str, text: str, voice: str, fmt: str) -> httpx.Request:
        encoding = "linear16&container=none" if fmt == "pcm" else fmt
        url = f"http://{address}/v1/speak?model={voice}&encoding={encoding}&sample_rate={RATE}"
        return httpx.Request("POST", url, json={"text": text})

    def speak(self, address: str, text: str, *, voice: str = VOICE, fmt: str = "pcm") -> Outcome:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            response, body, cut = read_body(client, self.request(address, text, voice, fmt))
        out = Outcome(fmt, RATE, ended=f"http {response.status_code}{cut}")
        if response.status_code == 200:
            out.audio.append(body)
        else:
            out.errors.append(json.loads(body)["err_code"].lower())
        return out

    def listen(self, address: str, text: str, fmt: str, enough: Callable[[Outcome], bool]) -> Outcome:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            response = client.send(self.request(address, text, VOICE, fmt), stream=True)
            return until_enough(response, response.iter_raw(), Outcome(fmt, RATE), enough)


CARTESIA = CartesiaWs()
DEEPGRAM = DeepgramWs()
VLLM = SpeechSocket("ws-vllm-omni", extensions=False)
VOXGATE = SpeechSocket("ws-voxgate.v1", extensions=True)
TWILIO = SpeechSocket("ws-twilio", extensions=True, carrier="twilio")
TELNYX = SpeechSocket("ws-telnyx", extensions=True, carrier="telnyx")
WYOMING_TCP = WyomingTcp()
SURFACES: list[Surface] = [
    VLLM,
    VOXGATE,
    TWILIO,
    TELNYX,
    ElevenSocket("el-stream-input", multi=False),
    ElevenSocket("el-multi-stream-input", multi=True),
    ElevenRest("el-rest", path=""),
    ElevenRest("el-rest-stream", path="/stream"),
    OpenAIRest("openai-body", sse=False),
    OpenAIRest("openai-sse", sse=True),
    WYOMING_TCP,
    CARTESIA,
    DEEPGRAM,
    CartesiaRest("cartesia-bytes", sse=False, formats=("mp3",)),
    CartesiaRest("cartesia-sse", sse=True),
    DeepgramRest(),
]
CARRIERS = {TWILIO.name, TELNYX.name}
WEBSOCKETS = {s.name for s in SURFACES if isinstance(s, SpeechSocket | ElevenSocket | DeepgramWs)}


def every(xfail: dict[str, str] | None = None) -> list[object]:
    """``SURFACES`` as parameters, the ones named in ``xfail`` marked so with their reason."""
    xfail = xfail or {}
    return [
        pytest.param(s, id=s.name, marks=[pytest.mark.xfail(strict=True, reason=xfail[s.name])])
        if s.name in xfail
        else pytest.param(s, id=s.name)
        for s in SURFACES
    ]


def normal_end(surface: Surface) -> str:
    """How an exchange that went well ends on ``surface``."""
    if surface.name in WEBSOCKETS:
        return "close 1000"
    if surface.name == WYOMING_TCP.name:
        return "audio-stop"  # the connection stays open for the next request
    if surface.name == CARTESIA.name:
        return "done"  # the context's end; the socket stays open for the next
    return {"openai-sse": "http 200 speech.audio.done", "cartesia-sse": "http 200 done"}.get(
        surface.name, "http 200"
    )


# -- the audio cap ---------------------------------------------------------------------------------------

#: How each wire reports a segment cut at the cap (docs/protocol.md §6 `audio_truncated`, never fatal).
#: The REST routes have no place for it: the audio ends at the cap and the route logs a warning.
TRUNCATION_REPORTED = {
    VLLM.name: [UNCODED],  # vllm-omni's error shape has no code; the error is still sent
    VOXGATE.name: ["audio_truncated"],
    TWILIO.name: ["audio_truncated"],
    TELNYX.name: ["audio_truncated"],
    "el-stream-input": ["audio_truncated"],
    "el-multi-stream-input": ["audio_truncated"],
    WYOMING_TCP.name: ["audio_truncated"],
    CARTESIA.name: ["audio_truncated"],
    DEEPGRAM.name: ["audio_truncated"],
}


@pytest.mark.parametrize("surface", every())
def test_the_audio_cap_cuts_every_surface_at_the_same_length(surface: Surface) -> None:
    engine = Scripted(endless=True)
    with serve_engine(engine, **CAP) as address:
        got = surface.speak(address, "Hi.")
        engine.settled(1)
    assert engine.finished == 0  # the engine's work stopped at the cap, not at its 20 s
    assert_lasts(got, CAP_S)
    assert (got.errors, got.ended) == (TRUNCATION_REPORTED.get(surface.name, []), normal_end(surface))


# -- cancel ----------------------------------------------------------------------------------------------

# An in-band cancel exists only with voxgate.v1 (`input.cancel`) and a carrier's relayed `clear` (§8, §12).
# vllm-omni's dialect refuses `input.cancel` as unknown_type (§9). ElevenLabs' `close_context` finishes the
# text it was given by design (§11.1: "ElevenLabs lets the flushed audio finish"; docs/agents.md: pipecat
# drops it), and its `flush` speaks what is buffered: neither cancels. A REST request has no message to
# send after its body: a client barges in by going away, which `test_a_client_that_goes_away_...` covers.
# Wyoming has no cancel either: Home Assistant hangs up, as a REST client goes away.


class BargeIn(Protocol):
    @property
    def name(self) -> str: ...

    def barge_in(self, address: str, engine: Scripted, probe: str) -> tuple[list[str], Outcome]: ...


#: The last message a cancel is acknowledged with, where it is not ``audio.cancelled`` (Cartesia's cancel
#: has none: its adapter notes "cancel" and what came before the next context's first message).
ACKS = {DEEPGRAM.name: "Cleared", CARTESIA.name: "cancel"}


@pytest.mark.parametrize("surface", [VOXGATE, TWILIO, TELNYX, CARTESIA, DEEPGRAM], ids=lambda s: s.name)
def test_a_barge_in_stops_the_engine_and_nothing_of_the_utterance_follows_its_ack(
    surface: BargeIn,
) -> None:
    engine = Scripted()
    with serve_engine(engine) as address:
        acks, after = surface.barge_in(address, engine, probe="Hi.")
        engine.settled(3)  # "Hello there.", the held one (closed by the cancel), the probe
    assert engine.finished == 2
    # A carrier is told to drop what it buffered (its own `clear`) right before the acknowledgement (§12).
    if isinstance(surface, SpeechSocket) and surface.carrier:
        assert acks[-2:] == ["clear", "audio.cancelled"]
    elif surface.name == CARTESIA.name:  # at most audio already on its way, then nothing of c1
        assert set(acks[1:]) <= {"chunk"}
    else:
        assert acks[-1] == ACKS.get(surface.name, "audio.cancelled")
    assert after.errors == []
    assert_lasts(after, said("Hi."))  # the probe's audio, and nothing of the cancelled utterance


@pytest.mark.parametrize("surface", every())
def test_a_client_that_goes_away_mid_utterance_stops_the_engine(surface: Surface) -> None:
    engine = Scripted()
    with serve_engine(engine) as address:
        surface.listen(address, f"Hello there. {HELD}", "pcm", lambda got: got.seconds > 0)
        assert engine.holding.wait(TIMEOUT_S)
        engine.settled(2)  # the held stream was closed: nobody is left to hear it
    assert engine.finished == 1


# -- errors ----------------------------------------------------------------------------------------------

#: The end of an exchange refused for its voice: before any audio, the WebSockets close with 1008 and the
#: code as the close reason (§6), ElevenLabs' with its own reason-less 1008, REST answers 400.
REFUSED = {
    **{name: "close 1008 voice_not_found" for name in (VLLM.name, VOXGATE.name, TWILIO.name, TELNYX.name)},
    "el-stream-input": "close 1008",
    "el-multi-stream-input": "close 1008",
    WYOMING_TCP.name: "hang-up",  # a connection's first request refused for its voice: error, then hang-up
    CARTESIA.name: "error",  # the refused message's error says done; the socket stays open
}


@pytest.mark.parametrize("surface", every())
def test_an_unknown_voice_is_voice_not_found_in_each_surfaces_shape(surface: Surface) -> None:
    with serve_engine(Scripted()) as address:
        got = surface.speak(address, "Hi.", voice="nobody")
    expected = [UNCODED] if surface.name == VLLM.name else ["voice_not_found"]
    assert (got.errors, got.ended, got.audio) == (expected, REFUSED.get(surface.name, "http 400"), [])


#: How each wire reports an engine that failed after its first audio (§6 engine_error: never fatal; REST
#: cannot change its status once the body started: SSE ends with an error event, and a body with no place
#: for one is cut off, without its end, so that it cannot be taken for complete).
FAILURE_REPORTED = {
    VLLM.name: ([UNCODED], "close 1000"),
    **{name: (["engine_error"], "close 1000") for name in (VOXGATE.name, TWILIO.name, TELNYX.name)},
    "el-stream-input": (["engine_error"], "close 1000"),
    "el-multi-stream-input": (["engine_error"], "close 1000"),
    "el-rest": ([], "http 200 cut"),
    "el-rest-stream": ([], "http 200 cut"),
    "openai-body": ([], "http 200 cut"),
    "openai-sse": (["engine_error"], "http 200 speech.audio.error"),
    WYOMING_TCP.name: (["engine_error"], "audio-stop"),
    CARTESIA.name: (["engine_error"], "done"),
    DEEPGRAM.name: (["engine_error"], "close 1000"),
    "cartesia-bytes": ([], "http 200 cut"),
    "cartesia-sse": (["engine_error"], "http 200 error"),
    "deepgram-rest": ([], "http 200 cut"),
}


@pytest.mark.parametrize("surface", every())
def test_an_engine_failing_mid_utterance_is_engine_error_and_the_server_goes_on(surface: Surface) -> None:
    fine, failing = "This is fine.", "Then boom here."
    engine = FakeEngine(sample_rate=RATE, chunk_s=CHUNK_S, fail_on="boom", fail_after_chunks=1)
    with serve_engine(engine) as address:
        got = surface.speak(address, f"{fine} {failing}")
        again = surface.speak(address, "Fine again.")
    assert (got.errors, got.ended) == FAILURE_REPORTED[surface.name]
    # The audio made before the failure is delivered: the first sentence, and the failing one's first chunk.
    assert_lasts(got, said(fine) + CHUNK_S)
    assert (again.errors, again.ended) == ([], normal_end(surface))
    assert_lasts(again, said("Fine again."))


# -- formats ---------------------------------------------------------------------------------------------

# Carrier framing forces the carrier's mu-law at 8 kHz whatever the config asks (§12): no other format.
# ElevenLabs offers mp3_* and opus_48000_* (docs/agents.md), no aac or flac.
FORMAT_CASES = [
    pytest.param(surface, fmt, id=f"{surface.name}-{fmt}")
    for surface in SURFACES
    if surface.name not in CARRIERS
    for fmt in surface.formats
]


@pytest.mark.parametrize(("surface", "fmt"), FORMAT_CASES)
def test_every_compressed_format_a_surface_offers_streams_the_engines_audio(
    surface: Surface, fmt: str
) -> None:
    first = "Hello there, this is a test."
    engine = Scripted()
    with serve_engine(engine) as address:
        # It streams: the first sentence decodes while the engine holds the second (else this never returns).
        surface.listen(address, f"{first} {HELD}", fmt, lambda got: got.seconds >= said(first) - LATENCY_S)
        engine.settled(2)
        got = surface.speak(address, first, fmt=fmt)
    assert (got.errors, got.ended) == ([], normal_end(surface))
    assert_lasts(got, said(first))


# -- the text cap ----------------------------------------------------------------------------------------

#: A text over the pending-text cap: refused whole on every surface, in its shape, and nothing is spoken.
TEXT_CAP = 200
OVER_CAP = "Words upon words. " * 12  # 216 characters

#: How each wire ends an exchange whose text was refused: sockets go on (the error is not fatal) and end
#: normally; REST answers 413 before any audio.
CAP_REFUSED = {
    VLLM.name: ([UNCODED], "close 1000"),
    **{name: (["text_backlog_full"], "close 1000") for name in (VOXGATE.name, TWILIO.name, TELNYX.name)},
    "el-stream-input": (["text_backlog_full"], "close 1000"),
    "el-multi-stream-input": (["text_backlog_full"], "close 1000"),
    "el-rest": (["text_backlog_full"], "http 413"),
    "el-rest-stream": (["text_backlog_full"], "http 413"),
    "openai-body": (["text_backlog_full"], "http 413"),
    "openai-sse": (["text_backlog_full"], "http 413"),
    WYOMING_TCP.name: (["text_backlog_full"], "audio-stop"),
    CARTESIA.name: (["text_backlog_full"], "done"),
    DEEPGRAM.name: (["text_backlog_full"], "close 1000"),
    **{
        name: (["text_backlog_full"], "http 413")
        for name in ("cartesia-bytes", "cartesia-sse", "deepgram-rest")
    },
}


@pytest.mark.parametrize("surface", every())
def test_a_text_over_the_pending_text_cap_is_refused_on_every_surface(surface: Surface) -> None:
    engine = Scripted()
    with serve_engine(engine, max_pending_text_chars=TEXT_CAP) as address:
        got = surface.speak(address, OVER_CAP)
        fits = surface.speak(address, "Fine.")
    assert (got.errors, got.ended, got.audio) == (*CAP_REFUSED[surface.name], [])
    assert (fits.errors, fits.ended) == ([], normal_end(surface))
    assert [r.text for r in engine.requests] == ["Fine."]


def test_a_batch_item_over_the_pending_text_cap_fails_and_the_others_are_spoken() -> None:
    engine = Scripted()
    items = [{"input": OVER_CAP}, {"input": "Fine."}]
    with serve_engine(engine, max_pending_text_chars=TEXT_CAP) as address:
        response = httpx.post(
            f"http://{address}/v1/audio/speech/batch",
            json={"items": items, "response_format": "pcm"},
            timeout=TIMEOUT_S,
        )
    answer = response.json()
    assert response.status_code == 200 and (answer["succeeded"], answer["failed"]) == (1, 1)
    refused, spoken = answer["results"]
    assert refused["status"] == "error" and "limit of 200" in refused["error"]
    assert spoken["status"] == "success" and base64.b64decode(spoken["audio_data"])
    assert [r.text for r in engine.requests] == ["Fine."]
