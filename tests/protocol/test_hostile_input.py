"""Inputs a hostile client sends to the session core: each is a structured error, never an exception."""

from __future__ import annotations

import pytest
from voxgate.protocol.errors import CloseCode, ErrorCode, ProtocolError
from voxgate.protocol.session import Session, State

DEPTH = 1000
DEEP = [
    '{"type": "input.text", "text": ' + "[" * DEPTH + "]" * DEPTH + "}",
    "[" * DEPTH + "]" * DEPTH,
    '{"a": ' * DEPTH + "1" + "}" * DEPTH,
    # Fails the schema first (text is a number), then the untyped decoder meets the nesting.
    '{"type": "input.text", "text": 1, "x": ' + "[" * DEPTH + "]" * DEPTH + "}",
    '{"type": "session.config", "x": ' + '{"a": ' * DEPTH + "1" + "}" * DEPTH + "}",
]


def configured() -> Session:
    session = Session()
    [event] = session.receive_text('{"type": "session.config"}')
    session.accept_config(event.config)  # type: ignore[attr-defined]
    return session


@pytest.mark.parametrize("data", DEEP, ids=range(len(DEEP)))
def test_deeply_nested_json_after_config_is_a_non_fatal_error(data: str) -> None:
    session = configured()
    with pytest.raises(ProtocolError) as info:
        session.receive_text(data)
    assert info.value.code is ErrorCode.INVALID_JSON and info.value.fatal is False
    assert session.state is State.READY
    assert session.receive_text('{"type": "input.text", "text": "Still here."}')


@pytest.mark.parametrize("data", DEEP, ids=range(len(DEEP)))
def test_deeply_nested_json_before_config_is_fatal_invalid_data(data: str) -> None:
    with pytest.raises(ProtocolError) as info:
        Session().receive_text(data)
    assert (info.value.code, info.value.close_code, info.value.fatal) == (
        ErrorCode.INVALID_JSON,
        CloseCode.INVALID_DATA,
        True,
    )
