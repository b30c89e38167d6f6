"""Contexts: several streams of utterances on one session (``context_id``), in the text side and the core."""

from __future__ import annotations

import json

import numpy as np
import pytest
from voxgate.protocol.audio import Samples
from voxgate.protocol.codecs.stream import render, sends
from voxgate.protocol.core import Core
from voxgate.protocol.errors import ErrorCode, ProtocolError
from voxgate.protocol.events import (
    CloseRequested,
    Committed,
    ConfigAccepted,
    ContextActive,
    ContextCancelled,
    ContextEnded,
    ContextStarted,
    Event,
    SegmentReady,
    UtteranceCancelled,
    UtteranceEnded,
    UtteranceStarted,
)
from voxgate.protocol.frames import CONTEXT_HEADER_BYTES, HEADER_BYTES, FrameHeader, split_frame
from voxgate.protocol.messages import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    ContextClosed,
    ContextOpened,
    Error,
    InputCommitted,
    SessionDone,
)
from voxgate.protocol.output import (
    Audio,
    Configure,
    Drop,
    Finish,
    Message,
    Output,
    OutputFormat,
    Report,
    Speak,
)
from voxgate.protocol.session import Session, State

from tests.protocol.test_core import unheard

RATE = 8000
PCM = OutputFormat("pcm", RATE, frame_ms=100, frame_header=True)


def msg(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, **fields})


def text(value: str, context: str | None = None) -> str:
    return msg("input.text", text=value, **({} if context is None else {"context_id": context}))


def done(context: str | None = None) -> str:
    return msg("input.done", **({} if context is None else {"context_id": context}))


def configured(session: Session | None = None, **config: object) -> Session:
    session = session or Session()
    [event] = session.receive_text(msg("session.config", **config))
    assert isinstance(event, ConfigAccepted)
    session.accept_config(event.config)
    return session


def feed(session: Session, *data: str) -> list[Event]:
    return [event for item in data for event in session.receive_text(item)]


def refused(session: Session, data: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        session.receive_text(data)
    return info.value


def state(session: Session) -> State:
    return session.state


# --- the text side ----------------------------------------------------------------------------------
def test_each_context_is_its_own_stream_of_utterances_with_session_wide_indices() -> None:
    session = configured()
    assert feed(session, text("Hello. Wor")) == [UtteranceStarted(0), SegmentReady(0, 0, "Hello.")]
    assert feed(session, text("Bonjour. Mon", "fr")) == [
        ContextStarted("fr", 1),
        UtteranceStarted(1, 1),
        SegmentReady(1, 0, "Bonjour."),
    ]
    # Each context has its own segmenter: the default's "Wor" and fr's "Mon" do not mix.
    assert feed(session, text("ld.", "fr"), done("fr")) == [
        ContextActive(1),
        ContextActive(1),
        SegmentReady(1, 1, "Monld."),
        UtteranceEnded(1, 2, 1),
    ]
    assert state(session) is State.SPEAKING  # the default context's utterance is still open
    assert feed(session, text("ld."), done()) == [SegmentReady(0, 1, "World."), UtteranceEnded(0, 2)]
    assert state(session) is State.READY
    assert feed(session, text("Encore.", "fr"), done("fr")) == [
        ContextActive(1),
        UtteranceStarted(2, 1),
        ContextActive(1),
        SegmentReady(2, 0, "Encore."),
        UtteranceEnded(2, 1, 1),
    ]


def test_a_context_opens_at_any_message_that_names_it_and_keepalives_restart_timers() -> None:
    session = configured()
    assert feed(session, text("", "a")) == [ContextStarted("a", 1)]
    assert feed(session, text("", "a")) == [ContextActive(1)]
    assert feed(session, msg("keepalive", context_id="b")) == [ContextStarted("b", 2)]
    assert feed(session, msg("keepalive", context_id="b")) == [ContextActive(2)]
    assert feed(session, msg("keepalive")) == [ContextActive(None)]
    assert feed(session, done("c")) == [ContextStarted("c", 3), UtteranceEnded(0, 0, 3)]
    assert feed(session, msg("input.commit", commit_id="x", context_id="d")) == [
        ContextStarted("d", 4),
        Committed("x", 1, None, 4),
    ]
    assert state(session) is State.READY


def test_a_commit_cuts_only_its_context() -> None:
    session = configured(split_granularity="none", eager_first_segment=False)
    feed(session, text("one two", "a"), text("three four"))
    assert feed(session, msg("input.commit", context_id="a")) == [
        ContextActive(1),
        SegmentReady(0, 0, "one two"),
        Committed(None, 0, 0, 1),
    ]
    assert session._segmenter.pending == "three four"


def test_the_context_cap_refuses_a_new_context_and_changes_nothing() -> None:
    session = configured(Session(max_contexts=1))
    feed(session, text("Hi", "a"))
    error = refused(session, text("Yo", "b"))
    assert (error.code, error.fatal, error.field, error.context_id) == (
        ErrorCode.TOO_MANY_CONTEXTS,
        False,
        "$.context_id",
        "b",
    )
    assert feed(session, done("a")) == [ContextActive(1), SegmentReady(0, 0, "Hi"), UtteranceEnded(0, 1, 1)]
    assert refused(session, msg("keepalive", context_id="b")).code is ErrorCode.TOO_MANY_CONTEXTS
    assert feed(session, text("Still fine.")) == [UtteranceStarted(1)]  # the default context is not counted
    assert feed(session, msg("context.close", context_id="a")) == [ContextEnded("a", 1)]
    assert feed(session, text("", "b")) == [ContextStarted("b", 2)]  # the slot is free again


def test_no_named_context_when_the_cap_is_zero() -> None:
    session = configured(Session(max_contexts=0))
    assert refused(session, text("Hi", "a")).code is ErrorCode.TOO_MANY_CONTEXTS
    assert feed(session, text("Hi")) == [UtteranceStarted(0)]


def test_the_backlog_counts_every_context_and_names_the_refused_one() -> None:
    session = configured(Session(max_pending_text_chars=10))
    feed(session, text("abcdef", "a"))
    error = refused(session, text("ghijk", "b"))
    assert (error.code, error.context_id) == (ErrorCode.TEXT_BACKLOG_FULL, "b")
    assert feed(session, text("", "b")) == [ContextStarted("b", 2)]  # refused text opened nothing: 2 is next


@pytest.mark.parametrize("bad", ["", "a" * 65, "has space", "é", 5])
def test_a_malformed_context_id_is_refused_by_field(bad: object) -> None:
    error = refused(configured(), msg("input.text", text="x", context_id=bad))
    assert (error.code, error.field, error.fatal) == (ErrorCode.INVALID_MESSAGE, "$.context_id", False)


def test_context_close_ends_the_open_utterance_and_frees_the_id() -> None:
    session = configured()
    feed(session, text("Hello. Wor", "a"))
    assert feed(session, msg("context.close", context_id="a")) == [
        SegmentReady(0, 1, "Wor"),
        UtteranceEnded(0, 2, 1),
        ContextEnded("a", 1),
    ]
    assert state(session) is State.READY
    assert feed(session, text("Again", "a")) == [ContextStarted("a", 2), UtteranceStarted(1, 2)]
    assert feed(session, msg("context.close", context_id="zz")) == [ContextEnded("zz", None)]
    assert refused(session, msg("context.close")).field == "$.context_id"  # the id is required


def test_cancel_of_one_context_leaves_the_others_open() -> None:
    session = configured()
    feed(session, text("Keep going", "a"), text("Stop here", "b"), text("Default"))
    assert feed(session, msg("input.cancel", context_id="b")) == [ContextCancelled("b", 2)]
    assert state(session) is State.SPEAKING
    assert feed(session, msg("input.cancel", context_id="b")) == [ContextCancelled("b", None)]
    assert feed(session, done("a"), done()) == [
        ContextActive(1),
        SegmentReady(0, 0, "Keep going"),
        UtteranceEnded(0, 1, 1),
        SegmentReady(2, 0, "Default"),
        UtteranceEnded(2, 1),
    ]


def test_cancel_without_a_context_cancels_and_closes_them_all() -> None:
    session = configured()
    feed(session, text("One", "a"), text("Two"))
    assert feed(session, msg("input.cancel")) == [UtteranceCancelled(0)]
    assert state(session) is State.READY
    assert session._segmenter.pending == ""
    assert feed(session, text("", "a")) == [ContextStarted("a", 2)]  # a closed: the id opens a new one


def test_session_close_ends_every_context_then_closes() -> None:
    session = configured()
    feed(session, text("Later", "b"), text("First"), text("", "c"))
    assert feed(session, msg("session.close")) == [
        SegmentReady(0, 0, "Later"),
        UtteranceEnded(0, 1, 1),
        SegmentReady(1, 0, "First"),
        UtteranceEnded(1, 1),
        ContextEnded("b", 1),
        ContextEnded("c", 2),
        CloseRequested(),
    ]
    assert state(session) is State.CLOSED


def test_config_waits_until_no_context_has_an_utterance_open() -> None:
    session = configured()
    feed(session, text("Open", "a"))
    assert refused(session, msg("session.config")).code is ErrorCode.INVALID_STATE
    feed(session, done("a"))
    [event] = feed(session, msg("session.config", split_granularity="clause"))
    assert isinstance(event, ConfigAccepted)
    session.accept_config(event.config)  # every context's segmenter follows the new config
    assert feed(session, text("Well, my friend, hi", "a"), done("a"))[2] == SegmentReady(
        1, 0, "Well, my friend,"
    )


def test_expire_closes_a_named_context_and_drops_its_text() -> None:
    session = configured()
    feed(session, text("Half a", "a"))
    assert session.expire(0) == [] and session.expire(9) == []  # the default never expires
    assert session.expire(1) == [ContextEnded("a", 1, "idle_timeout")]
    assert state(session) is State.READY
    assert feed(session, text("New", "a")) == [ContextStarted("a", 2), UtteranceStarted(1, 2)]


def test_eager_cuts_are_per_context() -> None:
    session = configured()
    feed(session, text("one two three four five six ", "a"))
    assert session.eager_pending and session.eager_pending_in(1) and not session.eager_pending_in(0)
    assert not session.eager_pending_in(7) and session.cut_early(7) == []
    assert session.cut_early(1) == [SegmentReady(0, 0, "one two three four")]


def test_vllm_omni_dialect_ignores_context_ids_and_refuses_the_new_types() -> None:
    session = configured(Session(extensions=False))
    assert feed(session, text("Hi", "a"), done("a")) == [
        UtteranceStarted(0),
        SegmentReady(0, 0, "Hi"),
        UtteranceEnded(0, 1),
    ]
    for kind in ("keepalive", "context.close"):
        error = refused(session, msg(kind, context_id="a"))
        assert error.code is ErrorCode.UNKNOWN_TYPE and kind in error.message


def test_new_types_need_a_config_first() -> None:
    error = refused(Session(), msg("keepalive"))
    assert error.code is ErrorCode.CONFIG_REQUIRED and error.fatal


# --- the core ---------------------------------------------------------------------------------------
def tone(seconds: float) -> Samples:
    return np.full(int(seconds * RATE), 0.25, dtype=np.float32)


def core_with(**session: object) -> Core:
    core = Core(PCM, Session(**session))  # type: ignore[arg-type]
    core.receive_text(msg("session.config", eager_first_segment=False), 0.0)
    (configure,) = core.data_to_send()
    assert isinstance(configure, Configure)
    core.accept_config(configure.config, PCM)
    return core


def messages(outputs: list[Output]) -> list[object]:
    return [o.msg for o in outputs if isinstance(o, Message)]


def play(core: Core, u: int, s: int, seconds: float = 0.1) -> list[Output]:
    """Synthesize a segment whole and write everything it queued; returns what was written."""
    core.segment_started(u, s)
    core.audio(u, s, tone(seconds), RATE)
    core.segment_done(u, s, synthesis_s=0.0)
    return written(core, 1.0)


def written(core: Core, now: float) -> list[Output]:
    out = [core.sending(o, now) for o in core.data_to_send()]
    return [o for o in out if o is not None]


def test_messages_and_frames_of_a_named_context_say_which_it_is() -> None:
    core = core_with()
    core.receive_text(text("Bonjour.", "fr"), 0.0)
    core.receive_text(done("fr"), 0.0)
    opened, speak = core.data_to_send()
    assert opened == Message(ContextOpened(context_id="fr", context_number=1))
    assert speak == Speak(0, 0, "Bonjour.")
    out = play(core, 0, 0)
    start, done_, session_done = messages(out)
    assert isinstance(start, AudioStart) and start.context_id == "fr"
    assert isinstance(done_, AudioDone) and done_.context_id == "fr"
    assert isinstance(session_done, SessionDone) and session_done.context_id == "fr"
    frame = next(o for o in out if isinstance(o, Audio))
    header, payload = split_frame(frame.data)
    assert header == FrameHeader(0, 0, 0, 0, 1) and header.size == CONTEXT_HEADER_BYTES
    assert frame.data[:4] == b"VGC1" and len(payload) == len(frame.data) - 28
    # The default context's messages and frames are unchanged: no context_id key, the 24-byte header.
    core.receive_text(text("Hi."), 2.0)
    core.receive_text(done(), 2.0)
    core.data_to_send()
    out = play(core, 1, 0)
    assert "context_id" not in json.loads(render(messages(out)[0], extensions=True))  # type: ignore[arg-type]
    frame = next(o for o in out if isinstance(o, Audio))
    assert frame.data[:4] == b"VGA1" and FrameHeader.parse(frame.data).size == HEADER_BYTES


def test_a_long_utterance_in_one_context_does_not_hold_back_another_context_s_session_done() -> None:
    core = core_with()
    core.receive_text(text("Long one. Still going."), 0.0)  # default: utterance 0, left open
    core.receive_text(text("Short.", "b"), 0.0)
    core.receive_text(done("b"), 0.0)
    core.data_to_send()
    play(core, 0, 0)
    out = play(core, 1, 0)
    assert [type(m).__name__ for m in messages(out)] == ["AudioStart", "AudioDone", "SessionDone"]
    assert core.in_flight == (0,)


def test_cancelling_one_context_drops_only_its_utterances() -> None:
    core = core_with()
    core.receive_text(text("Stays. Here.", "a"), 0.0)
    core.receive_text(text("Goes. Away.", "b"), 0.0)
    core.receive_text(done("a"), 0.0)
    core.receive_text(done("b"), 0.0)
    core.data_to_send()
    core.segment_started(1, 0)
    core.audio(1, 0, tone(0.1), RATE)
    core.data_to_send()
    core.receive_text(msg("input.cancel", context_id="b"), 1.0)
    assert core.data_to_send() == [
        Drop((1,)),
        Message(unheard(1, "Goes. Away.", "b")),
        Message(ContextClosed(context_id="b", context_number=2, reason="cancelled")),
    ]
    core.segment_done(1, 0, synthesis_s=0.0)  # the cancelled segment's engine work ends: nothing comes of it
    assert core.data_to_send() == []
    play(core, 0, 0)
    out = play(core, 0, 1)
    assert isinstance(messages(out)[-1], SessionDone) and core.in_flight == ()
    # A context that is not open is confirmed all the same, with nothing to close.
    core.receive_text(msg("input.cancel", context_id="b"), 2.0)
    assert core.data_to_send() == [Drop(()), Message(AudioCancelled(utterance_index=None, context_id="b"))]


def test_cancel_without_a_context_confirms_each_utterance_with_its_context_and_closes_the_contexts() -> None:
    core = core_with()
    core.receive_text(text("Default"), 0.0)
    core.receive_text(text("Named", "a"), 0.0)
    core.data_to_send()
    core.receive_text(msg("input.cancel"), 1.0)
    assert core.data_to_send() == [
        Drop((0, 1)),
        Message(unheard(0, "Default")),
        Message(unheard(1, "Named", "a")),
        Message(ContextClosed(context_id="a", context_number=1, reason="cancelled")),
    ]


def test_a_graceful_close_reports_context_closed_after_the_last_session_done_and_finish_last() -> None:
    core = core_with()
    core.receive_text(text("Bye now.", "a"), 0.0)
    core.receive_text(msg("context.close", context_id="a"), 0.0)
    core.receive_text(msg("context.close", context_id="nobody"), 0.0)
    core.receive_text(text("", "b"), 0.0)
    core.receive_text(msg("session.close"), 0.0)
    out = core.data_to_send()
    closed = Message(ContextClosed(context_id="b", context_number=2))
    assert out[-1] == closed  # b had nothing in flight; a waits for its audio; no Finish yet
    assert Message(ContextClosed(context_id="nobody", context_number=None)) in out
    out = play(core, 0, 0)
    assert [type(m).__name__ for m in messages(out)] == [
        "AudioStart",
        "AudioDone",
        "SessionDone",
        "ContextClosed",
    ]
    assert out[-1] == Finish()


def test_an_idle_context_times_out_after_its_last_message_or_its_last_audio() -> None:
    core = core_with(context_idle_timeout_s=20.0)
    assert core.next_deadline() is None  # the default context never times out
    core.receive_text(text("Hello there. More", "a"), 10.0)
    core.data_to_send()
    assert core.next_deadline() == 30.0
    core.receive_text(msg("keepalive", context_id="a"), 15.0)
    assert core.next_deadline() == 35.0
    core.receive_text(msg("keepalive"), 16.0)  # a keepalive without context_id restarts them all
    assert core.next_deadline() == 36.0
    # Audio still being made at the deadline holds the context open; audio.done written pushes it back.
    core.tick(36.0)
    assert core.data_to_send() == [] and core.next_deadline() == 56.0
    core.segment_started(0, 0)
    core.segment_done(0, 0, synthesis_s=0.0)
    for output in core.data_to_send():
        core.sending(output, 50.0)
    assert core.next_deadline() == 70.0
    core.tick(69.9)
    assert core.data_to_send() == []
    core.tick(70.0)
    assert core.data_to_send() == [
        Drop((0,)),
        # its open utterance ends unspoken
        Message(unheard(0, "Hello there. More", "a")),
        Message(ContextClosed(context_id="a", context_number=1, reason="idle_timeout")),
    ]
    assert core.next_deadline() is None and core.session.state is State.READY


def test_an_idle_context_with_nothing_in_flight_just_closes() -> None:
    core = core_with(context_idle_timeout_s=1.0)
    core.receive_text(msg("keepalive", context_id="a"), 0.0)
    core.data_to_send()
    core.tick(5.0)
    assert core.data_to_send() == [
        Message(ContextClosed(context_id="a", context_number=1, reason="idle_timeout"))
    ]


def test_a_closing_context_does_not_time_out() -> None:
    core = core_with(context_idle_timeout_s=1.0)
    core.receive_text(text("Bye.", "a"), 0.0)
    core.receive_text(msg("context.close", context_id="a"), 0.0)
    core.data_to_send()
    assert core.next_deadline() is None


def test_commits_and_engine_errors_of_a_context_name_it() -> None:
    core = core_with()
    core.receive_text(text("Cut here", "a"), 0.0)
    core.receive_text(msg("input.commit", commit_id="k", context_id="a"), 0.0)
    out = core.data_to_send()
    assert Message(InputCommitted(commit_id="k", utterance_index=0, sentence_index=0, context_id="a")) in out
    core.segment_started(0, 0)
    core.segment_done(0, 0, synthesis_s=0.0, error=ProtocolError(ErrorCode.ENGINE_ERROR, "boom"))
    error = messages(core.data_to_send())[1]
    assert error == Error(code="engine_error", message="boom", utterance_index=0, context_id="a")
    assert core.sending(Report(0, 0), 1.0) is not None


def test_eager_first_segments_have_a_deadline_per_context() -> None:
    core = Core(PCM)
    core.receive_text(msg("session.config", max_buffer_delay_ms=200), 0.0)
    (configure,) = core.data_to_send()
    assert isinstance(configure, Configure)
    core.accept_config(configure.config, PCM)
    core.receive_text(text("Let me check that for you, it will ", "a"), 10.0)
    core.receive_text(text("one two three four five six ", "b"), 10.1)
    core.data_to_send()
    assert core.next_deadline() == pytest.approx(10.2)
    core.tick(10.2)
    assert [o.text for o in core.data_to_send() if isinstance(o, Speak)] == ["Let me check that for you,"]
    assert core.next_deadline() == pytest.approx(10.3)
    core.tick(10.3)
    assert [o.text for o in core.data_to_send() if isinstance(o, Speak)] == ["one two three four"]


def test_context_messages_are_voxgate_extensions() -> None:
    opened = ContextOpened(context_id="a", context_number=1)
    closed = ContextClosed(context_id="a", context_number=1, reason="idle_timeout")
    assert not sends(opened, extensions=False) and not sends(closed, extensions=False)
    assert json.loads(render(closed, extensions=True)) == {
        "type": "context.closed",
        "context_id": "a",
        "context_number": 1,
        "reason": "idle_timeout",
    }
    # vllm-omni's field sets never carry context_id.
    start = AudioStart(utterance_index=1, format="pcm", context_id="a")
    assert "context_id" not in json.loads(render(start, extensions=False))
    assert json.loads(render(AudioCancelled(utterance_index=2, context_id="a"), extensions=True)) == {
        "type": "audio.cancelled",
        "utterance_index": 2,
        "context_id": "a",
    }


def test_the_context_frame_header_golden_bytes() -> None:
    header = FrameHeader(1, 2, 3, 48000, 5)
    data = header.serialize()
    assert data == (
        b"VGC1"
        + b"\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00"
        + b"\x80\xbb"
        + b"\x00" * 6
        + b"\x05\x00\x00\x00"
    )
    assert FrameHeader.parse(data + b"pay") == header and bytes(split_frame(data + b"pay")[1]) == b"pay"
    with pytest.raises(ProtocolError, match="shorter than its header"):
        FrameHeader.parse(data[:24])  # a VGC1 frame cut at the VGA1 size
    with pytest.raises(ValueError, match="context_number"):
        FrameHeader(0, 0, 0, 0, 2**32).check()


def test_idle_contexts_close_in_the_order_their_time_ran_out_however_late_the_tick() -> None:
    core = core_with(context_idle_timeout_s=1.0)
    core.receive_text(msg("keepalive", context_id="a"), 0.0)
    core.receive_text(msg("keepalive", context_id="b"), 0.1)
    core.receive_text(msg("keepalive", context_id="a"), 0.2)
    core.data_to_send()
    core.tick(9.0)
    assert [m.context_id for m in messages(core.data_to_send()) if isinstance(m, ContextClosed)] == ["b", "a"]
