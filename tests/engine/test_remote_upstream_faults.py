"""The remote engine in front of upstreams that redirect, leak, flood or fail in ways that carry meaning.

Issue 35 (hardening round 3), rows H3, M6, L4 and L5: ``Scripted`` is a raw ASGI speech server on a real
uvicorn whose speech answer and voice list each test chooses, and which records every request it gets
(method, path and body); the gateway in front of it is a real one (``tests.engine.test_remote.gateway``).

- H3: an upstream's redirect is never followed (a 307 would re-POST the tenant's reference clip to another
  origin, a 302 would turn the request into a GET): a 3xx is the upstream's failure, and its ``Location``
  never reaches the client.
- M6: an upstream's URL is named as ``scheme://host:port`` only (no user, password, path or query) in client
  errors, ``/metrics`` and the log; an upstream's error body never reaches the client.
- L4: a voice list of 100k names keeps at most ``MAX_LISTED_VOICES``; an unknown-voice error names a few.
- L5: a 429 with ``Retry-After`` reaches the client as 503 ``upstream_busy`` with ``Retry-After``; a format
  change mid-stream or a body cut short is an engine error, not noise or a complete-looking answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send

from tests.conftest import TIMEOUT_S, serve, session
from tests.engine.test_remote import gateway, post_speech, speak, stubs
from tests.engine.test_remote_hostile import FAST, wav_header_as
from tests.engine.upstream_stub import SAMPLE_RATE, StubUpstream, pcm16, tone

SECRET = "s3cr3t-PASS"
# What an upstream puts in its error bodies: internal detail a client must not see.
INTERNAL = "Traceback at /opt/vllm/internal.py on 10.9.8.7"
# engine.survey.MAX_LISTED_VOICES: the voices kept of an upstream's list.
LISTED_VOICES = 1000


@dataclass
class Reply:
    """One answer: its status, headers and body pieces (sent with a short pause between them)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "audio/wav"})
    pieces: list[bytes] = field(default_factory=list)
    cut: bool = False  # the connection ends without the body's end (the upstream died)


def audio_reply(seconds: float = 0.3, rate: int = SAMPLE_RATE) -> Reply:
    """A sane streamed WAV answer."""
    data = wav_header_as(rate) + pcm16(tone(seconds, rate))
    return Reply(pieces=[data[i : i + 2401] for i in range(0, len(data), 2401)])


@dataclass
class Scripted:
    """A speech server that answers ``speech`` to every synthesis request and records what it gets."""

    speech: Reply = field(default_factory=audio_reply)
    voices: list[str] = field(default_factory=lambda: ["vivian"])
    seen: list[tuple[str, str, bytes]] = field(default_factory=list)  # method, path, body

    def synthesis(self) -> list[tuple[str, str, bytes]]:
        """The requests other than the start-up probes (health, lists, the empty word-timestamp probe)."""
        return [
            s
            for s in self.seen
            if s[1] not in ("/health", "/v1/audio/voices", "/v1/models")
            and not (s[1] == "/v1/audio/speech" and b'"input":""' in s[2].replace(b" ", b""))
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = b""
        while (message := await receive())["type"] == "http.request":
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"].removeprefix("/prefix")  # ``with_credentials`` adds a path to the base URL
        self.seen.append((scope["method"], path, raw))
        if path == "/health":
            reply = Reply(headers={"content-type": "text/plain"}, pieces=[b"ok"])
        elif path == "/v1/audio/voices":
            listing = json.dumps({"voices": ["default", *self.voices]}).encode()
            reply = Reply(headers={"content-type": "application/json"}, pieces=[listing])
        elif path == "/v1/audio/speech" and b'"input":""' in raw.replace(b" ", b""):
            refusal = {"error": {"message": "Input text cannot be empty", "code": 400}}
            reply = Reply(400, {"content-type": "application/json"}, [json.dumps(refusal).encode()])
        elif path == "/v1/audio/speech" and scope["method"] == "POST":
            reply = self.speech
        else:
            reply = Reply(404, {"content-type": "text/plain"}, [b"not found"])
        headers = [(k.encode(), v.encode()) for k, v in reply.headers.items()]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        for piece in reply.pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            await asyncio.sleep(0.005)
        if reply.cut:
            raise ConnectionResetError("the upstream died")
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@contextlib.contextmanager
def scripted(server: Scripted) -> Iterator[str]:
    """Serve ``server`` on a real uvicorn; yields its base URL."""
    with serve(Starlette(routes=[Mount("/", app=server)])) as address:
        yield f"http://{address}"


def with_credentials(url: str) -> str:
    """``url`` with a user and password, as an operator might configure a proxied upstream."""
    return url.replace("http://", f"http://voxuser:{SECRET}@") + "/prefix"


# -- H3: redirects are never followed --------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_an_upstream_redirect_is_not_followed(status: int) -> None:
    elsewhere = Scripted()  # another origin: it must never see the request (POST or GET), nor the clip
    with scripted(elsewhere) as other:
        location = f"{other}/v1/audio/speech"
        server = Scripted(Reply(status, {"location": location, "content-type": "text/plain"}, [b"moved"]))
        with scripted(server) as url, gateway(url, **FAST) as b:
            rest = post_speech(b, "Where does this go?")
            with session(b) as ws:
                got = speak(ws, "And this?")
    assert not elsewhere.seen, f"the redirect was followed: {elsewhere.seen}"
    assert rest.status_code == 502, rest.text
    assert rest.json()["error"]["code"] == "engine_error"
    (error,) = got.messages("error")
    assert error["code"] == "engine_error" and not got.frames()
    for message in (rest.text, str(error["message"])):
        assert other.removeprefix("http://") not in message and "location" not in message.lower()
        assert "redirect" in message, message
    assert len(server.synthesis()) == 2


def test_a_redirect_fails_over_to_the_next_upstream() -> None:
    elsewhere, good = Scripted(), StubUpstream()
    with scripted(elsewhere) as other, stubs(good) as (good_url,):
        server = Scripted(Reply(307, {"location": f"{other}/v1/audio/speech"}, []))
        with scripted(server) as url, gateway(url, good_url, **FAST) as b:
            responses = [post_speech(b, "First one."), post_speech(b, "Second one.")]
    assert all(r.status_code == 200 and r.content for r in responses)
    assert server.synthesis() and not elsewhere.seen
    assert [body["input"] for body in good.speech_requests()] == ["First one.", "Second one."]


# -- M6: upstream URLs are redacted, upstream bodies are not relayed --------------------------------


def leaks(text: str) -> list[str]:
    return [s for s in (SECRET, "voxuser", "/prefix", INTERNAL, "10.9.8.7") if s in text]


def test_an_upstream_url_and_its_error_body_reach_no_client_metric_or_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error_body = json.dumps({"error": {"message": INTERNAL, "code": 500}}).encode()
    server = Scripted(Reply(500, {"content-type": "application/json"}, [error_body]))
    caplog.set_level(logging.DEBUG)
    with scripted(server) as url, gateway(with_credentials(url), **FAST) as b:
        rest = post_speech(b, "Hello there.")
        with session(b) as ws:
            got = speak(ws, "Hello again.")
        report = httpx.get(f"http://{b}/metrics", timeout=TIMEOUT_S).text
    assert server.synthesis(), "the upstream was not asked"
    assert rest.status_code == 502, rest.text
    assert not leaks(rest.text), rest.text
    (error,) = got.messages("error")
    assert not leaks(json.dumps(error)), error
    assert "500" in rest.json()["error"]["message"]  # the upstream's status is said, not its body
    assert url in rest.json()["error"]["message"]  # named as scheme://host:port
    upstream_lines = [line for line in report.splitlines() if "voxgate_upstream_" in line and "{" in line]
    assert upstream_lines and all(f'upstream="{url}"' in line for line in upstream_lines), upstream_lines
    assert not leaks(report)
    logged = [r.getMessage() for r in caplog.records]
    assert not [m for m in logged if SECRET in m or "voxuser" in m], logged
    # The body is logged at most once per failure, short and escaped, never where a client sees it.
    assert not [m for m in logged if INTERNAL in m and len(m) > 600], logged


def test_a_refusal_that_is_not_json_is_reported_by_its_status_only() -> None:
    server = Scripted(Reply(422, {"content-type": "text/html"}, [f"<html>{INTERNAL}</html>".encode()]))
    with scripted(server) as url, gateway(url, **FAST) as b:
        rest = post_speech(b, "Hello there.")
    assert rest.status_code == 422, rest.text
    assert rest.json()["error"]["code"] == "request_refused"
    assert "422" in rest.json()["error"]["message"] and not leaks(rest.text), rest.text


# -- L5: an upstream's failure keeps its meaning ----------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retry_after", "expected"),
    [(429, "7", "7"), (429, None, "1"), (503, "12", "12"), (429, "86400", "300")],
)
def test_a_busy_upstream_is_upstream_busy_with_its_retry_after(
    status: int, retry_after: str | None, expected: str
) -> None:
    headers = {"content-type": "application/json", **({"retry-after": retry_after} if retry_after else {})}
    refusal = json.dumps({"error": {"message": f"busy {INTERNAL}", "code": status}}).encode()
    server = Scripted(Reply(status, headers, [refusal]))
    with scripted(server) as url, gateway(url, **{**FAST, "upstream_breaker_failures": 10}) as b:
        rest = post_speech(b, "Hello there.")
        with session(b) as ws:
            got = speak(ws, "Hello again.")
            server.speech = audio_reply()
            again = speak(ws, "And now?")
    assert rest.status_code == 503, rest.text
    assert rest.headers.get("retry-after") == expected, rest.headers
    assert rest.json()["error"]["code"] == "upstream_busy" and not leaks(rest.text), rest.text
    (error,) = got.messages("error")
    assert error["code"] == "upstream_busy" and error["fatal"] is False, error
    assert f"retry after {expected} s" in str(error["message"])
    assert again.frames() and not again.messages("error")  # the session goes on


def test_a_busy_upstream_fails_over_to_one_that_is_not() -> None:
    server, good = Scripted(Reply(429, {"retry-after": "5"}, [b"slow down"])), StubUpstream()
    with scripted(server) as url, stubs(good) as (good_url,), gateway(url, good_url, **FAST) as b:
        responses = [post_speech(b, "First one."), post_speech(b, "Second one.")]
    assert all(r.status_code == 200 and r.content for r in responses)
    assert server.synthesis()


# -- L4: a hostile upstream's voice list is bounded -------------------------------------------------


def test_a_huge_voice_list_is_cut_to_a_bound_and_errors_name_a_few(caplog: pytest.LogCaptureFixture) -> None:
    names = [f"v{i}" for i in range(100_000)]  # 900 KB of JSON: under the read bound, far over the count
    server = Scripted(voices=["vivian", *names, "x" * 5000])
    caplog.set_level(logging.INFO)
    with scripted(server) as url, gateway(url, **FAST) as b:
        listed = httpx.get(f"http://{b}/v1/audio/voices", timeout=TIMEOUT_S)
        unknown = post_speech(b, "Hello there.", voice="nobody")
        known = post_speech(b, "Hello there.", voice="v5")
    voices = [v["name"] for v in listed.json()["voice_details"] if "remote" in v["engines"]]
    assert len(voices) == LISTED_VOICES and voices[0] == "vivian", len(voices)
    assert len(listed.content) < 1024 * 1024, len(listed.content)
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "voice_not_found"
    assert len(unknown.text) < 1024 and "more" in unknown.json()["error"]["message"], len(unknown.text)
    assert known.status_code == 200 and known.content
    assert any("kept the first 1000" in r.getMessage() and "100002" in r.getMessage() for r in caplog.records)


def wav_reply(*parts: bytes, headers: dict[str, str] | None = None) -> Reply:
    data = b"".join(parts)
    return Reply(
        headers={"content-type": "audio/wav", **(headers or {})},
        pieces=[data[i : i + 2401] for i in range(0, len(data), 2401)],
    )


def test_a_rate_change_mid_stream_fails_the_segment_instead_of_playing_noise() -> None:
    first, second = pcm16(tone(0.3)), pcm16(tone(0.3, 16000))
    server = Scripted(wav_reply(wav_header_as(SAMPLE_RATE), first, wav_header_as(16000), second))
    with scripted(server) as url, gateway(url, **FAST) as b, session(b, eager_first_segment=False) as ws:
        got = speak(ws, "Hello there.")
    (error,) = got.messages("error")
    assert error["code"] == "engine_error" and "changed mid-stream" in str(error["message"]), error
    assert [m["error"] for m in got.messages("audio.done")] == [True]
    played = sum(len(f) for f in got.frames())
    assert played <= len(first) + 4096, (played, len(first))  # the 16 kHz part was not played as 24 kHz


def test_a_second_header_of_the_same_format_is_not_played() -> None:
    audio = pcm16(tone(0.3))
    server = Scripted(wav_reply(wav_header_as(SAMPLE_RATE), audio, wav_header_as(SAMPLE_RATE), audio))
    with scripted(server) as url, gateway(url, **FAST) as b:
        response = post_speech(b, "Hello there.")
    assert response.status_code == 200 and len(response.content) == 2 * len(audio), len(response.content)


# content_length held before this round too (aiohttp raises ClientPayloadError); wav_size did not.
@pytest.mark.parametrize("how", ["wav_size", "content_length"])
def test_a_body_cut_short_is_an_engine_error_not_complete_audio(how: str) -> None:
    audio = pcm16(tone(0.3))
    if how == "wav_size":  # the WAV states its size; the HTTP body ends cleanly before it
        reply = wav_reply(wav_header_as(SAMPLE_RATE, data_bytes=2 * len(audio)), audio)
    else:  # the HTTP body ends before its Content-Length
        header = wav_header_as(SAMPLE_RATE)
        reply = wav_reply(header, audio, headers={"content-length": str(len(header) + 2 * len(audio))})
    server = Scripted(reply)
    with scripted(server) as url, gateway(url, **FAST) as b, session(b, eager_first_segment=False) as ws:
        got = speak(ws, "Hello there.")
    assert got.frames()  # what came was played
    (error,) = got.messages("error")
    assert error["code"] == "engine_error" and "mid-stream" in str(error["message"]), error
    assert [m["error"] for m in got.messages("audio.done")] == [True]


def test_a_body_that_is_not_a_wav_is_not_relayed() -> None:
    server = Scripted(wav_reply(b"10.9.8.7 says: " + INTERNAL.encode()))  # its start was in the message
    with scripted(server) as url, gateway(url, **FAST) as b:
        rest = post_speech(b, "Hello there.")
    assert rest.status_code == 502 and "not a WAV" in rest.text and not leaks(rest.text), rest.text


def test_an_upstream_out_for_being_busy_is_still_upstream_busy() -> None:
    """Busy answers open its circuit like any failure; while it is open, clients are told when to come
    back (the circuit's cooldown left), not sent a 502."""
    server = Scripted(Reply(429, {"retry-after": "3"}, [b"slow down"]))
    settings = {**FAST, "upstream_breaker_failures": 2, "upstream_breaker_cooldown_s": 60.0}
    with scripted(server) as url, gateway(url, **settings) as b:
        responses = [post_speech(b, f"Number {i}.") for i in range(3)]
    assert len(server.synthesis()) == 2  # the third was not sent: the circuit is open
    for response in responses:
        assert response.status_code == 503 and response.json()["error"]["code"] == "upstream_busy", (
            response.text
        )
    assert [r.headers["retry-after"] for r in responses[:2]] == ["3", "3"]
    assert 1 <= int(responses[2].headers["retry-after"]) <= 60
