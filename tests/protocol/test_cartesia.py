"""Cartesia's codec (``protocol.codecs.cartesia``) and what it shares with Deepgram's
(``protocol.codecs.vendor``), pure."""

from __future__ import annotations

import base64
import json
import struct
from collections import deque
from typing import Any

import pytest
from voxgate.protocol.codecs.cartesia import (
    CartesiaSocket,
    decode_request,
    error_payload,
    session_config,
    settings_of,
)
from voxgate.protocol.codecs.cartesia_rest import CartesiaSse
from voxgate.protocol.codecs.vendor import RawAudio, VoiceBook, alaw, wav_head
from voxgate.protocol.errors import CloseCode, ErrorCode, ProtocolError
from voxgate.protocol.messages import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    ContextClose,
    ContextClosed,
    ContextOpened,
    Error,
    InputCancel,
    InputCommit,
    InputDone,
    InputText,
    SessionConfig,
    SessionDone,
    WordTimestamp,
    WordTimestamps,
)
from voxgate.protocol.output import Audio, Message

KATIE = "f786b574-daa5-4673-aa0c-cbe3e8534c02"
BOOK = VoiceBook(("joe", "tone"), frozenset({"joe", "tone", KATIE}), frozenset({"", "joe", KATIE}))
FORMAT = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000}


def msg(**fields: Any) -> str:
    if "continue_" in fields:
        fields["continue"] = fields.pop("continue_")
    return json.dumps(fields)


def first(context: str = "c1", **fields: Any) -> str:
    """A context's first message as pipecat sends it."""
    base: dict[str, Any] = {
        "context_id": context,
        "model_id": "sonic-3",
        "voice": {"mode": "id", "id": KATIE},
        "output_format": FORMAT,
        "continue_": True,
    }
    return msg(**(base | fields))


def out(codec: CartesiaSocket, *items: Any) -> list[dict[str, Any]]:
    """What the codec writes for ``items`` (server messages, or Audio), as JSON."""
    payloads = []
    for item in items:
        output = item if isinstance(item, Audio) else Message(item)
        payloads += codec.encode(output)
    return [json.loads(p) for p in payloads]


def feed(codec: CartesiaSocket, data: str) -> list[Any]:
    """``codec.decode(data)``, each config in it taken by the session (the shell's ``adopt``)."""
    items = codec.decode(data)
    for item in items:
        if isinstance(item, SessionConfig):
            assert codec.adopt(item) is codec
    return items


def socket() -> CartesiaSocket:
    codec = CartesiaSocket(BOOK, 4096)
    (config,) = codec.opening()
    assert isinstance(config, SessionConfig) and config.voice is None and config.word_timestamps
    return codec


def test_first_message_configures_then_text_goes_to_its_context() -> None:
    codec = socket()
    config, text = feed(codec, first(transcript="Hello. ", add_timestamps=True))
    assert isinstance(config, SessionConfig)
    assert (config.voice, config.response_format, config.sample_rate) == (KATIE, "pcm", 16000)
    assert config.stream_audio and config.word_timestamps and config.language is None
    assert text == InputText(text="Hello. ", context_id="c1")
    # The same settings again: no second config; a flush ends the utterance with flush id 1.
    assert feed(codec, first(transcript="More.", flush=True)) == [
        InputText(text="More.", context_id="c1"),
        InputDone(context_id="c1"),
    ]
    # A second context with the same settings takes the session as it is.
    assert feed(codec, first("c2", transcript=" ", continue_=False)) == [
        InputText(text=" ", context_id="c2"),
        InputDone(context_id="c2"),
    ]


def test_max_buffer_delay_zero_speaks_each_transcript_at_once() -> None:
    codec = socket()
    items = feed(codec, first(transcript="One sentence.", max_buffer_delay_ms=0))
    assert items[1:] == [InputText(text="One sentence.", context_id="c1"), InputCommit(context_id="c1")]
    # Whitespace is kept, not committed on its own; the context's end closes it.
    assert feed(codec, first(transcript=" ", continue_=False, max_buffer_delay_ms=0)) == [
        InputText(text=" ", context_id="c1"),
        InputDone(context_id="c1"),
    ]


def test_other_settings_wait_for_contexts_with_text() -> None:
    codec = socket()
    feed(codec, first(transcript="Hello"))
    other = {"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 8000}
    with pytest.raises(ProtocolError) as refused:
        feed(codec, first("c2", transcript="Hi", output_format=other))
    assert refused.value.code == ErrorCode.INVALID_STATE and refused.value.context_id == "c2"
    assert not refused.value.fatal
    assert out(codec, Error.of(refused.value, None, "c2")) == [
        {
            "type": "error",
            "context_id": "c2",
            "done": True,
            "status_code": 409,
            "error": refused.value.message,
            "message": refused.value.message,
            "title": "invalid state",
            "error_code": "invalid_state",
        }
    ]
    feed(codec, first(flush=True))  # c1's text ended: c2 may reconfigure
    config, _ = feed(codec, first("c2", transcript="Hi", output_format=other, speed="fast"))
    assert isinstance(config, SessionConfig)
    assert (config.response_format, config.sample_rate, config.speed) == ("mulaw", 8000, 1.15)


def test_refusals_before_the_session_sees_them() -> None:
    codec = socket()
    cases: list[tuple[str, ErrorCode, str | None]] = [
        (first(voice="someone"), ErrorCode.VOICE_NOT_FOUND, "$.voice"),
        (first(voice={"mode": "embedding", "embedding": [0.1]}), ErrorCode.INVALID_MESSAGE, "$.voice.mode"),
        (
            first(output_format={"container": "wav"}),
            ErrorCode.UNSUPPORTED_FORMAT,
            "$.output_format.container",
        ),
        (
            first(output_format={"container": "raw", "encoding": "pcm_s24le"}),
            ErrorCode.UNSUPPORTED_FORMAT,
            "$.output_format.encoding",
        ),
        (
            first(output_format={"container": "raw", "sample_rate": 96000}),
            ErrorCode.UNSUPPORTED_RATE,
            "$.output_format.sample_rate",
        ),
        (first(speed="ludicrous"), ErrorCode.INVALID_MESSAGE, "$.speed"),
        (first(speed=9.0), ErrorCode.INVALID_MESSAGE, "$.speed"),
        (first(generation_config={"speed": 0.1}), ErrorCode.INVALID_MESSAGE, "$.generation_config.speed"),
        (msg(context_id="c1", transcript=3), ErrorCode.INVALID_MESSAGE, "$.transcript"),
        (msg(context_id="two words", transcript="Hi"), ErrorCode.INVALID_MESSAGE, "$.context_id"),
        ("{not json", ErrorCode.INVALID_JSON, None),
        ("x" * 5000, ErrorCode.MESSAGE_TOO_LARGE, None),
    ]
    for data, code, where in cases:
        with pytest.raises(ProtocolError) as refused:
            feed(codec, data)
        assert (refused.value.code, refused.value.field, refused.value.fatal) == (code, where, False), data
    with pytest.raises(ProtocolError) as unknown:
        feed(codec, first(voice="someone"))
    assert "'joe'" in unknown.value.message and "VOXGATE_VOICE_ALIASES" in unknown.value.message
    # Nothing was configured by the refused messages: the next good one still is a first one.
    assert isinstance(feed(codec, first(transcript="Hi"))[0], SessionConfig)


def test_voice_forms_and_speeds() -> None:
    for voice in ("joe", {"id": "joe"}, {"mode": "id", "id": "JOE"}):
        assert settings_of(decode_request(first(voice=voice)), BOOK).voice in ("joe", "JOE")
    pipecat_default = settings_of(decode_request(first(voice={"mode": "id", "id": None})), BOOK)
    assert pipecat_default.voice is None and pipecat_default.speed == 1.0
    assert settings_of(decode_request(first(speed=1.2)), BOOK).speed == 1.2
    assert (
        settings_of(decode_request(first(generation_config={"speed": 0.8}, speed="fast")), BOOK).speed == 0.8
    )
    no_format = settings_of(
        decode_request(msg(context_id="c", transcript="x", voice="joe", language="en")), BOOK
    )
    assert (no_format.fmt, no_format.sample_rate, no_format.language) == ("pcm", 24000, "en")
    rest = {"container": "mp3", "sample_rate": 44100, "bit_rate": 128000}
    mp3 = settings_of(decode_request(first(output_format=rest)), BOOK, rest=True)
    assert (mp3.fmt, mp3.bitrate, mp3.container) == ("mp3", 128000, "mp3")
    assert session_config(mp3, words=False).bitrate == 128000
    wav = settings_of(
        decode_request(first(output_format={"container": "wav", "encoding": "pcm_alaw"})), BOOK, rest=True
    )
    assert (wav.fmt, wav.to_alaw, wav.container) == ("mulaw", True, "wav")
    assert session_config(wav, words=False).bitrate is None


def test_cancel_drops_the_context_and_nothing_of_it_is_rendered() -> None:
    codec = socket()
    feed(codec, first(transcript="Hello. ", flush=True))
    assert feed(codec, msg(context_id="c1", cancel=True)) == [InputCancel(context_id="c1")]
    assert (
        out(
            codec,
            AudioCancelled(utterance_index=0, context_id="c1"),
            ContextClosed(context_id="c1", context_number=1, reason="cancelled"),
            SessionDone(utterance_index=0, context_id="c1"),
        )
        == []
    )
    # The id is free: the next message naming it is a first one (the same settings: no config).
    assert feed(codec, first(transcript="Again.")) == [InputText(text="Again.", context_id="c1")]


def speak_segment(
    codec: CartesiaSocket, utterance: int, start_ms: float, duration_ms: float, words: list[WordTimestamp]
) -> list[dict[str, Any]]:
    rate = 16000
    return out(
        codec,
        AudioStart(
            utterance_index=utterance,
            sample_rate=rate,
            start_sample=round(start_ms * rate / 1000),
            context_id="c1",
        ),
        WordTimestamps(utterance_index=utterance, timestamps=words, context_id="c1"),
        Audio(b"\x01\x00" * 4, utterance, 0, 0.0),
        AudioDone(utterance_index=utterance, duration_ms=duration_ms, context_id="c1"),
    )


def test_chunks_timestamps_flush_done_and_done_over_a_context() -> None:
    codec = socket()
    feed(codec, first(transcript="Hello there. ", add_timestamps=True, flush=True))
    feed(codec, first(transcript="Bye now.", continue_=False))
    hello = speak_segment(codec, 0, 0.0, 800.0, [WordTimestamp(word="Hello", start_ms=0, end_ms=400)])
    there = speak_segment(codec, 0, 800.0, 600.0, [WordTimestamp(word="there.", start_ms=800, end_ms=1300)])
    flushed = out(codec, SessionDone(utterance_index=0, context_id="c1"))
    bye = speak_segment(codec, 1, 0.0, 700.0, [WordTimestamp(word="Bye", start_ms=0, end_ms=300)])
    end = out(codec, SessionDone(utterance_index=1, context_id="c1"))
    # Its done went out: the session's context closes with the next message, which may reuse the id.
    assert feed(codec, first(transcript="New.")) == [
        ContextClose(context_id="c1"),
        InputText(text="New.", context_id="c1"),
    ]
    assert out(codec, ContextClosed(context_id="c1", context_number=1)) == []
    assert codec.contexts["c1"].ends == deque() and not codec.contexts["c1"].done
    chunk = hello[1]
    assert chunk == {
        "type": "chunk",
        "context_id": "c1",
        "data": base64.b64encode(b"\x01\x00" * 4).decode(),
        "done": False,
        "status_code": 206,
        "step_time": 0.0,
    }
    starts = [m["word_timestamps"]["start"][0] for m in (hello[0], there[0], bye[0])]
    assert starts == [0.0, 0.8, 1.4]  # the second utterance counts on from the first's end
    assert bye[0]["word_timestamps"] == {"words": ["Bye"], "start": [1.4], "end": [1.7]}
    assert flushed == [
        {
            "type": "flush_done",
            "context_id": "c1",
            "done": False,
            "flush_done": True,
            "flush_id": 1,
            "status_code": 206,
        }
    ]
    assert end == [{"type": "done", "context_id": "c1", "done": True, "status_code": 200}]


def test_timestamps_only_where_asked_and_messages_without_a_counterpart() -> None:
    codec = socket()
    feed(codec, first(transcript="Hi."))
    got = speak_segment(codec, 0, 0.0, 300.0, [WordTimestamp(word="Hi.", start_ms=0, end_ms=300)])
    assert [m["type"] for m in got] == ["chunk"]
    assert out(codec, ContextOpened(context_id="c1", context_number=1), SessionDone(context_id="c1")) == []
    # Audio whose context this codec never saw (the session's default one) carries no context id.
    stray = out(codec, AudioStart(sample_rate=16000), Audio(b"\x00\x00", 0, 0, 0.0))
    assert "context_id" not in stray[0]


def test_alaw_chunks_and_errors_of_the_socket() -> None:
    codec = socket()
    feed(
        codec,
        first(
            transcript="Hi.", output_format={"container": "raw", "encoding": "pcm_alaw", "sample_rate": 8000}
        ),
    )
    chunk = out(codec, AudioStart(sample_rate=8000, context_id="c1"), Audio(b"\xff\x00", 0, 0, 0.0))[0]
    assert base64.b64decode(chunk["data"]) == alaw(b"\xff\x00") == b"\xd5\x2a"
    # An error that names no context is about the context of the last message; a fatal one says done.
    failed = out(codec, Error(code="idle_timeout", message="idle", fatal=True))[0]
    assert (failed["context_id"], failed["done"], failed["status_code"]) == ("c1", True, 408)
    engine = out(codec, Error(code="upstream_said_no", message="no"))[0]
    assert (engine["done"], engine["status_code"]) == (False, 500)
    assert codec.close(None) == (1000, None)
    assert codec.close(ProtocolError(ErrorCode.IDLE_TIMEOUT, "idle", fatal=True)) == (CloseCode.TIMEOUT, None)
    assert codec.adopt(SessionConfig()) is codec and codec.check(SessionConfig(), None) == SessionConfig()
    codec.dropped()


def test_a_cancel_after_the_end_of_input_still_stops_the_audio() -> None:
    """pipecat ends a turn's context with ``continue: false`` and cancels it on a barge-in while its audio
    plays: the session's context stays open until its done, so the cancel reaches its utterances."""
    codec = socket()
    assert feed(codec, first(transcript="Hello there.", continue_=False))[-1] == InputDone(context_id="c1")
    assert feed(codec, msg(context_id="c1", cancel=True)) == [InputCancel(context_id="c1")]
    assert out(codec, AudioCancelled(utterance_index=0, context_id="c1"), SessionDone(context_id="c1")) == []
    assert "c1" not in codec.contexts


def test_more_input_before_the_done_goes_on_in_the_context() -> None:
    codec = socket()
    feed(codec, first(transcript="One.", continue_=False))
    # Sent before its done came: the same context again (its settings stay), its end is the last one.
    other = {"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 8000}
    assert feed(codec, first(transcript="Two.", continue_=False, output_format=other)) == [
        InputText(text="Two.", context_id="c1"),
        InputDone(context_id="c1"),
    ]
    assert out(codec, SessionDone(utterance_index=0, context_id="c1")) == [
        {"type": "done", "context_id": "c1", "done": True, "status_code": 200}
    ]
    # A refused message keeps the close that was due for the next one.
    with pytest.raises(ProtocolError):
        feed(codec, first("c2", voice="nobody"))
    assert feed(codec, first("c3"))[0] == ContextClose(context_id="c1")
    # A context whose done went out is not done again when its session context times out.
    assert out(codec, ContextClosed(context_id="c1", context_number=1, reason="idle_timeout")) == []
    assert out(codec, ContextClosed(context_id="c9", context_number=None)) == []


def test_a_flush_that_ends_the_input_says_both() -> None:
    codec = socket()
    feed(codec, first(transcript="All.", flush=True, continue_=False))
    kinds = [m["type"] for m in out(codec, SessionDone(utterance_index=0, context_id="c1"))]
    assert kinds == ["flush_done", "done"]
    assert feed(codec, first("c2", transcript="Next.")) == [
        ContextClose(context_id="c1"),
        InputText(text="Next.", context_id="c2"),
    ]
    assert out(codec, ContextClosed(context_id="c1", context_number=1)) == []
    assert list(codec.contexts) == ["c2"]


def test_a_context_closed_by_its_idle_timeout_is_a_new_one_next_time() -> None:
    codec = socket()
    feed(codec, first(transcript="Hello"))
    assert out(codec, ContextClosed(context_id="c1", context_number=1, reason="idle_timeout")) == [
        {"type": "done", "context_id": "c1", "done": True, "status_code": 200}
    ]
    other = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 22050}
    config, _ = feed(codec, first("c2", transcript="Hi", output_format=other))  # c1 holds no text now
    assert isinstance(config, SessionConfig) and config.sample_rate == 22050


def test_sse_body() -> None:
    body = CartesiaSse("ctx", to_alaw=True, words=True)
    assert body.media_type == "text/event-stream"
    chunk = body.audio(b"\xff", 0.1).decode()
    assert chunk.startswith("event: chunk\ndata: ") and chunk.endswith("\n\n")
    assert json.loads(chunk.split("data: ")[1])["data"] == base64.b64encode(b"\xd5").decode()
    timed = body.message(WordTimestamps(timestamps=[WordTimestamp(word="Hi", start_ms=0, end_ms=250)]))
    assert json.loads(timed.decode().split("data: ")[1])["word_timestamps"]["end"] == [0.25]
    assert body.message(WordTimestamps()) == b"" and body.message(AudioDone()) == b""
    assert json.loads(body.end(SessionDone()).decode().split("data: ")[1]) == {
        "type": "done",
        "context_id": "ctx",
        "done": True,
        "status_code": 200,
    }
    error = json.loads(body.error(ProtocolError(ErrorCode.ENGINE_ERROR, "boom")).decode().split("data: ")[1])
    assert (error["type"], error["error_code"], error["status_code"]) == ("error", "engine_error", 502)
    plain = CartesiaSse(None)
    assert "context_id" not in json.loads(plain.audio(b"\x00\x00", 0.1).decode().split("data: ")[1])
    assert json.loads(error_payload("request_too_large", "big", None))["status_code"] == 413


def test_raw_audio_body_and_wav_heads() -> None:
    body = RawAudio("audio/wav", to_alaw=True, head=wav_head("alaw", 8000))
    head = body.head()
    assert head[:4] == b"RIFF" and head[8:16] == b"WAVEfmt " and len(head) == 44
    tag, channels, rate, byte_rate, align, bits = struct.unpack("<HHIIHH", head[20:36])
    assert (tag, channels, rate, byte_rate, align, bits) == (6, 1, 8000, 8000, 1, 8)
    assert body.audio(b"\xff", 0.1) == b"\xd5"
    assert RawAudio("audio/pcm").audio(b"\x01\x02", 0.1) == b"\x01\x02"
    assert RawAudio("audio/pcm").head() == b""
    assert struct.unpack("<HHIIHH", wav_head("f32", 24000)[20:36]) == (3, 1, 24000, 96000, 4, 32)


def test_alaw_follows_mulaw_sample_for_sample() -> None:
    """Each μ-law byte becomes the A-law byte of the nearest level: decoded, the two agree within the
    coarser of their steps (ITU-T G.711's tables)."""

    def mulaw_value(byte: int) -> int:
        u = ~byte & 0xFF
        magnitude = (((u & 0x0F) << 3) + 0x84) << ((u >> 4) & 0x07)
        return 0x84 - magnitude if u & 0x80 else magnitude - 0x84

    def alaw_value(byte: int) -> int:
        a = byte ^ 0x55
        segment, value = (a & 0x70) >> 4, (a & 0x0F) << 4
        value = value + 8 if segment == 0 else (value + 0x108) << max(segment - 1, 0)
        return value if a & 0x80 else -value

    for byte in range(256):
        want, got = mulaw_value(byte), alaw_value(alaw(bytes([byte]))[0])
        assert abs(got - want) <= max(16, abs(want) // 8), (byte, want, got)
    assert alaw(bytes([0x00]))[0] == 0x2A and alaw(bytes([0x80]))[0] == 0xAA  # the loudest either way


def test_voice_book() -> None:
    BOOK.check(None, "$.voice")
    BOOK.check("Joe", "$.voice")
    assert BOOK.times_words(None) and BOOK.times_words("JOE") and not BOOK.times_words("tone")


def test_a_config_the_engines_refuse_cancels_its_context() -> None:
    """The engines refuse a context's settings (an option they cannot follow): the error is the context's
    and says done, nothing of its text goes out, the session cancels it at the next message, and the
    session's settings stay as they were."""
    codec = socket()
    other = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 22050}
    config, _ = codec.decode(first(transcript="Bonjour.", language="fr", output_format=other))  # not taken
    assert isinstance(config, SessionConfig) and config.language == "fr"
    (error,) = out(codec, Error(code="unsupported_option", message="English only", field="$.language"))
    assert (error["context_id"], error["done"], error["error_code"]) == ("c1", True, "unsupported_option")
    spoken_anyway = (AudioStart(sample_rate=24000, context_id="c1"), Audio(b"\x00\x00", 0, 0, 0.0))
    assert out(codec, *spoken_anyway, SessionDone(context_id="c1")) == []
    cancel, config, text = feed(codec, first("c2", transcript="Hi."))
    assert cancel == InputCancel(context_id="c1")
    assert isinstance(config, SessionConfig) and config.sample_rate == 16000  # the session was at 24 kHz
    assert text == InputText(text="Hi.", context_id="c2")
    assert out(codec, ContextClosed(context_id="c1", context_number=1, reason="cancelled")) == []
    chunk = out(codec, AudioStart(sample_rate=16000, context_id="c2"), Audio(b"\x00\x00", 1, 0, 0.0))
    assert chunk[0]["context_id"] == "c2"
