"""The error table: every code has one entry, and errors take their defaults from it."""

from __future__ import annotations

from voxgate.protocol.errors import FAILURES, CloseCode, ErrorCode, ProtocolError


def test_every_code_has_one_table_entry() -> None:
    assert set(FAILURES) == set(ErrorCode)


def test_an_error_takes_close_code_status_and_field_from_the_table() -> None:
    error = ProtocolError(ErrorCode.VOICE_NOT_FOUND, "no voice 'nobody'")
    assert (error.close_code, error.status, error.field, error.param) == (
        CloseCode.POLICY_VIOLATION,
        400,
        "$.voice",
        "voice",
    )


def test_an_upstream_refusal_keeps_its_own_status_and_field() -> None:
    error = ProtocolError(ErrorCode.REQUEST_REFUSED, "bad language", field="language", status=422)
    assert (error.status, error.field, error.param) == (422, "language", "language")


def test_param_is_none_without_a_field_or_for_the_whole_body() -> None:
    assert ProtocolError(ErrorCode.ENGINE_ERROR, "down").param is None
    assert ProtocolError(ErrorCode.REQUEST_TOO_LARGE, "big", field="$").param is None


def test_internal_errors_are_500_and_close_1011() -> None:
    error = ProtocolError(ErrorCode.INTERNAL_ERROR, "bug", fatal=True)
    assert (error.status, error.close_code) == (500, CloseCode.INTERNAL_ERROR)
