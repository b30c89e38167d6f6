"""The WebSocket session against a real uvicorn server, with the deterministic FakeEngine.

The FakeEngine stands in for a model only to control timing and failures; tests/e2e runs Piper.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from voxgate.engine.fake import SECONDS_PER_CHAR, FakeEngine
from voxgate.gateway.settings import Settings
from voxgate.protocol.audio import decode
from voxgate.protocol.frames import HEADER_BYTES, FrameHeader
from voxgate.protocol.messages import Limits
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.conftest import (
    TIMEOUT_S,
    Received,
    recv,
    recv_message,
    recv_until,
    send,
    serve_engine,
    session,
    voxgate_connect,
)

URL = "/v1/audio/speech/stream"


def speak(ws: object, *tokens: str) -> Received:
    for token in tokens:
        send(ws, type="input.text", text=token)  # type: ignore[arg-type]
    send(ws, type="input.done")  # type: ignore[arg-type]
    return recv_until(ws, "session.done")  # type: ignore[arg-type]


def closed_with(ws: object) -> tuple[list[dict[str, object]], int | None]:
    """Read until the server closes; returns the JSON messages seen and the close code."""
    messages = []
    try:
        while True:
            item = recv(ws)  # type: ignore[arg-type]
            if isinstance(item, dict):
                messages.append(item)
    except ConnectionClosed as closed:
        return messages, closed.rcvd.code if closed.rcvd else None


def test_session_ready_reports_effective_config_and_limits() -> None:
    with serve_engine(FakeEngine(), idle_timeout_s=42.0) as address:
        with voxgate_connect(f"ws://{address}{URL}") as ws:
            send(ws, type="session.config", response_format="mulaw", sample_rate=8000, frame_header=True)
            ready = recv(ws)
    assert isinstance(ready, dict) and ready["type"] == "session.ready"
    assert ready["config"]["engine"] == "fake" and ready["config"]["voice"] == "tone"  # type: ignore[index]
    assert ready["config"]["sample_rate"] == 8000 and ready["config"]["response_format"] == "mulaw"  # type: ignore[index]
    assert ready["limits"]["idle_timeout_s"] == 42.0  # type: ignore[index]
    assert ready["session_id"]


def test_session_ready_publishes_every_limit_as_configured() -> None:
    custom = {"rate_limit_per_s": 3.5, "rate_limit_burst": 7, "header_timeout_s": 4.0, "max_contexts": 3}
    with serve_engine(FakeEngine(), **custom) as address, voxgate_connect(f"ws://{address}{URL}") as ws:
        send(ws, type="session.config")
        ready = recv(ws)
    assert isinstance(ready, dict)
    limits = ready["limits"]
    assert isinstance(limits, dict)
    settings = Settings.from_env({}, voices_dir="unused", **custom)
    assert set(limits) == set(Limits.__struct_fields__)
    assert limits == {name: getattr(settings, name) for name in Limits.__struct_fields__}


def test_streamed_tokens_give_segments_in_order_with_headers() -> None:
    engine = FakeEngine()
    with (
        serve_engine(engine) as address,
        session(address, frame_header=True, eager_first_segment=False) as ws,
    ):
        got = speak(ws, "Hel", "lo the", "re.", " How are", " you", " today?")
    starts, dones = got.messages("audio.start"), got.messages("audio.done")
    assert [m["sentence_text"] for m in starts] == ["Hello there.", "How are you today?"]
    assert [m["sentence_index"] for m in dones] == [0, 1]
    assert [r.text for r in engine.requests] == ["Hello there.", "How are you today?"]
    frames = got.frames()
    headers = [FrameHeader.parse(f) for f in frames]
    assert [h.frame_index for h in headers] == list(range(len(frames)))
    position = 0
    for header, frame in zip(headers, frames, strict=True):
        assert header.start_sample == position and header.utterance_index == 0
        position += (len(frame) - HEADER_BYTES) // 2
    frame_samples = 24000 * 40 // 1000  # the default output rate
    assert all((len(f) - HEADER_BYTES) // 2 <= frame_samples for f in frames)
    done = got.messages("session.done")[0]
    assert done["total_sentences"] == 2 and done["audio_ms"] == pytest.approx(position / 24.0, abs=0.1)
    assert sum(int(m["total_bytes"]) for m in dones) == position * 2  # type: ignore[call-overload]
    assert all(m["text_to_first_audio_ms"] is not None and not m["error"] for m in dones)
    # Each segment's audio is announced before its frames and closed after them.
    types = got.types()
    assert types[0] == "audio.start" and types[-2:] == ["audio.done", "session.done"]


@pytest.mark.parametrize(
    ("fmt", "rate", "bytes_per_sample"),
    [("pcm", 16000, 2), ("f32", 24000, 4), ("mulaw", 8000, 1), ("wav", 22050, 2)],
)
def test_each_format_and_rate(fmt: str, rate: int, bytes_per_sample: int) -> None:
    text = "One two three four five."
    with serve_engine(FakeEngine()) as address, session(address, response_format=fmt, sample_rate=rate) as ws:
        got = speak(ws, text)
    data = b"".join(got.frames())
    if fmt == "wav":
        assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
        assert int.from_bytes(data[24:28], "little") == rate
        data = data[44:]
    samples = decode(data, fmt if fmt != "wav" else "pcm")  # type: ignore[arg-type]
    expected = len(text) * SECONDS_PER_CHAR * rate
    assert abs(len(samples) - expected) < rate * 0.01
    assert len(data) == len(samples) * bytes_per_sample
    assert got.messages("audio.start")[0]["sample_rate"] == rate
    # The tone survives encoding and resampling: a clear 220 Hz peak.
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(np.argmax(spectrum) * rate / len(samples) - 220.0) < 5.0


def test_stream_audio_false_sends_one_message_per_segment() -> None:
    with (
        serve_engine(FakeEngine()) as address,
        session(address, stream_audio=False, response_format="wav", eager_first_segment=False) as ws,
    ):
        got = speak(ws, "First sentence here. Second one.")
    frames = got.frames()
    assert len(frames) == 2 and all(f[:4] == b"RIFF" for f in frames)
    assert got.types() == ["audio.start", "<audio>", "audio.done"] * 2 + ["session.done"]


def test_cancel_mid_utterance_stops_audio_and_engine() -> None:
    engine = FakeEngine(chunk_s=0.05, delay_s=0.05)  # slow: 1 s of audio takes 1 s to make
    with serve_engine(engine) as address, session(address, frame_header=True) as ws:
        send(
            ws, type="input.text", text="This is a long sentence that takes a while to say. And another one."
        )
        send(ws, type="input.done")
        first = recv(ws)
        assert isinstance(first, dict) and first["type"] == "audio.start"
        assert isinstance(recv(ws), bytes)
        send(ws, type="input.cancel")
        got = recv_until(ws, "audio.cancelled")
        assert got.messages("audio.cancelled")[0]["utterance_index"] == 0
        # Nothing of utterance 0 after audio.cancelled, and the socket still speaks.
        after = speak(ws, "Next.")
    assert all(FrameHeader.parse(f).utterance_index == 1 for f in after.frames())
    assert all(m.get("utterance_index") == 1 for m in after.messages())
    assert after.messages("session.done")[0]["utterance_index"] == 1
    deadline = time.monotonic() + TIMEOUT_S
    while engine.closed < engine.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.closed == engine.started and engine.finished < engine.started


def test_disconnect_stops_engine_work() -> None:
    engine = FakeEngine(chunk_s=0.05, delay_s=0.05)
    with serve_engine(engine) as address:
        with session(address) as ws:
            send(ws, type="input.text", text="A long sentence that the engine is slow to say, on purpose.")
            send(ws, type="input.done")
            recv_until(ws, "audio.start")
        deadline = time.monotonic() + TIMEOUT_S
        while engine.closed < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert engine.started == 1 and engine.closed == 1 and engine.finished == 0


@pytest.mark.parametrize(
    ("raw", "code", "field"),
    [
        ("{not json", "invalid_json", None),
        ("[1, 2]", "not_an_object", None),
        ('{"type": "input.shout", "text": "x"}', "unknown_type", "$.type"),
        ('{"type": "input.text", "text": 5}', "invalid_message", "$.text"),
        ('{"type": "input.text", "txt": "x"}', "invalid_message", None),
        (json.dumps({"type": "input.text", "text": "x" * 200_000}), "message_too_large", None),
        (b"\x00\x01", "binary_not_accepted", None),
        ('{"type": "session.config", "sample_rate": 100}', "invalid_message", "$.sample_rate"),
        (
            '{"type": "session.config", "x_vector_only_mode": true}',
            "unsupported_option",
            "$.x_vector_only_mode",
        ),
        ('{"type": "session.config", "voice": "nobody"}', "voice_not_found", "$.voice"),
    ],
)
def test_bad_input_after_config_is_reported_and_session_stays_usable(
    raw: str | bytes, code: str, field: str | None
) -> None:
    with serve_engine(FakeEngine()) as address, session(address) as ws:
        ws.send(raw)
        error = recv(ws)
        assert isinstance(error, dict) and error["type"] == "error", error
        assert error["code"] == code and error["fatal"] is False
        if field is not None:
            assert error["field"] == field
        got = speak(ws, "Still here.")
    assert got.frames() and got.messages("session.done")


def test_error_codes_are_distinct() -> None:
    from voxgate.protocol.errors import ErrorCode

    assert len({c.value for c in ErrorCode}) == len(ErrorCode)


@pytest.mark.parametrize(
    ("first", "code", "close"),
    [
        ('{"type": "input.text", "text": "hi"}', "config_required", 1008),
        ('{"type": "session.config", "sample_rate": 100}', "invalid_message", 1007),
        ('{"type": "session.config", "x_vector_only_mode": true}', "unsupported_option", 1008),
        ("nope", "invalid_json", 1007),
    ],
)
def test_invalid_first_message_is_fatal(first: str, code: str, close: int) -> None:
    with serve_engine(FakeEngine()) as address, voxgate_connect(f"ws://{address}{URL}") as ws:
        ws.send(first)
        messages, close_code = closed_with(ws)
    assert messages[-1]["code"] == code and messages[-1]["fatal"] is True
    assert close_code == close


def test_unsupported_option_names_field_and_engine() -> None:
    with serve_engine(FakeEngine()) as address, session(address) as ws:
        send(ws, type="session.config", task_type="VoiceDesign")
        error = recv(ws)
    assert (
        isinstance(error, dict) and "task_type" in str(error["message"]) and "fake" in str(error["message"])
    )


def test_config_again_between_utterances_changes_format() -> None:
    with serve_engine(FakeEngine()) as address, session(address) as ws:
        first = speak(ws, "One two.")
        send(ws, type="session.config", response_format="f32", sample_rate=8000)
        assert recv_message(ws)["type"] == "session.ready"
        second = speak(ws, "One two.")
        send(ws, type="input.text", text="open utterance")
        send(ws, type="session.config", response_format="pcm")
        refused = recv_until(ws, "error")
    assert first.messages("audio.start")[0]["format"] == "pcm"
    assert second.messages("audio.start")[0]["format"] == "f32"
    assert second.messages("audio.start")[0]["sample_rate"] == 8000
    assert refused.messages("error")[0]["code"] == "invalid_state"


def test_session_close_finishes_the_utterance_then_closes_normally() -> None:
    with serve_engine(FakeEngine()) as address, session(address) as ws:
        send(ws, type="input.text", text="Goodbye now")
        send(ws, type="session.close")
        messages, code = closed_with(ws)
    assert [m["type"] for m in messages][-1] == "session.done"
    assert code == 1000


def test_engine_failure_is_reported_and_not_fatal() -> None:
    with (
        serve_engine(FakeEngine(fail_on="boom")) as address,
        session(address, eager_first_segment=False) as ws,
    ):
        got = speak(ws, "This goes boom. This is fine.")
        again = speak(ws, "Fine again.")
    dones = got.messages("audio.done")
    assert [d["error"] for d in dones] == [True, False]
    error = got.messages("error")[0]
    assert error["code"] == "engine_error" and error["utterance_index"] == 0 and error["fatal"] is False
    assert again.frames()


@pytest.mark.parametrize("after_chunks", [0, 1])
def test_an_engine_bug_closes_the_session_with_internal_error(after_chunks: int) -> None:
    engine = FakeEngine(fail_on="boom", fail_after_chunks=after_chunks, failure=ValueError)
    with serve_engine(engine) as address, session(address) as ws:
        send(ws, type="input.text", text="This goes boom.")
        send(ws, type="input.done")
        messages, code = closed_with(ws)
    assert messages[-1]["code"] == "internal_error" and messages[-1]["fatal"] is True
    assert code == 1011


def test_config_timeout_closes_with_error() -> None:
    with (
        serve_engine(FakeEngine(), config_timeout_s=0.3) as address,
        voxgate_connect(f"ws://{address}{URL}") as ws,
    ):
        messages, code = closed_with(ws)
    assert messages[-1]["code"] == "config_timeout" and code == 4008


def test_idle_timeout_closes_with_error() -> None:
    with serve_engine(FakeEngine(), idle_timeout_s=0.5) as address, session(address) as ws:
        got = speak(ws, "Hi.")
        messages, code = closed_with(ws)
    assert got.frames()
    assert messages[-1]["code"] == "idle_timeout" and code == 4008


def test_next_segment_arrives_before_the_previous_one_has_played() -> None:
    """Pipelining: with an engine faster than real time, no gap opens between segments."""
    with serve_engine(FakeEngine()) as address, session(address, eager_first_segment=False) as ws:
        for text in ["The first sentence is rather long, so it plays for a while.", " Second one."]:
            send(ws, type="input.text", text=text)
        send(ws, type="input.done")
        arrivals: dict[int, float] = {}
        durations: dict[int, float] = {}
        while True:
            item = recv(ws)
            if isinstance(item, dict) and item["type"] == "audio.start":
                arrivals[int(str(item["sentence_index"]))] = time.monotonic()
            if isinstance(item, dict) and item["type"] == "audio.done":
                durations[int(str(item["sentence_index"]))] = float(str(item["duration_ms"])) / 1000
            if isinstance(item, dict) and item["type"] == "session.done":
                break
    assert arrivals[1] - arrivals[0] < durations[0]


def test_slow_consumer_is_closed_and_other_sessions_are_unaffected(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine(sample_rate=48000, chunk_s=1.0)
    caplog.set_level(logging.INFO, logger="voxgate")
    with serve_engine(engine, max_buffered_audio_s=2.0, send_timeout_s=3.0) as address:
        with voxgate_connect(f"ws://{address}{URL}", max_size=None, max_queue=1) as stuck:
            send(stuck, type="session.config", response_format="f32", frame_ms=1000)
            send(stuck, type="input.text", text="word " * 4000)  # about 20 minutes of audio, 230 MB
            send(stuck, type="input.done")
            # Not reading: the kernel buffers fill, then the outbox; synthesis pauses.
            with session(address) as other:
                assert speak(other, "Meanwhile, this works.").frames()
            # Once the server gives up on it, the client has send_timeout_s to read the rest and the error.
            deadline = time.monotonic() + TIMEOUT_S
            while not any("closing with 4001" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "the stalled reader was not closed"
                time.sleep(0.02)
            messages, code = closed_with(stuck)
    assert messages[-1]["code"] == "slow_consumer" and code == 4001
    # The bound paused synthesis: far fewer than the ~70 segments of the text were ever started.
    assert engine.started < 20


def test_health_routes() -> None:
    with serve_engine(FakeEngine()) as address:
        assert httpx.get(f"http://{address}/healthz").json() == {"status": "ok"}
        ready = httpx.get(f"http://{address}/readyz")
    assert ready.status_code == 200 and ready.json()["engines"] == {"fake": "ready"}


def test_a_steady_slow_reader_pauses_synthesis_instead_of_being_closed() -> None:
    """A client reading slower than the engine makes audio (a phone bridge) is served, not closed."""
    engine = FakeEngine(sample_rate=48000, chunk_s=1.0)
    # 200 segments of about 1 s (38 MB of f32 at 48 kHz). Without the bound the engine, which costs
    # nothing, runs to the end while the reader pauses; with it, synthesis leads the reader only by what
    # the outbox, the client's queue and the kernel's socket buffers hold: tens of frames.
    text = "Some words here. " * 200
    with serve_engine(engine, max_buffered_audio_s=1.0, send_timeout_s=5.0) as address:
        with session(
            address, response_format="f32", sample_rate=48000, frame_ms=1000, eager_first_segment=False
        ) as ws:
            send(ws, type="input.text", text=text)
            send(ws, type="input.done")
            frames, paused_at = 0, None
            while True:
                item = recv(ws)
                if isinstance(item, bytes):
                    frames += 1
                    if frames == 40:
                        paused_at = settled(lambda: engine.finished)  # the reader pauses here
                elif item["type"] == "session.done":
                    break
                else:
                    assert item["type"] in ("audio.start", "audio.done"), item
    assert frames >= 195
    assert paused_at is not None and paused_at < 150  # synthesis waited for the reader


def settled(read: Callable[[], int], still_s: float = 0.3, limit_s: float = 2.0) -> int:
    """``read()`` once it stopped changing for ``still_s`` (at most ``limit_s``, under send_timeout_s)."""
    value, since, deadline = read(), time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() - since < still_s and time.monotonic() < deadline:
        time.sleep(0.02)
        if (now := read()) != value:
            value, since = now, time.monotonic()
    return value


def test_opted_in_clients_see_ignored_fields_and_warnings() -> None:
    with serve_engine(FakeEngine()) as address, voxgate_connect(f"ws://{address}{URL}") as ws:
        assert ws.subprotocol == "voxgate.v1"
        send(ws, type="session.config", instructions="calm", voise="tone", streaming_mode="token_level")
        ready, warning = recv(ws), recv(ws)
    assert isinstance(ready, dict) and ready["type"] == "session.ready"
    assert ready["ignored_fields"] == ["voise"]
    assert isinstance(warning, dict) and warning["type"] == "warning" and warning["field"] == "$.instructions"


def test_clients_without_the_subprotocol_get_no_extensions() -> None:
    with serve_engine(FakeEngine()) as address, connect(f"ws://{address}{URL}") as ws:
        assert ws.subprotocol is None
        send(ws, type="session.config", instructions="calm", response_format="pcm", stream_audio=True)
        send(ws, type="input.cancel")  # a voxgate extension: unknown here, as in vllm-omni
        error = recv(ws)
        got = speak(ws, "Hello there.")
    assert error == {"type": "error", "message": "unknown message type: 'input.cancel' (a voxgate extension)"}
    assert got.types()[0] == "audio.start" and got.types()[-1] == "session.done"
    assert set(got.messages("audio.start")[0]) == {
        "type",
        "utterance_index",
        "sentence_index",
        "sentence_text",
        "format",
        "sample_rate",
    }
    assert got.messages("session.done") == [
        {"type": "session.done", "utterance_index": 0, "total_sentences": 1}
    ]


def test_the_first_segment_is_cut_when_its_time_budget_passes() -> None:
    """The client sends nothing more until the first audio.start: only the server's deadline can cut."""
    with serve_engine(FakeEngine()) as address:
        with voxgate_connect(f"ws://{address}{URL}") as ws:
            send(ws, type="session.config", max_buffer_delay_ms=50)
            ready = recv_message(ws)
            assert ready["config"]["max_buffer_delay_ms"] == 50
            send(ws, type="input.text", text="one two three four five six ")
            start = recv_message(ws)
            assert start["type"] == "audio.start" and start["sentence_text"] == "one two three four"
            send(ws, type="input.text", text="seven. Eight")
            send(ws, type="input.done")
            received = recv_until(ws, "session.done")
    texts = [m["sentence_text"] for m in received.messages("audio.start")]
    assert texts == ["five six seven.", "Eight"]
    assert received.messages("session.done")[0]["total_sentences"] == 3


def test_a_sentence_sent_whole_is_one_segment_after_its_budget() -> None:
    sentence = "The quick brown fox jumps over the lazy dog and runs far away from the hunter."
    with serve_engine(FakeEngine()) as address, session(address, max_buffer_delay_ms=20) as ws:
        send(ws, type="input.text", text=sentence)
        with pytest.raises(TimeoutError):
            recv(ws, timeout=0.3)  # the budget passed: its end is in sight, so nothing is cut
        send(ws, type="input.done")
        received = recv_until(ws, "session.done")
    assert [m["sentence_text"] for m in received.messages("audio.start")] == [sentence]
