"""The S3 quota lock holds while its holder is slow: a replica whose voice PUT takes longer than the lock's
staleness keeps the lock (it renews it), so no other replica counts the owner's voices meanwhile.

Between the gateways and SeaweedFS sits a proxy that holds each voice PUT (``*.safetensors``) for
``PUT_DELAY_S`` before passing it on, as a slow or congested link to the store would; the lock's own small
requests pass at once.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import numpy as np
import obstore
import pytest
from obstore.store import S3Store
from voxgate.gateway.voices import s3 as store_s3
from voxgate.gateway.voices.local import PUBLIC_DIR, VoiceQuotaExceeded, encode
from voxgate.gateway.voices.s3 import S3VoiceStore

from tests.gateway.test_voice_store_reads import file_name
from tests.seaweed_server import BUCKET, SeaweedServer, seaweed_server

STALE_S = 2.0  # the lock's staleness in this test (5 s in production)
PUT_DELAY_S = 3.5  # longer than STALE_S and the second Last-Modified rounds to
DIM = 1024


class SlowPuts:
    """A TCP proxy to ``target`` holding every PUT of a voice object for ``delay_s`` before passing it on."""

    def __init__(self, target: tuple[str, int], delay_s: float) -> None:
        self.target, self.delay_s = target, delay_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        """Pass requests on one at a time (head, then the body its Content-Length gives)."""
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = client.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                while len(buffer) < length:
                    data = client.recv(65536)
                    if not data:
                        return
                    buffer += data
                body, buffer = buffer[:length], buffer[length:]
                method, path = lines[0].split(" ")[:2]
                if method == "PUT" and path.split("?")[0].endswith(".safetensors"):
                    time.sleep(self.delay_s)
                server.sendall(head + b"\r\n\r\n" + body)
        except OSError:
            return
        finally:
            server.close()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    with seaweed_server(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def slow_store(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowPuts]:
    """The AWS variables pointing at a slow-PUT proxy in front of SeaweedFS."""
    proxy = SlowPuts(("127.0.0.1", seaweed.s3_port), PUT_DELAY_S)
    for name, value in {**seaweed.env, "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(store_s3, "LOCK_STALE_S", STALE_S)
    try:
        yield proxy
    finally:
        proxy.close()


def vector(seed: int) -> np.typing.NDArray[np.float32]:
    return np.random.default_rng(seed).uniform(-1, 1, DIM).astype(np.float32)


def encode_voice(name: str, seed: int) -> bytes:
    """The bytes of an embedding voice as the store writes it."""
    payload, _ = encode(
        "",
        name,
        audio=None,
        sample_rate=0,
        embedding=vector(seed),
        consent="c",
        ref_text=None,
        speaker_description=None,
        mime_type=None,
    )
    return payload


def stored_bytes(replicas: int, prefix: str) -> tuple[int, int, list[str]]:
    """``replicas`` stores on one prefix, each saving a new voice at once into a quota of 2.5 voices that
    holds one already: the bytes stored, the quota, and each save's outcome."""
    one = len(encode_voice("v0", 0))
    quota = one * 5 // 2
    stores = [S3VoiceStore(BUCKET, prefix, max_bytes=quota) for _ in range(replicas)]
    stores[0].save("", "v0", embedding=vector(0), consent="c")
    outcomes: list[str] = []

    def save(i: int) -> None:
        try:
            stores[i].save("", f"v{i + 1}", embedding=vector(i + 1), consent="c")
            outcomes.append("stored")
        except VoiceQuotaExceeded:
            outcomes.append("quota")

    threads = [threading.Thread(target=save, args=(i,)) for i in range(replicas)]
    for i, thread in enumerate(threads):
        thread.start()
        time.sleep(0.3 if i == 0 else 0.0)  # the first takes the lock; the others wait on it
    for thread in threads:
        thread.join()
    return sum(info.file_size for info in stores[0].list("")), quota, sorted(outcomes)


def test_a_slow_holder_keeps_the_lock_and_the_quota_holds(slow_store: SlowPuts) -> None:
    used, quota, outcomes = stored_bytes(2, f"t-{uuid.uuid4().hex[:12]}")
    assert outcomes == ["quota", "stored"]
    assert used <= quota


def test_a_holder_that_lost_the_lock_during_its_put_counts_again(
    slow_store: SlowPuts, seaweed: SeaweedServer
) -> None:
    """A store too slow for the renewals: another replica takes the lock over during the holder's PUT and
    fills the quota. The holder finds the lock lost, counts again, and takes its new voice back out."""
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    payload = encode_voice("taker", 2)
    quota = 2 * len(payload)
    voices = S3VoiceStore(BUCKET, prefix, max_bytes=quota)
    voices.save("", "first", embedding=vector(1), consent="c")
    direct = S3Store(
        BUCKET,
        prefix=prefix,
        endpoint=seaweed.endpoint,
        access_key_id=seaweed.env["AWS_ACCESS_KEY_ID"],
        secret_access_key=seaweed.env["AWS_SECRET_ACCESS_KEY"],
        region="us-east-1",
        client_options={"allow_http": True},
    )
    outcome: list[BaseException | None] = []

    def save() -> None:
        try:
            voices.save("", "late", embedding=vector(3), consent="c")
            outcome.append(None)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=save)
    thread.start()
    time.sleep(PUT_DELAY_S / 3)  # the holder's voice PUT is held by the proxy now
    lock = f"{PUBLIC_DIR}/.lock"
    obstore.put(direct, lock, b"another replica", use_multipart=False)  # taken over
    time.sleep(STALE_S)  # the holder's next renewal finds it so
    obstore.put(direct, f"{PUBLIC_DIR}/{file_name('taker')}", payload, use_multipart=False)
    obstore.delete(direct, lock)
    thread.join()
    assert isinstance(outcome[0], VoiceQuotaExceeded), outcome
    assert sorted(info.name for info in voices.list("")) == ["first", "taker"]
