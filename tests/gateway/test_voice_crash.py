"""Crash safety: SIGKILL a gateway process mid-uploads, many times, and lose or tear nothing.

Each round starts a real gateway process on the same folder, checks what the last one left, then
uploads (and sometimes deletes) voices back to back, some replacing earlier ones, until a timer kills
the process at a random moment. A voice whose upload was answered must be on disk with exactly that
content, or the content of a later write to its name; the one request in flight at the kill may have
landed or not. Every file left must parse, and temp files must never show up as voices.
"""

from __future__ import annotations

import hashlib
import io
import random
import threading
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import safetensors.numpy
import soundfile
from voxgate.gateway.voices.local import PUBLIC_DIR, SUFFIX, VoiceStore

from tests.conftest import TIMEOUT_S
from tests.gateway import voice_server

URL = "/v1/audio/voices"
ROUNDS = 12
NAMES = [f"voice-{i}" for i in range(6)]  # few names, so most uploads replace a voice
MAX_OPS_PER_ROUND = 2000  # a bound for a machine too fast for the timer; never reached in practice
KILL_AFTER_S = (0.01, 0.25)

# What a name may hold now: content checksums, or None for "absent". One value once a write to it
# was answered; two when the write in flight at a kill may or may not have landed.
Possible = dict[str, set[str | None]]


def wav(seed: int) -> tuple[bytes, str]:
    """A noise clip of 1 to 3 s and the checksum of the float32 samples the gateway should store."""
    rng = np.random.default_rng(seed)
    audio = rng.uniform(-0.5, 0.5, int(16000 * rng.uniform(1.0, 3.0))).astype(np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, audio, 16000, format="WAV", subtype="PCM_16")
    data = buffer.getvalue()
    stored, _ = soundfile.read(io.BytesIO(data), dtype="float32")
    return data, checksum(stored)


def checksum(audio: npt.NDArray[np.float32]) -> str:
    return hashlib.sha256(np.ascontiguousarray(audio, dtype=np.float32).tobytes()).hexdigest()


def check_folder(directory: Path, client: httpx.Client, possible: Possible) -> None:
    """What the restarted gateway serves and what is on disk match what the answers promised."""
    folder = directory / PUBLIC_DIR
    files = [p for p in folder.iterdir() if not p.name.startswith(".")] if folder.exists() else []
    for path in files:
        assert path.suffix == SUFFIX
        safetensors.numpy.load(path.read_bytes())  # raises on a torn file
    listed = {v["name"] for v in client.get(URL).json()["uploaded_voices"]}
    assert len(listed) == len(files), "every voice file parses, and temp files are not listed"
    store = VoiceStore(directory)
    for name in NAMES:
        data = store.get("", name)
        assert data is None or data.audio is not None
        held = None if data is None or data.audio is None else checksum(data.audio)
        assert held in possible.get(name, {None}), f"{name} holds a version no write left there"
        assert (name in listed) == (held is not None)
        possible[name] = {held}


def run_until_killed(
    client: httpx.Client, process: voice_server.Process, rng: random.Random, possible: Possible
) -> int:
    """Write voices until the process dies; returns how many writes were answered."""
    timer: threading.Timer | None = None
    answered = 0
    try:
        for _ in range(MAX_OPS_PER_ROUND):
            name = rng.choice(NAMES)
            delete = rng.random() < 0.15
            data, digest = wav(rng.randrange(1 << 30))
            outcome: str | None = None if delete else digest
            try:
                if delete:
                    response = client.delete(f"{URL}/{name}")
                    assert response.status_code in (200, 404), response.text
                else:
                    files = {"audio_sample": ("clip.wav", data, "audio/wav")}
                    response = client.post(URL, data={"name": name, "consent": "test"}, files=files)
                    assert response.status_code == 200, response.text
            except httpx.TransportError:  # killed with this request in flight: it may have landed
                possible.setdefault(name, {None}).add(outcome)
                return answered
            possible[name] = {outcome}
            answered += 1
            if timer is None:  # arm the kill once the round has done something
                timer = threading.Timer(rng.uniform(*KILL_AFTER_S), process.kill)
                timer.start()
        return answered
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()


def test_sigkill_mid_upload_never_loses_or_tears_a_voice(tmp_path: Path) -> None:
    rng = random.Random(20240501)
    possible: Possible = {}
    answered = 0
    for _ in range(ROUNDS):
        process, url = voice_server.start(tmp_path)
        try:
            with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
                check_folder(tmp_path, client, possible)
                answered += run_until_killed(client, process, rng, possible)
        finally:
            voice_server.stop(process)
    with voice_server.running(tmp_path) as url, httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
        check_folder(tmp_path, client, possible)
    assert answered >= ROUNDS
