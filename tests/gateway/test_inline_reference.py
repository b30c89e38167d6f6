"""``ref_audio`` + ``ref_text`` sent with a request: one voice reference, for cloning engines."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
import soundfile
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.middleware.ratelimit import REFERENCES_BURST
from voxgate.gateway.voices import catalog as catalog_module
from voxgate.gateway.voices import clips

from tests.conftest import recv_message, recv_until, send, serve_engine, session, voxgate_connect

URL = "/v1/audio/speech/stream"


def clip(seconds: float = 2.0, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


def data_url(data: bytes) -> str:
    return "data:audio/wav;base64," + base64.b64encode(data).decode()


@pytest.mark.parametrize("encode", [data_url, lambda d: base64.b64encode(d).decode()])
def test_session_ref_audio_reaches_a_cloning_engine(encode: object) -> None:
    engine = FakeEngine(clones=True)
    with serve_engine(engine) as address:
        with session(address, ref_audio=encode(clip()), ref_text="Reference words.") as ws:  # type: ignore[operator]
            send(ws, type="input.text", text="Say it in that voice.")
            send(ws, type="input.done")
            recv_until(ws, "session.done")
    reference = engine.requests[-1].reference
    assert (
        reference is not None and reference.ref_text == "Reference words." and reference.sample_rate == 16000
    )
    assert reference.audio is not None and len(reference.audio) == 32000
    assert "ref_audio" not in engine.requests[-1].options


@pytest.mark.parametrize(
    ("config", "code", "field"),
    [
        ({"ref_audio": "not base64 at all!"}, "invalid_ref_audio", "$.ref_audio"),
        ({"ref_audio": "https://example.com/voice.wav"}, "invalid_ref_audio", "$.ref_audio"),
        ({"ref_audio": data_url(clip(0.3))}, "invalid_ref_audio", "$.ref_audio"),
        ({"ref_text": "words without a clip"}, "invalid_ref_audio", "$.ref_text"),
    ],
)
def test_bad_ref_audio_is_refused_by_name(config: dict[str, object], code: str, field: str) -> None:
    with serve_engine(FakeEngine(clones=True)) as address, session(address) as ws:
        send(ws, type="session.config", **config)
        error = recv_message(ws)
    assert error["code"] == code and error["field"] == field and error["fatal"] is False


def test_ref_audio_on_an_engine_that_cannot_clone() -> None:
    with serve_engine(FakeEngine(clones=False)) as address, voxgate_connect(f"ws://{address}{URL}") as ws:
        send(ws, type="session.config", ref_audio=data_url(clip()), ref_text="words")
        error = recv_message(ws)
    assert error["code"] == "voice_requires_cloning" and error["field"] == "$.ref_audio"


def test_rest_ref_audio() -> None:
    engine = FakeEngine(clones=True)
    with serve_engine(engine) as address:
        ok = httpx.post(
            f"http://{address}/v1/audio/speech",
            timeout=30,
            json={
                "input": "Hello.",
                "response_format": "pcm",
                "ref_audio": data_url(clip()),
                "ref_text": "Words.",
            },
        )
        bad = httpx.post(
            f"http://{address}/v1/audio/speech", timeout=30, json={"input": "Hello.", "ref_audio": "%%%"}
        )
    assert ok.status_code == 200 and engine.requests[-1].reference is not None
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "ref_audio"


def test_ref_audio_is_not_decoded_for_an_engine_that_cannot_clone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cloning check comes before the decode (issue 18 #18: 0.45-0.5 s of CPU per refused config)."""
    from voxgate.gateway.voices import catalog

    decoded: list[str] = []
    real = clips.inline_reference

    def spy(ref_audio: str, ref_text: str | None, max_rate: int) -> object:
        decoded.append(ref_audio[:16])
        return real(ref_audio, ref_text, max_rate)

    monkeypatch.setattr(catalog, "inline_reference", spy)
    with serve_engine(FakeEngine(clones=False)) as address:
        for _ in range(3):  # a first config refused is fatal: a client repeats it by reconnecting
            with voxgate_connect(f"ws://{address}{URL}") as ws:
                send(ws, type="session.config", ref_audio=data_url(clip(20.0)), ref_text="words")
                error = recv_message(ws)
                assert error["code"] == "voice_requires_cloning"
        rest = httpx.post(
            f"http://{address}/v1/audio/speech",
            timeout=30,
            json={"input": "Hello.", "ref_audio": data_url(clip()), "ref_text": "Words."},
        )
    assert rest.status_code == 400 and rest.json()["error"]["code"] == "voice_requires_cloning"
    assert decoded == []
    # A cloning engine still gets the clip decoded, once per request.
    with serve_engine(FakeEngine(clones=True)) as address, session(address, ref_audio=data_url(clip())):
        pass
    assert len(decoded) == 1


def test_a_session_that_resends_clips_is_rate_limited_and_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each inline clip is decoded on the process's few decode threads: past the session's burst, a
    config carrying one is refused (non-fatal ``rate_limited``, nothing decoded) and the session goes on
    with its config; one without a clip is still taken."""
    decoded: list[str] = []
    real = clips.inline_reference

    def counting(ref_audio: str, ref_text: str | None, max_rate: int) -> object:
        decoded.append(ref_audio)
        return real(ref_audio, ref_text, max_rate)

    monkeypatch.setattr(catalog_module, "inline_reference", counting)
    with serve_engine(FakeEngine(clones=True)) as address, session(address, ref_audio=data_url(clip())) as ws:
        for _ in range(REFERENCES_BURST - 1):
            send(ws, type="session.config", ref_audio=data_url(clip()))
            assert recv_message(ws)["type"] == "session.ready"
        send(ws, type="session.config", ref_audio=data_url(clip()))
        error = recv_message(ws)
        assert error["type"] == "error" and error["code"] == "rate_limited", error
        assert error["field"] == "$.ref_audio" and error["fatal"] is False
        send(ws, type="session.config", speed=1.5)
        assert recv_message(ws)["type"] == "session.ready"
        send(ws, type="input.text", text="Still speaking.")
        send(ws, type="input.done")
        assert recv_until(ws, "session.done").frames()
    assert len(decoded) == REFERENCES_BURST
