"""The socket codecs: wire messages in, what the core takes out; the core's outputs in, wire payloads out.

One golden exchange per codec: the session's own (vllm-omni and voxgate.v1), a phone carrier's framing
around it, and ElevenLabs'.
"""

from __future__ import annotations

import base64
import json

import pytest
from voxgate.protocol.codecs.base import Codec
from voxgate.protocol.codecs.elevenlabs import FIXED_CONTEXT, Params, Stream, VoiceSettings, session_config
from voxgate.protocol.codecs.elevenlabs_socket import ElevenLabsSocket
from voxgate.protocol.codecs.stream import SessionCodec
from voxgate.protocol.codecs.telephony import Telephony
from voxgate.protocol.errors import CloseCode, ErrorCode, ProtocolError
from voxgate.protocol.messages import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    ContextClosed,
    Error,
    InputCancel,
    InputText,
    PlaybackPosition,
    SessionClose,
    SessionConfig,
    SessionReady,
)
from voxgate.protocol.output import Audio, Message, OutputFormat

SID = "MZ0123456789abcdef0123456789abcdef"
SHUTDOWN = ProtocolError(ErrorCode.SERVER_SHUTDOWN, "the server is shutting down", fatal=True)
TIMEOUT = ProtocolError(ErrorCode.IDLE_TIMEOUT, "no message for 20 s", fatal=True)


def test_the_session_codec_passes_its_own_messages_and_renders_its_dialect() -> None:
    vllm, voxgate = SessionCodec(extensions=False), SessionCodec(extensions=True)
    assert vllm.opening() == [] and vllm.decode('{"type": "input.done"}') == ['{"type": "input.done"}']
    assert vllm.decode(b"\x00") == [b"\x00"]  # the session refuses it, in its own words
    assert vllm.encode(Audio(b"\x01\x02", 0, 0, 0.1)) == [b"\x01\x02"]
    start = AudioStart(sentence_text="Hi.", format="wav", sample_rate=24000)
    assert vllm.encode(Message(start, 0, streamed=False)) == [
        '{"type":"audio.start","utterance_index":0,"sentence_index":0,"sentence_text":"Hi.","format":"wav"}'
    ]
    (full,) = voxgate.encode(Message(start, 0, streamed=False))
    assert isinstance(full, str) and json.loads(full)["sample_rate"] == 24000
    assert vllm.close(None) == (1000, None) and vllm.close(SHUTDOWN) == (1001, "server_shutdown")
    config = SessionConfig(speed=1.5)
    assert vllm.check(config, None) is config and vllm.adopt(config) is vllm
    vllm.dropped()  # nothing to forget


def _telephony() -> Codec:
    inner = SessionCodec(extensions=True)
    config = inner.check(SessionConfig(framing="twilio", stream_sid=SID), None)
    assert config.response_format == "mulaw" and config.sample_rate == 8000
    codec = inner.adopt(config)
    assert isinstance(codec, Telephony) and codec.adopt(config) is codec
    return codec


def test_telephony_wraps_the_session_codec_in_the_carriers_messages() -> None:
    codec = _telephony()
    assert codec.opening() == []
    (media,) = codec.encode(Audio(b"\x01" * 160, 0, 0, 0.02))
    assert json.loads(media) == {
        "event": "media",
        "streamSid": SID,
        "media": {"payload": base64.b64encode(b"\x01" * 160).decode()},
    }
    codec.encode(Message(AudioStart(sentence_text="Hi."), 0))
    mark, done = codec.encode(Message(AudioDone(duration_ms=20.0), 0))
    assert json.loads(mark) == {"event": "mark", "streamSid": SID, "mark": {"name": "utt-0-seg-0"}}
    assert isinstance(done, str) and json.loads(done)["type"] == "audio.done"
    # In: a mark echoed is answered with the position heard; a clear cancels; the rest is the session's.
    echo = json.dumps({"event": "mark", "streamSid": SID, "mark": {"name": "utt-0-seg-0"}})
    (position,) = codec.decode(echo)
    assert isinstance(position, PlaybackPosition) and position.text == "Hi." and position.played_ms == 20.0
    assert codec.decode('{"event": "clear"}') == [InputCancel()]
    assert codec.decode('{"type": "input.done"}') == ['{"type": "input.done"}']
    assert codec.decode(b"\x00") == [b"\x00"]
    clear, cancelled = codec.encode(Message(AudioCancelled(utterance_index=0)))
    assert json.loads(clear) == {"event": "clear", "streamSid": SID}
    assert isinstance(cancelled, str) and json.loads(cancelled)["type"] == "audio.cancelled"
    codec.encode(Message(AudioStart(utterance_index=1, sentence_text="Bye."), 1))
    codec.encode(Message(AudioDone(utterance_index=1, duration_ms=20.0), 1))
    codec.dropped()  # a cancel: the mark still out will never mean "heard"
    assert codec.decode(echo.replace("utt-0", "utt-1")) == []
    assert codec.close(SHUTDOWN) == (1001, "server_shutdown")


def test_telephony_checks_later_configs_as_the_first_set_them() -> None:
    codec = _telephony()
    first = SessionConfig(framing="twilio", stream_sid=SID)
    with pytest.raises(ProtocolError) as changed:
        codec.check(SessionConfig(framing="telnyx"), first)
    assert changed.value.field == "$.framing"
    assert Telephony.of(SessionConfig(), SessionCodec(extensions=True)) is None


def _eleven(multi: bool = False) -> ElevenLabsSocket:
    return ElevenLabsSocket(Stream("joe", Params("pcm_16000"), multi=multi), max_message_bytes=72)


def test_elevenlabs_decodes_its_messages_into_the_sessions() -> None:
    codec = _eleven()
    assert codec.opening() == [session_config("joe", Params("pcm_16000"), whole_segments=False)]
    fast = session_config("joe", Params("pcm_16000"), VoiceSettings(speed=1.2), whole_segments=False)
    assert codec.decode('{"text": " ", "voice_settings": {"speed": 1.2}}')[0] == fast
    assert codec.decode(b'{"text": "Hi. "}') == [InputText(text="Hi. ", context_id=FIXED_CONTEXT)]
    assert codec.decode('{"text": ""}') == [SessionClose()]
    config = SessionConfig()
    assert codec.check(config, None) is config and codec.adopt(config) is codec
    codec.dropped()


def test_elevenlabs_refusals_are_fatal_only_for_what_is_not_its_wire() -> None:
    codec = _eleven(multi=True)
    with pytest.raises(ProtocolError) as bad:
        codec.decode("not json")
    assert bad.value.code is ErrorCode.INVALID_JSON and bad.value.fatal
    with pytest.raises(ProtocolError) as large:
        codec.decode(json.dumps({"text": "é" * 31}, ensure_ascii=False))  # 74 bytes in 43 characters
    assert large.value.code is ErrorCode.MESSAGE_TOO_LARGE and not large.value.fatal
    with pytest.raises(ProtocolError) as refused:  # a first message refused: the next is a first again
        codec.decode('{"text": " ", "context_id": "c1", "voice_settings": {"speed": 9}}')
    assert not refused.value.fatal and refused.value.context_id == "c1"
    assert isinstance(codec.decode('{"text": " ", "context_id": "c1"}')[0], SessionConfig)


def test_elevenlabs_encodes_audio_as_it_comes_and_the_alignment_once_it_is_known() -> None:
    codec = _eleven(multi=True)
    start = AudioStart(sentence_text="Hi.", sample_rate=16000, context_id="c1")
    assert codec.encode(Message(start, 0)) == []
    (audio,) = codec.encode(Audio(bytes(3200), 0, 0, 0.1))  # sent as it comes
    assert isinstance(audio, str)
    got = json.loads(audio)
    assert got["contextId"] == "c1" and base64.b64decode(got["audio"]) == bytes(3200)
    assert got["alignment"] is None  # no word timings: the characters wait for the segment's length
    (aligned,) = codec.encode(Message(AudioDone(duration_ms=100.0, context_id="c1"), 0))
    got = json.loads(aligned)
    assert got["audio"] == "" and got["alignment"]["chars"] == ["H", "i", ".", " "]
    (final,) = codec.encode(Message(ContextClosed(context_id="c1", context_number=1)))
    assert json.loads(final) == {"isFinal": True, "contextId": "c1"}
    assert codec.encode(Message(SessionReady(session_id="s"))) == []  # no counterpart
    (error,) = codec.encode(Message(Error(code="server_shutdown", message="bye", fatal=True)))
    assert json.loads(error) == {"message": "bye", "error": "server_shutdown", "code": 1001}


def test_elevenlabs_closes_with_its_own_codes() -> None:
    codec = _eleven()
    assert codec.close(None) == (CloseCode.NORMAL, None)
    assert codec.close(TIMEOUT) == (CloseCode.POLICY_VIOLATION, None)  # ElevenLabs' code for a timeout
    assert codec.close(SHUTDOWN) == (CloseCode.GOING_AWAY, None)


def test_an_output_format_is_the_one_its_config_asks_for() -> None:
    config = SessionConfig(response_format="mp3", frame_ms=20, stream_audio=False, bitrate=64000)
    assert OutputFormat.of(config, 44100) == OutputFormat("mp3", 44100, 20, False, False, 64000)
