"""The REST speech body: OpenAI's fields plus vllm-omni's, and the output rate it asks for."""

from __future__ import annotations

import msgspec
import pytest
from voxgate.protocol.codecs.openai import (
    DEFAULT_SAMPLE_RATE,
    check_limits,
    check_word_timestamps,
    decode_batch_request,
    decode_speech_request,
    merge,
)
from voxgate.protocol.errors import ErrorCode, ProtocolError


def test_voice_may_be_a_name_or_an_object() -> None:
    assert decode_speech_request(b'{"input": "Hi.", "voice": "joe"}').voice_name == "joe"
    assert decode_speech_request(b'{"input": "Hi.", "voice": {"id": "joe"}}').voice_name == "joe"
    assert decode_speech_request(b'{"input": "Hi."}').voice_name is None


def test_output_rate_defaults_to_24_khz_and_native_is_on_request() -> None:
    assert decode_speech_request(b'{"input": "Hi."}').output_rate(22050) == DEFAULT_SAMPLE_RATE == 24000
    assert decode_speech_request(b'{"input": "Hi.", "sample_rate": "native"}').output_rate(22050) == 22050
    assert decode_speech_request(b'{"input": "Hi.", "sample_rate": 16000}').output_rate(22050) == 16000


def test_unknown_fields_are_refused_by_name() -> None:
    with pytest.raises(msgspec.ValidationError, match="voise"):
        decode_speech_request(b'{"input": "Hi.", "voise": "joe"}')


def test_speaker_is_an_alias_of_voice_and_voice_wins() -> None:
    by_speaker = decode_speech_request(b'{"input": "Hi.", "speaker": "ryan"}')
    assert (by_speaker.voice_name, by_speaker.voice_field) == ("ryan", "$.speaker")
    both = decode_speech_request(b'{"input": "Hi.", "voice": "joe", "speaker": "ryan"}')
    assert (both.voice_name, both.voice_field) == ("joe", "$.voice")


def test_extra_params_and_word_timestamps_are_engine_options() -> None:
    req = decode_speech_request(b'{"input": "Hi.", "extra_params": {"top_k": 20}, "word_timestamps": true}')
    assert req.engine_options() == {"extra_params": {"top_k": 20}, "word_timestamps": True}
    assert decode_speech_request(b'{"input": "Hi.", "extra_params": {}}').engine_options() == {}
    with pytest.raises(msgspec.ValidationError, match="extra_params"):
        decode_speech_request(b'{"input": "Hi.", "extra_params": [1]}')


def test_max_new_tokens_is_at_most_4096() -> None:
    assert decode_speech_request(b'{"input": "Hi.", "max_new_tokens": 4096}').max_new_tokens == 4096
    with pytest.raises(msgspec.ValidationError, match="max_new_tokens"):
        decode_speech_request(b'{"input": "Hi.", "max_new_tokens": 4097}')


def test_instructions_are_checked_against_the_servers_limit() -> None:
    check_limits(decode_speech_request(b'{"input": "Hi.", "instructions": "' + b"x" * 500 + b'"}'))
    check_limits(decode_speech_request(b'{"input": "Hi."}'))
    with pytest.raises(ProtocolError) as refused:
        check_limits(decode_speech_request(b'{"input": "Hi.", "instructions": "' + b"x" * 501 + b'"}'))
    assert (refused.value.code, refused.value.field) == (ErrorCode.INVALID_MESSAGE, "$.instructions")
    with pytest.raises(ProtocolError):
        check_limits(decode_speech_request(b'{"input": "Hi.", "instructions": "abc"}'), 2)


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        (b'{"input": "Hi.", "word_timestamps": true}', False),
        (b'{"input": "Hi.", "word_timestamps": true, "stream": false}', False),
        (b'{"input": "Hi.", "word_timestamps": true, "stream": true}', True),
        (b'{"input": "Hi.", "word_timestamps": true, "stream_format": "audio"}', True),
        (b'{"input": "Hi.", "word_timestamps": true, "stream_format": "sse"}', True),
        (b'{"input": "Hi.", "stream": true}', False),
    ],
)
def test_word_timestamps_need_an_answer_held_whole(body: bytes, refused: bool) -> None:
    req = decode_speech_request(body)
    if not refused:
        check_word_timestamps(req)
        return
    with pytest.raises(ProtocolError) as error:
        check_word_timestamps(req)
    assert error.value.field == "$.word_timestamps"


def test_batch_items_merge_over_the_batch_defaults() -> None:
    batch = decode_batch_request(
        b'{"voice": "vivian", "speed": 1.5, "instructions": "calm", "extra_params": {"top_k": 5},'
        b' "items": [{"input": "One."}, {"input": "Two.", "speaker": "ryan", "speed": 2.0,'
        b' "response_format": "pcm", "voice": {"id": "aiden"}}, {"input": "Three.", "speaker": "serena"}],'
        b' "model": "m"}'
    )
    one, two, three = (merge(batch, item) for item in batch.items)
    assert (one.input, one.voice_name, one.speed, one.response_format) == ("One.", "vivian", 1.5, "wav")
    assert (one.instructions, one.extra_params, one.model, one.stream) == ("calm", {"top_k": 5}, "m", None)
    assert (two.voice_name, two.speed, two.response_format) == ("aiden", 2.0, "pcm")
    assert three.voice_name == "serena"
    plain = decode_batch_request(b'{"items": [{"input": "Hi."}]}')
    merged = merge(plain, plain.items[0])
    assert (merged.voice_name, merged.speed, merged.response_format) == (None, 1.0, "wav")


@pytest.mark.parametrize(
    ("item", "path"),
    [(b'{"input": ""}', "$.input"), (b'{"input": "Hi.", "max_new_tokens": 4097}', "$.max_new_tokens")],
)
def test_an_item_the_single_route_would_refuse_fails_at_merge(item: bytes, path: str) -> None:
    batch = decode_batch_request(b'{"items": [' + item + b"]}")  # the batch itself is taken
    with pytest.raises(msgspec.ValidationError, match=path.replace("$", r"\$")):
        merge(batch, batch.items[0])


@pytest.mark.parametrize(
    "body",
    [
        b'{"items": []}',
        b'{"items": [{"input": "Hi.", "bogus": 1}]}',
        b'{"items": [{"input": "Hi."}], "speed": 9}',
    ],
)
def test_the_batch_schema_refuses_the_batch(body: bytes) -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_batch_request(body)
