"""The rest of vllm-omni's REST speech API on a real uvicorn server with the FakeEngine: the batch route,
``speaker``, ``extra_params``, ``word_timestamps`` (``X-Word-Timestamps``), the limits, and the voice list.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import struct
import time
from collections.abc import AsyncGenerator

import httpx
import numpy as np
import pytest
import soundfile
from voxgate.engine.base import AudioChunk, SynthesisRequest, WordTiming
from voxgate.engine.fake import SECONDS_PER_CHAR, FakeEngine
from voxgate.gateway.routes.batch import ITEMS_AT_ONCE

from tests.conftest import TIMEOUT_S, recv_message, send, serve_engine, voxgate_connect

SPEECH = "/v1/audio/speech"
BATCH = "/v1/audio/speech/batch"
VOICES = "/v1/audio/voices"
RESULT_FIELDS = {"index", "status", "audio_data", "media_type", "usage"}
USAGE_FIELDS = {"input_tokens", "output_tokens", "total_tokens", "input_token_details"}


def post(address: str, path: str, **body: object) -> httpx.Response:
    return httpx.post(f"http://{address}{path}", json=body, timeout=TIMEOUT_S)


class CountingEngine(FakeEngine):
    """A paced FakeEngine that notes how many of its segments were being spoken at once, at most."""

    def __init__(self) -> None:
        super().__init__(delay_s=0.02, chunk_s=0.05)
        self.active = 0
        self.peak = 0

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            async for chunk in super().synthesize(req):
                yield chunk
        finally:
            self.active -= 1


class WordEngine(FakeEngine):
    """Times words: each word of a segment is 200 ms of a constant signal."""

    WORD_S = 0.2

    def __init__(self) -> None:
        supported = frozenset({"speed", "seed", "language", "word_timestamps"})
        super().__init__(sample_rate=24000, supported=supported)

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        self.requests.append(req)
        per = int(self.WORD_S * self.sample_rate)
        words = req.text.split()
        timings = tuple(WordTiming(w, i * per, (i + 1) * per) for i, w in enumerate(words))
        yield AudioChunk(np.full(per * len(words), 0.1, np.float32), self.sample_rate, timings)


# --- the batch route -------------------------------------------------------------------------------------


def test_batch_items_take_the_batch_defaults_and_override_them() -> None:
    with serve_engine(FakeEngine()) as address:
        response = post(
            address,
            BATCH,
            voice="alloy",
            speed=1.0,
            items=[
                {"input": "Hello there."},
                {"input": "A second one.", "response_format": "pcm", "speed": 2.0, "speaker": "tone"},
            ],
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"id", "results", "total", "succeeded", "failed"}
    assert body["id"].startswith("speech-batch-")
    assert (body["total"], body["succeeded"], body["failed"]) == (2, 2, 0)
    first, second = body["results"]
    assert set(first) == set(second) == RESULT_FIELDS
    assert (first["index"], first["status"], first["media_type"]) == (0, "success", "audio/wav")
    assert (second["index"], second["status"], second["media_type"]) == (1, "success", "audio/pcm")
    # The batch's default format is vllm-omni's wav, whole: its header carries the real sizes.
    wav = base64.b64decode(first["audio_data"])
    assert struct.unpack("<I", wav[40:44])[0] == len(wav) - 44
    audio, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    assert rate == 24000 and abs(len(audio) / rate - len("Hello there.") * SECONDS_PER_CHAR) < 0.1
    # The item's own speed (2x) halves its audio.
    pcm = base64.b64decode(second["audio_data"])
    assert abs(len(pcm) / 2 / 24000 - len("A second one.") * SECONDS_PER_CHAR / 2) < 0.1
    usage = first["usage"]
    assert set(usage) == USAGE_FIELDS and usage["input_tokens"] == len("Hello there.")
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > usage["input_tokens"]


def test_a_failing_item_fails_alone() -> None:
    items = [
        {"input": "Fine."},
        {"input": "Who?", "voice": "nobody"},
        {"input": ""},
        {"input": "Long.", "max_new_tokens": 4097},
        {"input": "Styled.", "instructions": "x" * 501},
        {"input": "Then boom."},
    ]
    with serve_engine(FakeEngine(fail_on="boom", fail_after_chunks=0)) as address:
        response = post(address, BATCH, items=items)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["total"], body["succeeded"], body["failed"]) == (6, 1, 5)
    results = body["results"]
    assert [r["index"] for r in results] == list(range(6))
    assert [r["status"] for r in results] == ["success"] + ["error"] * 5
    for failed in results[1:]:
        assert set(failed) == {"index", "status", "error"} and failed["error"]
    assert "nobody" in results[1]["error"]
    assert "4096" in results[3]["error"] and "500" in results[4]["error"]


@pytest.mark.parametrize(
    ("body", "settings", "param"),
    [
        ({"items": [{"input": "Hi."}] * 33}, {}, "items"),
        ({"items": [{"input": "Hi."}] * 3}, {"max_batch_items": 2}, "items"),
        ({"items": []}, {}, "items"),
        ({"items": [{"input": "Hi."}], "speed": 9}, {}, "speed"),
        ({"items": [{"input": "Hi.", "bogus": 1}]}, {}, "items[0].bogus"),
    ],
)
def test_a_batch_its_schema_refuses_is_a_400(
    body: dict[str, object], settings: dict[str, object], param: str
) -> None:
    with serve_engine(FakeEngine(), **settings) as address:
        response = post(address, BATCH, **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_message" and error["param"] == param


def test_a_batch_runs_a_few_items_at_once_and_no_more_than_the_session_cap() -> None:
    items = [{"input": f"Item number {i}, spoken."} for i in range(8)]
    unbounded = CountingEngine()
    with serve_engine(unbounded, max_sessions=0) as address:
        response = post(address, BATCH, items=items)
    assert response.json()["succeeded"] == 8
    assert unbounded.peak <= ITEMS_AT_ONCE
    capped = CountingEngine()
    with serve_engine(capped, max_sessions=2) as address:
        response = post(address, BATCH, items=items)
    assert response.json()["succeeded"] == 8
    assert capped.peak <= 2


class HeldEngine(FakeEngine):
    """Holds the segments whose text has "held" until the test calls ``release`` (from its thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_open = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()

    def release(self) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self.gate_open.set)

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        if "held" in req.text:
            await self.gate_open.wait()
        async for chunk in super().synthesize(req):
            yield chunk


def test_the_batch_answer_is_written_as_its_results_come() -> None:
    # Each result goes out once it and those before it are done: a maximal batch (32 items of 4096
    # characters, 490 MB of base64 audio) is never held whole in memory.
    engine = HeldEngine()
    items = [{"input": "First one."}, {"input": "This one is held."}]
    with serve_engine(engine) as address:
        with httpx.stream("POST", f"http://{address}{BATCH}", json={"items": items}, timeout=TIMEOUT_S) as r:
            assert r.status_code == 200
            received = b""
            chunks = r.iter_raw()
            while b'"index":0' not in received:
                received += next(chunks)
            assert b'"index":1' not in received and not engine.gate_open.is_set()
            engine.release()
            received += b"".join(chunks)
    body = json.loads(received)
    assert (body["total"], body["succeeded"], body["failed"]) == (2, 2, 0)
    assert [r["index"] for r in body["results"]] == [0, 1]


def test_a_batch_with_no_session_place_is_refused_like_a_speech_request() -> None:
    with serve_engine(FakeEngine(), max_sessions=1) as address:
        with voxgate_connect(f"ws://{address}/v1/audio/speech/stream") as ws:
            send(ws, type="session.config")
            assert recv_message(ws)["type"] == "session.ready"
            refused = post(address, BATCH, items=[{"input": "Hi."}])
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_busy"
        assert refused.headers["retry-after"] == "1"
        deadline = time.monotonic() + TIMEOUT_S
        while (admitted := post(address, BATCH, items=[{"input": "Hi."}])).status_code == 503:
            assert time.monotonic() < deadline, "the WebSocket's place was never given back"
            time.sleep(0.02)
        assert admitted.status_code == 200 and admitted.json()["succeeded"] == 1


def test_a_client_that_leaves_stops_the_batch() -> None:
    engine = FakeEngine(delay_s=0.1, chunk_s=0.1)  # an item's 2.3 s of audio takes 2.3 s to make
    items = [{"input": "A sentence long enough to take a while."}] * 8
    body = json.dumps({"items": items}).encode()
    with serve_engine(engine) as address:
        host, port = address.split(":")
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as client:
            head = f"POST {BATCH} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
            client.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            deadline = time.monotonic() + TIMEOUT_S
            while not engine.started:
                assert time.monotonic() < deadline, "the batch never started"
                time.sleep(0.01)
        while engine.closed < engine.started:
            assert time.monotonic() < deadline, (engine.started, engine.closed)
            time.sleep(0.01)
        started = engine.started
        time.sleep(0.3)
        assert engine.started == started <= ITEMS_AT_ONCE  # nothing more began once the client was gone
        assert engine.finished == 0


# --- the single route's vllm-omni fields -----------------------------------------------------------------


def test_speaker_is_an_alias_of_voice() -> None:
    with serve_engine(FakeEngine()) as address:
        spoken = post(address, SPEECH, input="Hi.", speaker="tone", response_format="pcm")
        unknown = post(address, SPEECH, input="Hi.", speaker="nobody", response_format="pcm")
    assert spoken.status_code == 200 and spoken.content
    assert unknown.status_code == 400
    assert (
        unknown.json()["error"]["code"] == "voice_not_found" and unknown.json()["error"]["param"] == "speaker"
    )


def test_extra_params_reach_the_engine_options_or_are_ignored() -> None:
    params = {"temperature": 0.7, "num_step": 16}
    taking = FakeEngine(supported=frozenset({"speed", "seed", "language", "extra_params"}))
    with serve_engine(taking) as address:
        response = post(address, SPEECH, input="Hi.", response_format="pcm", extra_params=params)
        batch = post(address, BATCH, extra_params=params, items=[{"input": "Hi."}])
    assert response.status_code == 200, response.text
    assert batch.json()["succeeded"] == 1
    assert [r.options["extra_params"] for r in taking.requests] == [params, params]
    unable = FakeEngine()
    with serve_engine(unable) as address:
        # Model tuning an engine cannot use is ignored, with a warning (gateway.voices.catalog.IGNORABLE).
        ignored = post(address, SPEECH, input="Hi.", response_format="pcm", extra_params=params)
        empty = post(address, SPEECH, input="Hi.", response_format="pcm", extra_params={})
        not_an_object = post(address, SPEECH, input="Hi.", extra_params=[1])
    assert ignored.status_code == 200
    assert all("extra_params" not in r.options for r in unable.requests)
    assert empty.status_code == 200  # asks for nothing
    assert not_an_object.status_code == 400 and not_an_object.json()["error"]["param"] == "extra_params"


@pytest.mark.parametrize(
    ("body", "settings", "param"),
    [
        ({"instructions": "x" * 501}, {}, "instructions"),
        ({"instructions": "x" * 11}, {"max_instructions_chars": 10}, "instructions"),
        ({"max_new_tokens": 4097}, {}, "max_new_tokens"),
        ({"max_new_tokens": 0}, {}, "max_new_tokens"),
        ({"speaker_embedding": [0.5] * 8193}, {}, "speaker_embedding"),
    ],
)
def test_limits_are_vllm_omnis(body: dict[str, object], settings: dict[str, object], param: str) -> None:
    with serve_engine(FakeEngine(), **settings) as address:
        response = post(address, SPEECH, input="Hi.", **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_message" and error["param"] == param


def test_instructions_at_the_limit_pass() -> None:
    with serve_engine(FakeEngine()) as address:
        response = post(address, SPEECH, input="Hi.", response_format="pcm", instructions="x" * 500)
    assert response.status_code == 200


def test_the_websocket_holds_instructions_to_the_same_limit() -> None:
    """One limit on every surface: a first session.config with 501 characters of instructions is refused
    (fatal, as any refused first config), one of 500 is taken."""
    with serve_engine(FakeEngine()) as address:
        for size, refused in ((501, True), (500, False)):
            uri = f"ws://{address}/v1/audio/speech/stream"
            with voxgate_connect(uri, open_timeout=TIMEOUT_S) as ws:
                send(ws, type="session.config", instructions="x" * size)
                answer = recv_message(ws)
            if refused:
                assert answer["type"] == "error" and answer["code"] == "invalid_message", answer
                assert answer["field"] == "$.instructions" and answer["fatal"] is True
            else:
                assert answer["type"] == "session.ready", answer


def test_word_timestamps_come_in_the_x_word_timestamps_header_of_a_whole_answer() -> None:
    engine = WordEngine()
    text = "Hello there. How are you?"
    with serve_engine(engine) as address:
        response = post(address, SPEECH, input=text, response_format="wav", word_timestamps=True)
        streamed = post(address, SPEECH, input=text, word_timestamps=True, stream=True)
        sse = post(address, SPEECH, input=text, word_timestamps=True, stream_format="sse")
        long = post(address, SPEECH, input="word " * 200, response_format="pcm", word_timestamps=True)
    assert response.status_code == 200, response.text
    words = json.loads(response.headers["x-word-timestamps"])
    assert [w["word"] for w in words] == text.split()
    assert all(set(w) == {"word", "start_ms", "end_ms"} and isinstance(w["start_ms"], int) for w in words)
    # The utterance's clock: the second sentence's words follow the first's 400 ms.
    assert [(w["start_ms"], w["end_ms"]) for w in words[:3]] == [(0, 200), (200, 400), (400, 600)]
    audio, rate = soundfile.read(io.BytesIO(response.content), dtype="float32")
    assert rate == 24000 and abs(len(audio) / rate - 5 * WordEngine.WORD_S) < 0.05
    for refused in (streamed, sse):
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "word_timestamps"
    assert long.status_code == 200 and "x-word-timestamps" not in long.headers
    assert long.headers["x-word-timestamps-omitted"].startswith("oversize; bytes=")
    assert long.headers["x-word-timestamps-omitted"].endswith("; limit=4096")
    with serve_engine(FakeEngine()) as address:
        unable = post(address, SPEECH, input=text, word_timestamps=True)
    assert unable.status_code == 400 and unable.json()["error"]["code"] == "unsupported_option"


# --- voices ----------------------------------------------------------------------------------------------


def _clip() -> bytes:
    out = io.BytesIO()
    t = np.arange(2 * 16000) / 16000
    soundfile.write(out, (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), 16000, format="WAV")
    return out.getvalue()


def test_uploaded_names_are_in_voices_and_uploads_say_their_embedding_source() -> None:
    with serve_engine(FakeEngine(clones=True)) as address:
        url = f"http://{address}{VOICES}"
        clip = httpx.post(
            url,
            data={"name": "Narrator", "consent": "rec-1"},
            files={"audio_sample": ("n.wav", _clip(), "audio/wav")},
            timeout=TIMEOUT_S,
        )
        direct = httpx.post(
            url,
            data={"name": "vec", "consent": "rec-2", "speaker_embedding": json.dumps([0.5] * 4096)},
            timeout=TIMEOUT_S,
        )
        too_long = httpx.post(
            url,
            data={"name": "vec2", "consent": "rec-3", "speaker_embedding": json.dumps([0.5] * 4097)},
            timeout=TIMEOUT_S,
        )
        listing = httpx.get(url, timeout=TIMEOUT_S).json()
    assert clip.status_code == 200, clip.text
    assert clip.json()["voice"]["embedding_source"] == "audio"
    assert direct.status_code == 200, direct.text
    assert direct.json()["voice"]["embedding_source"] == "direct"
    assert direct.json()["voice"]["embedding_dim"] == 4096
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "embedding_too_long"
    assert listing["voices"] == ["tone", "Narrator", "vec"]
    assert {v["name"]: v["embedding_source"] for v in listing["uploaded_voices"]} == {
        "Narrator": "audio",
        "vec": "direct",
    }
