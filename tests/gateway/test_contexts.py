"""Contexts on a real server: several streams of utterances on one socket (``context_id``)."""

from __future__ import annotations

import time

from voxgate.engine.fake import FakeEngine
from voxgate.protocol.frames import FrameHeader, split_frame
from websockets.sync.client import ClientConnection, connect

from tests.conftest import TIMEOUT_S, Received, recv, recv_message, recv_until, send, serve_engine, session

URL = "/v1/audio/speech/stream"


def context_of(item: dict[str, object] | bytes, numbers: dict[int, str]) -> str | None:
    """The context a message or a frame (by its header's context number) belongs to; None: the default."""
    if isinstance(item, bytes):
        header = FrameHeader.parse(item)
        return numbers[header.context_number] if header.context_number else None
    value = item.get("context_id")
    return None if value is None else str(value)


def test_two_contexts_interleave_and_one_is_cancelled_while_the_other_plays_on() -> None:
    engine = FakeEngine(chunk_s=0.05, delay_s=0.05)  # about real time: a sentence takes a second or two
    with serve_engine(engine) as address, session(address, frame_header=True) as ws:
        # Segments are cut in this order: b0, a0, b1, a1 (each sentence ends at the next one's space).
        send(ws, type="input.text", text="Bee one is short. ", context_id="b")
        send(ws, type="input.text", text="Alpha one is a long sentence to cancel. ", context_id="a")
        send(ws, type="input.text", text="Bee two plays on. ", context_id="b")
        send(ws, type="input.text", text="Alpha two never plays. ", context_id="a")
        send(ws, type="input.done", context_id="b")
        send(ws, type="input.done", context_id="a")
        got = Received()
        numbers: dict[int, str] = {}
        while True:  # until a's first segment is being spoken: its audio.start and one frame
            item = recv(ws)
            got.items.append(item)
            if isinstance(item, dict) and item["type"] == "context.opened":
                numbers[int(str(item["context_number"]))] = str(item["context_id"])
            if isinstance(item, bytes) and context_of(item, numbers) == "a":
                break
        send(ws, type="input.cancel", context_id="a")
        cancelled_at = len(got.items)
        recv_until(ws, "context.closed", got)
        recv_until(ws, "session.done", got)
        after = got.items[cancelled_at:]
    assert sorted(numbers.values()) == ["a", "b"]
    a_index = next(m["utterance_index"] for m in got.messages("audio.start") if m.get("context_id") == "a")
    b_index = next(m["utterance_index"] for m in got.messages("audio.start") if m.get("context_id") == "b")
    # The two contexts' audio interleaved on the socket: b0, then a0, then (after the cancel) b1.
    order = [m["context_id"] for m in got.messages("audio.start")]
    assert order == ["b", "a", "b"]
    # a: one audio.cancelled, then context.closed; after the cancel, nothing more of a (frames that were
    # already written may come before the audio.cancelled).
    cancelled = [m for m in got.messages("audio.cancelled")]
    fields = ("type", "utterance_index", "context_id")
    assert [{k: m[k] for k in fields} for m in cancelled] == [
        {"type": "audio.cancelled", "utterance_index": a_index, "context_id": "a"}
    ]
    heard = cancelled[0]  # what the listener heard of a, in its text as sent (docs/protocol.md §8)
    assert f"{heard['text_spoken']}{heard['text_remaining']}" == (
        "Alpha one is a long sentence to cancel. Alpha two never plays. "
    )
    closed = got.messages("context.closed")
    assert closed == [
        {"type": "context.closed", "context_id": "a", "context_number": 2, "reason": "cancelled"}
    ]
    confirm = next(i for i, m in enumerate(after) if isinstance(m, dict) and m["type"] == "audio.cancelled")
    assert all(context_of(m, numbers) != "a" for m in after[confirm + 1 :] if m is not closed[0])
    assert not [m for m in got.messages("audio.done") if m.get("context_id") == "a"]
    assert not [m for m in got.messages("session.done") if m.get("context_id") == "a"]
    # b: both segments whole, its session.done, and every frame of its audio.
    (b_done,) = got.messages("session.done")
    assert b_done["context_id"] == "b" and b_done["utterance_index"] == b_index
    assert b_done["total_sentences"] == 2
    b_dones = [m for m in got.messages("audio.done") if m["context_id"] == "b"]
    assert [m["sentence_index"] for m in b_dones] == [0, 1] and not any(m["error"] for m in b_dones)
    b_payload = sum(len(split_frame(f)[1]) for f in got.frames() if context_of(f, numbers) == "b")
    assert b_payload == sum(int(str(m["total_bytes"])) for m in b_dones) > 0
    # The engine stream of a's segment was closed, and a's second segment never started.
    assert [r.text for r in engine.requests].count("Alpha two never plays.") == 0
    deadline = time.monotonic() + TIMEOUT_S
    while engine.closed < engine.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.closed == engine.started and engine.finished == engine.started - 1


def test_an_idle_context_closes_and_a_keepalive_holds_it_open() -> None:
    with serve_engine(FakeEngine(), context_idle_timeout_s=0.5) as address, session(address) as ws:
        # a opens before b, but the keepalive after b's opening gives a the later deadline: b closes first.
        # The order comes from the order of the messages, not from how fast this machine is.
        send(ws, type="keepalive", context_id="a")
        send(ws, type="input.text", text="", context_id="b")
        send(ws, type="keepalive", context_id="a")
        got = recv_until(ws, "context.closed")
        got = recv_until(ws, "context.closed", got)
        # A context with an utterance left open ends it unspoken: audio.cancelled, then context.closed.
        send(ws, type="input.text", text="Hello there and", context_id="c")
        left_open = recv_until(ws, "context.closed")
    opened = got.messages("context.opened")
    assert [m["context_id"] for m in opened] == ["a", "b"]
    assert [(m["context_id"], m["reason"]) for m in got.messages("context.closed")] == [
        ("b", "idle_timeout"),
        ("a", "idle_timeout"),
    ]
    assert left_open.messages("audio.cancelled")[0]["context_id"] == "c"
    assert left_open.messages("context.closed")[0]["reason"] == "idle_timeout"


def test_the_context_cap_is_published_and_one_more_is_refused_without_closing() -> None:
    with serve_engine(FakeEngine(), max_contexts=2) as address:
        with session(address) as ws:
            send(ws, type="session.config")
            ready = recv_message(ws)
            send(ws, type="keepalive", context_id="one")
            send(ws, type="keepalive", context_id="two")
            send(ws, type="input.text", text="Three.", context_id="three")
            got = recv_until(ws, "error")
            send(ws, type="context.close", context_id="one")
            send(ws, type="input.text", text="Three.", context_id="three")
            send(ws, type="input.done", context_id="three")
            spoken = recv_until(ws, "session.done")
    assert ready["limits"]["max_contexts"] == 2 and ready["limits"]["context_idle_timeout_s"] == 20.0
    (error,) = got.messages("error")
    assert error["code"] == "too_many_contexts" and error["fatal"] is False
    assert error["context_id"] == "three" and error["field"] == "$.context_id"
    assert spoken.messages("context.closed")[0]["context_id"] == "one"
    assert spoken.messages("session.done")[0]["context_id"] == "three" and spoken.frames()


def test_a_closed_context_reports_after_its_audio() -> None:
    with serve_engine(FakeEngine()) as address, session(address) as ws:
        send(ws, type="input.text", text="Goodbye from here.", context_id="x")
        send(ws, type="context.close", context_id="x")
        got = recv_until(ws, "context.closed")
    assert got.types()[-2:] == ["session.done", "context.closed"]
    assert got.messages("context.closed")[0]["reason"] == "closed"
    assert got.messages("session.done")[0]["context_id"] == "x"


def test_without_context_ids_nothing_changes() -> None:
    with serve_engine(FakeEngine()) as address:
        with session(address, frame_header=True) as ws:
            send(ws, type="input.text", text="Hello there.")
            send(ws, type="keepalive")
            send(ws, type="input.done")
            got = recv_until(ws, "session.done")
        # vllm-omni's dialect ignores context_id, as it ignores every unknown field.
        with connect(f"ws://{address}{URL}") as plain:
            vllm = speak_plain(plain)
    assert not [m for m in got.messages() if "context_id" in m or str(m["type"]).startswith("context.")]
    assert all(f[:4] == b"VGA1" for f in got.frames()) and got.frames()
    assert vllm.messages("session.done") == [
        {"type": "session.done", "utterance_index": 0, "total_sentences": 1}
    ]


def speak_plain(ws: ClientConnection) -> Received:
    send(ws, type="session.config", response_format="pcm")
    send(ws, type="input.text", text="Hello there.", context_id="a")
    send(ws, type="input.done", context_id="b")
    return recv_until(ws, "session.done")


def test_cancelling_a_queued_context_leaves_the_segment_being_spoken_whole() -> None:
    engine = FakeEngine(chunk_s=0.05, delay_s=0.05)
    text = "This sentence of the other context is spoken while a is cancelled."
    with serve_engine(engine) as address, session(address) as ws:
        send(ws, type="input.text", text=text, context_id="b")
        send(ws, type="input.done", context_id="b")
        send(ws, type="input.text", text="Queued behind it.", context_id="a")
        send(ws, type="input.done", context_id="a")
        first = recv_until(ws, "audio.start")
        assert first.messages("audio.start")[0]["context_id"] == "b"
        # b's segment is being spoken; a's context.opened may come before or after b's audio.start
        while not isinstance(message := recv(ws), bytes):
            assert message["type"] == "context.opened" and message["context_id"] == "a", message
        send(ws, type="input.cancel", context_id="a")
        got = recv_until(ws, "session.done")
    assert got.messages("audio.cancelled") == [
        {
            "type": "audio.cancelled",
            "utterance_index": 1,
            "context_id": "a",
            "played_ms": 0.0,  # none of it was heard (docs/protocol.md §8)
            "text_spoken": "",
            "text_remaining": "Queued behind it.",
            "text_spoken_source": "estimate",
        }
    ]
    (done,) = got.messages("audio.done")
    assert done["context_id"] == "b" and done["error"] is False
    assert abs(float(str(done["duration_ms"])) - len(text) * 60.0) < 30.0  # all of it: 60 ms a character
    assert got.messages("session.done")[0]["context_id"] == "b"
    assert [r.text for r in engine.requests] == [text]
