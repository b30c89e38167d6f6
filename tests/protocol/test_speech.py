"""The REST speech body: OpenAI's fields plus vllm-omni's, and the output rate it asks for."""

from __future__ import annotations

import msgspec
import pytest
from voxgate.protocol.speech import DEFAULT_SAMPLE_RATE, decode_speech_request


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
