"""Hostile clients of the ElevenLabs and Twilio surfaces against a real uvicorn (issue 18 #4, #11, #19).

Deep JSON is a coded ``invalid_json`` (never a 1011 / 500 with a traceback); a non-fatal error carries no
close code; an alignment spells the text as written even where the engine splits a long token; a
``with-timestamps`` answer is written as it is made, in memory bounded by a segment; a Twilio ``clear``
naming another stream is refused, not honoured.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from voxgate.engine.base import AudioChunk, SynthesisRequest, WordTiming
from voxgate.engine.fake import FakeEngine
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.conftest import TIMEOUT_S, LogRecords, recv, recv_message, send, serve_engine, session

DEPTH = 5000  # nested arrays: past the interpreter's recursion limit, far below max_message_bytes
SID = "MZ00000000000000000000000000000001"


@contextmanager
def problems() -> Iterator[list[logging.LogRecord]]:
    """Records at WARNING or above, or with a traceback, that any logger emits while the block runs."""
    handler = LogRecords()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.error")]
    for logger in loggers:
        logger.addHandler(handler)
    found: list[logging.LogRecord] = []
    try:
        yield found
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        found.extend(r for r in handler.records if r.levelno >= logging.ERROR or r.exc_info)


def _ws(address: str, path: str, query: str = "output_format=pcm_16000") -> ClientConnection:
    conn: ClientConnection = connect(
        f"ws://{address}/v1/text-to-speech/{path}?{query}", open_timeout=TIMEOUT_S, max_size=None
    )
    return conn


def _until_closed(ws: ClientConnection) -> tuple[list[dict[str, Any]], int | None]:
    got: list[dict[str, Any]] = []
    try:
        while True:
            got.append(json.loads(ws.recv(timeout=TIMEOUT_S)))
    except ConnectionClosed as closed:
        return got, closed.rcvd.code if closed.rcvd else None


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    with serve_engine(FakeEngine()) as addr:
        yield addr


def _deep(field: str) -> str:
    return "{" + f'"{field}": ' + "[" * DEPTH + "]" * DEPTH + "}"


@pytest.mark.parametrize("path", ["tone/stream-input", "tone/multi-stream-input"])
@pytest.mark.parametrize(
    ("field", "error"),
    [("generation_config", "invalid_json"), ("pronunciation", "invalid_json"), ("text", "invalid_message")],
)
def test_deeply_nested_websocket_message_is_a_coded_error_without_a_traceback(
    address: str, path: str, field: str, error: str
) -> None:
    """An ignored field is skipped to its end (too deep: ``invalid_json``); a known one stops at its type."""
    with problems() as found, _ws(address, path) as ws:
        ws.send(_deep(field))
        got, code = _until_closed(ws)
    assert code == 1007 and [m["error"] for m in got] == [error]
    assert not found, [r.getMessage() for r in found]


@pytest.mark.parametrize("route", ["", "/stream", "/with-timestamps", "/stream/with-timestamps"])
def test_deeply_nested_rest_body_is_a_400_without_a_traceback(address: str, route: str) -> None:
    url = f"http://{address}/v1/text-to-speech/tone{route}?output_format=pcm_16000"
    with problems() as found:
        answer = httpx.post(url, content=_deep("previous_request_ids"), timeout=TIMEOUT_S)
    assert answer.status_code == 400 and answer.json()["detail"]["status"] == "invalid_json"
    assert not found, [r.getMessage() for r in found]


def test_a_non_fatal_error_carries_no_close_code(address: str) -> None:
    """The socket stays open after it: a close code in it (1009, 1011) would say otherwise."""
    with _ws(address, "tone/multi-stream-input") as ws:
        ws.send(json.dumps({"text": "x" * (200 * 1024), "context_id": "a"}))  # past max_message_bytes
        too_large = json.loads(ws.recv(timeout=TIMEOUT_S))
        for n in range(9):  # one past max_contexts
            ws.send(json.dumps({"text": " ", "context_id": f"c{n}"}))
        too_many = json.loads(ws.recv(timeout=TIMEOUT_S))
        ws.send(json.dumps({"text": "Still open. ", "context_id": "c0", "flush": True}))
        spoken = json.loads(ws.recv(timeout=TIMEOUT_S))
        while spoken["alignment"] is None:  # its audio as it comes, then its alignment
            spoken = json.loads(ws.recv(timeout=TIMEOUT_S))
        ws.send(json.dumps({"close_socket": True}))
        _, code = _until_closed(ws)
    assert too_large == {"message": too_large["message"], "error": "message_too_large"}
    assert too_many["error"] == "max_active_conversations" and "code" not in too_many
    assert spoken["contextId"] == "c0" and "".join(spoken["alignment"]["chars"]) == "Still open. "
    assert code == 1000


def test_a_fatal_error_carries_its_close_code(address: str) -> None:
    with _ws(address, "tone/stream-input") as ws:
        ws.send("{not json")
        got, code = _until_closed(ws)
    assert code == 1007 and got == [{"message": got[0]["message"], "error": "invalid_json", "code": 1007}]


class SplitWords(FakeEngine):
    """Times words as an engine that splits a long token over two synthesis pieces does: in two parts."""

    def __init__(self) -> None:
        super().__init__(supported=frozenset({"speed", "seed", "language", "word_timestamps"}))

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        words: list[str] = []
        for word in req.text.split():
            words += [word[: len(word) // 2], word[len(word) // 2 :]] if len(word) > 12 else [word]
        per_word = int(0.3 * self.sample_rate)
        yield AudioChunk(
            np.zeros(per_word * len(words), dtype=np.float32),
            self.sample_rate,
            tuple(WordTiming(w, n * per_word, (n + 1) * per_word) for n, w in enumerate(words)),
        )


TOKEN = "sha256:9f86d081884c7d659a2feaa0c55ad015"


def test_an_alignment_invents_no_space_inside_a_token_the_engine_timed_in_parts() -> None:
    text = f"The hash is {TOKEN} today. "
    with serve_engine(SplitWords()) as addr:
        with _ws(addr, "tone/stream-input") as ws:
            ws.send(json.dumps({"text": " "}))
            ws.send(json.dumps({"text": text}))
            ws.send(json.dumps({"text": ""}))
            got, code = _until_closed(ws)
        url = f"http://{addr}/v1/text-to-speech/tone/with-timestamps?output_format=pcm_16000"
        whole = httpx.post(url, json={"text": text.strip()}, timeout=TIMEOUT_S).json()
    assert code == 1000
    assert "".join(c for m in got if m.get("alignment") for c in m["alignment"]["chars"]) == text
    assert "".join(whole["alignment"]["characters"]) == text
    # The token's characters are timed where its two parts are spoken, in order.
    starts = whole["alignment"]["character_start_times_seconds"]
    assert starts == sorted(starts)


class HeldAfterFirst(FakeEngine):
    """Speaks the first segment at once and holds every later one until the request goes away."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()  # set once a held segment's synthesis was closed

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        if self.started:
            try:
                await asyncio.Event().wait()
            finally:
                self.released.set()
        async for chunk in super().synthesize(req):
            yield chunk


def test_with_timestamps_is_written_as_it_is_made() -> None:
    """Its JSON object starts before the last segment is made (an engine that holds it proves it)."""
    engine = HeldAfterFirst()
    with serve_engine(engine) as addr:
        url = f"http://{addr}/v1/text-to-speech/tone/with-timestamps?output_format=pcm_16000"
        with httpx.stream("POST", url, json={"text": "First. Second one."}, timeout=TIMEOUT_S) as answer:
            assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
            head = b""
            for piece in answer.iter_raw():
                head += piece
                if len(head) > 64:
                    break
        assert head.startswith(b'{"audio_base64":"')
        assert engine.released.wait(TIMEOUT_S)  # the client left: the held segment's work stopped


def _old_whole_json(lines: list[dict[str, Any]]) -> bytes:
    """The ``with-timestamps`` body as voxgate wrote it when it gathered the NDJSON lines (JSONResponse)."""
    audio = b"".join(base64.b64decode(line["audio_base64"]) for line in lines)
    shape = {
        key: [v for line in lines for v in line["alignment"][key]]
        for key in ("characters", "character_start_times_seconds", "character_end_times_seconds")
    }
    whole = {
        "audio_base64": base64.b64encode(audio).decode(),
        "alignment": shape,
        "normalized_alignment": shape,
    }
    return json.dumps(whole, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


@pytest.mark.parametrize("fmt", ["pcm_16000", "ulaw_8000", "mp3_22050_32"])
@pytest.mark.parametrize("text", ['One. Two "three". Four\\five.', "Ça va? Très bien — 終わり。 Yes."])
def test_with_timestamps_body_is_byte_identical_to_the_gathered_one(
    address: str, fmt: str, text: str
) -> None:
    base = f"http://{address}/v1/text-to-speech/tone"
    lines = httpx.post(f"{base}/stream/with-timestamps?output_format={fmt}", json={"text": text}).text
    whole = httpx.post(f"{base}/with-timestamps?output_format={fmt}", json={"text": text})
    assert whole.status_code == 200
    assert whole.content == _old_whole_json([json.loads(line) for line in lines.splitlines()])


def _rss_mb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) // 1024
    raise AssertionError(field)  # pragma: no cover


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak RSS reset")
@pytest.mark.parametrize("route", ["/with-timestamps", "", "/stream/with-timestamps"])
def test_a_20k_character_request_is_served_in_memory_bounded_by_a_segment(address: str, route: str) -> None:
    """20,000 characters are 20 minutes of audio (38 MB of pcm_16000): the server never holds them whole."""
    text = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 400)[:20_000]
    url = f"http://{address}/v1/text-to-speech/tone{route}?output_format=pcm_16000"
    httpx.post(url, json={"text": "Warm up. Twice."}, timeout=TIMEOUT_S).raise_for_status()
    before = _rss_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
    body = 0
    with httpx.stream("POST", url, json={"text": text}, timeout=10 * TIMEOUT_S) as answer:
        assert answer.status_code == 200
        for piece in answer.iter_raw():
            body += len(piece)
    assert body > 30_000_000
    assert _rss_mb("VmHWM") - before < 40


def test_twilio_clear_of_another_stream_is_refused_and_cancels_nothing(address: str) -> None:
    with session(address, framing="twilio", stream_sid=SID) as ws:
        ws.send(json.dumps({"event": "clear", "streamSid": "MZ99999999999999999999999999999999"}))
        refused = recv_message(ws)
        send(ws, type="input.text", text="Still speaking.")
        send(ws, type="input.done")
        kinds: list[str] = []
        while "session.done" not in kinds:
            item = recv(ws)
            assert isinstance(item, dict)
            kinds.append(str(item.get("type", item.get("event"))))
        ws.send(json.dumps({"event": "clear", "streamSid": SID}))  # its own stream's clear still cancels
        clear = recv(ws)
        cancelled = recv_message(ws)
    assert refused["type"] == "error" and refused["code"] == "invalid_message"
    assert refused["field"] == "$.streamSid" and refused["fatal"] is False
    assert "media" in kinds and "audio.cancelled" not in kinds
    assert clear == {"event": "clear", "streamSid": SID}
    assert cancelled["type"] == "audio.cancelled"
