"""Carrier framing: audio and segment ends in, carrier JSON messages out; mark echoes in, positions out."""

from __future__ import annotations

import base64
import json
from typing import get_args

import pytest
from voxgate.protocol.codecs.telephony import CARRIERS, Framing, framed_config, mark_name
from voxgate.protocol.errors import ErrorCode, ProtocolError
from voxgate.protocol.messages import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    CarrierName,
    InputCancel,
    PlaybackPosition,
    SessionConfig,
    SessionDone,
)

SID = "MZ0123456789abcdef0123456789abcdef"


def twilio() -> Framing:
    framing = Framing.of(framed_config(SessionConfig(framing="twilio", stream_sid=SID), None))
    assert framing is not None
    return framing


def end_segment(framing: Framing, u: int, s: int, text: str, duration_ms: float) -> list[str]:
    """Render a segment's audio.start and audio.done as the writer does; returns the carrier messages."""
    assert framing.cues(AudioStart(utterance_index=u, sentence_index=s, sentence_text=text)) == []
    return framing.cues(AudioDone(utterance_index=u, sentence_index=s, duration_ms=duration_ms))


def test_the_table_has_an_entry_for_every_name_a_config_may_give() -> None:
    assert set(CARRIERS) == set(get_args(CarrierName))
    assert all(name == carrier.name for name, carrier in CARRIERS.items())
    assert CARRIERS["twilio"].frame_bytes == 160  # 20 ms of 8 kHz mu-law


def test_framing_forces_the_carrier_format_whatever_the_config_says() -> None:
    asked = SessionConfig(
        framing="twilio",
        stream_sid=SID,
        response_format="pcm",
        sample_rate=24000,
        frame_ms=40,
        frame_header=True,
    )
    config = framed_config(asked, None)
    assert (config.response_format, config.sample_rate, config.frame_ms) == ("mulaw", 8000, 20)
    assert config.frame_header is False and config.streamed is True
    assert config.stream_sid == SID and config.framing == "twilio"


def test_a_config_without_framing_is_left_as_it_is() -> None:
    config = SessionConfig(response_format="pcm")
    assert framed_config(config, None) is config
    assert framed_config(config, SessionConfig()) is config
    assert Framing.of(config) is None


def test_twilio_needs_the_stream_sid_and_telnyx_does_not() -> None:
    with pytest.raises(ProtocolError) as err:
        framed_config(SessionConfig(framing="twilio"), None)
    assert err.value.code is ErrorCode.INVALID_MESSAGE and err.value.field == "$.stream_sid"
    telnyx = Framing.of(framed_config(SessionConfig(framing="telnyx"), None))
    assert telnyx is not None
    assert json.loads(telnyx.media(b"\x00" * 160)) == {
        "event": "media",
        "media": {"payload": base64.b64encode(b"\x00" * 160).decode()},
    }


@pytest.mark.parametrize(
    "later",
    [
        SessionConfig(),
        SessionConfig(framing="telnyx", stream_sid=SID),
        SessionConfig(framing="twilio", stream_sid="MZ-another-call"),
    ],
)
def test_framing_cannot_change_after_the_first_config(later: SessionConfig) -> None:
    first = framed_config(SessionConfig(framing="twilio", stream_sid=SID), None)
    assert framed_config(SessionConfig(framing="twilio", stream_sid=SID, speed=1.5), first).speed == 1.5
    with pytest.raises(ProtocolError) as err:
        framed_config(later, first)
    assert err.value.code is ErrorCode.INVALID_MESSAGE and err.value.field == "$.framing"
    assert not err.value.fatal  # the session goes on with its framing


def test_audio_frames_become_media_messages_padded_to_20_ms() -> None:
    framing = twilio()
    full = bytes(range(160))
    assert json.loads(framing.media(full)) == {
        "event": "media",
        "streamSid": SID,
        "media": {"payload": base64.b64encode(full).decode()},
    }
    short = json.loads(framing.media(b"\x01\x02"))  # a segment's last frame
    assert base64.b64decode(short["media"]["payload"]) == b"\x01\x02" + b"\xff" * 158


def test_a_mark_goes_before_each_audio_done_and_a_clear_before_audio_cancelled() -> None:
    framing = twilio()
    assert framing.cues(AudioCancelled(utterance_index=None)) == []  # nothing was sent: nothing to clear
    framing.media(b"\xff" * 160)
    [mark] = end_segment(framing, 2, 1, "Hello there.", 720.0)
    assert json.loads(mark) == {"event": "mark", "streamSid": SID, "mark": {"name": "utt-2-seg-1"}}
    assert mark_name(2, 1) == "utt-2-seg-1"
    assert framing.cues(SessionDone(utterance_index=2)) == []
    # One clear for a cancel of two utterances: before the first audio.cancelled.
    assert [json.loads(m) for m in framing.cues(AudioCancelled(utterance_index=2))] == [
        {"event": "clear", "streamSid": SID}
    ]
    assert framing.cues(AudioCancelled(utterance_index=3)) == []
    framing.media(b"\xff" * 160)
    assert len(framing.cues(AudioCancelled(utterance_index=None))) == 1  # audio since: Twilio may play it


def test_mark_echoes_report_what_was_heard_in_order() -> None:
    framing = twilio()
    end_segment(framing, 0, 0, "Hello there.", 720.0)
    end_segment(framing, 0, 1, "How are you?", 500.5)
    echo = {"event": "mark", "sequenceNumber": "7", "streamSid": SID}
    first = framing.receive(json.dumps({**echo, "mark": {"name": "utt-0-seg-0"}}))
    second = framing.receive(json.dumps({**echo, "mark": {"name": "utt-0-seg-1"}}))
    assert first == [
        PlaybackPosition(
            mark="utt-0-seg-0",
            utterance_index=0,
            sentence_index=0,
            text="Hello there.",
            duration_ms=720.0,
            played_ms=720.0,
        )
    ]
    assert second is not None and isinstance(position := second[0], PlaybackPosition)
    assert position.text == "How are you?" and position.played_ms == 1220.5
    # Each mark reports once; a name never sent is ignored (the carrier echoes whatever it was given).
    assert framing.receive(json.dumps({**echo, "mark": {"name": "utt-0-seg-0"}})) == []
    assert framing.receive(json.dumps({**echo, "mark": {"name": "someone-else"}})) == []


def test_after_a_cancel_the_echoes_of_cleared_marks_do_not_count_as_heard() -> None:
    framing = twilio()
    end_segment(framing, 0, 0, "Hello there.", 720.0)
    framing.cues(AudioStart(utterance_index=0, sentence_index=1, sentence_text="Cut off."))
    framing.cleared()
    # Twilio echoes the marks a clear dropped: they were not played.
    assert framing.receive(json.dumps({"event": "mark", "mark": {"name": "utt-0-seg-0"}})) == []
    assert framing.played_ms == 0.0
    # A segment announced before the cancel and ended after it has lost its text.
    assert framing.cues(AudioDone(utterance_index=0, sentence_index=1)) != []
    [position] = framing.receive(json.dumps({"event": "mark", "mark": {"name": "utt-0-seg-1"}})) or []
    assert isinstance(position, PlaybackPosition) and position.text == ""


def test_a_relayed_clear_is_a_cancel() -> None:
    assert twilio().receive(json.dumps({"event": "clear", "streamSid": SID})) == [InputCancel()]
    assert twilio().receive(json.dumps({"event": "clear"})) == [InputCancel()]  # naming no stream


@pytest.mark.parametrize("event", ['{"event":"clear"', '{"event":"mark","mark":{"name":"utt-0-seg-0"}'])
def test_a_carrier_message_of_another_stream_is_refused_not_honoured(event: str) -> None:
    """A bridge that mixes up its calls must not cancel another call's speech, nor count its playback."""
    framing = twilio()
    end_segment(framing, 0, 0, "Hi.", 200.0)
    with pytest.raises(ProtocolError) as refused:
        framing.receive(event + ',"streamSid":"MZ-someone-else"}')
    assert refused.value.code is ErrorCode.INVALID_MESSAGE and refused.value.field == "$.streamSid"
    assert not refused.value.fatal
    assert framing.played_ms == 0.0
    # Telnyx names its stream in ``stream_id``; a session that was given none takes any stream's.
    telnyx = Framing.of(framed_config(SessionConfig(framing="telnyx", stream_sid="v3:abc"), None))
    assert telnyx is not None
    with pytest.raises(ProtocolError) as other:
        telnyx.receive('{"event":"clear","stream_id":"v3:other"}')
    assert other.value.field == "$.stream_id"
    assert telnyx.receive('{"event":"clear","stream_id":"v3:abc","streamSid":"ignored"}') == [InputCancel()]
    anonymous = Framing.of(framed_config(SessionConfig(framing="telnyx"), None))
    assert anonymous is not None and anonymous.receive('{"event":"clear","stream_id":"any"}') == [
        InputCancel()
    ]


@pytest.mark.parametrize(
    "data",
    [
        '{"type":"input.text","text":"an \\"event\\" is no key"}',  # no "event" key: not even decoded
        '{"type":"input.text","text":"x","event":"mark"}',  # voxgate's own message with an odd field
        '{"streamSid":"MZ","note":"event"}',  # the word, not the key... nor a carrier's event
        '{"event": 5}',  # not a carrier's shape
        '{"event":"mark",',  # malformed
        "[" * 100_000 + '"event"',  # nested too deeply
    ],
)
def test_messages_that_are_not_a_carriers_go_to_the_session(data: str) -> None:
    assert twilio().receive(data) is None


def test_other_carrier_events_and_nameless_marks_are_refused_by_name() -> None:
    framing = twilio()
    with pytest.raises(ProtocolError) as err:
        framing.receive(json.dumps({"event": "media", "media": {"payload": ""}}))
    assert err.value.code is ErrorCode.UNKNOWN_TYPE and err.value.field == "$.event"
    assert "'media'" in err.value.message
    with pytest.raises(ProtocolError) as err:
        framing.receive(json.dumps({"event": "mark"}))
    assert err.value.code is ErrorCode.INVALID_MESSAGE and err.value.field == "$.mark"
