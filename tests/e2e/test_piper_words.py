"""Word timestamps from the real Piper engine, through a real server and the websockets client."""

from __future__ import annotations

import base64
from typing import Any, cast

import pytest
from voxgate.protocol.audio import decode
from websockets.sync.client import connect

from tests.conftest import TIMEOUT_S, Received, recv_until, send, session

pytestmark = pytest.mark.slow

SENTENCE = "It costs $3.50 on 5/12, Dr. Smith said."
WORDS = ["It", "costs", "$3.50", "on", "5/12,", "Dr.", "Smith", "said."]


def speak(ws: object, text: str) -> Received:
    send(ws, type="input.text", text=text)  # type: ignore[arg-type]
    send(ws, type="input.done")  # type: ignore[arg-type]
    return recv_until(ws, "session.done")  # type: ignore[arg-type]


def words_of(got: Received) -> list[dict[str, Any]]:
    return [w for m in got.messages("audio.chunk") for w in cast(list[dict[str, Any]], m["timestamps"])]


def check_timeline(got: Received, audio_ms: float) -> None:
    """Words in order, non-overlapping, each of some length, together covering the audio.

    Within a chunk the words tile its audio from the first word's onset (after the voice's leading
    silence) to the chunk's end; the chunks tile the utterance.
    """
    chunks = got.messages("audio.chunk")
    assert float(cast(float, chunks[0]["chunk_start_ms"])) == 0
    assert float(cast(float, chunks[-1]["chunk_end_ms"])) == pytest.approx(audio_ms, abs=2)
    for c, following in zip(chunks, chunks[1:], strict=False):
        assert following["chunk_start_ms"] == pytest.approx(c["chunk_end_ms"], abs=1)
    for c in chunks:
        words = cast(list[dict[str, float]], c["timestamps"])
        starts, ends = [w["start_ms"] for w in words], [w["end_ms"] for w in words]
        assert all(s < e for s, e in zip(starts, ends, strict=True)), words
        assert ends[:-1] == starts[1:], words  # no gap, no overlap
        assert 0 <= starts[0] - float(cast(float, c["chunk_start_ms"])) < 150, (c, starts[0])
        assert ends[-1] == c["chunk_end_ms"]


@pytest.mark.parametrize(("fmt", "rate", "speed"), [("pcm", None, 1.0), ("mulaw", 8000, 1.5)])
def test_words_are_the_inputs_in_order_timed_on_the_audio_clock(
    piper_gateway: str, fmt: str, rate: int | None, speed: float
) -> None:
    config: dict[str, object] = {"response_format": fmt, "word_timestamps": True, "speed": speed}
    if rate:
        config["sample_rate"] = rate
    with session(piper_gateway, **config) as ws:
        got = speak(ws, SENTENCE)
    out_rate = rate or 24000
    audio = decode(b"".join(got.frames()), fmt)  # type: ignore[arg-type]
    audio_ms = len(audio) * 1000 / out_rate
    assert [w["word"] for w in words_of(got)] == WORDS
    check_timeline(got, audio_ms)
    chunks = got.messages("audio.chunk")
    assert all(c["sample_rate"] == out_rate and c["audio_b64"] == "" for c in chunks)
    assert chunks[-1]["chunk_end_ms"] == pytest.approx(audio_ms, abs=2)
    # Each word message comes before the audio it describes, and just before: when it arrives, the audio
    # received so far ends where its chunk starts, less the frame being filled and the resampler's delay.
    received_ms = 0.0
    for item in got.items:
        if isinstance(item, bytes):
            received_ms += len(decode(item, fmt)) * 1000 / out_rate  # type: ignore[arg-type]
        elif item["type"] == "audio.chunk":
            assert received_ms <= float(cast(float, item["chunk_start_ms"])) + 0.01, (item, received_ms)
            assert received_ms > float(cast(float, item["chunk_start_ms"])) - 150, (item, received_ms)


def test_several_segments_keep_one_clock(piper_gateway: str) -> None:
    text = "Hello there. The 2 cats ate 3 fish! Done."
    with session(piper_gateway, word_timestamps=True, split_granularity="sentence") as ws:
        got = speak(ws, text)
    starts = {m["sentence_index"]: m["start_sample"] for m in got.messages("audio.start")}
    chunks = got.messages("audio.chunk")
    assert {c["sentence_index"] for c in chunks} == {0, 1, 2}
    for c in chunks:  # each segment's first chunk starts where its audio does on the utterance clock
        if c["chunk_id"] == 0:
            start = cast(int, starts[c["sentence_index"]])
            assert c["chunk_start_ms"] == pytest.approx(start * 1000 / 24000, abs=0.01)
    assert [w["word"] for w in words_of(got)] == text.split()
    check_timeline(got, len(decode(b"".join(got.frames()), "pcm")) * 1000 / 24000)


def test_without_asking_no_word_messages(piper_gateway: str) -> None:
    with session(piper_gateway) as ws:
        got = speak(ws, SENTENCE)
    assert got.messages("audio.chunk") == []


def test_the_vllm_omni_dialect_gets_them_when_it_asks(piper_gateway: str) -> None:
    with connect(f"ws://{piper_gateway}/v1/audio/speech/stream", open_timeout=TIMEOUT_S) as ws:
        send(ws, type="session.config", word_timestamps=True)
        got = speak(ws, "Dr. Smith paid $5.")
    chunks = got.messages("audio.chunk")
    assert set(chunks[0]) == {
        "type",
        "utterance_index",
        "sentence_index",
        "chunk_id",
        "chunk_start_ms",
        "chunk_end_ms",
        "sample_rate",
        "audio_b64",
        "timestamps",
    }
    # vllm-omni 0.30: the audio itself in base64 chunks with null timestamps, then one empty chunk with
    # the sentence's words in integer ms from its start; no binary frames.
    *audio, words = chunks
    assert audio and all(c["timestamps"] is None and c["audio_b64"] for c in audio)
    assert words["audio_b64"] == ""
    timed = cast(list[dict[str, Any]], words["timestamps"])
    assert [w["word"] for w in timed] == ["Dr.", "Smith", "paid", "$5."]
    assert all(isinstance(w["start_ms"], int) and w["start_ms"] < w["end_ms"] for w in timed)
    pcm = b"".join(base64.b64decode(cast(str, c["audio_b64"])) for c in audio)
    assert timed[-1]["end_ms"] <= len(pcm) // 2 * 1000 // 24000 + 1
    assert [c["chunk_id"] for c in chunks] == list(range(len(chunks)))
    assert "<audio>" not in got.types()
