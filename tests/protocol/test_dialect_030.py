"""vllm-omni 0.30's WebSocket additions in its dialect: base64 ``audio.chunk`` audio with word timestamps, and
``partial_audio`` / ``action`` on the error of a segment that failed after some of its audio went out.

What vllm-omni 0.30.0 sends (``serving_speech_stream.py``): with ``word_timestamps`` (which it takes only with
``stream_audio`` and ``pcm``) ``audio.start`` says ``sample_rate`` and ``word_timestamps: true``, each PCM
chunk goes out as ``{"type": "audio.chunk", ..., "audio_b64": ..., "timestamps": null}``, and one trailing
``audio.chunk`` with empty audio carries the sentence's words (integer ms from the sentence's start) before
``audio.done``. A failed sentence's ``error`` comes before its ``audio.done``, with ``partial_audio: true``
and ``action: "discard"`` when some of its audio was sent. The core drives these tests as the shell does.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

import msgspec
import numpy as np
from voxgate.protocol.codecs.stream import SessionCodec
from voxgate.protocol.core import Core
from voxgate.protocol.errors import ErrorCode, ProtocolError
from voxgate.protocol.messages import AudioDone, Error, SessionConfig
from voxgate.protocol.output import Audio, Configure, Message, OutputFormat
from voxgate.protocol.session import Session

RATE = 24000
CHUNK_FIELDS = [
    "type",
    "utterance_index",
    "sentence_index",
    "chunk_id",
    "chunk_start_ms",
    "chunk_end_ms",
    "sample_rate",
    "audio_b64",
    "timestamps",
]
Payloads = list[str | bytes]


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


class Driver:
    """A core and the session's codec, with outputs written as the shell writes them."""

    def __init__(self, config: dict[str, object] | None = None, *, extensions: bool = False) -> None:
        self.core = Core(OutputFormat("pcm", RATE), Session(extensions=extensions))
        self.codec = SessionCodec(extensions=extensions)
        self.payloads: Payloads = []
        self.text(json.dumps({"type": "session.config", **(config or {})}))
        self.pump()

    def text(self, data: str) -> None:
        self.core.receive_text(data, 0.0)

    def pump(self) -> Payloads:
        start = len(self.payloads)
        for output in self.core.data_to_send():
            if isinstance(output, Configure):
                config = output.config
                self.core.accept_config(config, OutputFormat.of(config, config.output_rate(RATE)))
                continue
            written = self.core.sending(output, 1.0)
            if isinstance(written, Audio | Message):
                self.payloads += self.codec.encode(written)
        return self.payloads[start:]

    def speak(
        self,
        text: str,
        pieces: Sequence[np.ndarray],
        words: Sequence[tuple[str, int, int]] = (),
        error: ProtocolError | None = None,
    ) -> list[dict[str, object] | bytes]:
        self.text(json.dumps({"type": "input.text", "text": text}))
        self.text('{"type": "input.done"}')
        self.pump()
        u = self.core.in_flight[-1]
        self.core.segment_started(u, 0)
        for n, piece in enumerate(pieces):
            self.core.audio(u, 0, piece, RATE, words if n == 0 else ())
        self.core.segment_done(u, 0, synthesis_s=0.1, error=error)
        return [p if isinstance(p, bytes) else json.loads(p) for p in self.pump()]


WORDS_CONFIG: dict[str, object] = {"word_timestamps": True, "stream_audio": True, "response_format": "pcm"}


def test_with_word_timestamps_the_audio_goes_in_base64_audio_chunks_and_the_words_after_it() -> None:
    d = Driver(WORDS_CONFIG)
    got = d.speak("Hello world.", [tone(0.3), tone(0.2)], [("Hello", 0, 4800), ("world.", 4800, 12000)])
    assert not [g for g in got if isinstance(g, bytes)], "no binary frame"
    msgs = [g for g in got if isinstance(g, dict)]
    assert [m["type"] for m in msgs][0] == "audio.start"
    assert msgs[0] == {
        "type": "audio.start",
        "utterance_index": 0,
        "sentence_index": 0,
        "sentence_text": "Hello world.",
        "format": "pcm",
        "sample_rate": RATE,
        "word_timestamps": True,
    }
    chunks = [m for m in msgs if m["type"] == "audio.chunk"]
    assert [m["type"] for m in msgs] == [
        "audio.start",
        *["audio.chunk"] * len(chunks),
        "audio.done",
        "session.done",
    ]
    assert all(list(c) == CHUNK_FIELDS for c in chunks)
    audio, last = chunks[:-1], chunks[-1]
    assert [c["chunk_id"] for c in chunks] == list(range(len(chunks)))
    assert all(c["timestamps"] is None and c["sample_rate"] == RATE for c in audio)
    pcm = b"".join(base64.b64decode(str(c["audio_b64"])) for c in audio)
    assert len(pcm) == 2 * int(0.5 * RATE)
    assert np.abs(np.frombuffer(pcm, "<i2")).max() > 10000  # the tone, not silence
    # Sentence-relative integer ms, each chunk where the previous one ended, computed as vllm-omni does.
    assert audio[0]["chunk_start_ms"] == 0
    assert all(a["chunk_end_ms"] == b["chunk_start_ms"] for a, b in zip(audio, audio[1:], strict=False))
    assert audio[-1]["chunk_end_ms"] == 500
    assert last == {
        "type": "audio.chunk",
        "utterance_index": 0,
        "sentence_index": 0,
        "chunk_id": len(audio),
        "chunk_start_ms": 0,
        "chunk_end_ms": 500,
        "sample_rate": RATE,
        "audio_b64": "",
        "timestamps": [
            {"word": "Hello", "start_ms": 0, "end_ms": 200},
            {"word": "world.", "start_ms": 200, "end_ms": 500},
        ],
    }
    assert msgs[-2] == {
        "type": "audio.done",
        "utterance_index": 0,
        "sentence_index": 0,
        "total_bytes": len(pcm),
        "error": False,
    }


def test_word_times_of_a_later_segment_count_from_its_own_start() -> None:
    d = Driver({**WORDS_CONFIG, "split_granularity": "sentence", "eager_first_segment": False})
    d.text('{"type": "input.text", "text": "One. Two."}')
    d.text('{"type": "input.done"}')
    d.pump()
    for s, word in enumerate(("One.", "Two.")):
        d.core.segment_started(0, s)
        d.core.audio(0, s, tone(0.25), RATE, [(word, 2400, 6000)])
        d.core.segment_done(0, s, synthesis_s=0.1)
    msgs = [json.loads(p) for p in d.pump() if isinstance(p, str)]
    trailing = [m for m in msgs if m["type"] == "audio.chunk" and m["audio_b64"] == ""]
    assert [t["timestamps"] for t in trailing] == [
        [{"word": w, "start_ms": 100, "end_ms": 250}] for w in ("One.", "Two.")
    ]
    assert [t["chunk_end_ms"] for t in trailing] == [250, 250]
    starts = [m for m in msgs if m["type"] == "audio.chunk" and m["audio_b64"]]
    assert starts[0]["chunk_start_ms"] == 0 and starts[0]["sentence_index"] == 0
    assert [m["chunk_id"] for m in msgs if m["type"] == "audio.chunk" and m["sentence_index"] == 1][0] == 0


def test_a_segment_without_words_ends_with_null_timestamps() -> None:
    d = Driver(WORDS_CONFIG)
    got = d.speak("Hmm.", [tone(0.1)])  # the aligner timed no word of it
    trailing = [g for g in got if isinstance(g, dict) and g["type"] == "audio.chunk"][-1]
    assert trailing["audio_b64"] == "" and trailing["timestamps"] is None


def test_a_failure_after_audio_sends_the_error_with_partial_audio_before_audio_done() -> None:
    d = Driver({"stream_audio": True, "response_format": "pcm"})
    failure = ProtocolError(ErrorCode.ENGINE_ERROR, "engine failed")
    got = d.speak("Hello world.", [tone(0.2)], error=failure)
    msgs = [g for g in got if isinstance(g, dict)]
    assert [m["type"] for m in msgs] == ["audio.start", "error", "audio.done", "session.done"]
    assert msgs[1] == {
        "type": "error",
        "message": "engine failed",
        "partial_audio": True,
        "action": "discard",
    }
    assert msgs[2]["error"] is True and msgs[2]["total_bytes"] == 2 * int(0.2 * RATE)


def test_a_failure_before_any_audio_has_no_partial_audio() -> None:
    d = Driver(WORDS_CONFIG)
    got = d.speak("Hello world.", [], error=ProtocolError(ErrorCode.ENGINE_ERROR, "engine failed"))
    msgs = [g for g in got if isinstance(g, dict)]
    # No trailing words chunk for a failed sentence, as vllm-omni.
    assert [m["type"] for m in msgs] == ["audio.start", "error", "audio.done", "session.done"]
    assert msgs[1] == {"type": "error", "message": "engine failed"}


def test_voxgate_v1_keeps_binary_audio_and_its_error_after_audio_done() -> None:
    d = Driver(WORDS_CONFIG, extensions=True)
    got = d.speak(
        "Hello world.", [tone(0.2)], [("Hello", 0, 2400)], ProtocolError(ErrorCode.ENGINE_ERROR, "x")
    )
    assert any(isinstance(g, bytes) for g in got)
    msgs = [g for g in got if isinstance(g, dict)]
    assert [m["type"] for m in msgs] == ["audio.start", "audio.chunk", "audio.done", "error", "session.done"]
    assert msgs[0]["word_timestamps"] is True and msgs[0]["channels"] == 1
    assert msgs[1]["audio_b64"] == "" and "partial_audio" not in msgs[3]


def test_without_word_timestamps_audio_stays_binary_and_audio_start_has_no_channels() -> None:
    d = Driver({"stream_audio": True, "response_format": "pcm"})
    got = d.speak("Hello.", [tone(0.1)])
    assert isinstance(got[1], bytes)
    assert got[0] == {
        "type": "audio.start",
        "utterance_index": 0,
        "sentence_index": 0,
        "sentence_text": "Hello.",
        "format": "pcm",
        "sample_rate": RATE,
    }


def test_frame_headers_or_a_whole_file_keep_binary_audio_with_words_before_it() -> None:
    for config in (
        {**WORDS_CONFIG, "frame_header": True},
        {"word_timestamps": True, "response_format": "wav"},
    ):
        d = Driver(config)
        got = d.speak("Hello.", [tone(0.1)], [("Hello.", 0, 2400)])
        kinds = ["<audio>" if isinstance(g, bytes) else g["type"] for g in got]
        assert kinds[:3] == ["audio.start", "audio.chunk", "<audio>"], kinds
        assert isinstance(got[0], dict) and got[0]["word_timestamps"] is True


def test_a_held_audio_done_goes_out_before_anything_but_its_error() -> None:
    codec = SessionCodec(extensions=False)
    done = AudioDone(utterance_index=3, sentence_index=0, total_bytes=0, error=True)
    assert codec.encode(Message(done)) == []
    other = Error(message="refused", utterance_index=None)
    out = codec.encode(Message(other))
    assert [json.loads(p)["type"] for p in out if isinstance(p, str)] == ["audio.done", "error"]
    assert codec.encode(Audio(b"\x00\x00", 4, 0, 0.0)) == [b"\x00\x00"]
    # A cancel forgets what is held.
    assert codec.encode(Message(done)) == []
    codec.dropped()
    assert codec.encode(Message(Error(message="later", utterance_index=3))) == [
        '{"type":"error","message":"later"}'
    ]


def test_the_config_word_timestamps_reaches_the_output_format() -> None:
    config = msgspec.json.decode(b'{"type":"session.config","word_timestamps":true}', type=SessionConfig)
    assert OutputFormat.of(config, RATE).word_timestamps is True
