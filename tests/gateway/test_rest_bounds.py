"""REST answers bounded as sockets are: a reader that stops is cut off, batches admitted item by item, held
answers with true file sizes (gateway/transport/body.py, gateway/routes/batch.py; the hardening round's
H1-H2, M2-M3)."""

from __future__ import annotations

import base64
import collections
import io
import json
import socket
import time
import wave
from collections.abc import AsyncGenerator

import httpx
import soundfile
from voxgate.engine.base import AudioChunk, SynthesisRequest
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.middleware.ratelimit import REFERENCES_BURST

from tests.conftest import TIMEOUT_S, serve_engine
from tests.gateway.test_inline_reference import clip, data_url

SPEECH, BATCH = "/v1/audio/speech", "/v1/audio/speech/batch"


class Counting(FakeEngine):
    """The fake tone, counting the chunks it has made."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.chunks: collections.Counter[str] = collections.Counter()  # by the item named in the text

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        async for chunk in super().synthesize(req):
            self.chunks[req.text.split()[-1]] += 1
            yield chunk


def _unread_request(address: str, body: dict[str, object], path: str = SPEECH) -> socket.socket:
    """A client that sends a request and then never reads (its receive buffer kept small)."""
    host, port = address.split(":")
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect((host, int(port)))
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
    client.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return client


def test_a_rest_answer_nobody_reads_is_cut_off_after_the_send_timeout_and_frees_its_place() -> None:
    engine = FakeEngine(sample_rate=48000)
    text = "A long answer that nobody reads. " * 100  # 200 s of audio: far more than the socket buffers hold
    with serve_engine(engine, max_sessions=1, send_timeout_s=1.0) as address:
        client = _unread_request(address, {"input": text, "response_format": "pcm", "sample_rate": 48000})
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while True:  # the one place is held until the unread answer is cut off
                response = httpx.post(
                    f"http://{address}{SPEECH}",
                    json={"input": "Hi.", "response_format": "pcm"},
                    timeout=TIMEOUT_S,
                )
                if response.status_code == 200:
                    break
                assert response.status_code == 503, response.text
                assert time.monotonic() < deadline, "the unread answer was never cut off"
                time.sleep(0.2)
            # The connection was closed without the body's end: the client cannot take it for complete.
            client.settimeout(TIMEOUT_S)
            received = b""
            while chunk := client.recv(1 << 16):
                received += chunk
            assert received.startswith(b"HTTP/1.1 200") and not received.endswith(b"0\r\n\r\n")
        finally:
            client.close()
    # The unread answer's work stopped: no engine stream is left open, and most of its 100 sentences
    # were never begun.
    assert engine.closed == engine.started < 60


def test_held_answers_carry_true_sizes_stream_false_wav_and_batch_flac() -> None:
    with serve_engine(FakeEngine(sample_rate=16000)) as address:
        plain = httpx.post(
            f"http://{address}{SPEECH}",
            json={"input": "Hello there. Two sentences.", "response_format": "wav", "stream": False},
            timeout=TIMEOUT_S,
        )
        batch = httpx.post(
            f"http://{address}{BATCH}",
            json={"items": [{"input": "Hello there."}, {"input": "Once more."}], "response_format": "flac"},
            timeout=TIMEOUT_S,
        )
    with wave.open(io.BytesIO(plain.content)) as w:
        frames = w.getnframes()
    assert plain.status_code == 200 and frames == (len(plain.content) - 44) // 2 > 0
    for result in batch.json()["results"]:
        samples, rate = soundfile.read(io.BytesIO(base64.b64decode(result["audio_data"])))
        assert rate == 24000 and len(samples) > 0  # the batch's default rate


def test_a_batch_decodes_no_more_inline_clips_than_a_session_may() -> None:
    engine = FakeEngine(clones=True)
    reference = {"ref_audio": data_url(clip()), "ref_text": "Reference words."}
    items = [{"input": f"Item {n}."} for n in range(REFERENCES_BURST + 2)]
    with serve_engine(engine) as address:
        response = httpx.post(
            f"http://{address}{BATCH}", json={"items": items, **reference}, timeout=TIMEOUT_S
        )
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["success"] * REFERENCES_BURST + ["error"] * 2
    assert all("upload the voice" in r["error"] for r in results[REFERENCES_BURST:])
    assert len(engine.requests) == REFERENCES_BURST


def test_a_batch_takes_the_callers_rate_limit_item_by_item() -> None:
    engine = FakeEngine()
    items = [{"input": f"Item {n}."} for n in range(4)]
    with serve_engine(engine, rate_limit_per_s=2.0, rate_limit_burst=2) as address:
        url = f"http://{address}{BATCH}"
        batch = httpx.post(url, json={"items": items, "response_format": "pcm"}, timeout=TIMEOUT_S)
        after = httpx.post(f"http://{address}{SPEECH}", json={"input": "Hi."}, timeout=TIMEOUT_S)
    # The batch's 4 items took 4 tokens (the burst, then 2 more as they came back, at 2 a second), so a
    # request right after it finds the bucket empty; before, a batch took one token whatever its size.
    assert batch.status_code == 200 and batch.json()["succeeded"] == 4
    assert after.status_code == 429 and after.headers["retry-after"]


def test_a_batchs_items_behind_the_one_being_written_wait_at_their_outbox_bound() -> None:
    engine = Counting(sample_rate=16000, chunk_s=0.1, delay_s=0.005)
    # 20 segments of 2.3 s each per item (46 s): each segment's text ends with its item's name.
    items = [
        {"input": f"Words and more words for a long item {name}. " * 20} for name in ("one", "two", "six")
    ]
    with serve_engine(engine, max_buffered_audio_s=1.0) as address:
        client = _unread_request(address, {"items": items, "response_format": "pcm"}, path=BATCH)
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while engine.chunks["one."] < 300:  # the first item, drained to be written
                assert time.monotonic() < deadline, engine.chunks
                time.sleep(0.02)
            # The items begun after it made about their outbox's bound (1 s: 10 chunks, and the segment
            # opened ahead) and wait for their turn, instead of their whole answers (460 chunks each).
            assert engine.chunks["two."] <= 40 and engine.chunks["six."] <= 40, engine.chunks
        finally:
            client.close()
