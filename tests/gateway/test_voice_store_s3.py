"""Voices in S3 (``voice_store=s3://...``) against a real S3 server: SeaweedFS, started per module.

Gateways here are real servers (uvicorn on loopback ports, or ``voxgate serve`` processes for the crash
test) that share one bucket prefix, as replicas of a fleet do.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import obstore
import pytest
import safetensors.numpy
import soundfile
from obstore.store import S3Store
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.voices import s3 as store_s3
from voxgate.gateway.voices.local import FORMAT, PUBLIC_DIR, SUFFIX, VoiceStore
from voxgate.gateway.voices.s3 import S3VoiceStore

from tests.conftest import TIMEOUT_S, recv, recv_message, send, serve_engine, session, voxgate_connect
from tests.gateway.test_voice_crash import NAMES, Possible, checksum, run_until_killed
from tests.gateway.test_voice_store_reads import OWNER, bad_voices, file_name
from tests.redis_server import free_port
from tests.seaweed_server import BUCKET, SeaweedServer, location, seaweed_server

URL = "/v1/audio/voices"
WS_URL = "/v1/audio/speech/stream"
# The bound for a replica to see another's upload or delete.
VISIBLE_WITHIN_S = 2.0
CRASH_ROUNDS = 6


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    with seaweed_server(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def prefix(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh prefix in the bucket, with the AWS variables pointing at SeaweedFS for in-process gateways."""
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    return f"t-{uuid.uuid4().hex[:12]}"


def wav(seed: int, seconds: float = 1.5) -> bytes:
    rng = np.random.default_rng(seed)
    audio = rng.uniform(-0.5, 0.5, int(16000 * seconds)).astype(np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, audio, 16000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def upload(address: str, name: str, seed: int = 0, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(
        f"http://{address}{URL}",
        files={"audio_sample": ("clip.wav", wav(seed), "audio/wav")},
        data={"name": name, "consent": "I own this voice", "ref_text": "A reference clip."},
        headers=headers,
        timeout=TIMEOUT_S,
    )


def listed(address: str) -> list[str]:
    response = httpx.get(f"http://{address}{URL}", timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text
    return [v["name"] for v in response.json()["uploaded_voices"]]


def bucket(seaweed: SeaweedServer, prefix: str) -> S3Store:
    return S3Store(
        BUCKET,
        prefix=prefix,
        endpoint=seaweed.endpoint,
        access_key_id=seaweed.env["AWS_ACCESS_KEY_ID"],
        secret_access_key=seaweed.env["AWS_SECRET_ACCESS_KEY"],
        region="us-east-1",
        client_options={"allow_http": True},
    )


def objects(seaweed: SeaweedServer, prefix: str) -> dict[str, bytes]:
    store = bucket(seaweed, prefix)
    keys = [str(m["path"]) for batch in obstore.list(store) for m in batch]
    return {key: bytes(obstore.get(store, key).bytes()) for key in keys}


def spoken_reference_len(address: str, engine: FakeEngine, voice: str) -> int:
    """Speak one sentence in ``voice``; how many samples of reference clip the engine got."""
    with session(address, voice=voice, sample_rate=16000) as ws:
        send(ws, type="input.text", text="Hello.")
        send(ws, type="input.done")
        while not (isinstance(m := recv(ws), dict) and m["type"] == "session.done"):
            pass
    reference = engine.requests[-1].reference
    assert reference is not None and reference.audio is not None
    return len(reference.audio)


def test_upload_list_speak_and_delete_through_s3(seaweed: SeaweedServer, prefix: str) -> None:
    engine = FakeEngine(clones=True)
    with serve_engine(engine, voice_store=location(prefix)) as address:
        assert upload(address, "Maria", seed=1).status_code == 200
        assert listed(address) == ["Maria"]
        details = httpx.get(f"http://{address}{URL}/maria", timeout=TIMEOUT_S).json()
        assert details["name"] == "Maria" and details["duration_s"] == 1.5
        assert spoken_reference_len(address, engine, "maria") == 24000
        # One object, the same safetensors file the local store writes, where the local store puts it.
        ((key, data),) = objects(seaweed, prefix).items()
        assert key.startswith(f"{PUBLIC_DIR}/") and key.endswith(SUFFIX)
        assert safetensors.numpy.load(data)["audio"].dtype == np.int16 and FORMAT.encode() in data[:4096]
        assert httpx.delete(f"http://{address}{URL}/MARIA", timeout=TIMEOUT_S).status_code == 200
        assert httpx.get(f"http://{address}{URL}/maria", timeout=TIMEOUT_S).status_code == 404
        assert httpx.delete(f"http://{address}{URL}/maria", timeout=TIMEOUT_S).status_code == 404
        assert listed(address) == []
    assert objects(seaweed, prefix) == {}


def test_two_replicas_see_each_others_uploads_replacements_and_deletes(
    seaweed: SeaweedServer, prefix: str
) -> None:
    engine_a, engine_b = FakeEngine(clones=True), FakeEngine(clones=True)
    store = location(prefix)
    with serve_engine(engine_a, voice_store=store) as a, serve_engine(engine_b, voice_store=store) as b:
        uploaded = time.monotonic()
        assert upload(a, "maria", seed=1).status_code == 200
        # Seen by the other replica on its first look: every use asks the store, so no poll is needed.
        assert listed(b) == ["maria"]
        assert spoken_reference_len(b, engine_b, "maria") == 24000  # 1.5 s at 16 kHz, now in B's cache
        assert time.monotonic() - uploaded < VISIBLE_WITHIN_S * 5  # generous: the figure itself is measured
        # A replacement through A reaches B's next session, not B's cached clip.
        response = httpx.post(
            f"http://{a}{URL}",
            files={"audio_sample": ("clip.wav", wav(2, seconds=2.5), "audio/wav")},
            data={"name": "Maria", "consent": "yes"},
            timeout=TIMEOUT_S,
        )
        assert response.status_code == 200
        assert spoken_reference_len(b, engine_b, "maria") == 40000
        # A delete through B is seen by A's next session and listing.
        assert spoken_reference_len(a, engine_a, "maria") == 40000
        assert httpx.delete(f"http://{b}{URL}/maria", timeout=TIMEOUT_S).status_code == 200
        assert listed(a) == []
        with voxgate_connect(f"ws://{a}{WS_URL}") as ws:
            send(ws, type="session.config", voice="maria")
            refused = recv(ws)
        assert isinstance(refused, dict) and refused["code"] == "voice_not_found"


def test_voice_quotas_hold_across_replicas(seaweed: SeaweedServer, prefix: str) -> None:
    store = location(prefix)
    settings: dict[str, object] = {"voice_store": store, "max_voices": 3, "api_keys": ("alice", "bob")}
    with serve_engine(FakeEngine(), **settings) as a, serve_engine(FakeEngine(), **settings) as b:
        # Eight uploads of different names at once, half through each replica: exactly three land.
        answers: list[int] = []

        def put(address: str, i: int) -> None:
            answers.append(upload(address, f"v{i}", seed=i, key="alice").status_code)

        threads = [threading.Thread(target=put, args=(a if i % 2 else b, i)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(answers) == [200] * 3 + [409] * 5
        names = httpx.get(f"http://{b}{URL}", headers={"Authorization": "Bearer alice"}).json()
        assert len(names["uploaded_voices"]) == 3
        # Replacing one of them is still allowed through either replica; another name is not.
        kept = names["uploaded_voices"][0]["name"]
        assert upload(a, kept, seed=9, key="alice").status_code == 200
        refused = upload(a, "one-more", key="alice")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "voice_limit_reached"
        # Bob's quota is his own, and he cannot see Alice's voices.
        assert upload(b, "v1", key="bob").status_code == 200
        bobs = httpx.get(f"http://{a}{URL}", headers={"Authorization": "Bearer bob"}).json()
        assert [v["name"] for v in bobs["uploaded_voices"]] == ["v1"]


def test_byte_quota_counts_the_shared_store(seaweed: SeaweedServer, prefix: str) -> None:
    store = location(prefix)
    one = len(safetensors_bytes_of_upload(seaweed, prefix, store))
    settings: dict[str, object] = {"voice_store": store, "max_voice_bytes": 2 * one + one // 2}
    with serve_engine(FakeEngine(), **settings) as a, serve_engine(FakeEngine(), **settings) as b:
        assert upload(b, "second", seed=2).status_code == 200
        refused = upload(a, "third", seed=3)
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "voice_quota_exceeded"


def safetensors_bytes_of_upload(seaweed: SeaweedServer, prefix: str, store: str) -> bytes:
    """Upload one voice through a gateway; the object it left (it stays, as the first of the quota)."""
    with serve_engine(FakeEngine(), voice_store=store) as address:
        assert upload(address, "first", seed=1).status_code == 200
    (data,) = objects(seaweed, prefix).values()
    return data


def test_a_crashed_replicas_lock_is_taken_over(
    seaweed: SeaweedServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock left by a replica killed mid-save delays the owner's uploads, and only by ``LOCK_STALE_S``."""
    monkeypatch.setattr(store_s3, "LOCK_STALE_S", 2.0)
    locked_at = time.time()
    obstore.put(bucket(seaweed, prefix), f"{PUBLIC_DIR}/.lock", b"a dead replica", use_multipart=False)
    voices = S3VoiceStore(BUCKET, prefix)
    voices.save("", "maria", embedding=np.ones(8, dtype=np.float32), consent="yes")
    # It waited for the lock to go stale (Last-Modified has whole seconds, so up to 1 s less).
    assert time.time() - locked_at >= 2.0 - 1.0
    assert [info.name for info in voices.list("")] == ["maria"]
    assert list(objects(seaweed, prefix)) == [f"{PUBLIC_DIR}/{name_file('maria')}"]  # lock released


def name_file(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:32] + SUFFIX


@contextmanager
def voxgate_serve(
    seaweed: SeaweedServer, store: str, log: Path
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A ``voxgate serve --engine fake`` process on the shared store; SIGKILLed at the end if alive."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    env.update({**seaweed.env, "VOXGATE_VOICE_STORE": store})
    command = [sys.executable, "-m", "voxgate.cli", "serve", "--engine", "fake", "--port", str(port)]
    with log.open("ab") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://{address}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"voxgate serve never got ready:\n{log.read_text()}"
            time.sleep(0.05)
        yield process, f"http://{address}"
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(TIMEOUT_S)


def check_bucket(seaweed: SeaweedServer, prefix: str, client: httpx.Client, possible: Possible) -> None:
    """What the restarted gateway serves and what is in the bucket match what the answers promised."""
    found = objects(seaweed, prefix)
    voices = {key: data for key, data in found.items() if not key.rsplit("/", 1)[1].startswith(".")}
    for key, data in voices.items():
        assert key.endswith(SUFFIX)
        safetensors.numpy.load(data)  # raises on a torn object
    names = {v["name"] for v in client.get(URL).json()["uploaded_voices"]}
    assert len(names) == len(voices), "every voice object parses and is listed"
    store = S3VoiceStore(BUCKET, prefix)
    for name in NAMES:
        voice = store.get("", name)
        assert voice is None or voice.audio is not None
        held = None if voice is None or voice.audio is None else checksum(voice.audio)
        assert held in possible.get(name, {None}), f"{name} holds a version no write left there"
        assert (name in names) == (held is not None)
        possible[name] = {held}


def test_sigkill_mid_upload_never_loses_or_tears_a_voice_in_s3(
    seaweed: SeaweedServer, prefix: str, tmp_path: Path
) -> None:
    rng = random.Random(20261204)
    possible: Possible = {}
    answered = 0
    store = location(prefix)
    for _ in range(CRASH_ROUNDS):
        with voxgate_serve(seaweed, store, tmp_path / "serve.log") as (process, url):
            with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
                check_bucket(seaweed, prefix, client, possible)
                answered += run_until_killed(client, process, rng, possible)
    with voxgate_serve(seaweed, store, tmp_path / "serve.log") as (_, url):
        with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
            check_bucket(seaweed, prefix, client, possible)
    assert answered >= CRASH_ROUNDS


def test_a_voices_folder_copied_to_the_bucket_is_served(
    seaweed: SeaweedServer, prefix: str, tmp_path: Path
) -> None:
    """``aws s3 sync VOICES_DIR s3://...``: the same files, and those named before names ignored case."""
    folder = VoiceStore(tmp_path)
    folder.save("", "Anna", embedding=np.ones(8, dtype=np.float32), consent="yes")
    folder.save("", "Maria", embedding=np.ones(8, dtype=np.float32), consent="yes")
    public = tmp_path / PUBLIC_DIR
    (public / name_file("maria")).rename(public / name_file("Maria"))  # as an earlier version named it
    s3 = bucket(seaweed, prefix)
    for path in public.iterdir():
        obstore.put(s3, f"{PUBLIC_DIR}/{path.name}", path.read_bytes(), use_multipart=False)
    with serve_engine(FakeEngine(), voice_store=location(prefix)) as address:
        assert listed(address) == ["Anna", "Maria"]
        assert httpx.get(f"http://{address}{URL}/Maria", timeout=TIMEOUT_S).json()["embedding_dim"] == 8
        assert upload(address, "Maria", seed=1).status_code == 200  # replaces the old object
        assert listed(address) == ["Anna", "Maria"]
        assert httpx.get(f"http://{address}{URL}/maria", timeout=TIMEOUT_S).json()["kind"] == "audio"
    assert sorted(objects(seaweed, prefix)) == sorted(
        f"{PUBLIC_DIR}/{name_file(n)}" for n in ("anna", "maria")
    )


def test_a_store_that_cannot_be_reached_is_a_503_not_a_crash(
    seaweed: SeaweedServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = free_port()  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed}")
    with serve_engine(FakeEngine(), voice_store=location(prefix)) as address:
        answers = [
            upload(address, "maria"),
            httpx.get(f"http://{address}{URL}", timeout=TIMEOUT_S),
            httpx.get(f"http://{address}{URL}/maria", timeout=TIMEOUT_S),
            httpx.delete(f"http://{address}{URL}/maria", timeout=TIMEOUT_S),
        ]
        # The speaking routes name an uploaded voice: the same code, not an internal error.
        speech = httpx.post(
            f"http://{address}/v1/audio/speech", json={"input": "Hi.", "voice": "maria"}, timeout=TIMEOUT_S
        )
        with voxgate_connect(f"ws://{address}/v1/audio/speech/stream", open_timeout=TIMEOUT_S) as ws:
            send(ws, type="session.config", voice="maria")
            refused = recv_message(ws)
    assert refused["code"] == "voice_store_unavailable" and refused["field"] == "$.voice", refused
    assert speech.status_code == 503 and speech.json()["error"]["code"] == "voice_store_unavailable"
    for response in answers:
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "voice_store_unavailable"
        assert "Retry-After" in response.headers


def test_voices_an_upload_would_refuse_are_never_listed_or_served_from_s3(
    seaweed: SeaweedServer, prefix: str
) -> None:
    s3 = bucket(seaweed, prefix)
    for name, data in bad_voices().items():
        obstore.put(s3, f"{OWNER}/{file_name(name)}", data, use_multipart=False)
    voices = S3VoiceStore(BUCKET, prefix)
    assert [info.name for info in voices.list(OWNER)] == ["good"]
    for name in bad_voices():
        if name != "good":
            assert voices.get(OWNER, name) is None, name
            assert voices.info(OWNER, name) is None, name
    good = voices.get(OWNER, "good")
    assert good is not None and good.audio is not None and good.info.duration_s == 1.5
