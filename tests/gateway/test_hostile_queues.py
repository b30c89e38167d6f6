"""Hostile queues against a real uvicorn: what a session queues is bounded whatever its kind, a cancel costs
what it cancels, and repeated errors do not flood the log (issue 18 #1, #2, #19).

The hostile clients are raw sockets: they send without ever reading, as an attacker does, so what the
server holds for them is only what it chose to queue (a WebSocket client library would stop sending once
its own buffers filled).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager

import pytest
from voxgate.engine.base import AudioChunk, SynthesisRequest
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.session import errorlog, outbox
from voxgate.protocol.output import Output

from tests.conftest import (
    TIMEOUT_S,
    LogRecords,
    recv,
    recv_message,
    recv_until,
    send,
    serve_engine,
    session,
)

URL = "/v1/audio/speech/stream"


def _raw_connect(address: str, path: str, subprotocol: str | None = None) -> socket.socket:
    """A WebSocket opened by hand on a socket with a small receive buffer, that the test never reads."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(TIMEOUT_S)
    sock.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    offer = f"Sec-WebSocket-Protocol: {subprotocol}\r\n" if subprotocol else ""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{offer}\r\n"
    )
    sock.sendall(request.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert b" 101 " in head.split(b"\r\n", 1)[0], head
    return sock


def _frame(text: str) -> bytes:
    """One masked text frame, as a client sends it."""
    data, mask = text.encode(), os.urandom(4)
    n = len(data)
    head = bytes([0x81])
    head += bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def _flood(sock: socket.socket, payload: bytes) -> threading.Thread:
    """Send ``payload`` from a thread until it is all sent or the server is gone."""

    def send_all() -> None:
        try:
            sock.sendall(payload)
        except OSError:
            pass

    thread = threading.Thread(target=send_all, daemon=True)
    thread.start()
    return thread


@contextmanager
def _peak_queue(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The most outputs any session's outbox held at once, while the block runs (one-item list)."""
    peak = [0]
    put = outbox.Outbox.put

    def counting_put(self: outbox.Outbox, item: Output) -> None:
        put(self, item)
        peak[0] = max(peak[0], len(self))

    monkeypatch.setattr(outbox.Outbox, "put", counting_put)
    yield peak


@contextmanager
def _gateway_log() -> Iterator[LogRecords]:
    """The gateway's records at INFO and above while the block runs."""
    log = logging.getLogger("voxgate.gateway")
    level = log.level
    handler = LogRecords()
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


class GatedEngine(FakeEngine):
    """A FakeEngine whose audio waits until the test opens the gate (from its own thread)."""

    def __init__(self) -> None:
        super().__init__()
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.waiting = 0

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        if self._event is None:
            self._loop, self._event = asyncio.get_running_loop(), asyncio.Event()
        self.waiting += 1
        await self._event.wait()
        async for chunk in super().synthesize(req):
            yield chunk

    def open(self) -> None:
        assert self._loop is not None and self._event is not None
        self._loop.call_soon_threadsafe(self._event.set)


# -- #1: a client that repeats a refused message and never reads ---------------------------------------


def test_an_elevenlabs_client_repeating_a_refused_first_message_without_reading_is_held_to_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each refusal is an error queued for the client; it never reads them. The reader stops at the bound
    (TCP pushes back on the client), and the writer's send timeout ends the session (4001)."""
    refused = _frame(json.dumps({"text": " ", "voice_settings": {"speed": 99}}))
    bound = 64
    with (
        _peak_queue(monkeypatch) as peak,
        _gateway_log() as records,
        serve_engine(FakeEngine(), send_timeout_s=1.0, max_buffered_messages=bound) as address,
    ):
        sock = _raw_connect(address, "/v1/text-to-speech/tone/stream-input?output_format=pcm_16000")
        flood = _flood(sock, refused * 50_000)  # 3.4 MB of refused first messages
        _wait_for(
            lambda: any("slow_consumer" in r.getMessage() for r in records.records),
            "the session was not ended as a slow consumer",
        )
        sock.close()
        flood.join(TIMEOUT_S)
    # The error of one message may be queued past the bound before the reader waits.
    assert peak[0] <= bound + 1, f"{peak[0]} outputs queued for a client that reads nothing"


# -- #2: a cancel flood on one socket does not freeze the others ----------------------------------------


def _first_audio_ms(ws: object) -> float:
    """Speak a short utterance on a configured session: milliseconds from its text to its first audio."""
    started = time.perf_counter()
    send(ws, type="input.text", text="Hello there.")  # type: ignore[arg-type]
    send(ws, type="input.done")  # type: ignore[arg-type]
    while not isinstance(recv(ws), bytes):  # type: ignore[arg-type]
        pass
    elapsed = (time.perf_counter() - started) * 1000.0
    recv_until(ws, "session.done")  # type: ignore[arg-type]
    return elapsed


SID = "MZ00000000000000000000000000000018"


@pytest.mark.parametrize("carrier", [None, "twilio"])
def test_a_flood_of_12k_cancels_on_one_socket_leaves_another_sessions_first_audio_under_a_second(
    carrier: str | None,
) -> None:
    """12k ``input.cancel`` (or a phone carrier's ``clear``) from a client that reads nothing: each costs
    what it cancels, and the reader stops at the outbox's bound, so the other sessions do not wait."""
    setup: dict[str, object] = {"type": "session.config", "voice": "tone"}
    cancel: dict[str, object] = {"type": "input.cancel"}
    if carrier is not None:
        setup |= {"framing": carrier, "stream_sid": SID}
        cancel = {"event": "clear", "streamSid": SID}
    cancels = _frame(json.dumps(cancel)) * 12_000
    # Audio first, so that the buffers between the two fill and the writer blocks: what the server
    # answers from then on waits in the outbox.
    speech = [_frame(json.dumps(m)) for m in (setup, {"type": "input.text", "text": "Words. " * 400})]
    speech.append(_frame(json.dumps({"type": "input.done"})))
    with serve_engine(FakeEngine()) as address, session(address, voice="tone") as probe:
        assert _first_audio_ms(probe) < 1000.0  # warm
        sock = _raw_connect(address, URL, subprotocol="voxgate.v1")
        sock.sendall(b"".join(speech))
        time.sleep(1.0)  # the audio fills the socket's buffers, then the outbox
        flood = _flood(sock, cancels)
        time.sleep(0.2)  # the server is taking the cancels
        worst = max(_first_audio_ms(probe) for _ in range(5))
        sock.close()
        flood.join(TIMEOUT_S)
    assert worst < 1000.0, f"a probe's first audio took {worst:.0f} ms during the cancel flood"


# -- #19a: the bound never holds a client that reads ----------------------------------------------------


def test_a_reader_over_the_message_bound_still_gets_every_answer_and_its_cancel_works() -> None:
    """The client floods refused messages and a cancel before it reads anything, with its utterance held
    by the engine: the reader stops at the bound, but once the client reads, everything goes through in
    order (no answer is lost) and the cancel cancels. No deadlock: the writer makes room whenever the
    client reads, whatever the engine does."""
    engine = GatedEngine()
    bound, refusals = 8, 200
    with serve_engine(engine, max_buffered_messages=bound) as address, session(address, voice="tone") as ws:
        send(ws, type="input.text", text="A long sentence that the engine holds back for now.")
        send(ws, type="input.done")
        _wait_for(lambda: engine.waiting, "the engine was not asked")
        for _ in range(refusals):
            ws.send("not json")
        send(ws, type="input.cancel")
        got = recv_until(ws, "audio.cancelled")
        errors = got.messages("error")
        assert len(errors) == refusals
        assert {(e["code"], e["fatal"]) for e in errors} == {("invalid_json", False)}
        assert not got.frames()
        engine.open()
        send(ws, type="input.text", text="Still here.")
        send(ws, type="input.done")
        after = recv_until(ws, "session.done")
    assert after.frames()


def test_a_client_behind_on_audio_and_over_the_message_bound_gets_its_cancel_once_it_reads() -> None:
    """The hardest case for the bound: the client has not read its audio (the writer waits on it, and
    synthesis waits for room), then floods refused messages and cancels. The reader stops at the bound
    with the cancel still in the socket; once the client reads, the writer goes on, the reader takes the
    rest, and the cancel cancels: no deadlock, no ``slow_consumer``."""
    bound, refusals = 8, 100
    with (
        serve_engine(FakeEngine(), max_buffered_audio_s=1.0, max_buffered_messages=bound) as address,
        session(address, voice="tone", response_format="pcm") as ws,
    ):
        send(ws, type="input.text", text="Many words to speak for a long while. " * 40)
        send(ws, type="input.done")
        time.sleep(0.5)  # not reading: the writer and the engine wait for the client
        for _ in range(refusals):
            ws.send("not json")
        send(ws, type="input.cancel")
        time.sleep(0.5)  # the reader is stopped at the bound, the cancel waits in the socket
        got = recv_until(ws, "audio.cancelled")
        send(ws, type="input.text", text="Again.")
        send(ws, type="input.done")
        again = recv_until(ws, "session.done")
    assert len(got.messages("error")) == refusals
    assert again.frames()


def test_a_cancel_is_read_while_the_outbox_is_full_of_audio_for_a_client_that_stopped_reading() -> None:
    """Audio never stops the reader: with the audio bound reached and the client not reading, its cancel
    is still taken at once, and what was queued is dropped."""
    with (
        serve_engine(FakeEngine(), max_buffered_audio_s=1.0) as address,
        session(address, voice="tone", response_format="pcm") as ws,
    ):
        send(ws, type="input.text", text="Many words to speak for a long while. " * 40)
        send(ws, type="input.done")
        time.sleep(0.5)  # not reading: the outbox fills to its audio bound and synthesis pauses
        send(ws, type="input.cancel")
        got = recv_until(ws, "audio.cancelled")
        send(ws, type="input.text", text="Again.")
        send(ws, type="input.done")
        again = recv_until(ws, "session.done")
    assert got.messages("audio.cancelled")
    assert again.frames()


# -- #19b: repeated non-fatal errors are rate-limited in the log ----------------------------------------


def test_repeated_non_fatal_errors_log_a_few_lines_then_a_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errorlog, "WINDOW_S", 1.0)
    refusals = 300
    with (
        _gateway_log() as records,
        serve_engine(FakeEngine()) as address,
        session(address, voice="tone") as ws,
    ):
        for _ in range(refusals):
            ws.send("not json")
        for _ in range(refusals):
            assert recv_message(ws)["code"] == "invalid_json"
        _wait_for(
            lambda: any("suppressed" in r.getMessage() for r in records.records),
            "no line counted the errors not logged",
        )
    lines = [r.getMessage() for r in records.records]
    errors = [line for line in lines if "invalid_json" in line and "suppressed" not in line]
    assert 0 < len(errors) <= errorlog.FIRST_ERRORS
    suppressed = [line for line in lines if "suppressed" in line]
    assert f"{refusals - len(errors)} more" in suppressed[0], suppressed


# -- the outbox's accounting -----------------------------------------------------------------------------


def test_the_outbox_drops_an_utterance_at_its_own_cost_and_keeps_the_rest_in_order() -> None:
    """Dropping counts off the victims' tallies at once; the writer skips their outputs; a queue mostly of
    dropped outputs is rebuilt, so it holds no more than the live ones (plus a little)."""
    from voxgate.protocol.messages import AudioCancelled
    from voxgate.protocol.output import Audio, Message, Report

    async def scenario() -> None:
        box = outbox.Outbox(max_audio_s=1000.0, max_messages=10_000, max_message_bytes=10**9)
        for u in range(200):
            box.put(Audio(b"x" * 10, u, 0, 0.5))
            box.put(Report(u, 0))
        box.put(Message(AudioCancelled(utterance_index=7)))
        assert len(box) == 401 and box.audio_s == 100.0
        box.drop(range(0, 200, 2))  # every even utterance
        assert len(box) == 201 and box.audio_s == 50.0 and box.queued.messages == 101
        box.drop(range(1, 199, 2))  # all odd ones but the last: the queue is rebuilt
        assert len(box) == 3 and len(box._items) == 3
        got = [await box.get() for _ in range(3)]
        assert got == [
            Audio(b"x" * 10, 199, 0, 0.5),
            Report(199, 0),
            Message(AudioCancelled(utterance_index=7)),
        ]
        assert len(box) == 0 and box.audio_s == 0.0 and box.queued.message_bytes == 0
        box.drop([199])  # nothing left of it: a no-op
        box.put(Report(3))
        assert await box.get() == Report(3)

    asyncio.run(scenario())


def test_the_reader_waits_at_the_whole_bound_and_the_engine_at_half() -> None:
    from voxgate.protocol.output import Report

    async def scenario() -> None:
        box = outbox.Outbox(max_audio_s=1.0, max_messages=4, max_message_bytes=10**9)
        for u in range(3):
            box.put(Report(u))
        await asyncio.wait_for(box.room_to_read(), TIMEOUT_S)  # 3 of 4: the reader goes on
        engine = asyncio.ensure_future(box.room())  # over half: the engine waits
        await asyncio.sleep(0)
        assert not engine.done()
        box.put(Report(3))
        box.put(Report(4))
        reader = asyncio.ensure_future(box.room_to_read())
        receipts = asyncio.Event()
        writer = asyncio.ensure_future(box.unless_reader_stops(receipts.wait()))
        await asyncio.wait_for(writer, TIMEOUT_S)  # released: receipts cannot come while the reader waits
        assert not reader.done()
        for _ in range(4):
            await box.get()
        await asyncio.wait_for(asyncio.gather(reader, engine), TIMEOUT_S)

    asyncio.run(scenario())
