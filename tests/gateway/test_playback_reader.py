"""A client that reads at playback pace, far behind, is served to the end; one that stops reading is closed.

Issue 18 #3: a client reading a long utterance in real time falls tens of seconds of audio behind what the
server wrote (the kernel's buffers and the server's transport hold it). Its writes then block for long
stretches while it reads steadily, and a keepalive ping reaches it only once it has played everything sent
before the ping: the 15 s write timeout closed it as ``slow_consumer`` and uvicorn's keepalive (20 s ping,
20 s pong timeout) cut it with 1011. Both now count read receipts (gateway/session/receipts.py).

The scale is shrunk so a test takes seconds: 8 kHz 16-bit PCM (16 kB a second, so uvicorn's 64 KiB of
transport buffer alone is 4 s of audio), a 2 s send timeout, a 1 s keepalive ping with a 2 s pong timeout.
The server runs with the WebSocket options ``voxgate serve`` gives uvicorn (``uvicorn_ws_options``), and
the client is a plain socket with a small receive buffer speaking WebSocket through websockets' sans-I/O
``ClientProtocol``, so it really reads no faster than it plays, and answers each ping when it reaches it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from voxgate.engine.fake import SECONDS_PER_CHAR, FakeEngine
from voxgate.gateway.app import create_app
from voxgate.gateway.server.config import uvicorn_ws_options
from voxgate.gateway.session.deadline import Deadline
from voxgate.gateway.settings import Settings
from voxgate.protocol.codecs.stream import EXTENSIONS_SUBPROTOCOL
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from ..conftest import TIMEOUT_S, bound_socket, serve

URL = "/v1/audio/speech/stream"
RATE = 8000
BYTES_PER_S = RATE * 2  # 16-bit PCM
SEND_TIMEOUT_S = 2.0
PING_INTERVAL_S = 1.0
PING_TIMEOUT_S = 2.0
IDLE_TIMEOUT_S = 3.0  # shorter than the client falls behind
# What the kernel may hold between the two: little (Linux doubles these and keeps a floor), so that the
# server's writes block within seconds of audio, as they do within minutes with a loopback's megabytes.
CLIENT_RCVBUF = 4096
SERVER_SNDBUF = 16384


@contextmanager
def gateway(**settings: object) -> Iterator[str]:
    """A real server run with the options ``voxgate serve`` gives uvicorn for WebSockets."""
    with tempfile.TemporaryDirectory(prefix="voxgate-voices-") as voices_dir:
        configured = Settings.from_env(
            {},
            voices_dir=voices_dir,
            send_timeout_s=SEND_TIMEOUT_S,
            ws_ping_interval_s=PING_INTERVAL_S,
            ws_ping_timeout_s=PING_TIMEOUT_S,
            **settings,
        )
        engine = FakeEngine(sample_rate=RATE, chunk_s=0.5)
        sock = bound_socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SERVER_SNDBUF)  # accepted sockets inherit it
        app = create_app(configured, engine=engine)
        with serve(app, sock, **uvicorn_ws_options(configured)) as address:
            yield address


class RawClient:
    """A WebSocket client on a blocking socket with a small receive buffer; it reads only when asked."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF)
        self.sock.connect((host, int(port)))
        self.sock.settimeout(TIMEOUT_S)
        self.proto = ClientProtocol(
            parse_uri(f"ws://{address}{URL}"), subprotocols=[Subprotocol(EXTENSIONS_SUBPROTOCOL)]
        )
        self.proto.send_request(self.proto.connect())
        self._flush()
        self.pending: list[Frame] = []
        while True:  # the handshake's answer
            events = self._receive(4096)
            responses = [e for e in events if isinstance(e, Response)]
            if responses:
                assert responses[0].status_code == 101, responses[0]
                self.pending = [e for e in events if isinstance(e, Frame)]
                break

    def send(self, **message: object) -> None:
        self.proto.send_text(json.dumps(message).encode())
        self._flush()

    def read(self, max_bytes: int) -> tuple[int, list[Frame]]:
        """Read at most ``max_bytes`` from the socket (answering the pings among them): bytes read, frames."""
        if self.pending:
            frames, self.pending = self.pending, []
            return 0, frames
        before = self.received
        events = self._receive(max_bytes)
        return self.received - before, [e for e in events if isinstance(e, Frame)]

    received = 0
    eof = False

    def _receive(self, max_bytes: int) -> list[object]:
        data = self.sock.recv(max_bytes)
        if data:
            self.received += len(data)
            self.proto.receive_data(data)
        else:
            self.eof = True
            self.proto.receive_eof()
        events: list[object] = list(self.proto.events_received())
        self._flush()  # the pongs ClientProtocol queued for the pings it parsed
        return events

    def _flush(self) -> None:
        for data in self.proto.data_to_send():
            if data:
                try:
                    self.sock.sendall(data)
                except OSError:
                    return

    def close(self) -> None:
        self.sock.close()


@contextmanager
def raw_client(address: str) -> Iterator[RawClient]:
    client = RawClient(address)
    try:
        yield client
    finally:
        client.close()


def configure(client: RawClient) -> None:
    client.send(type="session.config", response_format="pcm", sample_rate=RATE, frame_ms=100)
    while True:
        _, frames = client.read(4096)
        for frame in frames:
            if frame.opcode is Opcode.TEXT:
                message = json.loads(bytes(frame.data))
                assert message["type"] == "session.ready", message
                return


def speak(client: RawClient, audio_s: float) -> None:
    """Ask for one utterance of about ``audio_s`` of audio (the fake engine's tone), in sentences."""
    sentence = "A sentence of some words, read out. "
    client.send(type="input.text", text=sentence * round(audio_s / (len(sentence) * SECONDS_PER_CHAR)))
    client.send(type="input.done")


def test_a_reader_at_playback_pace_far_behind_is_served_to_the_end() -> None:
    """16 s of audio; the client reads 16 kB a second. The server writes ahead of it until the buffers on
    its side are full, so the client ends up seconds behind: more than the send timeout and more than the
    keepalive's ping interval plus pong timeout, and more than the idle timeout. It still gets every byte
    and ``session.done``, and the idle timeout counts from the end of its reading."""
    with gateway(idle_timeout_s=IDLE_TIMEOUT_S) as address, raw_client(address) as client:
        configure(client)
        speak(client, 16.0)
        audio, expected = 0, 0
        messages: list[dict[str, object]] = []
        started: float | None = None
        while not client.eof:
            if started is not None:  # play: read no faster than 16 kB a second
                ahead_s = client.received / BYTES_PER_S - (time.monotonic() - started)
                if ahead_s > 0:
                    time.sleep(ahead_s)
            _, frames = client.read(1024)
            for frame in frames:
                if frame.opcode is Opcode.BINARY:
                    if started is None:
                        started = time.monotonic() - client.received / BYTES_PER_S
                    audio += len(frame.data)
                elif frame.opcode is Opcode.TEXT:
                    messages.append(message := json.loads(bytes(frame.data)))
                    if message["type"] == "audio.done":
                        expected += int(message["total_bytes"])
            if client.proto.close_rcvd is not None or (
                messages and messages[-1]["type"] in ("session.done", "error")
            ):
                break
        done_at = time.monotonic()
        closed = client.proto.close_rcvd
        assert messages[-1]["type"] == "session.done", (messages[-1], closed and (closed.code, closed.reason))
        assert audio == expected and audio >= 14 * BYTES_PER_S
        # The session is idle once the client has read it all, not once the server wrote it all (seconds
        # earlier, more than the idle timeout): the idle timeout runs from the client's last receipt.
        while client.proto.close_rcvd is None and not client.eof:
            client.read(4096)
        idle_s = time.monotonic() - done_at
    closed = client.proto.close_rcvd
    assert closed is not None and (closed.code, closed.reason) == (4008, "idle_timeout"), closed
    assert idle_s > IDLE_TIMEOUT_S * 0.95, idle_s  # its clock starts after the client read session.done


def test_a_client_that_stops_reading_is_still_closed_with_slow_consumer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The same client reads its first audio, then nothing: it is closed about ``send_timeout_s`` later,
    and the close (4001) is in the stream for it once it reads again."""
    caplog.set_level(logging.INFO, logger="voxgate")
    with gateway() as address, raw_client(address) as client:
        configure(client)
        speak(client, 30.0)
        while not any(f.opcode is Opcode.BINARY for f in client.read(1024)[1]):
            pass
        stopped = time.monotonic()
        assert until(lambda: any("closing with 4001" in r.getMessage() for r in caplog.records))
        closed_after_s = time.monotonic() - stopped
        # It reads again only after the server stopped waiting for it to take the error and the close.
        time.sleep(SEND_TIMEOUT_S + 2.0)
        codes, errors = [], []
        while not client.eof:  # read everything that is left
            for frame in client.read(65536)[1]:
                if frame.opcode is Opcode.TEXT and json.loads(bytes(frame.data))["type"] == "error":
                    errors.append(json.loads(bytes(frame.data))["code"])
                if frame.opcode is Opcode.CLOSE:
                    codes.append(client.proto.close_rcvd.code if client.proto.close_rcvd else None)
    assert codes == [4001], (codes, errors)
    # about the send timeout: the last receipt came at most an interval of audio after the stop
    assert closed_after_s < 4 * SEND_TIMEOUT_S, closed_after_s


def test_an_idle_client_that_answers_no_ping_is_still_found_by_the_keepalive() -> None:
    """With nothing in flight, uvicorn's keepalive still runs: a client that has read everything, then
    answers no ping (a peer that is gone) is closed with 1011 about the ping interval plus timeout later."""
    with gateway() as address, raw_client(address) as client:
        configure(client)
        while not any(
            f.opcode is Opcode.PING and bytes(f.data).startswith(b"vxrr") for f in client.read(4096)[1]
        ):
            pass  # the read receipt's ping after session.ready, answered: nothing is in flight now
        time.sleep(PING_INTERVAL_S + PING_TIMEOUT_S + 2.0)  # not reading, so not answering
        while not client.eof:
            client.read(65536)
    closed = client.proto.close_rcvd
    assert closed is not None and closed.code == 1011, closed


def test_a_receipt_gives_a_blocked_send_its_timeout_again() -> None:
    """``Deadline.extend``, which each receipt calls on the writer's send deadline: the wait goes on past
    its first deadline while receipts come, and times out once they stop. Paced by the test's own loop
    callbacks, with margins of several times the timeout, so a slow machine only makes it slower."""
    timeout_s = 0.05

    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadline = Deadline()
        released = asyncio.Event()
        receipts = 0

        def receipt() -> None:  # a pong every half timeout, six of them: three timeouts in all
            nonlocal receipts
            receipts += 1
            deadline.extend(timeout_s)
            if receipts < 6:
                loop.call_later(timeout_s / 2, receipt)
            else:
                loop.call_later(timeout_s / 4, released.set)  # before the last extension runs out

        loop.call_later(timeout_s / 2, receipt)
        started = loop.time()
        assert await deadline.within(released.wait(), timeout_s) is True
        assert loop.time() - started > 3 * timeout_s and receipts == 6
        with pytest.raises(TimeoutError):  # no receipts: the timeout holds
            await deadline.within(asyncio.Event().wait(), timeout_s)
        deadline.extend(timeout_s)  # no wait in progress: nothing to move
        deadline.close()

    asyncio.run(main())


def until(condition: Callable[[], bool], limit_s: float = TIMEOUT_S) -> bool:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
