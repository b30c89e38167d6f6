"""A client message from the text of a WebSocket message: its size caps, its JSON, its schema.

``Session.receive_text`` calls ``decode``; every refusal is a ``ProtocolError`` whose code says what was
wrong (``message_too_large``, ``invalid_json``, ``not_an_object``, ``unknown_type``, ``invalid_message``,
the last with the field's path), fatal or not as the session says (fatal before its first config).
"""

from __future__ import annotations

import msgspec

from .errors import MALFORMED_JSON, ErrorCode, ProtocolError, field_path
from .messages import CLIENT_TYPES, ClientMessage, SessionConfig

_decode_client = msgspec.json.Decoder(ClientMessage).decode
_decode_any = msgspec.json.Decoder().decode
_CONFIG_FIELDS: frozenset[str] = frozenset(SessionConfig.__struct_fields__) | {"type"}
# msgspec names an unknown or missing top-level field without a path; client messages are flat.


def decode(data: str, *, max_config_bytes: int, max_message_bytes: int, fatal: bool) -> ClientMessage:
    """The client message ``data`` holds: a ``session.config`` of up to ``max_config_bytes``, any other
    message of up to ``max_message_bytes``.

    Raises:
        ProtocolError: the message is refused, ``fatal`` as given.
    """
    size = len(data) if data.isascii() else len(data.encode())
    if size > max_config_bytes:
        raise _error(
            ErrorCode.MESSAGE_TOO_LARGE, f"message of {size} bytes exceeds {max_config_bytes}", fatal
        )
    try:
        msg = _decode_client(data)
    except msgspec.ValidationError as exc:
        raise _classify(data, exc, fatal) from None
    except MALFORMED_JSON as exc:
        raise _error(ErrorCode.INVALID_JSON, f"invalid JSON: {exc}", fatal) from None
    if not isinstance(msg, SessionConfig) and size > max_message_bytes:
        raise _error(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"{msg.__struct_config__.tag} message of {size} bytes exceeds {max_message_bytes}",
            fatal,
        )
    return msg


def unknown_fields(data: str) -> tuple[str, ...]:
    """The top-level fields of a ``session.config`` that the schema does not know (they are ignored)."""
    raw = _decode_any(data)
    return tuple(sorted(k for k in raw if k not in _CONFIG_FIELDS)) if isinstance(raw, dict) else ()


def _classify(data: str, exc: msgspec.ValidationError, fatal: bool) -> ProtocolError:
    try:
        raw = _decode_any(data)
    except MALFORMED_JSON as err:
        # The typed decoder stops at the first schema error, before it reaches malformed JSON after it.
        return _error(ErrorCode.INVALID_JSON, f"invalid JSON: {err}", fatal)
    if not isinstance(raw, dict):
        return _error(ErrorCode.NOT_AN_OBJECT, "messages must be JSON objects", fatal)
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in CLIENT_TYPES:
        return _error(ErrorCode.UNKNOWN_TYPE, f"unknown message type: {kind!r}", fatal, field="$.type")
    return _error(ErrorCode.INVALID_MESSAGE, f"invalid {kind}: {exc}", fatal, field=field_path(exc))


def _error(code: ErrorCode, message: str, fatal: bool, *, field: str | None = None) -> ProtocolError:
    return ProtocolError(code, message, fatal=fatal, field=field)
