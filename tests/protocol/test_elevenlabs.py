"""The ElevenLabs codec: client messages in, voxgate session messages out, and back."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest
from voxgate.protocol.alignment import (
    Alignment,
    known_alignment,
    seconds_alignment,
    spread_alignment,
    word_alignment,
)
from voxgate.protocol.codecs.elevenlabs import (
    DEFAULT_INACTIVITY_TIMEOUT_S,
    FIXED_CONTEXT,
    Inbound,
    Params,
    Stream,
    VoiceSettings,
    close_code,
    decode_body,
    decode_inbound,
    http_error,
    parse_params,
    session_config,
    ws_error,
)
from voxgate.protocol.errors import ErrorCode, ProtocolError
from voxgate.protocol.messages import (
    AudioDone,
    AudioStart,
    ContextClose,
    ContextClosed,
    Error,
    InputDone,
    InputText,
    Keepalive,
    ServerMessage,
    SessionClose,
    SessionConfig,
    SessionDone,
    SessionReady,
    WordTimestamp,
    WordTimestamps,
)

_encode = msgspec.json.encode


def _json(data: bytes) -> dict[str, object]:
    decoded = json.loads(data)
    assert isinstance(decoded, dict)
    return decoded


def test_decode_inbound_reads_every_field_and_ignores_unknown_ones() -> None:
    msg = decode_inbound(
        '{"text": " ", "context_id": "c1", "voice_settings": {"speed": 1.1, "stability": 0.5},'
        ' "generation_config": {"chunk_length_schedule": [50]}, "xi_api_key": "k", "flush": true}'
    )
    assert msg == Inbound(
        text=" ", context_id="c1", flush=True, voice_settings=VoiceSettings(speed=1.1, stability=0.5)
    )


def test_deep_nesting_is_invalid_json_in_messages_and_bodies() -> None:
    deep = '{"pronunciation": ' + "[" * 5000 + "]" * 5000 + "}"
    for decode in (decode_inbound, lambda data: decode_body(data.encode())):
        with pytest.raises(ProtocolError) as refused:
            decode(deep)
        assert refused.value.code is ErrorCode.INVALID_JSON


def test_decode_body_reads_a_request_body() -> None:
    body = decode_body(b'{"text": "Hi.", "seed": 3, "voice_settings": {"speed": 1.1}, "extra": 1}')
    assert (body.text, body.seed, body.model_id) == ("Hi.", 3, None)
    assert body.voice_settings is not None and body.voice_settings.speed == 1.1
    with pytest.raises(ProtocolError) as refused:
        decode_body(b'{"words": "Hi."}')
    assert refused.value.code is ErrorCode.INVALID_MESSAGE and refused.value.field == "$.text"
    with pytest.raises(ProtocolError, match="invalid JSON body"):
        decode_body(b"{")


def test_decode_inbound_refuses_bad_json_and_bad_fields() -> None:
    with pytest.raises(ProtocolError) as bad_json:
        decode_inbound("{nope")
    assert bad_json.value.code is ErrorCode.INVALID_JSON
    with pytest.raises(ProtocolError) as bad_field:
        decode_inbound('{"text": 5}')
    assert bad_field.value.code is ErrorCode.INVALID_MESSAGE and bad_field.value.field == "$.text"


def test_compressed_formats_are_offered_on_every_route_with_their_bit_rate() -> None:
    params = parse_params({})  # ElevenLabs' default, mp3_44100_128
    assert (params.audio, params.bitrate) == (("mp3", 44100), 128_000)
    assert parse_params({"output_format": "mp3_22050_32"}).audio == ("mp3", 22050)
    opus = parse_params({"output_format": "opus_48000_64"})
    assert (opus.audio, opus.bitrate) == (("opus", 48000), 64_000)
    assert parse_params({"output_format": "pcm_16000"}).bitrate is None
    config = session_config("joe", opus)
    assert (config.response_format, config.sample_rate, config.bitrate) == ("opus", 48000, 64_000)


def test_parse_params_maps_formats_and_ignores_what_it_cannot_honour() -> None:
    params = parse_params(
        {
            "output_format": "ulaw_8000",
            "model_id": "eleven_flash_v2_5",
            "seed": "7",
            "inactivity_timeout": "180",
            "auto_mode": "true",
            "sync_alignment": "true",
            "enable_logging": "false",
        }
    )
    assert params == Params("ulaw_8000", "eleven_flash_v2_5", 7, 180)
    assert params.audio == ("mulaw", 8000)
    assert parse_params({"output_format": "pcm_44100"}).inactivity_timeout_s == DEFAULT_INACTIVITY_TIMEOUT_S


@pytest.mark.parametrize(
    ("query", "code", "field"),
    [
        ({"output_format": "mp3_48000_320"}, ErrorCode.UNSUPPORTED_FORMAT, "output_format"),
        ({"output_format": "opus_24000_32"}, ErrorCode.UNSUPPORTED_FORMAT, "output_format"),
        (
            {"output_format": "pcm_16000", "inactivity_timeout": "181"},
            ErrorCode.INVALID_MESSAGE,
            "inactivity_timeout",
        ),
        (
            {"output_format": "pcm_16000", "inactivity_timeout": "soon"},
            ErrorCode.INVALID_MESSAGE,
            "inactivity_timeout",
        ),
        ({"output_format": "pcm_16000", "seed": "x"}, ErrorCode.INVALID_MESSAGE, "seed"),
    ],
)
def test_parse_params_refuses(query: dict[str, str], code: ErrorCode, field: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse_params(query)
    assert refused.value.code is code and refused.value.field == field


def test_session_config_speaks_the_voice_in_the_query_format() -> None:
    config = session_config("joe", Params("pcm_16000", "piper", 3), VoiceSettings(speed=1.2, stability=0.1))
    assert config == SessionConfig(
        voice="joe",
        response_format="pcm",
        sample_rate=16000,
        stream_audio=False,
        model="piper",
        seed=3,
        speed=1.2,
    )
    assert session_config("joe", Params(), whole_segments=False).stream_audio is True


def test_session_config_refuses_values_out_of_range() -> None:
    with pytest.raises(ProtocolError) as speed:
        session_config("joe", Params(), VoiceSettings(speed=9.0))
    assert speed.value.field == "$.voice_settings.speed"
    with pytest.raises(ProtocolError) as seed:
        session_config("joe", Params(seed=2**70))
    assert seed.value.code is ErrorCode.INVALID_MESSAGE and seed.value.field == "$.seed"


def test_spread_alignment_shares_the_duration_evenly() -> None:
    alignment = spread_alignment("Hi. ", 100.0)
    assert alignment.chars == ["H", "i", ".", " "]
    assert alignment.charStartTimesMs == [0, 25, 50, 75]
    assert alignment.charDurationsMs == [25, 25, 25, 25]
    uneven = spread_alignment("abc", 100.0)
    assert sum(uneven.charDurationsMs) == 100 and uneven.charStartTimesMs == [0, 33, 67]
    assert spread_alignment("", 50.0) == Alignment([], [], [])


F = FIXED_CONTEXT


def test_stream_input_maps_messages_to_one_fixed_context() -> None:
    codec = Stream("joe", Params(), multi=False)
    assert codec.start() == [session_config("joe", Params(), whole_segments=False)]  # audio as it comes
    first = codec.receive(Inbound(text=" ", try_trigger_generation=True, context_id="ignored"))
    assert first == [Keepalive(context_id=F)]  # the init message opens the context
    assert codec.receive(Inbound(text=" ")) == [InputText(text=" ", context_id=F)]  # a space between words
    assert codec.receive(Inbound(text="Hello there. ")) == [InputText(text="Hello there. ", context_id=F)]
    assert codec.receive(Inbound(text="More", flush=True)) == [
        InputText(text="More", context_id=F),
        InputDone(context_id=F),
    ]
    assert codec.receive(Inbound(text="")) == [SessionClose()]  # end of input: the context closes
    assert codec.ended and codec.receive(Inbound(text="late")) == []


def test_the_first_message_may_set_the_speed_of_the_whole_session() -> None:
    codec = Stream("joe", Params(), multi=True)
    codec.start()
    with pytest.raises(ProtocolError) as refused:
        codec.receive(Inbound(text=" ", context_id="a", voice_settings=VoiceSettings(speed=9.0)))
    assert refused.value.field == "$.voice_settings.speed" and not codec.settled
    fast = VoiceSettings(speed=1.5)
    (config, opened) = codec.receive(Inbound(text=" ", context_id="b", voice_settings=fast))
    assert isinstance(config, SessionConfig) and config.speed == 1.5 and opened == Keepalive(context_id="b")
    # Later voice_settings cannot differ per context (config is per session): they are ignored.
    slow = Inbound(text="Hi. ", context_id="c", voice_settings=VoiceSettings(speed=0.5))
    assert codec.receive(slow) == [InputText(text="Hi. ", context_id="c")]
    # Without a start (REST), the first message configures the session itself.
    rest = Stream("joe", Params(), multi=False)
    assert rest.receive(Inbound(text="Hi."))[0] == session_config("joe", Params(), whole_segments=False)


def test_multi_stream_input_names_contexts_keeps_alive_and_closes_them() -> None:
    codec = Stream("joe", Params(), multi=True)
    codec.start()
    assert codec.receive(Inbound(context_id="c1", flush=True)) == [InputDone(context_id="c1")]
    assert codec.receive(Inbound(text="", context_id="c1")) == [Keepalive(context_id="c1")]
    assert codec.receive(Inbound(text="")) == [Keepalive()]  # the socket's: every context's timer
    assert codec.receive(Inbound(text=" ", context_id="c1")) == [InputText(text=" ", context_id="c1")]
    assert codec.receive(Inbound(context_id="c1", close_context=True)) == [ContextClose(context_id="c1")]
    assert codec.receive(Inbound(text="Hi. ")) == [InputText(text="Hi. ", context_id=F)]  # none named
    assert codec.receive(Inbound(context_id="c1")) == []  # nothing to do
    assert codec.receive(Inbound(close_socket=True)) == [SessionClose()]
    assert codec.receive(Inbound(text="late", context_id="c1")) == []


def _server(msg: ServerMessage) -> ServerMessage:
    """A server message as the codec takes it: typed, as the session core hands it out."""
    return msg


def test_render_routes_each_segment_and_each_end_to_its_context() -> None:
    codec = Stream("joe", Params("pcm_16000"), multi=True)
    start = AudioStart(sentence_text="Hi.", format="pcm", sample_rate=16000, context_id="c1")
    assert codec.render(_server(start)) == []
    audio = bytes(2 * 1600)  # 100 ms
    # The audio goes out as it comes; with no word timings its characters wait for its length.
    got = _json(codec.audio(audio, 0.0))  # a frame's length is its bytes' (0.0: Audio.audio_s unused)
    assert got == {
        "audio": base64.b64encode(audio).decode(),
        "isFinal": None,
        "normalizedAlignment": None,
        "alignment": None,
        "contextId": "c1",
    }
    (message,) = codec.render(_server(AudioDone(duration_ms=100.0, context_id="c1")))
    alignment = {
        "chars": ["H", "i", ".", " "],
        "charStartTimesMs": [0, 25, 50, 75],
        "charDurationsMs": [25] * 4,
    }
    assert _json(message) == {
        "audio": "",
        "isFinal": None,
        "normalizedAlignment": alignment,
        "alignment": alignment,
        "contextId": "c1",
    }
    other = AudioStart(sentence_text="Yo.", format="pcm", sample_rate=16000, context_id="c2")
    codec.render(_server(other))
    assert {_json(m)["contextId"] for m in _segment(codec, audio, "c2")} == {"c2"}
    closed = codec.render(_server(ContextClosed(context_id="c1", context_number=1)))
    assert [_json(m) for m in closed] == [{"isFinal": True, "contextId": "c1"}]
    # The fixed context (text that named none) and the default context have no id.
    codec.render(_server(AudioStart(sentence_text="A.", sample_rate=16000, context_id=F)))
    assert {_json(m)["contextId"] for m in _segment(codec, audio, F)} == {None}
    codec.render(_server(AudioStart(sentence_text="B.", sample_rate=16000)))
    assert {_json(m)["contextId"] for m in _segment(codec, audio)} == {None}
    # Audio after the segment's audio.done (a compressed stream's last bytes) goes out with no alignment.
    assert _json(codec.audio(b"tail", 0.0))["alignment"] is None


def test_compressed_pieces_go_out_as_the_encoder_gives_them() -> None:
    codec = Stream("joe", Params("mp3_44100_128"), multi=False)
    codec.render(_server(AudioStart(sentence_text="Hi.", format="mp3", sample_rate=44100)))
    pieces = [b"\xff\xfb" + bytes(415), b"\xff\xfb" + bytes(200)]  # their lengths say nothing of time
    sent = [_json(codec.audio(piece, 0.15)) for piece in pieces]  # each piece's audio_s does
    assert [base64.b64decode(str(m["audio"])) for m in sent] == pieces
    assert all(m["alignment"] is None for m in sent)
    (message,) = codec.render(_server(AudioDone(total_bytes=616, duration_ms=300.0)))
    alignment = _json(message)["alignment"]
    assert isinstance(alignment, dict) and alignment["chars"] == ["H", "i", ".", " "]
    assert alignment["charStartTimesMs"] == [0, 75, 150, 225]
    # An audio.done with no segment started before it (a cancelled one) sends nothing.
    assert codec.render(_server(AudioDone(duration_ms=0.0))) == []


def test_word_timings_align_each_piece_as_it_goes_out() -> None:
    codec = Stream("joe", Params("pcm_16000"), multi=False, words=True)
    codec.render(AudioStart(sentence_text="Hi you all.", sample_rate=16000, start_sample=16000))
    frame = bytes(2 * 640)  # 40 ms
    assert _json(codec.audio(frame, 0.0))["alignment"] is None  # no word timed yet
    timed = [
        WordTimestamp(word="Hi", start_ms=1000.0, end_ms=1090.0),
        WordTimestamp(word="you", start_ms=1090.0, end_ms=1180.0),
    ]
    assert codec.render(WordTimestamps(timestamps=timed)) == []
    # "Hi " is known (the next word bounds it) and starts in the audio sent (0-80 ms): it goes out, its
    # last character lasting to the end of that audio. "you" waits for the word after it.
    first = _json(codec.audio(frame, 0.0))["alignment"]
    assert first == {
        "chars": ["H", "i", " "],
        "charStartTimesMs": [0, 30, 60],
        "charDurationsMs": [30, 30, 20],
    }
    assert _json(codec.audio(frame, 0.0))["alignment"] is None  # 80-120 ms: "you" starts at 90, unknown
    last_word = WordTimestamp(word="all.", start_ms=1180.0, end_ms=1300.0)
    assert codec.render(WordTimestamps(timestamps=[last_word])) == []
    rest = [_json(codec.audio(frame, 0.0))["alignment"] for _ in range(5)]  # up to 320 ms
    (last,) = codec.render(AudioDone(duration_ms=320.0))
    alignments: list[Any] = [first, *(a for a in rest if a is not None), _json(last)["alignment"]]
    assert "".join(c for a in alignments for c in a["chars"]) == "Hi you all. "  # each character once
    # Added up as pipecat does, the spans reach the end of the segment's audio.
    assert sum(a["charStartTimesMs"][-1] + a["charDurationsMs"][-1] for a in alignments) == 320


def test_the_known_alignment_is_word_alignment_up_to_the_last_word_found() -> None:
    text = "Good morning, all. "
    words = [
        WordTimestamp(word="Good", start_ms=500.0, end_ms=700.0),
        WordTimestamp(word="morning", start_ms=700.0, end_ms=1000.0),
        WordTimestamp(word="all.", start_ms=1100.0, end_ms=1300.0),
    ]
    whole = word_alignment(text, words, 400.0, 1000.0)
    for n, until in ((1, 0), (2, len("Good ")), (3, len("Good morning, "))):
        known, open_ms = known_alignment(text, words[:n], 400.0)
        assert known == Alignment(
            whole.chars[:until], whole.charStartTimesMs[:until], whole.charDurationsMs[:until]
        )
        assert open_ms == words[n - 1].start_ms - 400.0  # where the characters left out start
    assert known_alignment(text, [], 0.0) == (Alignment([], [], []), 0.0)  # nothing is known yet


def _segment(codec: Stream, audio: bytes, context: object = msgspec.UNSET) -> list[bytes]:
    """The messages of a segment: its audio, then its alignment at its audio.done."""
    sent = codec.audio(audio, 0.0)
    duration_ms = len(audio) / 2 / 16000 * 1000
    done = AudioDone(duration_ms=duration_ms, context_id=context)  # type: ignore[arg-type]
    return [sent, *codec.render(_server(done))]


def test_render_reports_errors_and_skips_what_has_no_counterpart() -> None:
    codec = Stream("joe", Params(), multi=False)
    error = Error(code="engine_error", message="boom", fatal=True)
    assert [_json(m) for m in codec.render(_server(error))] == [
        {"message": "boom", "error": "engine_error", "code": 1011}
    ]
    assert codec.render(_server(SessionDone())) == []
    assert codec.render(SessionReady(session_id="s")) == []  # a message this dialect lacks
    refused = codec.error(ProtocolError(ErrorCode.INVALID_STATE, "too many"), "c1")
    assert _json(refused) == {"message": "too many", "error": "invalid_state"}  # not fatal: no close code
    closing = codec.error(ProtocolError(ErrorCode.INVALID_JSON, "no", fatal=True))
    assert _json(closing) == {"message": "no", "error": "invalid_json", "code": 1007}
    assert [_json(m) for m in codec.render(_server(ContextClosed(context_id=F)))] == [{"isFinal": True}]
    assert codec.observe(_server(error)) == error and codec.observe(_server(SessionDone())) is None
    multi = Stream("joe", Params(), multi=True)
    many = Error(code="too_many_contexts", message="8 open", context_id="c9")
    assert [_json(m) for m in multi.render(_server(many))] == [
        {"message": "8 open", "error": "max_active_conversations", "contextId": "c9"}
    ]
    # A segment's engine failure leaves the socket open: no 1011 in it.
    failed = Error(code="engine_error", message="one segment", fatal=False)
    assert [_json(m) for m in codec.render(_server(failed))] == [
        {"message": "one segment", "error": "engine_error"}
    ]
    assert "contextId" not in _json(multi.render(_server(error))[0])  # the socket's own error


def test_errors_use_elevenlabs_shapes_and_codes() -> None:
    unknown = ProtocolError(ErrorCode.VOICE_NOT_FOUND, "voice 'x' was not found")
    assert ws_error(unknown.code, unknown.message, unknown.close_code) == {
        "message": "voice 'x' was not found",
        "error": "voice_not_found",
        "code": 1008,
    }
    assert _json(http_error(unknown)) == {
        "detail": {"status": "voice_not_found", "message": "voice 'x' was not found"}
    }
    assert ws_error(ErrorCode.IDLE_TIMEOUT, "quiet", 4008) == {
        "message": "quiet",
        "error": "input_timeout_exceeded",
        "code": 1008,  # ElevenLabs closes an idle socket with 1008; voxgate's own code is 4008
    }
    assert ws_error("some_new_code", "?", None) == {"message": "?", "error": "some_new_code"}
    assert close_code(1000) == 1000 and close_code(4008) == 1008
    assert _json(http_error(ProtocolError(ErrorCode.EMPTY_INPUT, "empty"))) == {
        "detail": {"status": "empty_input", "message": "empty"}
    }


def test_seconds_alignment_moves_times_to_the_response_clock() -> None:
    shape = seconds_alignment(Alignment(["a", " "], [0, 250], [250, 250]), 1000.0)
    assert shape.characters == ["a", " "]
    assert shape.character_start_times_seconds == [1.0, 1.25]
    assert shape.character_end_times_seconds == [1.25, 1.5]


def test_word_alignment_follows_the_engine_words() -> None:
    words = [
        WordTimestamp(word="Hi", start_ms=1010.0, end_ms=1100.0),
        WordTimestamp(word="you.", start_ms=1100.0),
    ]
    alignment = word_alignment("Hi you. ", words, offset_ms=1000.0, duration_ms=300.0)
    assert alignment.chars == ["H", "i", " ", "y", "o", "u", ".", " "]
    assert alignment.charStartTimesMs == [10, 40, 70, 100, 140, 180, 220, 260]
    # The last word's space reaches the end of the audio, whatever the engine said of its end.
    assert alignment.charStartTimesMs[-1] + alignment.charDurationsMs[-1] == 300
    stray = word_alignment(
        "a ", [WordTimestamp(word="a", start_ms=-5.0, end_ms=999.0)], offset_ms=0.0, duration_ms=20.0
    )
    assert stray.charStartTimesMs == [0, 10] and stray.charDurationsMs == [10, 10]


def test_word_alignment_spells_the_text_not_the_words_joined_by_spaces() -> None:
    """A long token an engine timed in two parts is spelled whole: no space is invented inside it."""
    words = [
        WordTimestamp(word="Hash", start_ms=0.0, end_ms=100.0),
        WordTimestamp(word="9f86d0", start_ms=100.0, end_ms=200.0),
        WordTimestamp(word="81884c.", start_ms=200.0, end_ms=300.0),
    ]
    alignment = word_alignment("Hash 9f86d081884c. ", words, offset_ms=0.0, duration_ms=400.0)
    assert "".join(alignment.chars) == "Hash 9f86d081884c. "
    # Each part's characters share that part's time; the last reaches the end of the audio.
    assert alignment.charStartTimesMs[5] == 100 and alignment.charStartTimesMs[11] == 200
    assert alignment.charStartTimesMs[-1] + alignment.charDurationsMs[-1] == 400


def test_word_alignment_keeps_the_text_when_the_engine_words_differ_from_it() -> None:
    words = [
        WordTimestamp(word="dr", start_ms=0.0, end_ms=100.0),  # found whatever its case
        WordTimestamp(word="doctor", start_ms=100.0, end_ms=200.0),  # normalized: lends its time
        WordTimestamp(word="who", start_ms=200.0, end_ms=300.0),
    ]
    alignment = word_alignment("  Dr. Who ", words, offset_ms=0.0, duration_ms=300.0)
    assert "".join(alignment.chars) == "  Dr. Who "
    assert alignment.charStartTimesMs[:6] == [0, 33, 67, 100, 133, 167]  # "  Dr. " over 0-200 ms
    unknown_first = word_alignment(
        "Hi. ",
        [WordTimestamp(word="hey", end_ms=50.0), WordTimestamp(word="Hi.", start_ms=50.0, end_ms=90.0)],
        offset_ms=0.0,
        duration_ms=100.0,
    )
    assert "".join(unknown_first.chars) == "Hi. " and unknown_first.charStartTimesMs == [50, 62, 75, 88]
    assert word_alignment("Ok. ", [], offset_ms=0.0, duration_ms=40.0) == spread_alignment("Ok. ", 40.0)
    # Without lower-casing of the same length (a dotted capital I), the text is searched as it is.
    dotted = word_alignment("İz ", [WordTimestamp(word="İz", end_ms=30.0)], offset_ms=0.0, duration_ms=30.0)
    assert "".join(dotted.chars) == "İz "


def test_a_context_with_word_timings_aligns_with_them() -> None:
    ctx = Stream("joe", Params("pcm_16000"), multi=False, words=True)
    (config, _) = ctx.receive(Inbound(text="Hi you."))
    assert isinstance(config, SessionConfig) and config.word_timestamps
    ctx.render(AudioStart(sentence_text="Hi you.", sample_rate=16000, start_sample=16000))
    timed = WordTimestamps(
        timestamps=[
            WordTimestamp(word="Hi", start_ms=1000.0, end_ms=1100.0),
            WordTimestamp(word="you.", start_ms=1100.0, end_ms=1200.0),
        ]
    )
    assert ctx.render(timed) == []
    ctx.hold(bytes(2 * 3200))
    assert ctx.observe(AudioDone(duration_ms=200.0)) is None
    (_, alignment, duration_ms) = ctx.take_segment() or ((), None, 0.0)
    assert alignment is not None and duration_ms == 200.0
    assert alignment.charStartTimesMs[:4] == [0, 33, 67, 100]
    assert ctx.take_segment() is None  # taken once
    # The next segment has no words (an engine that timed none): its characters are spread.
    ctx.render(AudioStart(sentence_text="Ok.", sample_rate=16000, start_sample=19200))
    ctx.hold(bytes(2 * 1600))
    ctx.observe(AudioDone(duration_ms=100.0))
    assert ctx.take_segment() == (bytes(2 * 1600), spread_alignment("Ok. ", 100.0), 100.0)
