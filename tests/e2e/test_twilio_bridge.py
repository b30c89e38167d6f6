"""A simulated Twilio call against the example bridge (examples/twilio_bridge.py) against a real voxgate.

Three real servers on loopback ports: voxgate (uvicorn), the bridge (uvicorn, built by the code in
docs/agents.md), and a Twilio stand-in that is a websockets client speaking Twilio's Media Streams
messages. The stand-in echoes each mark when it arrives: with the bridge pacing the audio in real
time, arrival is when the audio before the mark has played, which is when Twilio echoes it.
"""

from __future__ import annotations

import base64
import json
import re
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from voxgate.engine.fake import FakeEngine
from voxgate.protocol.audio import decode, mulaw_encode
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from examples.twilio_bridge import Call, SpeechDetector
from tests.conftest import TIMEOUT_S, recv_message, send, serve, serve_engine, session
from tests.speech_check import load_whisper, word_error_rate

SID = "MZ00000000000000000000000000000001"
FRAME_BYTES = 160  # 20 ms of 8 kHz mu-law
FRAME_S = 0.020
AGENTS_MD = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def doc_bridge(voxgate_address: str) -> Any:
    """The bridge app, built by the Python code in docs/agents.md's Twilio section, aimed at our voxgate."""
    doc = AGENTS_MD.read_text()
    section = doc[doc.index("## Twilio / telephony bridge") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    scope: dict[str, Any] = {}
    exec(code.group(1).replace("127.0.0.1:8000", voxgate_address), scope)
    return scope["app"]


def loud_frame() -> bytes:
    """20 ms of a 300 Hz tone at -10 dBFS: speech-like energy for the bridge's detector."""
    t = np.arange(FRAME_BYTES) / 8000.0
    return mulaw_encode((0.3 * np.sin(2 * np.pi * 300.0 * t)).astype(np.float32))


@dataclass
class Twilio:
    """Twilio's side of one bidirectional Media Stream, as a client of the bridge."""

    ws: ClientConnection
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    sequence: int = 0

    def send(self, event: str, **body: object) -> None:
        self.sequence += 1
        self.ws.send(json.dumps({"event": event, "sequenceNumber": str(self.sequence), **body}))

    def start(self, reply: str) -> None:
        self.ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        start = {
            "streamSid": SID,
            "accountSid": "AC0",
            "callSid": "CA0",
            "tracks": ["inbound"],
            "customParameters": {"reply": reply},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        }
        self.send("start", streamSid=SID, start=start)

    def speak(self, frames: int) -> None:
        """The caller talks: inbound media with speech-like energy."""
        for chunk in range(frames):
            payload = base64.b64encode(loud_frame()).decode()
            media = {"track": "inbound", "chunk": str(chunk), "timestamp": "0", "payload": payload}
            self.send("media", streamSid=SID, media=media)

    def pump(self, until: Callable[[], bool]) -> None:
        """Receive (echoing marks, as Twilio does once their audio has played) until ``until()``."""
        deadline = time.monotonic() + TIMEOUT_S
        while not until():
            assert time.monotonic() < deadline, "the call did not get there"
            try:
                text = self.ws.recv(timeout=0.05)
            except TimeoutError:
                continue
            msg = json.loads(text)
            self.received.append((time.perf_counter(), msg))
            if msg["event"] == "mark":
                self.send("mark", streamSid=SID, mark=msg["mark"])

    def hang_up(self) -> None:
        """Twilio's ``stop``, then read what is left until the bridge closes."""
        self.send("stop", streamSid=SID, stop={"accountSid": "AC0", "callSid": "CA0"})
        deadline = time.monotonic() + TIMEOUT_S
        with pytest.raises(ConnectionClosed):
            while time.monotonic() < deadline:
                self.received.append((time.perf_counter(), json.loads(self.ws.recv(timeout=TIMEOUT_S))))

    def events(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, m) for t, m in self.received if m["event"] == kind]


@contextmanager
def call(voxgate_address: str, reply: str, **options: object) -> Iterator[tuple[Twilio, Call]]:
    """A call through the bridge of docs/agents.md; yields Twilio's side and the bridge's record of it.

    ``options`` are more ``session.config`` fields for voxgate.
    """
    app = doc_bridge(voxgate_address)
    app.state.config.options = options
    with serve(app) as bridge, connect(f"ws://{bridge}/twilio", open_timeout=TIMEOUT_S) as ws:
        twilio = Twilio(ws)
        twilio.start(reply)
        deadline = time.monotonic() + TIMEOUT_S
        while not app.state.calls:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield twilio, app.state.calls[0]


def heard_text(bridge: Call) -> str:
    return " ".join(str(p["text"]) for p in bridge.heard)


def test_voxgate_writes_twilio_media_and_a_mark_after_each_sentence() -> None:
    with serve_engine(FakeEngine()) as address:
        with session(address, framing="twilio", stream_sid=SID, response_format="pcm", frame_ms=40) as ws:
            send(ws, type="input.text", text="Hello there. How are you?")
            send(ws, type="input.done")
            got: list[dict[str, Any]] = []
            while not got or got[-1].get("type") != "session.done":
                got.append(recv_message(ws))
            send(ws, event="mark", sequenceNumber="9", streamSid=SID, mark={"name": "utt-0-seg-0"})
            position = recv_message(ws)
    media = [m for m in got if m.get("event") == "media"]
    assert media and all(m["streamSid"] == SID for m in media)
    assert {len(base64.b64decode(m["media"]["payload"])) for m in media} == {FRAME_BYTES}
    kinds = [m.get("event") or m.get("type") for m in got if m.get("event") != "media"]
    assert kinds == ["audio.start", "mark", "audio.done"] * 2 + ["session.done"]
    marks = [m["mark"]["name"] for m in got if m.get("event") == "mark"]
    assert marks == ["utt-0-seg-0", "utt-0-seg-1"]
    start, done = got[0], got[-1]
    assert (start["format"], start["sample_rate"]) == ("mulaw", 8000)  # forced, whatever was asked
    assert len(media) == sum(-(-int(d["duration_ms"]) // 20) for d in got if d.get("type") == "audio.done")
    assert position["type"] == "playback.position" and position["text"] == "Hello there."
    assert position["mark"] == "utt-0-seg-0" and position["played_ms"] == position["duration_ms"] > 0
    assert done["audio_ms"] > position["played_ms"]


def test_input_cancel_sends_twilio_a_clear_before_audio_cancelled_and_forgets_marks_out() -> None:
    engine = FakeEngine(chunk_s=0.05, delay_s=0.05)
    with serve_engine(engine) as address, session(address, framing="twilio", stream_sid=SID) as ws:
        send(ws, type="input.text", text="Short one. Then a long sentence that takes a while to say.")
        send(ws, type="input.done")
        while recv_message(ws).get("event") != "mark":
            pass
        send(ws, type="input.cancel")
        after: list[dict[str, Any]] = []
        while not after or after[-1].get("type") != "audio.cancelled":
            after.append(recv_message(ws))
        # Twilio echoes the marks a clear dropped: that audio was not heard, so no playback.position
        # (the commit's answer comes next, in order, with nothing before it).
        send(ws, event="mark", streamSid=SID, mark={"name": "utt-0-seg-0"})
        send(ws, type="input.commit", commit_id="after-the-echo")
        answer = recv_message(ws)
    clear = after.index({"event": "clear", "streamSid": SID})
    assert all(m.get("event") != "media" for m in after[clear:])
    assert after[clear + 1]["type"] == "audio.cancelled"
    assert answer["type"] == "input.committed" and answer["commit_id"] == "after-the-echo"


def test_twilio_framing_needs_a_stream_sid_and_stays_fixed() -> None:
    with serve_engine(FakeEngine()) as address:
        with session(address, framing="twilio", stream_sid=SID) as ws:
            send(ws, type="session.config", framing="twilio", stream_sid="MZ-another")
            refused = recv_message(ws)
            send(ws, type="session.config", framing="twilio", stream_sid=SID, speed=1.5)
            again = recv_message(ws)
        with session(address) as ws:
            send(ws, type="session.config", framing="twilio")
            late = recv_message(ws)
        with pytest.raises(AssertionError, match="stream_sid"), session(address, framing="twilio"):
            pass
    assert refused["code"] == "invalid_message" and refused["field"] == "$.framing" and not refused["fatal"]
    assert again["type"] == "session.ready" and again["config"]["framing"] == "twilio"
    assert late["field"] == "$.framing"


def test_a_simulated_call_gets_real_time_media_and_marks_report_what_was_heard() -> None:
    reply = "Hello there, thanks for calling. Your order has shipped today."
    # Sentences only (no eager first fragment): two marks, whatever the machine's load.
    with (
        serve_engine(FakeEngine()) as address,
        call(address, reply, split_granularity="sentence") as (
            twilio,
            bridge,
        ),
    ):
        twilio.pump(lambda: heard_text(bridge) == reply)
        twilio.hang_up()
    media = twilio.events("media")
    payloads = [base64.b64decode(m["media"]["payload"]) for _, m in media]
    assert len(payloads) > 100 and {len(p) for p in payloads} == {FRAME_BYTES}
    assert all(m["streamSid"] == SID for _, m in twilio.received)
    # Real-time pace is behaviour, not speed: voxgate makes the audio much faster than real time, so
    # frames must be held back to arrive one per 20 ms. A busy machine can only stretch the gaps, so
    # the lower bound on the whole span cannot flake; the median gap, on the bridge's own send clock,
    # is bounded loosely on both sides (a paced stream, not a burst, and not a stall).
    arrivals = [t for t, _ in media]
    assert arrivals[-1] - arrivals[0] >= 0.8 * (len(media) - 1) * FRAME_S
    sends = [t for kind, t in bridge.sent if kind == "media"]
    median_gap = statistics.median(b - a for a, b in zip(sends, sends[1:], strict=False))
    assert 0.75 * FRAME_S <= median_gap <= 3 * FRAME_S, median_gap
    # Each mark echoed and voxgate reported it, in order, with the sentence's text.
    marks = [m["mark"]["name"] for _, m in twilio.events("mark")]
    assert [p["mark"] for p in bridge.heard] == marks == [f"utt-0-seg-{i}" for i in range(len(marks))]
    assert len(marks) >= 2
    # A mark comes after all its sentence's audio: played_ms counts the frames before it (the last
    # frame of a sentence is padded to 20 ms).
    for position in bridge.heard:
        before = next(
            i for i, (_, m) in enumerate(twilio.received) if m.get("mark", {}).get("name") == position["mark"]
        )
        frames = sum(1 for _, m in twilio.received[:before] if m["event"] == "media")
        assert frames * 20 - 20 * len(marks) < float(str(position["played_ms"])) <= frames * 20


def test_the_caller_talking_clears_twilio_and_media_stops_at_once() -> None:
    reply = "This is the first thing I say. Then I go on for quite a while about something else. And more."
    engine = FakeEngine(chunk_s=0.25, delay_s=0.15)  # still synthesizing when the caller barges in
    with (
        serve_engine(engine) as address,
        call(address, reply, split_granularity="sentence") as (
            twilio,
            bridge,
        ),
    ):
        twilio.pump(lambda: len(bridge.heard) >= 1)  # the first sentence has played
        twilio.speak(SpeechDetector().frames + 1)
        twilio.pump(lambda: bool(twilio.events("clear")))
        twilio.pump(bridge.cancelled.is_set)  # voxgate confirmed: nothing of the reply can follow
        twilio.hang_up()
    events = [m["event"] for _, m in twilio.received]
    assert events.count("clear") == 1
    cleared = events.index("clear")
    # After the clear, no media at all, in the order Twilio gets them; well inside "stop within 100 ms".
    assert "media" not in events[cleared:]
    # On the bridge's own clock: the first message after it detected speech is the clear, and it
    # sent no media after it (it drops its queue and what voxgate wrote before taking the cancel).
    [speech_at] = bridge.speech_at
    after_speech = [kind for kind, t in bridge.sent if t >= speech_at]
    assert after_speech[0] == "clear" and "media" not in after_speech
    # What the caller heard is the first sentence only; the rest was cancelled in voxgate too.
    assert heard_text(bridge) == "This is the first thing I say."
    deadline = time.monotonic() + TIMEOUT_S
    while engine.closed < engine.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.closed == engine.started and engine.finished < engine.started


@pytest.mark.slow
def test_piper_speech_through_the_bridge_is_intelligible(piper_gateway: str) -> None:
    sentence = "Please hold while I transfer your call to a specialist."
    # seed: Piper runs noise-free, so Whisper hears the same audio every run.
    with call(piper_gateway, sentence, seed=7) as (twilio, bridge):
        twilio.pump(lambda: heard_text(bridge) == sentence)
        twilio.hang_up()
    audio = decode(
        b"".join(base64.b64decode(m["media"]["payload"]) for _, m in twilio.events("media")), "mulaw"
    )
    error, hypothesis = word_error_rate(load_whisper(), audio.astype(np.float32), 8000, sentence)
    assert error < 0.15, hypothesis


def test_the_speech_detector_wants_a_run_of_loud_frames_and_fires_once() -> None:
    detector = SpeechDetector(frames=3)
    silence = mulaw_encode(np.zeros(FRAME_BYTES, dtype=np.float32))
    click = [loud_frame(), silence]
    assert [detector.feed(f) for f in click * 3] == [False] * 6
    assert [detector.feed(loud_frame()) for _ in range(5)] == [False, False, True, False, False]
    assert detector.feed(b"") is False
