"""Read receipts and the coalescing transport (gateway/session/receipts.py).

A client that stops reading is closed with 4001 ``slow_consumer`` within ``send_timeout_s`` even when
nothing it was sent ever fills a buffer: with permessage-deflate a test tone compresses to almost
nothing, so the writes never block (issue 10). A client that reads at playback pace, however far
behind, is never closed. The writes of one turn of the event loop reach the socket as one write.

The ``ReadReceipts`` unit tests drive a hand-turned clock (``Clock``), so no ordering depends on timing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
import voxgate.gateway.session.receipts as receipts_module
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.session.receipts import QUIET_S, CoalescingTransport, ReadReceipts

from ..conftest import TIMEOUT_S, recv, send, serve_engine, voxgate_connect

URL = "/v1/audio/speech/stream"


# -- ReadReceipts, on a hand-turned clock ------------------------------------------------------------------


class Handle:
    """What ``ReadReceipts`` does with a timer handle: cancel it."""

    def __init__(self) -> None:
        self.is_cancelled = False

    def cancel(self) -> None:
        self.is_cancelled = True


class Clock:
    """The two methods of an event loop that ``ReadReceipts`` uses, with time moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Callable[[], None], Handle]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        handle = Handle()
        self.timers.append((when, callback, handle))
        return cast(asyncio.TimerHandle, handle)

    def advance(self, seconds: float) -> None:
        """Move time on, running the timers that fall due (and those they arm), in order."""
        end = self.now + seconds
        while due := sorted(
            (t for t in self.timers if t[0] <= end and not t[2].is_cancelled), key=lambda t: t[0]
        ):
            when, callback, handle = due[0]
            self.timers.remove(due[0])
            self.now = when
            callback()
        self.now = end


def receipts(timeout_s: float = 4.0) -> tuple[ReadReceipts, list[bytes], Clock]:
    clock, pings = Clock(), []

    def send_ping(payload: bytes) -> bool:
        pings.append(payload)
        return True

    watched = ReadReceipts(send_ping, cast(Any, clock))
    watched.watch(timeout_s)  # a ping per second of audio (a quarter of the timeout)
    return watched, pings, clock


def test_a_ping_follows_each_interval_of_audio_and_its_pong_is_a_receipt() -> None:
    watched, pings, clock = receipts()
    watched.wrote(0.6)
    assert pings == []
    watched.wrote(0.6)  # 1.2 s of audio since the last ping
    assert len(pings) == 1 and watched.awaiting
    assert watched.pong(b"1234") is False  # uvicorn's keepalive pong: not ours
    assert watched.awaiting
    assert watched.pong(pings[0]) is True
    assert not watched.awaiting
    clock.advance(60.0)
    assert not watched.stalled.is_set()


def test_the_end_of_a_burst_gets_a_ping_once_writes_pause() -> None:
    watched, pings, clock = receipts()
    watched.wrote()  # a JSON event: no audio
    clock.advance(QUIET_S / 2)
    watched.wrote(0.04)  # the burst goes on
    clock.advance(QUIET_S * 0.9)
    assert pings == []  # less than QUIET_S since the last write
    clock.advance(QUIET_S)
    assert len(pings) == 1
    clock.advance(QUIET_S * 5)
    assert len(pings) == 1  # nothing written since: no other ping


def test_no_pong_for_the_timeout_is_a_stall() -> None:
    watched, pings, clock = receipts(timeout_s=4.0)
    watched.wrote(1.0)
    clock.advance(3.9)
    assert not watched.stalled.is_set()
    clock.advance(0.2)
    assert watched.stalled.is_set()


def test_a_reader_far_behind_but_at_playback_pace_is_not_stalled() -> None:
    """All of 20 s of audio is written at once; the client then reads it in real time, so the ping after
    second k is answered k seconds later: far past the timeout for the late ones, but the pongs keep
    coming, one a second, and each restarts the clock."""
    watched, pings, clock = receipts(timeout_s=4.0)
    for _ in range(20):
        watched.wrote(1.0)
    assert len(pings) == 20
    for ping in pings:
        clock.advance(1.0)
        assert watched.pong(ping)
        assert not watched.stalled.is_set()
    assert not watched.awaiting


def test_pongs_answer_every_ping_before_theirs_and_stale_ones_are_ignored() -> None:
    watched, pings, clock = receipts(timeout_s=4.0)
    for _ in range(3):
        watched.wrote(1.0)
    assert watched.pong(pings[1])  # a client may answer only the latest of several pings
    assert watched.pong(pings[0])  # stale now: ignored, and still ours
    assert watched.awaiting  # the third is unanswered
    clock.advance(3.9)  # the clock restarted at the pong
    assert not watched.stalled.is_set()
    clock.advance(0.2)
    assert watched.stalled.is_set()


def test_a_closed_or_unwatched_receipts_sends_nothing() -> None:
    clock, pings = Clock(), list[bytes]()

    def send_ping(payload: bytes) -> bool:
        pings.append(payload)
        return True

    idle = ReadReceipts(send_ping, cast(Any, clock))
    idle.wrote(10.0)  # not watching yet
    assert pings == [] and not idle.awaiting
    idle.watch(4.0)
    idle.wrote(1.0)
    idle.close()
    clock.advance(60.0)
    assert len(pings) == 1 and not idle.stalled.is_set()


def test_a_socket_that_is_closing_takes_no_ping() -> None:
    clock = Clock()
    watched = ReadReceipts(lambda p: False, cast(Any, clock))
    watched.watch(4.0)
    watched.wrote(2.0)
    assert not watched.awaiting
    clock.advance(60.0)
    assert not watched.stalled.is_set()


def test_pings_carry_random_tokens_and_made_up_pongs_answer_none() -> None:
    """Issue 18 #13: a counter let a client answer pings it never read."""
    watched, pings, clock = receipts(timeout_s=4.0)
    other, other_pings, _ = receipts(timeout_s=4.0)
    for _ in range(3):
        watched.wrote(1.0)
        other.wrote(1.0)
    assert len(set(pings) | set(other_pings)) == 6
    assert all(len(p) == 12 and p.startswith(b"vxrr") for p in pings)
    for seq in range(1, 10):  # what a counter would have sent, in both of its lengths
        assert watched.pong(b"vxrr" + seq.to_bytes(8, "big"))  # ours in shape: not uvicorn's ...
        watched.pong(b"vxrr" + seq.to_bytes(4, "big"))
    assert watched.pong(other_pings[2])  # ... and another connection's
    assert watched.awaiting and watched.unread_s == 3.0  # ... but none answers a ping
    clock.advance(4.1)
    assert watched.stalled.is_set()


def test_a_receipt_calls_on_receipt_and_counts_the_audio_read() -> None:
    watched, pings, clock = receipts(timeout_s=4.0)
    seen: list[float] = []
    watched.on_receipt = lambda: seen.append(clock.time())
    for _ in range(4):
        watched.wrote(1.0)
    assert watched.unread_s == 4.0 and watched.in_flight
    clock.advance(0.5)
    assert watched.pong(pings[1])  # the client read the first two seconds
    assert seen == [clock.time()] and watched.last_receipt == clock.time()
    assert watched.unread_s == 2.0 and watched.awaiting
    assert watched.pong(pings[0])  # answered already: no receipt
    assert len(seen) == 1
    assert watched.pong(pings[3])
    assert watched.unread_s == 0.0 and not watched.awaiting and not watched.in_flight
    watched.wrote()  # a JSON message: unreceipted until its ping, 0.2 s later
    assert watched.in_flight and not watched.awaiting
    watched.close()
    assert not watched.in_flight


def test_read_up_to_waits_for_the_client_to_read_and_pings_the_last_writes_at_once() -> None:
    async def run() -> None:
        watched, pings, clock = receipts(timeout_s=4.0)
        await watched.read_up_to(0.0)  # nothing written: returns at once
        for _ in range(3):
            watched.wrote(1.0)
        watched.wrote(0.5)  # not yet pinged
        waiter = asyncio.ensure_future(watched.read_up_to(1.0))
        await asyncio.sleep(0)
        assert not waiter.done() and len(pings) == 4  # the last half second was pinged at once
        watched.pong(pings[1])  # 1.5 s unread still
        await asyncio.sleep(0)
        assert not waiter.done()
        watched.pong(pings[2])  # 0.5 s unread
        await asyncio.sleep(0)
        assert waiter.done()
        closing = asyncio.ensure_future(watched.read_up_to(0.0))
        await asyncio.sleep(0)
        watched.close()  # the connection went: the wait ends
        await asyncio.sleep(0)
        assert closing.done()

    asyncio.run(run())


# -- through a real server --------------------------------------------------------------------------------


def until(condition: Callable[[], bool], limit_s: float = TIMEOUT_S) -> bool:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_stalled_reader_with_deflate_is_closed_though_no_write_ever_blocks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The tone compresses about 100 to 1: all of its 40 s go into the socket's buffers at once, so
    the writer never waits, and only the missing pongs tell that the client stopped reading."""
    engine = FakeEngine(sample_rate=24000, chunk_s=0.5)
    with serve_engine(engine, send_timeout_s=1.5, max_buffered_audio_s=120.0) as address:
        with voxgate_connect(
            f"ws://{address}{URL}", max_size=None, max_queue=1, compression="deflate"
        ) as stuck:
            assert stuck.response is not None
            assert "permessage-deflate" in (stuck.response.headers.get("Sec-WebSocket-Extensions") or "")
            send(stuck, type="session.config", response_format="pcm", sample_rate=24000)
            assert isinstance(ready := recv(stuck), dict) and ready["type"] == "session.ready"
            sentences = 8
            send(stuck, type="input.text", text="A sentence of a few words. " * sentences)
            send(stuck, type="input.done")
            # Not reading now (the client's queue is full, so it reads nothing from the socket either).
            # The server finishes synthesizing and writing, and then closes the session.
            caplog.set_level(logging.INFO, logger="voxgate")
            assert until(lambda: engine.finished == sentences), "the engine did not finish"
            closed = until(lambda: any("closing with 4001" in r.getMessage() for r in caplog.records))
            messages, code = _read_to_close(stuck)
    assert closed, "a stalled reader was not closed"
    assert messages[-1]["code"] == "slow_consumer" and code == 4001
    assert "no pong" in str(messages[-1]["message"])
    # Everything synthesized was written before the close (the writes never blocked).
    assert sum(1 for m in messages if m["type"] == "audio.done") == sentences


def test_a_reader_at_playback_pace_with_deflate_is_served_to_the_end() -> None:
    """The whole utterance sits in the buffers, far more than the send timeout of audio ahead of the
    client; it reads it in real time and answers the pings as it reaches them."""
    engine = FakeEngine(sample_rate=24000, chunk_s=0.5)
    with serve_engine(engine, send_timeout_s=2.0, max_buffered_audio_s=120.0) as address:
        with voxgate_connect(f"ws://{address}{URL}", max_size=None, max_queue=1, compression="deflate") as ws:
            send(ws, type="session.config", response_format="pcm", sample_rate=24000, frame_ms=100)
            assert isinstance(ready := recv(ws), dict) and ready["type"] == "session.ready"
            send(ws, type="input.text", text="Words to be read out at playback pace. " * 3)
            send(ws, type="input.done")
            frames, last = 0, None
            while True:
                item = recv(ws)
                if isinstance(item, bytes):
                    frames += 1
                    time.sleep(0.1)  # plays the frame
                    continue
                last = item
                if item["type"] in ("session.done", "error"):
                    break
    assert last is not None and last["type"] == "session.done", last
    assert frames * 0.1 > 3 * 2.0  # it was more than the send timeout behind


def test_a_stalled_reader_that_forges_pongs_is_still_closed_with_slow_consumer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 18 #13: the pings carried a counter (``vxrr`` and 4 bytes), so a client could answer every
    ping without reading it, and with permessage-deflate (no write ever blocks) it held its session until
    uvicorn's keepalive dropped it, with no close code. Now each ping carries random bytes: pongs made up
    in advance answer none, the client is closed about ``send_timeout_s`` after it stopped reading, and
    the close (4001) waits for it in the stream."""
    engine = FakeEngine(sample_rate=24000, chunk_s=0.5)
    caplog.set_level(logging.INFO, logger="voxgate")
    with serve_engine(engine, send_timeout_s=1.5, max_buffered_audio_s=120.0) as address:
        with voxgate_connect(
            f"ws://{address}{URL}", max_size=None, max_queue=1, compression="deflate"
        ) as stuck:
            send(stuck, type="session.config", response_format="pcm", sample_rate=24000)
            assert isinstance(ready := recv(stuck), dict) and ready["type"] == "session.ready"
            send(stuck, type="input.text", text="A sentence of a few words. " * 8)
            send(stuck, type="input.done")
            forging = threading.Event()
            forging.set()

            def forge() -> None:
                """Answer the pings a counter would have sent so far, and some to come, over and over."""
                while forging.is_set():
                    for seq in range(1, 80):
                        stuck.pong(b"vxrr" + seq.to_bytes(4, "big"))
                        stuck.pong(b"vxrr" + seq.to_bytes(12, "big"))  # the length of today's payloads
                    time.sleep(0.05)

            forger = threading.Thread(target=forge, daemon=True)
            started = time.monotonic()
            forger.start()
            try:
                closed = until(
                    lambda: any("closing with 4001" in r.getMessage() for r in caplog.records), limit_s=15.0
                )
                closed_after_s = time.monotonic() - started
            finally:
                forging.clear()
                forger.join(TIMEOUT_S)
            assert closed, "forged pongs kept a stalled reader open"
            assert closed_after_s < 10.0, (
                closed_after_s
            )  # about the 1.5 s send timeout (uvicorn's keepalive: 40 s)
            messages, code = _read_to_close(stuck)
    assert messages[-1]["code"] == "slow_consumer" and code == 4001


def _read_to_close(ws: Any) -> tuple[list[dict[str, Any]], int | None]:
    from websockets.exceptions import ConnectionClosed

    messages: list[dict[str, Any]] = []
    try:
        while True:
            item = recv(ws)
            if isinstance(item, dict):
                messages.append(item)
    except ConnectionClosed as closed:
        return messages, closed.rcvd.code if closed.rcvd else None


# -- CoalescingTransport ---------------------------------------------------------------------------------


class Recorder:
    """A transport that records its writes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_writes_of_one_turn_of_the_loop_go_out_as_one_in_order() -> None:
    async def run() -> Recorder:
        recorder = Recorder()
        transport = CoalescingTransport(cast(Any, recorder), asyncio.get_running_loop())
        for frame in (b"a", b"bb", b"ccc"):
            transport.write(frame)
        assert recorder.writes == [] and transport.get_write_buffer_size() == 6
        await asyncio.sleep(0)  # the loop's turn ends
        assert recorder.writes == [b"abbccc"]
        transport.write(b"d")
        await asyncio.sleep(0)
        transport.write(b"close frame")
        transport.close()  # what is pending goes first
        assert transport.get_extra_info("peername") == "info:peername"
        await asyncio.sleep(0)
        return recorder

    recorder = asyncio.run(run())
    assert recorder.writes == [b"abbccc", b"d", b"close frame"] and recorder.closed


def test_nothing_is_written_to_a_transport_that_closed_under_it() -> None:
    async def run() -> Recorder:
        recorder = Recorder()
        transport = CoalescingTransport(cast(Any, recorder), asyncio.get_running_loop())
        transport.write(b"late")
        recorder.closed = True  # the connection was lost
        await asyncio.sleep(0)
        return recorder

    assert asyncio.run(run()).writes == []


class Stuck(Recorder):
    """A transport whose peer reads nothing: what is written stays in its buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self.writes))

    def abort(self) -> None:
        self.aborted = True


def test_a_closed_connection_whose_peer_reads_nothing_is_aborted(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio's close waits to send what is buffered, forever for a stalled client: it is aborted after
    ``CLOSE_FLUSH_S``; a connection that goes away in time is not."""
    monkeypatch.setattr(receipts_module, "CLOSE_FLUSH_S", 0.05)

    async def run(lost: bool) -> Stuck:
        stuck = Stuck()
        transport = CoalescingTransport(cast(Any, stuck), asyncio.get_running_loop())
        transport.write(b"audio, error and close frame")
        transport.close()
        if lost:
            transport.lost()
        await asyncio.sleep(0.2)
        return stuck

    assert asyncio.run(run(lost=False)).aborted
    assert not asyncio.run(run(lost=True)).aborted
    assert not asyncio.run(run_recorder_close()).aborted


async def run_recorder_close() -> Stuck:
    """A peer that read everything: nothing buffered at the close, nothing to abort."""
    stuck = Stuck()
    transport = CoalescingTransport(cast(Any, stuck), asyncio.get_running_loop())
    stuck.get_write_buffer_size = lambda: 0  # type: ignore[method-assign]
    transport.close()
    await asyncio.sleep(0.2)
    return stuck
