"""Deepgram Aura's codec (``protocol.codecs.deepgram``), pure: the query, the socket's messages, REST's
pieces."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from voxgate.protocol.codecs.deepgram import (
    DeepgramSocket,
    Params,
    decode_body,
    parse_params,
    rest_error,
    warning,
)
from voxgate.protocol.codecs.vendor import VoiceBook
from voxgate.protocol.errors import CloseCode, ErrorCode, ProtocolError
from voxgate.protocol.messages import (
    AudioCancelled,
    AudioDone,
    EffectiveConfig,
    Error,
    InputCancel,
    InputDone,
    InputText,
    ServerWarning,
    SessionClose,
    SessionConfig,
    SessionDone,
    SessionReady,
)
from voxgate.protocol.output import Audio, Message

BOOK = VoiceBook(("joe",), frozenset({"joe", "aura-2-thalia-en"}))


def socket(**query: str) -> DeepgramSocket:
    return DeepgramSocket(parse_params(query, BOOK, socket=True), 1024)


def out(codec: DeepgramSocket, *items: Any) -> list[Any]:
    """What the codec writes: JSON messages as dicts, audio as bytes."""
    written: list[Any] = []
    for item in items:
        for payload in codec.encode(item if isinstance(item, Audio) else Message(item)):
            written.append(payload if isinstance(payload, bytes) else json.loads(payload))
    return written


def test_query_defaults_socket_and_rest() -> None:
    ws = parse_params({}, BOOK, socket=True)
    assert (ws.model, ws.encoding, ws.sample_rate, ws.container, ws.fmt) == (
        None,
        "linear16",
        24000,
        "none",
        "pcm",
    )
    assert ws.media_type == "audio/pcm" and ws.head() == b""
    rest = parse_params({"mip_opt_out": "true"}, BOOK, socket=False)
    assert (rest.encoding, rest.sample_rate, rest.container, rest.media_type) == (
        "mp3",
        22050,
        "none",
        "audio/mpeg",
    )
    wav = parse_params({"encoding": "linear16", "model": "aura-2-thalia-en"}, BOOK, socket=False)
    assert (wav.container, wav.media_type, wav.model) == ("wav", "audio/wav", "aura-2-thalia-en")
    assert struct.unpack("<HHIIHH", wav.head()[20:36]) == (1, 1, 24000, 48000, 2, 16)
    alaw = parse_params({"encoding": "alaw", "container": "wav"}, BOOK, socket=False)
    assert (alaw.fmt, alaw.to_alaw, alaw.sample_rate) == ("mulaw", True, 8000)
    assert struct.unpack("<H", alaw.head()[20:22]) == (6,)
    raw_mulaw = parse_params(
        {"encoding": "mulaw", "container": "none", "sample_rate": "16000"}, BOOK, socket=False
    )
    assert (raw_mulaw.media_type, raw_mulaw.sample_rate, raw_mulaw.to_alaw) == ("audio/basic", 16000, False)
    raw_alaw = parse_params({"encoding": "alaw", "container": "none"}, BOOK, socket=True)
    assert raw_alaw.media_type == "audio/x-alaw-basic"
    opus = parse_params({"encoding": "opus", "container": "ogg", "bit_rate": "32000"}, BOOK, socket=False)
    assert (opus.media_type, opus.sample_rate, opus.bit_rate) == ("audio/ogg", 48000, 32000)
    assert opus.config().bitrate == 32000
    aac = parse_params({"encoding": "aac", "speed": "1.2"}, BOOK, socket=False)
    assert (aac.media_type, aac.sample_rate, aac.config().speed) == ("audio/aac", 22050, 1.2)
    assert parse_params({"encoding": "flac"}, BOOK, socket=False).media_type == "audio/flac"
    # A bit rate means nothing to 16-bit PCM: it is left out.
    assert parse_params({"bit_rate": "48000"}, BOOK, socket=True).config().bitrate is None
    config = ws.config()
    assert (config.voice, config.response_format, config.sample_rate, config.stream_audio) == (
        None,
        "pcm",
        24000,
        True,
    )


@pytest.mark.parametrize(
    ("query", "socket_", "code", "field"),
    [
        ({"model": "aura-luna-en"}, True, ErrorCode.VOICE_NOT_FOUND, "model"),
        ({"encoding": "mp3"}, True, ErrorCode.UNSUPPORTED_FORMAT, "encoding"),
        ({"encoding": "pcm"}, False, ErrorCode.UNSUPPORTED_FORMAT, "encoding"),
        ({"container": "wav"}, True, ErrorCode.UNSUPPORTED_FORMAT, "container"),
        ({"encoding": "mp3", "container": "wav"}, False, ErrorCode.UNSUPPORTED_FORMAT, "container"),
        ({"encoding": "opus", "container": "none"}, False, ErrorCode.UNSUPPORTED_FORMAT, "container"),
        ({"sample_rate": "4000"}, True, ErrorCode.UNSUPPORTED_RATE, "sample_rate"),
        ({"sample_rate": "fast"}, True, ErrorCode.INVALID_MESSAGE, "sample_rate"),
        ({"bit_rate": "9"}, False, ErrorCode.INVALID_MESSAGE, "bit_rate"),
        ({"speed": "9"}, True, ErrorCode.INVALID_MESSAGE, "speed"),
    ],
)
def test_query_refusals(query: dict[str, str], socket_: bool, code: ErrorCode, field: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse_params(query, BOOK, socket=socket_)
    assert (refused.value.code, refused.value.field) == (code, field)
    body = json.loads(rest_error(refused.value, "req-1"))
    assert body == {"err_code": code.upper(), "err_msg": refused.value.message, "request_id": "req-1"}


def test_messages_become_the_sessions() -> None:
    codec = socket(model="joe")
    assert codec.opening() == [
        SessionConfig(voice="joe", response_format="pcm", sample_rate=24000, stream_audio=True)
    ]
    assert codec.decode('{"type": "Speak", "text": "Hello. "}') == [InputText(text="Hello. ")]
    assert codec.decode('{"type": "Speak", "text": ""}') == []
    assert codec.decode('{"type": "Flush"}') == [InputDone()]
    assert codec.decode('{"type": "Clear"}') == [InputCancel()]
    assert codec.decode('{"type": "Close"}') == [SessionClose()]


@pytest.mark.parametrize(
    ("data", "code", "field"),
    [
        ('{"type": "Shout", "text": "hi"}', ErrorCode.UNKNOWN_TYPE, "$.type"),
        ('{"text": "hi"}', ErrorCode.UNKNOWN_TYPE, "$.type"),
        ('{"type": "Speak"}', ErrorCode.INVALID_MESSAGE, "$.text"),
        ('{"type": "Speak", "text": 3}', ErrorCode.INVALID_MESSAGE, "$.text"),
        ("{nope", ErrorCode.INVALID_JSON, None),
        (b"\x00\x01", ErrorCode.INVALID_MESSAGE, None),
        ("x" * 2000, ErrorCode.MESSAGE_TOO_LARGE, None),
    ],
)
def test_bad_messages_are_warnings_not_a_dropped_socket(
    data: str | bytes, code: ErrorCode, field: str | None
) -> None:
    codec = socket()
    with pytest.raises(ProtocolError) as refused:
        codec.decode(data)
    assert (refused.value.code, refused.value.field, refused.value.fatal) == (code, field, False)
    (shown,) = out(codec, Error.of(refused.value))
    assert shown == {
        "type": "Warning",
        "description": refused.value.message,
        "code": code,
        "warn_code": code,
        "warn_msg": refused.value.message,
    }


def test_metadata_audio_flushed_cleared() -> None:
    codec = socket(encoding="alaw", sample_rate="8000")
    ready = SessionReady(session_id="s1", config=EffectiveConfig(voice="joe", engine="piper"))
    assert out(codec, ready, ready) == [
        {
            "type": "Metadata",
            "request_id": "s1",
            "model_name": "joe",
            "model_version": "piper",
            "model_uuid": "s1",
        }
    ]
    assert out(codec, Audio(b"\xff\x00", 0, 0, 0.0)) == [b"\xd5\x2a"]  # μ-law made A-law
    codec.decode('{"type": "Speak", "text": "One."}')
    codec.decode('{"type": "Flush"}')
    codec.decode('{"type": "Flush"}')
    assert out(codec, AudioDone(), SessionDone(utterance_index=0)) == [{"type": "Flushed", "sequence_id": 0}]
    # A Clear cancels the second flush's utterance: no Flushed for it, one Cleared however many were cut.
    codec.decode('{"type": "Clear"}')
    assert out(codec, AudioCancelled(utterance_index=1), AudioCancelled(utterance_index=2)) == [
        {"type": "Cleared", "sequence_id": 1}
    ]
    assert out(codec, SessionDone(utterance_index=3)) == []
    assert out(codec, ServerWarning(code="option_ignored", message="no")) == [
        json.loads(warning("option_ignored", "no"))
    ]
    assert out(codec, Error(code="idle_timeout", message="idle", fatal=True)) == [
        {"type": "Error", "description": "idle", "err_code": "idle_timeout", "err_msg": "idle"}
    ]
    plain = socket()
    assert out(plain, Audio(b"\x01\x02", 0, 0, 0.0)) == [b"\x01\x02"]
    assert (
        out(plain, SessionReady(session_id="s2", config=EffectiveConfig(voice="joe")))[0]["model_name"]
        == "joe"
    )
    plain.decode('{"type": "Clear"}')
    assert out(plain, AudioCancelled()) == [{"type": "Cleared", "sequence_id": 0}]


def test_close_codes_and_hooks() -> None:
    codec = socket()
    assert codec.close(None) == (CloseCode.NORMAL, None)
    assert codec.close(ProtocolError(ErrorCode.SLOW_CONSUMER, "slow", fatal=True)) == (4001, "slow_consumer")
    assert codec.adopt(SessionConfig()) is codec and codec.check(SessionConfig(), None) == SessionConfig()
    codec.dropped()


def test_rest_body() -> None:
    assert decode_body(b'{"text": "Hello."}') == "Hello."
    for data, code in ((b'{"words": 1}', ErrorCode.INVALID_MESSAGE), (b"{", ErrorCode.INVALID_JSON)):
        with pytest.raises(ProtocolError) as refused:
            decode_body(data)
        assert refused.value.code == code
    assert Params("joe", "linear16", 16000, "none").to_alaw is False
