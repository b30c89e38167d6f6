"""Voice files and the speaker cache, proven against vllm-omni 0.30.0's own serving layer.

One Fish Speech server (tests/vllm_omni/server.py ``--family fish_tts``: vllm-omni's own stack, its engine
client standing in for the model) is started on a speaker folder (``SPEAKER_SAMPLES_DIR``) that
``voxgate voices export`` wrote:

- vllm-omni's own start-up (``_restore_uploaded_speakers``) lists those voices, and a request naming one
  speaks from its clip (vllm-omni's ``_load_uploaded_audio`` read it);
- a voice uploaded through vllm-omni's own ``POST /v1/audio/voices`` lands in that folder, and
  ``voxgate voices import`` takes it into voxgate's store;
- a cloned voice spoken through ``--engine remote`` is uploaded to the upstream once and named after, so
  the model's prompt carries the speaker cache's key (``voice_name``, logged by the stand-in engine client)
  instead of a clip to encode again; a name the upstream lost is sent inline at once; and voxgate's names
  never show in a gateway's voice list.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import soundfile
from voxgate.engine.families import FAMILIES
from voxgate.engine.upstream_voices import PREFIX, UpstreamVoices
from voxgate.engine.upstreams import Upstream
from voxgate.gateway.voices.folder import export_folder, import_folder
from voxgate.gateway.voices.local import VoiceStore

from tests.conftest import TIMEOUT_S, serve_engine
from tests.vllm_omni.upstream import RealUpstream, real_upstream

pytestmark = pytest.mark.slow

READ_TIMEOUT_S = 60.0
TEXT = "Hello there."
TRANSCRIPT = "The quick brown fox jumps over the lazy dog."


def tone(seconds: float, rate: int, channels: int = 1) -> npt.NDArray[np.float32]:
    t = np.arange(int(seconds * rate)) / rate
    mono = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
    columns = [mono * (1 + i) / channels for i in range(channels)]
    return np.stack(columns, axis=1).astype(np.float32) if channels > 1 else mono.astype(np.float32)


def wav(audio: npt.NDArray[np.float32], rate: int) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, audio, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def data_url(audio: npt.NDArray[np.float32], rate: int = 24000) -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav(audio, rate)).decode()


@pytest.fixture(scope="module")
def fish(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealUpstream, Path]]:
    """A Fish Speech vllm-omni started on a speaker folder that voxgate exported."""
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    store.save("", "Exported", audio=tone(2.0, 24000), sample_rate=24000, consent="c-1", ref_text=TRANSCRIPT)
    store.save("", "vector", embedding=np.full(1024, 0.01, np.float32), consent="c-2")
    folder = tmp_path_factory.mktemp("speakers")
    assert [m.name for m in export_folder(store, "", folder).moved] == ["Exported", "vector"]
    with contextlib.ExitStack() as stack:
        with pytest.MonkeyPatch.context() as env:  # the server process takes its environment at start
            env.setenv("SPEAKER_SAMPLES_DIR", str(folder))
            upstream = stack.enter_context(real_upstream(family="fish_tts"))
        yield upstream, folder


def _uploaded(upstream: RealUpstream) -> dict[str, dict[str, object]]:
    listed = httpx.get(f"{upstream.url}/v1/audio/voices", timeout=TIMEOUT_S).json()
    return {str(v["name"]): v for v in listed["uploaded_voices"]}


def test_vllm_omni_restores_the_folder_voxgate_exports(fish: tuple[RealUpstream, Path]) -> None:
    upstream, _ = fish
    voices = _uploaded(upstream)
    assert voices["Exported"]["embedding_source"] == "audio" and voices["Exported"]["ref_text"] == TRANSCRIPT
    assert (voices["vector"]["embedding_source"], voices["vector"]["embedding_dim"]) == ("direct", 1024)
    since = len(upstream.log())
    response = httpx.post(
        f"{upstream.url}/v1/audio/speech",
        json={"input": TEXT, "voice": "Exported", "response_format": "wav"},
        timeout=READ_TIMEOUT_S,
    )
    assert response.status_code == 200, (response.text, upstream.log()[-3000:])
    # Fish Speech's adapter loaded the exported clip (its prompt holds the clip and the cache key).
    assert "voice_name=exported" in upstream.log()[since:]


def test_voxgate_imports_what_vllm_omni_uploads(fish: tuple[RealUpstream, Path], tmp_path: Path) -> None:
    upstream, folder = fish
    stereo = tone(2.0, 48000, channels=2)
    response = httpx.post(
        f"{upstream.url}/v1/audio/voices",
        data={"name": "Uploaded", "consent": "c-3", "ref_text": "Hi.", "speaker_description": "bright"},
        files={"audio_sample": ("clip.wav", wav(stereo, 48000), "audio/wav")},
        timeout=TIMEOUT_S,
    )
    assert response.status_code == 200, response.text
    store = VoiceStore(tmp_path / "voices")
    report = import_folder(folder, store, "")
    assert {m.name for m in report.moved} >= {"Uploaded", "Exported", "vector"}, report
    got = store.get("", "uploaded")
    assert got is not None and got.audio is not None
    info = got.info
    assert (info.name, info.consent, info.ref_text, info.speaker_description) == (
        "Uploaded",
        "c-3",
        "Hi.",
        "bright",
    )
    assert info.sample_rate == 24000 and info.duration_s == pytest.approx(2.0, abs=0.01)
    expected = tone(2.0, 24000) * 1.5 / 2  # the mean of the two channels (gains 1/2 and 2/2)
    assert float(np.corrcoef(got.audio[: len(expected)], expected)[0, 1]) > 0.99
    vector = store.get("", "vector")
    assert vector is not None and vector.embedding is not None and len(vector.embedding) == 1024


def _speak(address: str, voice: str) -> None:
    response = httpx.post(
        f"http://{address}/v1/audio/speech",
        json={"input": TEXT, "voice": voice, "response_format": "wav"},
        timeout=READ_TIMEOUT_S * 2,
    )
    assert response.status_code == 200, response.text


def _names(upstream: RealUpstream) -> list[str]:
    return [name for name in _uploaded(upstream) if name.startswith(PREFIX)]


def test_a_cloned_voice_is_uploaded_once_then_named_for_the_speaker_cache(
    fish: tuple[RealUpstream, Path],
) -> None:
    upstream, _ = fish
    settings: dict[str, object] = {
        "engine": "remote",
        "upstreams": (upstream.url,),
        "upstream_read_timeout_s": READ_TIMEOUT_S,
        "upstream_first_byte_timeout_s": READ_TIMEOUT_S,
        "upstream_segment_timeout_s": READ_TIMEOUT_S,
    }
    with serve_engine(None, **settings) as address:
        form = {"name": "told", "consent": "the speaker agreed", "ref_text": TRANSCRIPT}
        files = {"audio_sample": ("clip.wav", wav(tone(2.5, 24000), 24000), "audio/wav")}
        assert httpx.post(
            f"http://{address}/v1/audio/voices", data=form, files=files, timeout=TIMEOUT_S
        ).is_success

        since = len(upstream.log())
        _speak(address, "told")  # the first goes inline; the upload runs meanwhile
        assert "voice_name=None" in upstream.log()[since:]
        deadline = time.monotonic() + READ_TIMEOUT_S
        while not _names(upstream) and time.monotonic() < deadline:
            time.sleep(0.2)
        (name,) = _names(upstream)
        assert _uploaded(upstream)[name]["ref_text"] == TRANSCRIPT

        since = len(upstream.log())
        _speak(address, "told")
        _speak(address, "told")
        log = upstream.log()[since:]
        assert log.count(f"voice_name={name}") == 2 and "voice_name=None" not in log, log[-3000:]

        # The upstream loses the voice (deleted there): the named request is refused, then sent inline.
        assert httpx.delete(f"{upstream.url}/v1/audio/voices/{name}", timeout=TIMEOUT_S).is_success
        since = len(upstream.log())
        _speak(address, "told")
        log = upstream.log()[since:]
        assert "status=bad_request" in log and "voice_name=None" in log, log[-3000:]
        _speak(address, "told")  # inline, and uploaded again meanwhile
        deadline = time.monotonic() + READ_TIMEOUT_S
        while not _names(upstream) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _names(upstream) == [name]

    # A gateway started now does not offer the upstream's voxgate voices as its own.
    with serve_engine(None, **settings) as address:
        listed = httpx.get(f"http://{address}/v1/audio/voices", timeout=TIMEOUT_S).json()
        assert not [v for v in str(listed).split("'") if v.startswith(PREFIX)], listed


def test_each_upstream_keeps_at_most_the_limit_of_voxgate_voices(fish: tuple[RealUpstream, Path]) -> None:
    upstream, _ = fish

    async def run() -> tuple[list[str], list[str]]:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            voices = UpstreamVoices(lambda: client, limit=1)
            target = Upstream(upstream.url)
            names = []
            for seconds in (1.5, 1.6):
                body: dict[str, object] = {"input": TEXT, "ref_audio": data_url(tone(seconds, 24000))}
                assert voices.shape(target, FAMILIES["fish_tts"], body) is body  # not there yet: inline
                await voices.settled()
                named = voices.shape(target, FAMILIES["fish_tts"], body)
                assert set(named) == {"input", "voice"}, named  # the clip goes as its name now
                names.append(str(named["voice"]))
            await voices.settled()
            return names, list(voices.ready[upstream.url])

    before = set(_names(upstream))
    (first, second), held = asyncio.run(run())
    assert held == [second]
    now = set(_names(upstream)) - before
    assert second in now and first not in now  # the least recently used was deleted upstream
