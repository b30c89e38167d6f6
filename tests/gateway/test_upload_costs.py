"""Uploads cost what they are worth: a clip is refused from its header, decoded block by block into its
canonical form (mono, at most 24 kHz) and stored as 16-bit PCM, within a per-key disk quota; inline
``ref_audio`` takes the same path.

The clip of the issue: a 46 KB FLAC of 29.9 s of silence at 192 kHz with 8 channels. Decoded whole it is
184 MB of float32 (the old server took 196 MB for it and stored 23 MB).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import safetensors.numpy
import soundfile
from safetensors import safe_open
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.app import create_app
from voxgate.gateway.middleware.http import Rejected
from voxgate.gateway.settings import Settings
from voxgate.gateway.voices import clips
from voxgate.gateway.voices.catalog import Catalog
from voxgate.gateway.voices.clips import decode_audio
from voxgate.gateway.voices.local import FORMAT, PUBLIC_DIR, VoiceQuotaExceeded, VoiceStore

from tests.conftest import TIMEOUT_S, recv_message, recv_until, send, serve_engine, session, voxgate_connect

URL = "/v1/audio/voices"
# The issue's budget for that clip: server memory to take it in, and disk to keep it.
MEMORY_BUDGET_BYTES = 40 << 20
DISK_BUDGET_BYTES = 2 << 20


def issue_flac(seconds: float = 29.9, rate: int = 192000, channels: int = 8) -> bytes:
    """Silence as FLAC, written one second at a time so the test itself stays small."""
    buffer = io.BytesIO()
    second = np.zeros((rate, channels), np.int16)
    with soundfile.SoundFile(buffer, "w", rate, channels, "PCM_16", format="FLAC") as f:
        left = int(seconds * rate)
        while left > 0:
            f.write(second[: min(rate, left)])
            left -= rate
    return buffer.getvalue()


def claiming(flac: bytes, frames: int) -> bytes:
    """``flac`` with its STREAMINFO's total sample count (36 bits after rate, channels and depth) replaced."""
    data = bytearray(flac)
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # the first metadata block is STREAMINFO
    fields = int.from_bytes(data[18:26], "big")
    data[18:26] = ((fields & ~((1 << 36) - 1)) | frames).to_bytes(8, "big")
    return bytes(data)


def wav(seconds: float, rate: int = 16000, channels: int = 1, seed: int = 0) -> bytes:
    pcm = np.random.default_rng(seed).integers(-8000, 8000, (int(seconds * rate), channels), dtype=np.int16)
    buffer = io.BytesIO()
    soundfile.write(buffer, pcm, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def upload(client: httpx.Client, name: str, audio: bytes) -> httpx.Response:
    files = {"audio_sample": ("clip.bin", audio, "application/octet-stream")}
    return client.post(URL, data={"name": name, "consent": "the speaker agreed"}, files=files)


def error_of(response: httpx.Response) -> dict[str, object]:
    error: dict[str, object] = response.json()["error"]
    return error


@pytest.fixture(scope="module")
def flac() -> bytes:
    return issue_flac()


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Any read of samples fails the test: a refusal must come from the header alone."""
    reads: list[int] = []

    def read(*args: object, **kwargs: object) -> object:
        reads.append(1)
        raise AssertionError("samples were decoded")

    monkeypatch.setattr(soundfile.SoundFile, "read", read)
    monkeypatch.setattr(soundfile.SoundFile, "blocks", read)
    monkeypatch.setattr(soundfile.SoundFile, "buffer_read", read)
    yield reads


# --- decode -----------------------------------------------------------------------------------------


def test_the_issue_flac_is_small_and_decodes_in_little_memory(flac: bytes) -> None:
    assert len(flac) < 60_000  # the issue's 46 KB file, give or take the encoder
    tracemalloc.start()
    try:
        audio, rate, mime = decode_audio(flac)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # numpy reports its buffers to tracemalloc: the old whole-file read peaked at 207 MB here.
    assert peak < MEMORY_BUDGET_BYTES, f"decoding took {peak / 1e6:.1f} MB"
    assert (rate, mime, audio.dtype, audio.ndim) == (24000, "audio/flac", np.dtype(np.float32), 1)
    assert len(audio) == pytest.approx(29.9 * 24000, abs=2)
    assert not audio.any()


def test_canonical_form_mixes_down_and_resamples() -> None:
    rate = 48000
    t = np.arange(2 * rate) / rate
    tone = 0.25 * np.sin(2 * np.pi * 440 * t)
    stereo = np.stack([tone, tone], axis=1)  # the mix-down of two equal channels is the channel
    buffer = io.BytesIO()
    soundfile.write(buffer, stereo.astype(np.float32), rate, format="WAV", subtype="FLOAT")
    audio, got_rate, _ = decode_audio(buffer.getvalue())
    assert got_rate == 24000 and len(audio) == 48000
    expected = 0.25 * np.sin(2 * np.pi * 440 * np.arange(48000) / 24000)
    # Away from the edges, where the resampler's filter starts and ends, the tone is unchanged.
    np.testing.assert_allclose(audio[1000:-1000], expected[1000:-1000], atol=1e-3)


@pytest.mark.parametrize(
    ("make", "code", "words"),
    [
        (lambda: claiming(issue_flac(2.0, 16000, 1), 10**9), "invalid_duration", "header says 62500 s"),
        (lambda: claiming(issue_flac(2.0, 192000, 8), 10**9), "invalid_duration", "header says 5208.33 s"),
        (lambda: wav(31.0, rate=8000), "invalid_duration", "header says 31 s"),
        (lambda: wav(0.5), "invalid_duration", "header says 0.5 s"),
        (lambda: wav(1.5, channels=9), "invalid_audio", "9 channels"),
        (lambda: claiming(issue_flac(2.0, 16000, 1), 0), "invalid_audio", "does not state its length"),
    ],
    ids=[
        "flac-claims-1e9-frames",
        "issue-flac-claims-1e9-frames",
        "31s",
        "half-second",
        "9-channels",
        "no-length",
    ],
)
def test_the_header_is_refused_before_any_decoding(
    no_decoding: list[int], make: object, code: str, words: str
) -> None:
    data = make()  # type: ignore[operator]
    with pytest.raises(Rejected) as caught:
        decode_audio(data)
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, code, "audio_sample")
    assert words in caught.value.message and not no_decoding


def test_a_file_shorter_than_its_header_is_refused() -> None:
    data = claiming(issue_flac(2.0, 16000, 1), 16000 * 5)  # says 5 s, holds 2
    with pytest.raises(Rejected) as caught:
        decode_audio(data)
    assert (caught.value.status, caught.value.code) == (415, "unsupported_audio")


# --- storage ----------------------------------------------------------------------------------------


def test_the_issue_flac_is_stored_canonical_and_small(tmp_path: Path, flac: bytes) -> None:
    with (
        serve_engine(FakeEngine(clones=True), voices_dir=str(tmp_path)) as address,
        httpx.Client(base_url=f"http://{address}", timeout=TIMEOUT_S) as client,
    ):
        response = upload(client, "silence", flac)
        assert response.status_code == 200, response.text
        voice = response.json()["voice"]
        (path,) = (tmp_path / PUBLIC_DIR).glob("*.safetensors")
        assert voice["file_size"] == path.stat().st_size < DISK_BUDGET_BYTES
        assert (voice["sample_rate"], voice["mime_type"]) == (24000, "audio/flac")
        assert voice["duration_s"] == pytest.approx(29.9, abs=1e-3)
    with safe_open(str(path), framework="numpy") as f:
        assert list(f.keys()) == ["audio"]
        tensor = f.get_slice("audio")
        assert (tensor.get_dtype(), len(tensor.get_shape())) == ("I16", 1)  # mono 16-bit PCM
        assert f.metadata()["sample_rate"] == "24000"


def test_sixteen_bit_sources_are_kept_exactly_and_louder_ones_clipped(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    exact = (np.arange(-32768, 32768, 7) / 32768).astype(np.float32)
    store.save("", "exact", audio=exact, sample_rate=8000, consent="c")  # 1.17 s: a clip is 1 to 30 s
    data = store.get("", "exact")
    assert data is not None and data.audio is not None and data.audio.dtype == np.float32
    np.testing.assert_array_equal(data.audio, exact)
    loud_clip = np.zeros(16000, np.float32)
    loud_clip[:3] = [1.5, -1.5, 0.5]
    store.save("", "loud", audio=loud_clip, sample_rate=16000, consent="c")
    loud = store.get("", "loud")
    assert loud is not None and loud.audio is not None
    np.testing.assert_array_equal(loud.audio[:3], np.array([32767 / 32768, -1.0, 0.5], np.float32))


def legacy_voice(folder: Path, name: str, audio: npt.NDArray[np.float32], rate: int) -> None:
    """A voice file as the earlier store wrote it: float32 audio at the upload's own rate."""
    folder.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT,
        "name": name,
        "owner": "",
        "kind": "audio",
        "consent": "given",
        "created_at": repr(time.time()),
        "sample_rate": str(rate),
        "mime_type": "audio/wav",
    }
    file_name = hashlib.sha256(name.casefold().encode()).hexdigest()[:32] + ".safetensors"
    (folder / file_name).write_bytes(safetensors.numpy.save({"audio": audio}, meta))


def test_float32_voices_of_earlier_versions_still_load(tmp_path: Path) -> None:
    audio = np.random.default_rng(1).uniform(-0.5, 0.5, 48000 * 2).astype(np.float32)
    legacy_voice(tmp_path / PUBLIC_DIR, "old", audio, 48000)
    store = VoiceStore(tmp_path)
    assert [(v.name, v.sample_rate, v.duration_s) for v in store.list("")] == [("old", 48000, 2.0)]
    engine = FakeEngine(clones=True)
    resolved = asyncio.run(Catalog([engine], store=store).resolve("", "old"))
    reference = resolved.reference
    assert reference is not None and reference.audio is not None and reference.sample_rate == 48000
    assert reference.audio.dtype == np.float32
    np.testing.assert_array_equal(reference.audio, audio)


def test_stored_voices_reach_engines_as_float32(tmp_path: Path) -> None:
    engine = FakeEngine(clones=True)
    with (
        serve_engine(engine, voices_dir=str(tmp_path)) as address,
        httpx.Client(base_url=f"http://{address}", timeout=TIMEOUT_S) as client,
    ):
        assert upload(client, "mine", wav(1.5, rate=44100, channels=2)).status_code == 200
        with session(address, voice="mine") as ws:
            send(ws, type="input.text", text="Hello there.")
            send(ws, type="input.done")
            recv_until(ws, "session.done")
    reference = engine.requests[-1].reference
    assert reference is not None and reference.audio is not None
    assert (reference.audio.dtype, reference.sample_rate, len(reference.audio)) == (
        np.dtype(np.float32),
        24000,
        36000,
    )


def test_a_deployment_may_keep_clips_up_to_48_khz(tmp_path: Path) -> None:
    """``max_clip_rate_hz``: a 44.1 kHz upload and inline clip are kept at their own rate, a 96 kHz one
    comes down to 48 kHz; the voice file and the engine's reference say so, samples intact."""
    engine = FakeEngine(clones=True)
    clip = wav(1.5, rate=44100, channels=2)
    with (
        serve_engine(engine, voices_dir=str(tmp_path), max_clip_rate_hz=48000) as address,
        httpx.Client(base_url=f"http://{address}", timeout=TIMEOUT_S) as client,
    ):
        response = upload(client, "fish", clip)
        assert response.status_code == 200, response.text
        assert response.json()["voice"]["sample_rate"] == 44100
        high = upload(client, "high", wav(1.5, rate=96000))
        assert high.status_code == 200 and high.json()["voice"]["sample_rate"] == 48000
        for config in ({"voice": "fish"}, {"ref_audio": data_url(clip)}):
            with session(address, **config) as ws:
                send(ws, type="input.text", text="Hello there.")
                send(ws, type="input.done")
                recv_until(ws, "session.done")
            reference = engine.requests[-1].reference
            assert reference is not None and reference.audio is not None
            assert (reference.sample_rate, len(reference.audio)) == (44100, 66150)
            expected = soundfile.read(io.BytesIO(clip), dtype="float32")[0].mean(axis=1)
            np.testing.assert_allclose(reference.audio, expected, atol=1 / 32768 + 1e-6)


@pytest.mark.parametrize("rate", [7999, 48001])
def test_a_clip_rate_past_what_any_model_takes_stops_the_gateway_at_start(rate: int) -> None:
    with pytest.raises(ValueError, match="max_clip_rate_hz must be 8000 to 48000"):
        create_app(Settings.from_env({}, max_clip_rate_hz=rate), engine=FakeEngine(clones=True))


# --- quota ------------------------------------------------------------------------------------------


def test_the_disk_quota_refuses_an_upload_that_would_pass_it(tmp_path: Path) -> None:
    clip = wav(1.5)  # 24,000 samples: a 48 KB voice file
    with (
        serve_engine(FakeEngine(clones=True), voices_dir=str(tmp_path), max_voice_bytes=110_000) as address,
        httpx.Client(base_url=f"http://{address}", timeout=TIMEOUT_S) as client,
    ):
        assert upload(client, "a", clip).status_code == 200
        assert upload(client, "b", clip).status_code == 200
        refused = upload(client, "c", clip)
        assert refused.status_code == 409, refused.text
        error = error_of(refused)
        assert (error["code"], error["param"]) == ("voice_quota_exceeded", "audio_sample")
        assert "110000" in str(error["message"])
        assert [v["name"] for v in client.get(URL).json()["uploaded_voices"]] == ["a", "b"]
        assert upload(client, "B", wav(1.5, seed=3)).status_code == 200  # a replacement frees its own bytes
        assert client.delete(f"{URL}/a").status_code == 200
        assert upload(client, "c", clip).status_code == 200


def test_the_quota_is_per_key_and_zero_means_none(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path, max_bytes=60_000)
    audio = np.zeros(24000, np.float32)  # 48,000 bytes stored
    store.save("", "a", audio=audio, sample_rate=16000, consent="c")
    with pytest.raises(VoiceQuotaExceeded) as caught:
        store.save("", "b", audio=audio, sample_rate=16000, consent="c")
    assert caught.value.limit == 60_000 and caught.value.used > 48_000
    store.save("0123456789abcdef01234567", "b", audio=audio, sample_rate=16000, consent="c")
    store.save("", "b", audio=audio, sample_rate=16000, consent="c", max_bytes=0)
    assert [v.name for v in store.list("")] == ["a", "b"]


def test_a_refused_replacement_keeps_the_voice_stored_before_names_ignored_case(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    legacy_voice(tmp_path / PUBLIC_DIR, "Old", np.zeros(16000, np.float32), 16000)  # 64 KB of float32
    (legacy,) = (tmp_path / PUBLIC_DIR).glob("*.safetensors")
    legacy.rename(legacy.with_name(hashlib.sha256(b"Old").hexdigest()[:32] + ".safetensors"))
    store.save("", "other", audio=np.zeros(16000, np.float32), sample_rate=16000, consent="c")
    with pytest.raises(VoiceQuotaExceeded):
        store.save(
            "", "Old", audio=np.zeros(48000, np.float32), sample_rate=16000, consent="c", max_bytes=90_000
        )
    assert store.get("", "Old") is not None  # not deleted by the refused save
    store.save("", "Old", audio=np.zeros(16000, np.float32), sample_rate=16000, consent="c", max_bytes=90_000)
    assert [v.name for v in store.list("")] == ["Old", "other"]
    assert len(list((tmp_path / PUBLIC_DIR).glob("*.safetensors"))) == 2  # the float32 file was replaced


# --- inline ref_audio -------------------------------------------------------------------------------


def data_url(data: bytes, mime: str = "audio/flac") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def test_inline_ref_audio_gets_the_canonical_form(flac: bytes) -> None:
    engine = FakeEngine(clones=True)
    with serve_engine(engine) as address:
        with session(address, ref_audio=data_url(flac)) as ws:
            send(ws, type="input.text", text="Say it.")
            send(ws, type="input.done")
            recv_until(ws, "session.done")
    reference = engine.requests[-1].reference
    assert reference is not None and reference.audio is not None
    assert (reference.audio.dtype, reference.audio.ndim, reference.sample_rate) == (
        np.dtype(np.float32),
        1,
        24000,
    )
    assert len(reference.audio) == pytest.approx(29.9 * 24000, abs=2)


def test_inline_ref_audio_is_refused_from_its_header(no_decoding: list[int]) -> None:
    absurd = data_url(claiming(issue_flac(2.0, 16000, 1), 10**9))
    with serve_engine(FakeEngine(clones=True)) as address:
        with voxgate_connect(f"ws://{address}/v1/audio/speech/stream") as ws:
            send(ws, type="session.config", ref_audio=absurd)
            error = recv_message(ws)
        response = httpx.post(
            f"http://{address}/v1/audio/speech",
            timeout=TIMEOUT_S,
            content=json.dumps({"input": "Hello.", "ref_audio": absurd}),
            headers={"content-type": "application/json"},
        )
    assert (error["code"], error["field"]) == ("invalid_ref_audio", "$.ref_audio")
    assert "header says 62500 s" in error["message"]
    assert response.status_code == 400
    assert (error_of(response)["code"], error_of(response)["param"]) == ("invalid_ref_audio", "ref_audio")
    assert not no_decoding


def test_decodes_wait_their_turn() -> None:
    """With MAX_CONCURRENT_DECODES decodes under way, the next one waits for one of them to end."""
    release = threading.Event()
    busy = [clips._decoder.submit(release.wait) for _ in range(clips.MAX_CONCURRENT_DECODES)]
    results: list[int] = []
    waiting = threading.Thread(target=lambda: results.append(decode_audio(wav(1.5))[1]))
    try:
        waiting.start()
        waiting.join(0.5)  # a decode of 1.5 s takes milliseconds; this one waits for a thread
        assert waiting.is_alive() and not results
    finally:
        release.set()
    waiting.join(TIMEOUT_S)
    assert results == [16000] and all(f.result() for f in busy)
