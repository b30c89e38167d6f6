"""``keep_emoji``: emoji are left out of what is said unless a config (REST body, batch item) keeps them."""

from __future__ import annotations

import json

import pytest
from voxgate.protocol.codecs.openai import decode_batch_request, decode_speech_request, merge
from voxgate.protocol.errors import ErrorCode, ProtocolError
from voxgate.protocol.events import SegmentReady
from voxgate.protocol.session import Session

TEXT = "Great job! 🎉 See you 👋"


def said(**config: object) -> str:
    session = Session()
    [event] = session.receive_text(json.dumps({"type": "session.config", **config}))
    session.accept_config(event.config)  # type: ignore[attr-defined]
    events = session.receive_text(json.dumps({"type": "input.text", "text": TEXT}))
    events += session.receive_text(json.dumps({"type": "input.done"}))
    return " ".join(e.text for e in events if isinstance(e, SegmentReady))


def test_emoji_are_left_out_unless_the_config_keeps_them() -> None:
    assert said() == "Great job! See you"
    assert said(keep_emoji=True) == "Great job! 🎉 See you 👋"
    assert said(keep_emoji=True, text_normalization="off") == TEXT


def test_keep_emoji_must_be_a_boolean() -> None:
    with pytest.raises(ProtocolError) as info:
        Session().receive_text(json.dumps({"type": "session.config", "keep_emoji": "yes"}))
    assert (info.value.code, info.value.field) == (ErrorCode.INVALID_MESSAGE, "$.keep_emoji")


def test_the_rest_body_and_a_batch_item_take_keep_emoji() -> None:
    assert decode_speech_request(b'{"input": "x", "keep_emoji": true}').keep_emoji is True
    assert decode_speech_request(b'{"input": "x"}').keep_emoji is False
    batch = decode_batch_request(
        b'{"keep_emoji": true, "items": [{"input": "a"}, {"input": "b", "keep_emoji": false}]}'
    )
    assert [merge(batch, item).keep_emoji for item in batch.items] == [True, False]
