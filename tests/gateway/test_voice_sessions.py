"""Uploaded voices in WebSocket sessions: cloning engines get the reference, others refuse by name."""

from __future__ import annotations

import io

import httpx
import numpy as np
import soundfile
from voxgate.engine.fake import FakeEngine

from tests.conftest import recv, recv_until, send, serve_engine, session, voxgate_connect

URL = "/v1/audio/speech/stream"


def upload(address: str, name: str, headers: dict[str, str] | None = None) -> None:
    t = np.arange(2 * 16000) / 16000
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), 16000, format="WAV")
    response = httpx.post(
        f"http://{address}/v1/audio/voices",
        files={"audio_sample": ("clip.wav", buffer.getvalue(), "audio/wav")},
        data={"name": name, "consent": "I own this voice", "ref_text": "A reference clip."},
        headers=headers or {},
    )
    assert response.status_code == 200, response.text


def dominant_hz(frames: list[bytes], rate: int) -> float:
    samples = np.frombuffer(b"".join(frames), "<i2") / 32768.0
    return float(np.argmax(np.abs(np.fft.rfft(samples))) * rate / len(samples))


def test_uploaded_voice_on_an_engine_that_cannot_clone_is_refused_by_name() -> None:
    with serve_engine(FakeEngine(clones=False)) as address:
        upload(address, "maria")
        with voxgate_connect(f"ws://{address}{URL}") as ws:
            send(ws, type="session.config", voice="maria")
            error = recv(ws)
    assert isinstance(error, dict) and error["code"] == "voice_requires_cloning" and error["fatal"] is True
    assert (
        "maria" in str(error["message"])
        and "fake" in str(error["message"])
        and "remote" in str(error["message"])
    )


def test_uploaded_voice_reaches_a_cloning_engine_as_a_reference() -> None:
    engine = FakeEngine(clones=True)
    with serve_engine(engine) as address:
        upload(address, "maria")
        with session(address, voice="maria", sample_rate=16000) as ws:
            send(ws, type="input.text", text="Speak as Maria.")
            send(ws, type="input.done")
            got = recv_until(ws, "session.done")
    reference = engine.requests[-1].reference
    assert reference is not None and reference.name == "maria" and reference.ref_text == "A reference clip."
    assert reference.audio is not None and len(reference.audio) == 2 * 16000
    assert abs(dominant_hz(got.frames(), 16000) - 330) < 5  # the fake's "cloned" tone


def test_uploaded_voices_belong_to_their_key() -> None:
    with serve_engine(FakeEngine(clones=True), api_keys=("alice", "bob")) as address:
        upload(address, "private", headers={"Authorization": "Bearer alice"})
        with voxgate_connect(f"ws://{address}{URL}?api_key=bob") as ws:
            send(ws, type="session.config", voice="private")
            refused = recv(ws)
        with voxgate_connect(f"ws://{address}{URL}?api_key=alice") as ws:
            send(ws, type="session.config", voice="private")
            accepted = recv(ws)
    assert isinstance(refused, dict) and refused["code"] == "voice_not_found"
    assert isinstance(accepted, dict) and accepted["type"] == "session.ready"


def test_unknown_voice_names_the_available_ones() -> None:
    with serve_engine(FakeEngine()) as address, voxgate_connect(f"ws://{address}{URL}") as ws:
        send(ws, type="session.config", speaker="nobody")
        error = recv(ws)
    assert isinstance(error, dict) and error["code"] == "voice_not_found" and error["field"] == "$.speaker"
    assert "tone" in str(error["message"])
