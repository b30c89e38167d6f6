"""The Session state machine: JSON messages in, events (or a ProtocolError) out."""

from __future__ import annotations

import json

import msgspec
import pytest
from voxgate.protocol.codecs.openai import speakable
from voxgate.protocol.codecs.stream import sends
from voxgate.protocol.errors import CloseCode, ErrorCode, ProtocolError
from voxgate.protocol.events import (
    CloseRequested,
    Committed,
    ConfigAccepted,
    Event,
    SegmentReady,
    UtteranceCancelled,
    UtteranceEnded,
    UtteranceStarted,
)
from voxgate.protocol.messages import (
    ENGINE_OPTION_FIELDS,
    AudioCancelled,
    AudioDone,
    AudioStart,
    EffectiveConfig,
    Error,
    Limits,
    ServerMessage,
    SessionConfig,
    SessionDone,
    SessionReady,
    WordTimestamp,
    WordTimestamps,
)
from voxgate.protocol.session import MAX_CONFIG_BYTES, MAX_MESSAGE_BYTES, Session, State

CONFIG = '{"type": "session.config"}'
DONE = '{"type": "input.done"}'
CANCEL = '{"type": "input.cancel"}'
CLOSE = '{"type": "session.close"}'
CLIENT_TYPES = ["session.config", "input.text", "input.done", "input.commit", "input.cancel", "session.close"]


def message(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, **fields}, ensure_ascii=False)


def text(value: str) -> str:
    return message("input.text", text=value)


def minimal(kind: str) -> str:
    """The smallest valid message of ``kind``."""
    return text("Hi.") if kind == "input.text" else message(kind)


def configured(session: Session | None = None, **config: object) -> Session:
    """A session past its first ``session.config``, accepted by the (imaginary) engine."""
    session = session or Session()
    [event] = session.receive_text(message("session.config", **config))
    assert event == ConfigAccepted(msgspec.convert(config, SessionConfig))
    session.accept_config(event.config)
    return session


def refused(session: Session, data: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        session.receive_text(data)
    return info.value


def state(session: Session) -> State:
    """``session.state``, read through a call so that mypy does not keep it narrowed across messages."""
    return session.state


def feed(session: Session, *data: str) -> list[Event]:
    return [event for item in data for event in session.receive_text(item)]


# --- the first message ------------------------------------------------------------------------------
def test_config_is_accepted_first() -> None:
    session = Session()
    assert state(session) is State.AWAITING_CONFIG and not session.configured
    [event] = session.receive_text(
        message("session.config", voice="joe", sample_rate=16000, frame_header=True)
    )
    assert event == ConfigAccepted(SessionConfig(voice="joe", sample_rate=16000, frame_header=True))
    assert state(session) is State.READY
    assert not session.configured  # only accept_config adopts it, once the engine agreed
    session.accept_config(event.config)
    assert session.configured and session.config == event.config


@pytest.mark.parametrize("kind", ["input.text", "input.done", "input.cancel", "session.close"])
def test_first_message_must_be_config(kind: str) -> None:
    session = Session()
    error = refused(session, minimal(kind))
    assert (error.code, error.fatal, error.close_code) == (
        ErrorCode.CONFIG_REQUIRED,
        True,
        CloseCode.POLICY_VIOLATION,
    )
    assert kind in error.message
    assert state(session) is State.AWAITING_CONFIG


@pytest.mark.parametrize(
    ("data", "code", "field"),
    [
        (message("session.config", sample_rate=7000), ErrorCode.INVALID_MESSAGE, "$.sample_rate"),
        (message("session.config", speed=5), ErrorCode.INVALID_MESSAGE, "$.speed"),
        (message("session.config", response_format="vorbis"), ErrorCode.INVALID_MESSAGE, "$.response_format"),
        (
            message("session.config", speaker_embedding=[0.0] * 8193),
            ErrorCode.INVALID_MESSAGE,
            "$.speaker_embedding",
        ),
        ("{", ErrorCode.INVALID_JSON, None),
        ("[]", ErrorCode.NOT_AN_OBJECT, None),
        (message("session.start"), ErrorCode.UNKNOWN_TYPE, "$.type"),
    ],
)
def test_invalid_first_config_is_fatal(data: str, code: ErrorCode, field: str | None) -> None:
    session = Session()
    error = refused(session, data)
    assert (error.code, error.field, error.fatal) == (code, field, True)
    assert state(session) is State.AWAITING_CONFIG and session.config is None


def test_binary_before_config_is_fatal() -> None:
    with pytest.raises(ProtocolError) as info:
        Session().receive_bytes(b"\x00")
    assert (info.value.code, info.value.fatal) == (ErrorCode.BINARY_NOT_ACCEPTED, True)


# --- malformed messages after the config ------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "code", "close_code", "field"),
    [
        ("{not json", ErrorCode.INVALID_JSON, CloseCode.INVALID_DATA, None),
        ("", ErrorCode.INVALID_JSON, CloseCode.INVALID_DATA, None),
        ('{"type": "input.done"} {}', ErrorCode.INVALID_JSON, CloseCode.INVALID_DATA, None),
        # Each of these fails the typed decoder's schema before the malformed JSON that follows.
        ("[1, oops", ErrorCode.INVALID_JSON, CloseCode.INVALID_DATA, None),
        ('{"type": "nope", oops', ErrorCode.INVALID_JSON, CloseCode.INVALID_DATA, None),
        ('{"type": "input.text", "text": 1, oops', ErrorCode.INVALID_JSON, CloseCode.INVALID_DATA, None),
        ("[1, 2]", ErrorCode.NOT_AN_OBJECT, CloseCode.INVALID_DATA, None),
        ('"input.done"', ErrorCode.NOT_AN_OBJECT, CloseCode.INVALID_DATA, None),
        ("null", ErrorCode.NOT_AN_OBJECT, CloseCode.INVALID_DATA, None),
        (message("input.flush"), ErrorCode.UNKNOWN_TYPE, CloseCode.POLICY_VIOLATION, "$.type"),
        ('{"text": "hi"}', ErrorCode.UNKNOWN_TYPE, CloseCode.POLICY_VIOLATION, "$.type"),
        ('{"type": 5}', ErrorCode.UNKNOWN_TYPE, CloseCode.POLICY_VIOLATION, "$.type"),
        (message("input.text", text=5), ErrorCode.INVALID_MESSAGE, CloseCode.INVALID_DATA, "$.text"),
        (message("input.text"), ErrorCode.INVALID_MESSAGE, CloseCode.INVALID_DATA, "$.text"),
        (
            message("session.config", frame_ms="40"),
            ErrorCode.INVALID_MESSAGE,
            CloseCode.INVALID_DATA,
            "$.frame_ms",
        ),
        (message("session.config", seed=2**63), ErrorCode.INVALID_MESSAGE, CloseCode.INVALID_DATA, "$.seed"),
    ],
)
def test_malformed_message_is_refused_without_closing(
    data: str, code: ErrorCode, close_code: CloseCode, field: str | None
) -> None:
    session = configured()
    error = refused(session, data)
    assert (error.code, error.close_code, error.field, error.fatal) == (code, close_code, field, False)
    assert state(session) is State.READY


def test_each_failure_kind_has_its_own_code() -> None:
    session = configured(Session(max_message_bytes=100))
    errors = [
        refused(session, "{not json"),
        refused(session, "[]"),
        refused(session, message("input.flush")),
        refused(session, message("input.text", text=5)),  # a wrong type in two messages: both are
        refused(session, message("session.config", frame_ms="x")),  # invalid_message, told apart by field
        refused(session, text("x" * 100)),
    ]
    with pytest.raises(ProtocolError) as info:
        session.receive_bytes(b"RIFF")
    errors.append(info.value)
    codes = [error.code for error in errors]
    assert codes == [
        ErrorCode.INVALID_JSON,
        ErrorCode.NOT_AN_OBJECT,
        ErrorCode.UNKNOWN_TYPE,
        ErrorCode.INVALID_MESSAGE,
        ErrorCode.INVALID_MESSAGE,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.BINARY_NOT_ACCEPTED,
    ]
    assert errors[3].field != errors[4].field
    assert not any(error.fatal for error in errors)


def test_binary_message_is_refused() -> None:
    session = configured()
    with pytest.raises(ProtocolError, match="binary") as info:
        session.receive_bytes(b"\x00\x01")
    assert (info.value.code, info.value.fatal, info.value.close_code) == (
        ErrorCode.BINARY_NOT_ACCEPTED,
        False,
        CloseCode.POLICY_VIOLATION,
    )


def test_default_limits() -> None:
    session = Session()
    limits = session.limits
    assert (limits.max_config_bytes, limits.max_message_bytes) == (MAX_CONFIG_BYTES, MAX_MESSAGE_BYTES)
    assert (MAX_CONFIG_BYTES, MAX_MESSAGE_BYTES) == (4 * 1024 * 1024, 128 * 1024)


def test_oversized_message_is_refused() -> None:
    session = configured(Session(max_config_bytes=400, max_message_bytes=100))
    small = text("x" * 50)
    assert len(small) <= 100
    assert feed(session, small) == [UtteranceStarted(0)]
    wide = [text("é" * 40), text("語" * 30)]  # 2- and 3-byte UTF-8: the limit counts bytes, not characters
    assert all(len(data) <= 100 < len(data.encode()) for data in wide)
    for data in [text("x" * 100), *wide]:
        error = refused(session, data)
        assert (error.code, error.close_code, error.fatal) == (
            ErrorCode.MESSAGE_TOO_LARGE,
            CloseCode.MESSAGE_TOO_BIG,
            False,
        )
    assert state(session) is State.SPEAKING  # the utterance goes on


def test_config_has_its_own_larger_limit() -> None:
    session = configured(Session(max_config_bytes=400, max_message_bytes=100))
    config = message("session.config", instructions="x" * 300)
    assert 100 < len(config) <= 400
    assert feed(session, config) == [ConfigAccepted(SessionConfig(instructions="x" * 300))]
    error = refused(session, message("session.config", instructions="x" * 400))
    assert (error.code, error.close_code, error.fatal) == (
        ErrorCode.MESSAGE_TOO_LARGE,
        CloseCode.MESSAGE_TOO_BIG,
        False,
    )


def test_oversized_first_config_is_fatal() -> None:
    error = refused(Session(max_config_bytes=100), message("session.config", instructions="x" * 100))
    assert (error.code, error.fatal) == (ErrorCode.MESSAGE_TOO_LARGE, True)


# --- utterances ---------------------------------------------------------------------------------------
def test_token_stream_is_segmented_into_one_utterance() -> None:
    session = configured()
    assert feed(session, text("Hel")) == [UtteranceStarted(0)]
    assert state(session) is State.SPEAKING
    assert feed(session, text("lo."), text(" How")) == [SegmentReady(0, 0, "Hello.")]
    assert feed(session, text(" are you?")) == []
    assert feed(session, DONE) == [SegmentReady(0, 1, "How are you?"), UtteranceEnded(0, total_sentences=2)]
    assert state(session) is State.READY


def test_next_utterance_gets_the_next_index() -> None:
    session = configured()
    first = feed(session, text("Hello."), text(" How are you?"), DONE)
    second = feed(session, text("Fine."), text(" Thanks. "), text("Bye"), DONE)
    assert first == [
        UtteranceStarted(0),
        SegmentReady(0, 0, "Hello."),
        SegmentReady(0, 1, "How are you?"),
        UtteranceEnded(0, 2),
    ]
    assert second == [
        UtteranceStarted(1),
        SegmentReady(1, 0, "Fine."),
        SegmentReady(1, 1, "Thanks."),
        SegmentReady(1, 2, "Bye"),
        UtteranceEnded(1, 3),
    ]
    assert session.utterance_index == 2


def test_input_done_without_text_ends_an_empty_utterance() -> None:
    session = configured()
    assert feed(session, DONE) == [UtteranceEnded(0, 0)]
    assert state(session) is State.READY
    assert feed(session, text("Hi."), DONE) == [
        UtteranceStarted(1),
        SegmentReady(1, 0, "Hi."),
        UtteranceEnded(1, 1),
    ]


def test_refuse_new_lets_the_open_utterances_finish_and_refuses_the_next() -> None:
    """A drain: the utterances open go on to their end, in every context; none starts."""
    session = configured()
    feed(session, text("Hello"), message("input.text", text="Other", context_id="b"))
    session.refuse_new(ProtocolError(ErrorCode.SERVER_SHUTDOWN, "shutting down"))
    assert feed(session, text(" there."), DONE) == [SegmentReady(0, 0, "Hello there."), UtteranceEnded(0, 1)]
    for data in (text("Next."), DONE, message("input.text", text="New", context_id="c")):
        error = refused(session, data)
        assert error.code is ErrorCode.SERVER_SHUTDOWN and not error.fatal
    assert refused(session, message("input.done", context_id="c")).context_id == "c"
    assert feed(session, text("")) == []  # a keep-alive starts nothing, and is not refused
    assert feed(session, message("input.done", context_id="b"))[-1] == UtteranceEnded(1, 1, 1)


def test_empty_text_is_a_keep_alive() -> None:
    session = configured()
    assert feed(session, text("")) == []
    assert state(session) is State.READY  # no utterance opened
    assert feed(session, text("Hi"), text(""), text("")) == [UtteranceStarted(0)]
    assert state(session) is State.SPEAKING
    assert feed(session, DONE) == [SegmentReady(0, 0, "Hi"), UtteranceEnded(0, 1)]


def test_whitespace_only_utterance_has_no_segments() -> None:
    session = configured()
    assert feed(session, text("  "), DONE) == [UtteranceStarted(0), UtteranceEnded(0, 0)]


def test_config_during_an_utterance_is_refused() -> None:
    session = configured()
    feed(session, text("Hello"))
    error = refused(session, CONFIG)
    assert (error.code, error.fatal) == (ErrorCode.INVALID_STATE, False)
    assert "input.done" in error.message
    assert state(session) is State.SPEAKING
    assert feed(session, text(" world."), DONE) == [SegmentReady(0, 0, "Hello world."), UtteranceEnded(0, 1)]


def test_config_between_utterances_is_accepted() -> None:
    session = configured()
    feed(session, text("One."), DONE)
    [event] = feed(session, message("session.config", split_granularity="clause", eager_first_segment=False))
    assert event == ConfigAccepted(SessionConfig(split_granularity="clause", eager_first_segment=False))
    assert state(session) is State.READY
    session.accept_config(event.config)
    assert session.config == event.config
    # The new segmentation rules apply from the next utterance on.
    assert feed(session, text("Well, my friend, "), text("hello there"), DONE) == [
        UtteranceStarted(1),
        SegmentReady(1, 0, "Well, my friend,"),
        SegmentReady(1, 1, "hello there"),
        UtteranceEnded(1, 2),
    ]


def test_cancel_during_an_utterance_drops_its_text() -> None:
    session = configured()
    assert feed(session, text("Hello. Wor")) == [UtteranceStarted(0), SegmentReady(0, 0, "Hello.")]
    assert feed(session, CANCEL) == [UtteranceCancelled(0)]
    assert state(session) is State.READY
    assert feed(session, text("New"), DONE) == [
        UtteranceStarted(1),
        SegmentReady(1, 0, "New"),
        UtteranceEnded(1, 1),
    ]


def test_cancel_when_idle_names_no_utterance() -> None:
    session = configured()
    feed(session, text("Hi."), DONE)
    assert feed(session, CANCEL) == [UtteranceCancelled(None)]
    assert session.utterance_index == 1  # nothing was open, so no index is used up
    assert feed(session, text("Yo.")) == [UtteranceStarted(1)]


def test_close_during_an_utterance_flushes_it_first() -> None:
    session = configured()
    feed(session, text("Hello. How"))
    assert feed(session, text(" are you")) == []
    assert feed(session, CLOSE) == [SegmentReady(0, 1, "How are you"), UtteranceEnded(0, 2), CloseRequested()]
    assert state(session) is State.CLOSED


def test_close_when_idle() -> None:
    session = configured()
    assert feed(session, CLOSE) == [CloseRequested()]
    assert state(session) is State.CLOSED
    assert session.utterance_index == 0


@pytest.mark.parametrize("kind", CLIENT_TYPES)
def test_messages_after_close_are_refused(kind: str) -> None:
    session = configured()
    feed(session, CLOSE)
    error = refused(session, minimal(kind))
    assert (error.code, error.fatal) == (ErrorCode.INVALID_STATE, False)
    assert "after session.close" in error.message
    assert state(session) is State.CLOSED


# Every (state, message) pair: the state it moves to, or None where the message is refused.
TRANSITIONS: dict[State, dict[str, State | None]] = {
    State.AWAITING_CONFIG: {
        "session.config": State.READY,
        "input.text": None,
        "input.done": None,
        "input.commit": None,
        "input.cancel": None,
        "session.close": None,
    },
    State.READY: {
        "session.config": State.READY,
        "input.text": State.SPEAKING,
        "input.done": State.READY,
        "input.commit": State.READY,
        "input.cancel": State.READY,
        "session.close": State.CLOSED,
    },
    State.SPEAKING: {
        "session.config": None,
        "input.text": State.SPEAKING,
        "input.done": State.READY,
        "input.commit": State.SPEAKING,
        "input.cancel": State.READY,
        "session.close": State.CLOSED,
    },
    State.CLOSED: {kind: None for kind in CLIENT_TYPES},
}
SETUP: dict[State, list[str]] = {
    State.AWAITING_CONFIG: [],
    State.READY: [CONFIG],
    State.SPEAKING: [CONFIG, text("Hi")],
    State.CLOSED: [CONFIG, CLOSE],
}


@pytest.mark.parametrize(
    ("start", "kind"), [(start, kind) for start in TRANSITIONS for kind in CLIENT_TYPES], ids=str
)
def test_transition_table(start: State, kind: str) -> None:
    session = Session()
    feed(session, *SETUP[start])
    assert state(session) is start
    target = TRANSITIONS[start][kind]
    if target is None:
        with pytest.raises(ProtocolError):
            session.receive_text(minimal(kind))
        assert state(session) is start
    else:
        session.receive_text(minimal(kind))
        assert state(session) is target


# --- engine refusals --------------------------------------------------------------------------------
def test_rejected_first_config_is_fatal() -> None:
    session = Session()
    feed(session, message("session.config", voice="nobody"))
    error = ProtocolError(
        ErrorCode.VOICE_NOT_FOUND, "no voice 'nobody'", close_code=CloseCode.INVALID_DATA, field="$.voice"
    )
    assert session.reject_config(error) is error
    assert (error.fatal, error.close_code, error.field) == (True, CloseCode.POLICY_VIOLATION, "$.voice")
    assert state(session) is State.AWAITING_CONFIG and not session.configured


def test_rejected_later_config_keeps_the_previous_one() -> None:
    session = configured(voice="joe")
    previous = session.config
    feed(session, message("session.config", voice="nobody"))
    error = ProtocolError(ErrorCode.VOICE_NOT_FOUND, "no voice 'nobody'", field="$.voice")
    assert session.reject_config(error) is error
    assert (error.fatal, error.close_code) == (False, CloseCode.POLICY_VIOLATION)
    assert state(session) is State.READY and session.config is previous


# --- the config itself ------------------------------------------------------------------------------
def test_speaker_is_an_alias_of_voice() -> None:
    assert SessionConfig(voice="a", speaker="b").voice_name == "a"
    assert SessionConfig(speaker="b").voice_name == "b"
    assert SessionConfig().voice_name is None
    [event] = Session().receive_text(message("session.config", speaker="ryan"))
    assert isinstance(event, ConfigAccepted) and event.config.voice_name == "ryan"


def test_engine_options_list_only_what_is_set() -> None:
    assert SessionConfig().engine_options() == {}
    assert SessionConfig(speed=1.0, word_timestamps=False, voice="joe", frame_ms=20).engine_options() == {}
    # An explicit false is passed on (it may override an engine default); engines without the
    # feature accept it (engine.base.demands). ref_audio/ref_text become a voice reference instead.
    explicit = SessionConfig(x_vector_only_mode=False, non_streaming_mode=False, ref_audio="x", ref_text="y")
    assert explicit.engine_options() == {"x_vector_only_mode": False, "non_streaming_mode": False}
    config = SessionConfig(
        speed=1.5,
        seed=0,
        language="en",
        word_timestamps=True,
        x_vector_only_mode=False,
        speaker_embedding=[0.5],
        initial_codec_chunk_frames=0,
        response_format="wav",
        sample_rate=8000,
    )
    assert config.engine_options() == {
        "speed": 1.5,
        "seed": 0,  # set, even though falsy
        "language": "en",
        "word_timestamps": True,
        "x_vector_only_mode": False,
        "speaker_embedding": [0.5],
        "initial_codec_chunk_frames": 0,
    }


def test_engine_option_fields_are_config_fields() -> None:
    assert set(ENGINE_OPTION_FIELDS) <= set(SessionConfig.__struct_fields__)


# --- server messages --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("msg", "tag"),
    [
        (SessionReady(), "session.ready"),
        (AudioStart(), "audio.start"),
        (AudioDone(), "audio.done"),
        (SessionDone(), "session.done"),
        (AudioCancelled(), "audio.cancelled"),
        (Error(), "error"),
    ],
)
def test_send_tags_each_server_message(msg: ServerMessage, tag: str) -> None:
    payload = Session().send(msg)
    assert isinstance(payload, str)
    assert json.loads(payload)["type"] == tag


def test_send_encodes_every_field() -> None:
    session = Session()
    assert json.loads(session.send(Error(code=ErrorCode.INVALID_JSON, message="bad", field="$.x"))) == {
        "type": "error",
        "code": "invalid_json",
        "message": "bad",
        "fatal": False,
        "utterance_index": None,
        "field": "$.x",
    }
    assert json.loads(session.send(AudioCancelled(utterance_index=4))) == {
        "type": "audio.cancelled",
        "utterance_index": 4,
    }
    ready = SessionReady(
        session_id="s1", config=EffectiveConfig(voice="joe"), limits=Limits(max_message_bytes=9)
    )
    decoded = json.loads(session.send(ready))
    assert (decoded["type"], decoded["session_id"]) == ("session.ready", "s1")
    assert decoded["config"]["voice"] == "joe" and "type" not in decoded["config"]  # nested: no tag
    assert decoded["limits"]["max_message_bytes"] == 9


# --- leniency, dialects and vllm-omni's text input modes ---------------------------------------------


def test_unknown_fields_are_ignored_and_listed_back() -> None:
    session = Session()
    [event] = session.receive_text(message("session.config", voice="joe", voise="x", future={"a": 1}))
    assert isinstance(event, ConfigAccepted)
    assert event.config.voice == "joe" and event.ignored_fields == ("future", "voise")
    session.accept_config(event.config)
    assert feed(session, message("input.text", text="Hi there. ", lang="en"))[0] == UtteranceStarted(0)


def test_cancel_is_an_extension() -> None:
    session = configured(Session(extensions=False))
    error = refused(session, CANCEL)
    assert (error.code, error.field, error.fatal) == (ErrorCode.UNKNOWN_TYPE, "$.type", False)


@pytest.mark.parametrize(
    ("config", "granularity", "eager"),
    [
        ({}, "sentence", True),
        ({"text_input_mode": "buffered"}, "none", False),
        ({"text_input_mode": "commitment"}, "sentence", False),
        ({"streaming_mode": "token_level"}, "sentence", True),
        ({"streaming_mode": "sentence_commit"}, "none", False),
        ({"split_granularity": "none"}, "none", False),
        ({"split_granularity": "clause", "eager_first_segment": True}, "clause", True),
        ({"text_input_mode": "buffered", "split_granularity": "sentence"}, "sentence", False),
        ({"eager_first_segment": False}, "sentence", False),
    ],
)
def test_segmentation_follows_explicit_fields(
    config: dict[str, object], granularity: str, eager: bool
) -> None:
    assert msgspec.convert(config, SessionConfig).segmentation() == (granularity, eager)


def test_wav_without_stream_audio_is_one_file_per_segment() -> None:
    assert not msgspec.convert({"response_format": "wav"}, SessionConfig).streamed
    assert msgspec.convert({"response_format": "wav", "stream_audio": True}, SessionConfig).streamed
    assert msgspec.convert({"response_format": "pcm"}, SessionConfig).streamed


def test_commitment_mode_cuts_only_at_confirmed_sentence_ends() -> None:
    session = configured(text_input_mode="commitment")
    assert feed(session, text("The total is 2026")) == [UtteranceStarted(0)]
    assert feed(session, text(" dollars. ")) == [SegmentReady(0, 0, "The total is 2026 dollars.")]
    assert feed(session, text("Thank you"), DONE) == [SegmentReady(0, 1, "Thank you"), UtteranceEnded(0, 2)]


def test_commit_cuts_the_text_so_far() -> None:
    session = configured(streaming_mode="sentence_commit")
    events = feed(session, text("Hello there, this is"), message("input.commit", commit_id="c0"))
    assert events == [UtteranceStarted(0), SegmentReady(0, 0, "Hello there, this is"), Committed("c0", 0, 0)]
    assert feed(session, message("input.commit")) == [Committed(None, 0, None)]
    assert feed(session, text(" more."), DONE) == [SegmentReady(0, 1, "more."), UtteranceEnded(0, 2)]


def test_vllm_dialect_writes_vllm_omnis_field_sets() -> None:
    vllm, ours = Session(extensions=False), Session()
    start = AudioStart(
        utterance_index=1, sentence_index=2, sentence_text="Hi.", format="pcm", sample_rate=24000
    )
    assert json.loads(vllm.send(start)) == {
        "type": "audio.start",
        "utterance_index": 1,
        "sentence_index": 2,
        "sentence_text": "Hi.",
        "format": "pcm",
        "sample_rate": 24000,
    }
    assert "sample_rate" not in json.loads(vllm.send(start, streamed=False))
    done = AudioDone(utterance_index=1, sentence_index=2, total_bytes=10, synthesis_ms=3.0)
    assert json.loads(vllm.send(done)) == {
        "type": "audio.done",
        "utterance_index": 1,
        "sentence_index": 2,
        "total_bytes": 10,
        "error": False,
    }
    assert json.loads(vllm.send(SessionDone(utterance_index=1, total_sentences=3, audio_ms=5.0))) == {
        "type": "session.done",
        "utterance_index": 1,
        "total_sentences": 3,
    }
    assert json.loads(vllm.send(Error(code="engine_error", message="boom"))) == {
        "type": "error",
        "message": "boom",
    }
    assert "synthesis_ms" in json.loads(ours.send(done))
    assert not sends(SessionReady(), extensions=False) and sends(SessionReady(), extensions=True)
    assert not sends(AudioCancelled(), extensions=False) and sends(done, extensions=False)


def test_word_timestamps_go_to_both_dialects_in_vllm_omnis_alignment_chunk_shape() -> None:
    chunk = WordTimestamps(
        utterance_index=1,
        sentence_index=2,
        chunk_start_ms=100.0,
        chunk_end_ms=400.0,
        sample_rate=24000,
        timestamps=[WordTimestamp(word="$3.50", start_ms=150.0, end_ms=400.0)],
    )
    expected = {
        "type": "audio.chunk",
        "utterance_index": 1,
        "sentence_index": 2,
        "chunk_id": 0,
        "chunk_start_ms": 100.0,
        "chunk_end_ms": 400.0,
        "sample_rate": 24000,
        "audio_b64": "",
        "timestamps": [{"word": "$3.50", "start_ms": 150.0, "end_ms": 400.0}],
    }
    assert json.loads(Session(extensions=False).send(chunk)) == expected == json.loads(Session().send(chunk))
    assert sends(chunk, extensions=False) and sends(chunk, extensions=True)


@pytest.mark.parametrize(
    ("text", "expected"), [("...", False), ("?! --", False), ("Hi.", True), ("42", True)]
)
def test_speakable_text_has_a_letter_or_a_digit(text: str, expected: bool) -> None:
    assert speakable(text) is expected
