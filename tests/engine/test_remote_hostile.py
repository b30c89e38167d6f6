"""The remote engine in front of a hostile upstream: one that trickles, goes silent, dies mid-stream,
answers hundreds of megabytes, or states a WAV nobody can play.

``Hostile`` is a raw ASGI speech server on a real uvicorn whose every answer a test chooses; the
gateway in front of it is a real one too (``tests.engine.test_remote.gateway``). Each test reproduces one
row of the hardening round's attack on the remote engine (issue 18, rows 5-9 and 14) and checks the bound
that now holds: a byte bound on what is held, a deadline on every wait, every failure counted toward the
upstream's circuit breaker, a start-up that does not wait on a hung upstream, a WAV refused when its rate,
channels or sample format cannot be played.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Literal

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import Message, Receive, Scope, Send
from voxgate.protocol.audio import decode

from tests.conftest import TIMEOUT_S, Received, serve, session
from tests.engine.test_remote import gateway, post_speech, readyz, speak, stubs
from tests.engine.upstream_stub import SAMPLE_RATE, StubUpstream, pcm16, tone

Speech = Literal["ok", "die_mid", "huge", "huge_error", "trickle", "trickle_header", "silent"]
Listing = Literal["ok", "trickle"]

# A step of a trickle: under every idle deadline the tests set, so only the overall one ends it.
TRICKLE_S = 0.2
# The tests' deadlines, in seconds: far below the defaults and TIMEOUT_S, far above a loopback answer.
DEADLINE_S = 1.0
# A bound that holds with room on a busy machine, and that the unfixed gateway missed by a wide margin.
PROMPT_S = 10 * DEADLINE_S
# Answers far larger than any segment's audio cap; the kernel's socket buffers hold a few MB of it.
HUGE_BYTES = 64 * 1024 * 1024
HELD_BYTES = 32 * 1024 * 1024
MB = 1024 * 1024
WORDS = json.dumps(
    [{"word": "Hello", "start_ms": 0, "end_ms": 150}, {"word": "there", "start_ms": 150, "end_ms": 300}]
)


def wav_header_as(rate: int, channels: int = 1, bits: int = 16, data_bytes: int = 0xFFFFFFFF) -> bytes:
    """A PCM WAV header stating ``rate``, ``channels`` and ``bits``, whatever they are."""
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 1, channels, rate, (rate * block) & 0xFFFFFFFF, block, bits)
    riff = 0xFFFFFFFF if data_bytes == 0xFFFFFFFF else 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", data_bytes)
    )


@dataclass
class Answer:
    """One speech answer as the hostile server saw it."""

    sent_bytes: int = 0
    cut: bool = False  # the client went away before it ended
    sent_when_cut: int | None = None  # what had been sent by then (later sends go nowhere)
    opened_t: float = field(default_factory=time.monotonic)


@dataclass
class Hostile:
    """A speech server that misbehaves as the test says (switchable at any time from the test's thread).

    ``speech`` is how ``POST /v1/audio/speech`` answers (a word-timestamp probe, an empty input, always
    gets vllm-omni's "empty input" refusal, which says it has the aligner); ``rate``, ``channels`` and
    ``bits`` are what its WAV header states; ``voices`` and ``health`` how its voice list and its health
    check answer.
    """

    speech: Speech = "ok"
    rate: int = SAMPLE_RATE
    channels: int = 1
    bits: int = 16
    voices: Listing = "ok"
    health: Listing = "ok"
    answers: list[Answer] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        if path == "/health":
            await self._respond(receive, send, 200, "text/plain", self._listing(self.health, b"ok"))
        elif path == "/v1/audio/voices":
            listing = json.dumps({"voices": ["default", "vivian"]}).encode()
            await self._respond(receive, send, 200, "application/json", self._listing(self.voices, listing))
        elif path == "/v1/audio/speech":
            await self._speech(receive, send)
        else:
            await self._respond(receive, send, 404, "text/plain", _pieces(b"not found"))

    def _listing(self, how: Listing, content: bytes) -> AsyncIterator[bytes]:
        return _pieces(content) if how == "ok" else _trickle(content * 1000)

    async def _speech(self, receive: Receive, send: Send) -> None:
        raw = b""
        while (message := await receive())["type"] == "http.request":
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        body = json.loads(raw)
        if not str(body.get("input", "")).strip():  # the word-timestamp probe: "has an aligner"
            refusal = {"error": {"message": "Input text cannot be empty", "code": 400}}
            await self._respond(receive, send, 400, "application/json", _pieces(json.dumps(refusal).encode()))
            return
        answer = Answer()
        self.answers.append(answer)
        words = {"x-word-timestamps": WORDS} if body.get("word_timestamps") else {}
        audio = pcm16(tone(0.3, self.rate if 8000 <= self.rate <= 192000 else SAMPLE_RATE))
        header = wav_header_as(self.rate, self.channels, self.bits)
        match self.speech:
            case "ok":
                if words:
                    header = wav_header_as(self.rate, self.channels, self.bits, len(audio))
                content = _pieces(header + audio)
            case "die_mid":
                content = _pieces(header + audio[:4800], die=True)
            case "huge":
                content = _zeros(wav_header_as(self.rate, data_bytes=HUGE_BYTES), HUGE_BYTES)
            case "huge_error":
                await self._respond(receive, send, 500, "text/plain", _zeros(b"", HUGE_BYTES), answer)
                return
            case "trickle":
                content = _trickle(header + b"\x00" * HUGE_BYTES, start=len(header))
            case "trickle_header":
                content = _trickle(header + audio)
            case "silent":
                answer.cut = not await _until_disconnected(receive, asyncio.sleep(TIMEOUT_S * 10), answer)
                return
        await self._respond(receive, send, 200, "audio/wav", content, answer, words)

    async def _respond(
        self,
        receive: Receive,
        send: Send,
        status: int,
        kind: str,
        content: AsyncIterator[bytes],
        answer: Answer | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Send an answer until its end or the client's going away, counting what was sent."""
        record = answer or Answer()
        listed = [(b"content-type", kind.encode())] + [
            (k.encode(), v.encode()) for k, v in (headers or {}).items()
        ]

        async def write() -> None:
            await send({"type": "http.response.start", "status": status, "headers": listed})
            async for piece in content:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                record.sent_bytes += len(piece)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        record.cut = not await _until_disconnected(receive, write(), record)


async def _until_disconnected(receive: Receive, work: object, record: Answer) -> bool:
    """Run ``work`` until it ends (True) or the client disconnects (False, noted in ``record``)."""
    assert asyncio.iscoroutine(work)
    writer = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                record.sent_when_cut = record.sent_bytes
                return

    listener = asyncio.ensure_future(disconnected())
    await asyncio.wait({writer, listener}, return_when=asyncio.FIRST_COMPLETED)
    finished = writer.done() and not writer.cancelled() and writer.exception() is None
    for task in (writer, listener):
        task.cancel()
    await asyncio.gather(writer, listener, return_exceptions=True)
    return finished


async def _pieces(data: bytes, *, die: bool = False, size: int = 2401) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]
        await asyncio.sleep(0.005)
    if die:  # the process behind it died: the connection ends without the body's end
        raise ConnectionResetError("the upstream died mid-stream")


async def _zeros(header: bytes, total: int) -> AsyncIterator[bytes]:
    yield header
    for _ in range(total // MB):
        yield bytes(MB)
        await asyncio.sleep(0)  # a send to a client that left returns at once: let its leaving be seen


async def _trickle(data: bytes, *, start: int = 0) -> AsyncIterator[bytes]:
    """``data[:start]`` at once, then two bytes every ``TRICKLE_S``: never idle long, never done."""
    if start:
        yield data[:start]
    for at in range(start, len(data), 2):
        await asyncio.sleep(TRICKLE_S)
        yield data[at : at + 2]


@contextlib.contextmanager
def hostile(server: Hostile) -> Iterator[str]:
    """Serve ``server`` on a real uvicorn; yields its base URL."""
    with serve(Starlette(routes=[Mount("/", app=server)])) as address:
        yield f"http://{address}"


FAST: dict[str, object] = {
    "upstream_first_byte_timeout_s": DEADLINE_S,
    "upstream_read_timeout_s": DEADLINE_S,
    "upstream_segment_timeout_s": DEADLINE_S,
    "upstream_breaker_failures": 2,
    "upstream_breaker_cooldown_s": 60.0,
}


def errors_of(got: Received) -> list[dict[str, object]]:
    return got.messages("error")


# -- 5: an answer is held only up to the segment's audio cap --------------------------------------


def test_a_huge_word_timed_answer_is_an_upstream_failure_and_is_not_read_on() -> None:
    server = Hostile(speech="huge")
    with hostile(server) as url, gateway(url, **FAST) as b, session(b, word_timestamps=True) as ws:
        started = time.monotonic()
        got = speak(ws, "Hello there.", timeout=PROMPT_S)
        elapsed = time.monotonic() - started
        deadline = time.monotonic() + TIMEOUT_S
        while not server.answers[0].cut and time.monotonic() < deadline:
            time.sleep(0.02)
    (error,) = errors_of(got)
    assert error["code"] == "engine_error" and error["fatal"] is False, error
    assert "s of audio" in str(error["message"]), error
    assert not got.frames()
    # "Hello there." may have 13.6 s of audio (650 KB at 24 kHz): the rest was never asked for.
    sent = server.answers[0].sent_when_cut
    assert sent is not None and sent < HELD_BYTES, server.answers[0]
    assert elapsed < PROMPT_S


def test_a_huge_error_answer_is_read_only_for_its_message_and_fails_over() -> None:
    server, good = Hostile(speech="huge_error"), StubUpstream()
    with hostile(server) as url, stubs(good) as (good_url,), gateway(url, good_url, **FAST) as b:
        responses = [post_speech(b, "First one."), post_speech(b, "Second one.")]
        deadline = time.monotonic() + TIMEOUT_S
        while not all(a.cut for a in server.answers) and time.monotonic() < deadline:
            time.sleep(0.02)
    assert all(r.status_code == 200 and r.content for r in responses)
    sent = [a.sent_when_cut for a in server.answers]
    assert sent and all(n is not None and n < HELD_BYTES for n in sent), server.answers


# -- 6: failures after the first byte count toward the breaker ------------------------------------


def test_an_upstream_dying_mid_stream_opens_its_circuit() -> None:
    dying, good = Hostile(speech="die_mid"), StubUpstream()
    with hostile(dying) as url, stubs(good) as (good_url,), gateway(url, good_url, **FAST) as b:
        with session(b, eager_first_segment=False) as ws:
            got = [speak(ws, f"Utterance number {i}.") for i in range(8)]
        report = httpx.get(f"http://{b}/metrics", timeout=TIMEOUT_S).text
    cut = [g for g in got if errors_of(g)]
    # Two failures in a row (upstream_breaker_failures) open its circuit: it gets no third utterance.
    assert len(dying.answers) == 2 and len(cut) == 2, (len(dying.answers), len(cut))
    assert all("mid-stream" in str(errors_of(g)[0]["message"]) for g in cut)
    assert f'voxgate_upstream_breaker_state{{engine="remote",upstream="{url}"}} 2.0' in report


# -- 7: failover before the first byte takes the first-byte deadline, not the idle one ------------


@pytest.mark.parametrize("speech", ["silent", "trickle_header"])
def test_failover_before_the_first_byte_takes_the_first_byte_deadline(speech: Speech) -> None:
    broken, good = Hostile(speech=speech), StubUpstream()
    # An idle deadline far above the first-byte one: failing over must not wait for it.
    slow_idle = {**FAST, "upstream_read_timeout_s": 30.0, "upstream_segment_timeout_s": 30.0}
    with hostile(broken) as url, stubs(good) as (good_url,), gateway(url, good_url, **slow_idle) as b:
        times = []
        for text in ("First one.", "Second one."):  # ties rotate: one of the two tries the broken one first
            started = time.monotonic()
            response = post_speech(b, text)
            times.append(time.monotonic() - started)
            assert response.status_code == 200 and response.content, response.text
    assert broken.answers
    assert max(times) < PROMPT_S, times
    assert [body["input"] for body in good.speech_requests()] == ["First one.", "Second one."]


# -- 8: every request has an overall deadline -----------------------------------------------------


def test_a_trickling_upstream_fails_the_segment_within_its_overall_deadline() -> None:
    server = Hostile(speech="trickle")
    # The audio cap of "Still there?": 1 + 0.05 * 12 = 1.6 s; the overall deadline 1.6 + 1 s.
    cap = {"max_segment_audio_base_s": 1.0, "max_segment_audio_per_char_s": 0.05}
    with hostile(server) as url, gateway(url, **FAST, **cap) as b, session(b) as ws:
        started = time.monotonic()
        got = speak(ws, "Still there?", timeout=PROMPT_S)
        elapsed = time.monotonic() - started
        server.speech = "ok"
        again = speak(ws, "Now it answers.")
    (error,) = errors_of(got)
    assert error["code"] == "engine_error" and error["fatal"] is False, error
    assert "overall deadline" in str(error["message"]), error
    assert [m["error"] for m in got.messages("audio.done")] == [True]
    assert elapsed < PROMPT_S
    assert again.frames() and not errors_of(again)


# -- 9: start-up does not wait on a hung upstream ------------------------------------------------


@pytest.mark.parametrize("hung", ["voices", "health"])
def test_start_up_is_bounded_when_an_upstream_hangs(hung: str) -> None:
    server = Hostile(**{hung: "trickle"})  # type: ignore[arg-type]
    good = StubUpstream()
    with hostile(server) as url, stubs(good) as (good_url,):
        started = time.monotonic()
        with gateway(url, good_url, **FAST) as b:
            listening = time.monotonic() - started
            report = readyz(b)
            listed = httpx.get(f"http://{b}/v1/audio/voices", timeout=TIMEOUT_S).json()
            responses = [post_speech(b, "First one."), post_speech(b, "Second one.")]
    assert listening < PROMPT_S, listening
    assert report.status_code == 200
    assert listed["voices"] == ["ryan", "vivian"]  # learned from the upstream that answered
    # Served: by the upstream that answered, or by the hung one once its health check passes again
    # (its speech answers are sound; only its voice list or health check hung).
    assert all(r.status_code == 200 and r.content for r in responses)


# -- 14: a WAV nobody can play is the upstream's failure -----------------------------------------

UNPLAYABLE = [
    pytest.param({"rate": 1}, id="1 Hz"),
    pytest.param({"rate": 2_000_000_000}, id="2 GHz"),
    pytest.param({"channels": 1000}, id="1000 channels"),
    pytest.param({"bits": 8}, id="8-bit"),
]


@pytest.mark.parametrize("stated", UNPLAYABLE)
def test_an_unplayable_wav_is_a_counted_engine_error(stated: dict[str, int]) -> None:
    server = Hostile(**stated)  # type: ignore[arg-type]
    with hostile(server) as url, gateway(url, **FAST) as b:
        with session(b) as ws:
            got = [speak(ws, "Hello there.", timeout=PROMPT_S), speak(ws, "Hello again.", timeout=PROMPT_S)]
        down = readyz(b)
    for received in got:
        (error,) = errors_of(received)
        assert error["code"] == "engine_error" and error["fatal"] is False, error
        assert not received.frames()
    assert "WAV" in str(errors_of(got[0])[0]["message"])
    # Counted toward the breaker: two failures opened the only upstream's circuit.
    assert down.status_code == 503, down.text


@pytest.mark.parametrize("stated", UNPLAYABLE)
def test_an_unplayable_wav_fails_over(stated: dict[str, int]) -> None:
    server, good = Hostile(**stated), StubUpstream()  # type: ignore[arg-type]
    with hostile(server) as url, stubs(good) as (good_url,), gateway(url, good_url, **FAST) as b:
        responses = [post_speech(b, "First one."), post_speech(b, "Second one.")]
    assert server.answers
    for response in responses:
        assert response.status_code == 200, response.text
        audio = decode(response.content, "pcm")
        assert len(audio) == pytest.approx(good.seconds * SAMPLE_RATE, abs=SAMPLE_RATE * 0.01)


def test_the_hostile_server_plays_fair_when_asked() -> None:
    """The control: the same server with a sane WAV serves audio, so the failures above are the WAV's."""
    server = Hostile()
    with hostile(server) as url, gateway(url, **FAST) as b, session(b) as ws:
        got = speak(ws, "Hello there.")
    assert got.frames() and not errors_of(got)
    assert len(decode(b"".join(got.frames()), "pcm")) == pytest.approx(
        0.3 * SAMPLE_RATE, abs=SAMPLE_RATE * 0.01
    )
