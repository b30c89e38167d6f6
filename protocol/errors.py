"""Errors of the voxgate wire protocol.

Hierarchy::

    ProtocolError                 a client broke the protocol; carries an ErrorCode and a CloseCode
    └── (raised by Session.receive_text / receive_bytes)

Whether an error ends the session is the ``fatal`` flag: errors before a session is configured are
fatal (as in vllm-omni), errors after it are not, except those the gateway raises itself (timeouts,
slow consumer). The shell closes the socket with ``close_code`` when ``fatal`` is true.
"""

from __future__ import annotations

import enum
import re

import msgspec

_PATH = re.compile(r"at `(\$[^`]*)`")
_FIELD = re.compile(r"(?:unknown|missing required) field `([^`]*)`")


class CloseCode(enum.IntEnum):
    """WebSocket close codes used by voxgate (RFC 6455 section 7.4, plus private 4xxx codes)."""

    NORMAL = 1000
    INVALID_DATA = 1007
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    #: The client stopped reading and too much audio waited to be sent.
    SLOW_CONSUMER = 4001
    #: No session.config in time, or no message and no audio for the idle timeout.
    TIMEOUT = 4008


class ErrorCode(enum.StrEnum):
    """Machine-readable ``code`` of an ``error`` message; each failure kind has its own."""

    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_TYPE = "unknown_type"
    MESSAGE_TOO_LARGE = "message_too_large"
    INVALID_MESSAGE = "invalid_message"
    BINARY_NOT_ACCEPTED = "binary_not_accepted"
    CONFIG_REQUIRED = "config_required"
    INVALID_STATE = "invalid_state"
    UNSUPPORTED_OPTION = "unsupported_option"
    UNKNOWN_VOICE = "unknown_voice"
    VOICE_REQUIRES_CLONING = "voice_requires_cloning"
    INVALID_REF_AUDIO = "invalid_ref_audio"
    ENGINE_ERROR = "engine_error"
    #: The engine's upstream refused a segment as invalid (its 4xx); ``field`` names what it is about.
    REQUEST_REFUSED = "request_refused"
    CONFIG_TIMEOUT = "config_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    SLOW_CONSUMER = "slow_consumer"
    INTERNAL_ERROR = "internal_error"


def field_path(exc: msgspec.ValidationError) -> str | None:
    """The path of the field a msgspec validation error is about (``$.sample_rate``), if it names one.

    msgspec writes a path for wrong values ("... - at `$.speed`") but names unknown and missing
    fields in the text ("Object contains unknown field `lang`"), relative to the path when nested.
    """
    text = str(exc)
    path, name = _PATH.search(text), _FIELD.search(text)
    base = path[1] if path else "$"
    return f"{base}.{name[1]}" if name else base if path else None


class ProtocolError(Exception):
    """A message the session cannot accept.

    Args:
        code: what went wrong, for clients to branch on.
        message: human-readable detail, safe to show to the client.
        close_code: the close code to use when the error is fatal.
        fatal: whether the session must close after reporting it.
        field: the offending field path (``$.sample_rate``) when one is known.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        close_code: CloseCode = CloseCode.POLICY_VIOLATION,
        fatal: bool = False,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.close_code = close_code
        self.fatal = fatal
        self.field = field
