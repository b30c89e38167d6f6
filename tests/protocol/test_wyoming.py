"""The Wyoming codec and its framing: bytes in, events and session messages out, and back (no event loop)."""

from __future__ import annotations

import json

import pytest
from voxgate.protocol.codecs.wyoming import (
    Event,
    Framer,
    VoiceInfo,
    WyomingCodec,
    error_event,
    info,
    parse,
    pong,
    serialize,
)
from voxgate.protocol.errors import CloseCode, ErrorCode, ProtocolError
from voxgate.protocol.messages import (
    AudioDone,
    AudioStart,
    Error,
    InputDone,
    InputText,
    SessionConfig,
    SessionDone,
    SessionReady,
)
from voxgate.protocol.output import Audio, Message
from wyoming.event import Event as WyomingEvent
from wyoming.info import Info

MAX = 1000


def wire(type: str, data: dict[str, object] | None = None, payload: bytes = b"") -> bytes:
    """An event as the ``wyoming`` package writes it: header line, data, payload."""
    return serialize(Event(type, data or {}, payload))


def events(data: bytes) -> list[Event]:
    """Every event in ``data``, as the shell reads them."""
    return [parse(frame, MAX) for frame in Framer(MAX).feed(data)]


def refusal(frame: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        parse(frame, MAX)
    return caught.value


def config(voice: str | None = None) -> SessionConfig:
    return SessionConfig(voice=voice, response_format="pcm", sample_rate="native")


# -- framing -------------------------------------------------------------------------------------------------


def test_an_event_round_trips_through_its_bytes() -> None:
    event = Event("audio-chunk", {"rate": 22050, "width": 2, "channels": 1}, b"\x01\x00\x02\x00")
    data = serialize(event)
    assert data == (
        b'{"type":"audio-chunk","version":"1.7.0","data_length":37,"payload_length":4}\n'
        b'{"rate":22050,"width":2,"channels":1}\x01\x00\x02\x00'
    )
    assert events(data) == [event]
    assert serialize(Event("synthesize-stop", {})) == b'{"type":"synthesize-stop","version":"1.7.0"}\n'


def test_the_framer_waits_for_whole_events_however_the_bytes_come() -> None:
    data = (
        wire("synthesize", {"text": "Hello."}) + wire("describe") + wire("audio-chunk", {"rate": 1}, b"\n\n")
    )
    framer = Framer(MAX)
    frames = [frame for byte in data for frame in framer.feed(bytes([byte]))]
    assert [parse(f, MAX).type for f in frames] == ["synthesize", "describe", "audio-chunk"]
    assert parse(frames[2], MAX).payload == b"\n\n"
    assert Framer(MAX).feed(data) == frames  # all at once: the same events


def test_data_in_the_header_line_is_merged_under_the_data_section() -> None:
    header = {"type": "synthesize", "data": {"text": "old", "voice": {"name": "v"}}, "data_length": 15}
    (event,) = events(json.dumps(header).encode() + b"\n" + b'{"text": "new"}')
    assert event.data == {"text": "new", "voice": {"name": "v"}}
    (event,) = events(b'{"type": "synthesize", "data": {"text": "inline"}}\n')  # wyoming before 1.0
    assert event.data == {"text": "inline"}


def test_an_event_over_the_limit_is_left_out_and_the_next_one_is_read() -> None:
    big = wire("synthesize", {"text": "x" * MAX})
    framer = Framer(MAX)
    frames = framer.feed(big[:500]) + framer.feed(big[500:700]) + framer.feed(big[700:] + wire("describe"))
    assert len(frames) == 2 and parse(frames[1], MAX).type == "describe"
    error = refusal(frames[0])
    assert error.code == ErrorCode.MESSAGE_TOO_LARGE and not error.fatal
    assert f"exceeds {MAX}" in error.message


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", ErrorCode.INVALID_JSON),  # not Wyoming at all
        (b'["type"]\n', ErrorCode.INVALID_JSON),  # JSON, but not a header
        (b'{"type": "x", "payload_length": -1}\n', ErrorCode.INVALID_JSON),
        (b"x" * (MAX + 5), ErrorCode.MESSAGE_TOO_LARGE),  # no line end within the limit
    ],
)
def test_a_stream_whose_events_cannot_be_told_apart_is_lost(data: bytes, code: ErrorCode) -> None:
    framer = Framer(MAX)
    (frame,) = framer.feed(data)
    error = refusal(frame)
    assert error.code == code and error.fatal and error.close_code == CloseCode.POLICY_VIOLATION
    assert framer.feed(wire("describe")) == []  # nothing after it is read


def test_a_header_line_is_awaited_up_to_the_limit() -> None:
    framer = Framer(MAX)
    assert framer.feed(b"x" * (MAX - 1)) == []
    assert len(framer.feed(b"x")[0]) == MAX


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b'{"data": {}}\n', ErrorCode.INVALID_MESSAGE),  # no type
        (b'{"type": 5}\n', ErrorCode.INVALID_MESSAGE),
        (b'{"type": "synthesize", "data_length": 2}\n[]', ErrorCode.INVALID_MESSAGE),
        (b'{"type": "synthesize", "data_length": 2}\n{"', ErrorCode.INVALID_JSON),
    ],
)
def test_an_event_that_is_framed_but_invalid_is_refused_and_the_stream_goes_on(
    data: bytes, code: ErrorCode
) -> None:
    framer = Framer(MAX)
    (frame,) = framer.feed(data)
    error = refusal(frame)
    assert error.code == code and not error.fatal
    assert [parse(f, MAX).type for f in framer.feed(wire("describe"))] == ["describe"]


# -- requests in ---------------------------------------------------------------------------------------------


def test_a_one_shot_synthesize_is_a_config_then_its_text_as_one_utterance() -> None:
    codec = WyomingCodec(MAX)
    assert codec.opening() == []
    said = codec.decode(wire("synthesize", {"text": "Hello there.", "voice": {"name": "amy"}}))
    assert said == [config("amy"), InputText(text="Hello there."), InputDone()]
    assert codec.check(config("amy"), None) == config("amy")
    assert codec.adopt(config("amy")) is codec
    assert codec.adopt(config("amy")) is codec  # nothing waits for it: no harm
    # The voice in force: no config again; a language alone picks the default voice, as wyoming-piper does.
    assert codec.decode(wire("synthesize", {"text": "Again.", "voice": {"name": "amy"}})) == [
        InputText(text="Again."),
        InputDone(),
    ]
    assert codec.decode(wire("synthesize", {"text": "", "voice": {"language": "en_US"}})) == [
        config(None),
        InputDone(),
    ]
    assert codec.decode(wire("synthesize", {"text": "As text."}).decode()) == [
        config(None),  # the last config was never adopted: asked again
        InputText(text="As text."),
        InputDone(),
    ]


def test_a_stream_is_its_chunks_and_the_whole_text_sent_again_is_not_said_twice() -> None:
    codec = WyomingCodec(MAX)
    assert codec.decode(wire("synthesize-start", {"voice": {"name": "amy", "speaker": "0"}})) == [
        config("amy")
    ]
    codec.adopt(config("amy"))
    assert codec.decode(wire("synthesize-chunk", {"text": "Hello "})) == [InputText(text="Hello ")]
    assert codec.decode(wire("synthesize-chunk", {"text": ""})) == []
    assert codec.decode(wire("synthesize-chunk", {"text": "there."})) == [InputText(text="there.")]
    assert codec.decode(wire("synthesize", {"text": "Hello there.", "voice": {"name": "amy"}})) == []
    assert codec.decode(wire("synthesize-stop")) == [InputDone()]
    # A stream of no chunks: its synthesize is the text.
    assert codec.decode(wire("synthesize-start", {"voice": {"name": "amy"}})) == []
    assert codec.decode(wire("synthesize", {"text": "Whole."})) == [InputText(text="Whole.")]
    assert codec.decode(wire("synthesize-stop")) == [InputDone()]


def test_a_stream_whose_voice_was_refused_says_nothing() -> None:
    codec = WyomingCodec(MAX)
    codec.decode(wire("synthesize", {"text": "Hi."}))
    codec.adopt(config())
    assert codec.decode(wire("synthesize-start", {"voice": {"name": "nobody"}})) == [config("nobody")]
    # No adopt: the session refused the config (and said so); the old voice must not say this text.
    assert codec.decode(wire("synthesize-chunk", {"text": "Not me."})) == []
    assert codec.decode(wire("synthesize", {"text": "Not me."})) == []
    assert codec.decode(wire("synthesize-stop")) == [InputDone()]


@pytest.mark.parametrize(
    ("events_in", "code", "words"),
    [
        ([wire("synthesize-chunk", {"text": "x"})], ErrorCode.INVALID_STATE, "synthesize-start first"),
        ([wire("synthesize-stop")], ErrorCode.INVALID_STATE, "synthesize-start first"),
        (
            [wire("synthesize-start"), wire("synthesize-start")],
            ErrorCode.INVALID_STATE,
            "synthesize-stop first",
        ),
        ([wire("synthesize", {"text": 5})], ErrorCode.INVALID_MESSAGE, "invalid synthesize"),
        ([wire("synthesize-start", {"voice": "amy"})], ErrorCode.INVALID_MESSAGE, "$.voice"),
        ([b'{"type": "synthesize", "data_length": 1}\nx'], ErrorCode.INVALID_JSON, "not JSON"),
    ],
)
def test_bad_requests_are_refused_and_the_session_goes_on(
    events_in: list[bytes], code: ErrorCode, words: str
) -> None:
    codec = WyomingCodec(MAX)
    *before, last = events_in
    for event in before:
        codec.decode(event)
    with pytest.raises(ProtocolError) as caught:
        codec.decode(last)
    assert caught.value.code == code and not caught.value.fatal and words in caught.value.message


def test_events_that_are_not_requests_are_ignored() -> None:
    codec = WyomingCodec(MAX)
    for event in (wire("describe"), wire("ping"), wire("select-program", {"name": "x"}), wire("audio-stop")):
        assert codec.decode(event) == []


# -- audio and messages out ----------------------------------------------------------------------------------


def one_shot_then_stream() -> WyomingCodec:
    codec = WyomingCodec(MAX)
    codec.decode(wire("synthesize", {"text": "One. Two."}))
    codec.adopt(config())
    codec.decode(wire("synthesize-start"))
    return codec


def decoded(payloads: list[bytes | str]) -> list[Event]:
    return [parse(p, MAX) for p in payloads if isinstance(p, bytes)]


def test_a_one_shot_answer_is_one_audio_start_its_chunks_and_one_audio_stop() -> None:
    codec = one_shot_then_stream()
    out: list[Audio | Message] = [
        Message(AudioStart(utterance_index=0, sentence_index=0, sample_rate=22050)),
        Audio(b"\x01\x00", 0, 0, 0.1),
        Message(AudioDone(utterance_index=0, sentence_index=0)),
        Message(AudioStart(utterance_index=0, sentence_index=1, sample_rate=22050)),
        Audio(b"\x02\x00", 0, 1, 0.1),
        Message(AudioDone(utterance_index=0, sentence_index=1)),
        Message(SessionDone(utterance_index=0)),
    ]
    sent = [event for output in out for event in decoded(codec.encode(output))]
    fmt: dict[str, object] = {"rate": 22050, "width": 2, "channels": 1}
    assert sent == [
        Event("audio-start", fmt),
        Event("audio-chunk", fmt, b"\x01\x00"),
        Event("audio-chunk", fmt, b"\x02\x00"),
        Event("audio-stop", {}),
    ]


def test_a_streamed_answer_is_each_segment_as_it_comes_then_synthesize_stopped() -> None:
    codec = one_shot_then_stream()
    codec.encode(Message(SessionDone(utterance_index=0)))  # the one-shot request's (empty) answer
    out: list[Audio | Message] = [
        Message(AudioStart(utterance_index=1, sentence_index=0, sample_rate=16000)),
        Audio(b"\x01\x00", 1, 0, 0.1),
        Message(AudioDone(utterance_index=1, sentence_index=0)),
        Message(AudioStart(utterance_index=1, sentence_index=1, sample_rate=16000)),
        Message(AudioDone(utterance_index=1, sentence_index=1)),
        Message(SessionDone(utterance_index=1)),
    ]
    assert [e.type for output in out for e in decoded(codec.encode(output))] == [
        "audio-start",
        "audio-chunk",
        "audio-stop",
        "audio-start",
        "audio-stop",
        "synthesize-stopped",
    ]


@pytest.mark.parametrize(
    ("request_event", "last"), [("synthesize", "audio-stop"), ("synthesize-start", "synthesize-stopped")]
)
def test_the_answer_to_a_refused_voice_is_its_end_alone(request_event: str, last: str) -> None:
    codec = WyomingCodec(MAX)
    codec.decode(wire(request_event, {"text": "Hi.", "voice": {"name": "nobody"}}))  # never adopted
    out: list[Audio | Message] = [
        Message(AudioStart(utterance_index=0, sentence_index=0, sample_rate=16000)),
        Audio(b"\x01\x00", 0, 0, 0.1),
        Message(AudioDone(utterance_index=0, sentence_index=0)),
        Message(SessionDone(utterance_index=0)),
    ]
    assert [e.type for output in out for e in decoded(codec.encode(output))] == [last]


def test_errors_are_error_events_and_other_messages_have_no_counterpart() -> None:
    codec = WyomingCodec(MAX)
    error = Error(code="voice_not_found", message="no voice 'x'; voices: tone", fatal=True)
    assert decoded(codec.encode(Message(error))) == [
        Event("error", {"text": "no voice 'x'; voices: tone", "code": "voice_not_found"})
    ]
    assert codec.encode(Message(error)) == [error_event(error)]
    assert codec.encode(Message(SessionReady())) == []
    # An utterance no request accounts for (never, unless the session refused a request's end): one-shot.
    assert [e.type for e in decoded(codec.encode(Message(SessionDone(utterance_index=7))))] == ["audio-stop"]


def test_the_codec_has_no_cancel_and_no_close_code_of_its_own() -> None:
    codec = WyomingCodec(MAX)
    codec.dropped()
    assert codec.close(None) == (CloseCode.NORMAL, None)
    failure = ProtocolError(ErrorCode.IDLE_TIMEOUT, "idle", fatal=True)
    assert codec.close(failure) == (failure.close_code, None)


# -- the transport's own answers -----------------------------------------------------------------------------


def test_info_lists_one_streaming_tts_program_with_its_voices_as_wyoming_reads_it() -> None:
    voices = [
        VoiceInfo("joe", "piper", "en-US", "Joe, US English"),
        VoiceInfo("upstream-voice", "remote"),
    ]
    (event,) = events(info(voices, "1.2.3"))
    found = Info.from_event(WyomingEvent(event.type, event.data))
    assert found.asr == [] and found.wake == [] and len(found.tts) == 1
    program = found.tts[0]
    assert (program.name, program.version, program.installed) == ("voxgate", "1.2.3", True)
    assert program.supports_synthesize_streaming
    assert [(v.name, v.languages, v.description, v.attribution.name, v.speakers) for v in program.voices] == [
        ("joe", ["en_US"], "Joe, US English", "piper", None),
        ("upstream-voice", [], "upstream-voice", "remote", None),
    ]


def test_ping_is_answered_with_pong_and_its_text() -> None:
    assert events(pong(Event("ping", {"text": "hi"}))) == [Event("pong", {"text": "hi"})]
    assert events(pong(Event("ping", {}))) == [Event("pong", {})]
    assert events(pong(Event("ping", {"text": 5}))) == [Event("pong", {})]
