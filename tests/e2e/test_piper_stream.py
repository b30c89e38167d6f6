"""Real Piper behind a real uvicorn server, driven by the websockets client."""

from __future__ import annotations

import concurrent.futures
import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile
from voxgate.protocol.audio import decode
from voxgate.protocol.frames import HEADER_BYTES, FrameHeader

from tests.conftest import TIMEOUT_S, Received, recv, recv_until, send, session

pytestmark = pytest.mark.slow

TOKENS = ["Hel", "lo", " th", "ere", ".", " The", " gate", "way", " speaks", " while", " you", " type", "."]


def speak(ws: object, tokens: list[str]) -> Received:
    for token in tokens:
        send(ws, type="input.text", text=token)  # type: ignore[arg-type]
    send(ws, type="input.done")  # type: ignore[arg-type]
    return recv_until(ws, "session.done")  # type: ignore[arg-type]


def rms_dbfs(samples: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(np.square(samples))) + 1e-12))


@pytest.mark.parametrize(("fmt", "rate"), [("pcm", None), ("f32", 24000), ("mulaw", 8000), ("wav", 16000)])
def test_streamed_tokens_become_speech_in_each_format(piper_gateway: str, fmt: str, rate: int | None) -> None:
    config: dict[str, object] = {"response_format": fmt, "frame_header": True, "stream_audio": True}
    if rate:
        config["sample_rate"] = rate
    with session(piper_gateway, **config) as ws:
        got = speak(ws, TOKENS)
    out_rate = rate or 24000  # the default output rate, resampled from Piper's 22050
    starts = got.messages("audio.start")
    assert [s["sentence_text"] for s in starts] == ["Hello there.", "The gateway speaks while you type."]
    assert all(s["sample_rate"] == out_rate for s in starts)
    frames = got.frames()
    headers = [FrameHeader.parse(f) for f in frames]
    assert [h.frame_index for h in headers] == list(range(len(frames)))
    assert [h.sentence_index for h in headers] == sorted(h.sentence_index for h in headers)
    payload = b"".join(f[HEADER_BYTES:] for f in frames)
    if fmt == "wav":
        assert payload[:4] == b"RIFF"
        payload = payload[44:]
    samples = decode(payload, "pcm" if fmt == "wav" else fmt)  # type: ignore[arg-type]
    position = 0
    for header, frame in zip(headers, frames, strict=True):
        assert header.start_sample == position
        width = {"pcm": 2, "f32": 4, "mulaw": 1, "wav": 2}[fmt]
        position += (
            len(frame) - HEADER_BYTES - (44 if fmt == "wav" and header.frame_index == 0 else 0)
        ) // width
    assert position == len(samples)
    seconds = len(samples) / out_rate
    assert 1.5 < seconds < 6.0, seconds  # two short sentences at about 170 words a minute
    assert -30 < rms_dbfs(samples) < -6  # speech, not silence and not clipping noise
    assert got.messages("session.done")[0]["audio_ms"] == pytest.approx(seconds * 1000, abs=1)


def test_cancel_mid_utterance_then_second_utterance(piper_gateway: str) -> None:
    paragraph = " ".join(["This sentence is here to keep the engine busy for a little while."] * 8)
    with session(piper_gateway, frame_header=True, split_granularity="sentence") as ws:
        send(ws, type="input.text", text=paragraph)
        send(ws, type="input.done")
        while not isinstance(recv(ws), bytes):
            pass
        send(ws, type="input.cancel")
        cancelled = recv_until(ws, "audio.cancelled")
        after = speak(ws, ["Second", " utterance."])
    assert len(cancelled.messages("audio.done")) < 8  # stopped well before the paragraph's end
    assert after.frames() and all(FrameHeader.parse(f).utterance_index == 1 for f in after.frames())
    assert all(m.get("utterance_index") in (1, None) for m in after.messages())


def test_concurrent_sessions(piper_gateway: str) -> None:
    def one(i: int) -> int:
        with session(piper_gateway) as ws:
            got = speak(ws, [f"Session number {i} is speaking now."])
        return sum(len(f) for f in got.frames())

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        sizes = list(pool.map(one, range(4)))
    assert all(size > 22050 for size in sizes)  # each got over half a second of audio


def test_seed_gives_identical_audio_and_speed_shortens_it(piper_gateway: str) -> None:
    def audio(**config: object) -> bytes:
        with session(piper_gateway, **config) as ws:
            return b"".join(speak(ws, ["Same text, same seed, same audio."]).frames())

    first, second = audio(seed=7), audio(seed=7)
    fast = audio(seed=7, speed=2.0)
    assert first == second
    assert 0.35 < len(fast) / len(first) < 0.65


def test_bad_inputs_keep_the_session_usable(piper_gateway: str) -> None:
    with session(piper_gateway) as ws:
        for raw, code in [
            ("{oops", "invalid_json"),
            ('{"type":"nope"}', "unknown_type"),
            ('{"type":"session.config","x_vector_only_mode":true}', "unsupported_option"),
            ('{"type":"session.config","language":"fr"}', "unsupported_option"),
        ]:
            ws.send(raw)
            error = recv(ws)
            assert isinstance(error, dict) and error["code"] == code and error["fatal"] is False
        assert speak(ws, ["Still fine."]).frames()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_voxgate_serve_command(tmp_path: Path) -> None:
    """The console script the README starts: serve, become ready, speak, stop on SIGINT."""
    port = _free_port()
    exe = Path(sys.executable).with_name("voxgate")
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [str(exe), "serve", "--port", str(port), "--engine", "piper"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ},
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        with session(f"127.0.0.1:{port}", response_format="wav", stream_audio=False) as ws:
            got = speak(ws, ["Hello from the command line."])
        data, rate = soundfile.read(io.BytesIO(got.frames()[0]))
        assert rate == 24000 and len(data) > rate // 2
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(TIMEOUT_S) == 0
        log.close()
