"""Errors of voxgate's surfaces, and the one table that says how each is reported.

Hierarchy::

    ProtocolError     a request or message was refused, or the session failed; carries an ErrorCode
    └── (raised by Session.receive_text / receive_bytes, and built by the gateway from its exceptions)

Each ``ErrorCode`` is one failure kind. ``FAILURES`` maps it to how every surface reports it: the
WebSocket close code (when the error is fatal), the HTTP status of ``POST /v1/audio/speech`` and the
field it is usually about. A dialect renders a ``ProtocolError`` from that table, so the same failure
gets the same code everywhere (h11's ``error_status_hint``).

Whether an error ends a WebSocket session is the ``fatal`` flag: errors before a session is configured
are fatal (as in vllm-omni), errors after it are not, except those the gateway raises itself (timeouts,
slow consumer, internal errors). The shell closes the socket with ``close_code`` when ``fatal`` is true.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import msgspec

#: What a msgspec JSON decoder raises on a text it cannot read: ``DecodeError`` (not JSON; its subclass
#: ``ValidationError``, a wrong shape, is usually caught before it), or ``RecursionError`` for nesting
#: deeper than the interpreter's stack (a hostile ``[[[[…]]]]`` of a few kilobytes). Every decoder of
#: client JSON catches this one tuple, so that no surface answers deep nesting with a traceback.
MALFORMED_JSON: tuple[type[Exception], ...] = (msgspec.DecodeError, RecursionError)
_PATH = re.compile(r"at `(\$[^`]*)`")
_FIELD = re.compile(r"(?:unknown|missing required) field `([^`]*)`")
_T = TypeVar("_T")


class CloseCode(enum.IntEnum):
    """WebSocket close codes used by voxgate (RFC 6455 section 7.4, plus private 4xxx codes)."""

    NORMAL = 1000
    #: The server is shutting down (a drain on SIGTERM): reconnect, to another replica.
    GOING_AWAY = 1001
    INVALID_DATA = 1007
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    #: The client stopped reading and too much audio waited to be sent.
    SLOW_CONSUMER = 4001
    #: No session.config in time, or no message and no audio for the idle timeout.
    TIMEOUT = 4008


class ErrorCode(enum.StrEnum):
    """Machine-readable ``code`` of an error, on every surface; each failure kind has its own."""

    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_TYPE = "unknown_type"
    MESSAGE_TOO_LARGE = "message_too_large"
    #: An HTTP request body over the route's limit.
    REQUEST_TOO_LARGE = "request_too_large"
    INVALID_MESSAGE = "invalid_message"
    BINARY_NOT_ACCEPTED = "binary_not_accepted"
    CONFIG_REQUIRED = "config_required"
    INVALID_STATE = "invalid_state"
    UNSUPPORTED_OPTION = "unsupported_option"
    UNSUPPORTED_FORMAT = "unsupported_format"
    UNSUPPORTED_RATE = "unsupported_rate"
    EMPTY_INPUT = "empty_input"
    VOICE_NOT_FOUND = "voice_not_found"
    VOICE_REQUIRES_CLONING = "voice_requires_cloning"
    INVALID_REF_AUDIO = "invalid_ref_audio"
    #: The shared voice store (``voice_store``: object storage) did not answer: try again shortly.
    VOICE_STORE_UNAVAILABLE = "voice_store_unavailable"
    ENGINE_ERROR = "engine_error"
    #: Every upstream speech server asked is busy (its 429, or 503 with ``Retry-After``): retry after
    #: ``retry_after`` seconds (REST: the ``Retry-After`` header). Never fatal (per segment).
    UPSTREAM_BUSY = "upstream_busy"
    #: The engine's upstream refused a segment as invalid (its 4xx); ``field`` names what it is about.
    REQUEST_REFUSED = "request_refused"
    #: A segment's text has letters of a script the voice's language does not use (Chinese to an English
    #: voice): the segment is not spoken; the message names the voice's language and the letters.
    UNSUPPORTED_SCRIPT = "unsupported_script"
    CONFIG_TIMEOUT = "config_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    SLOW_CONSUMER = "slow_consumer"
    INTERNAL_ERROR = "internal_error"
    #: The server is draining for shutdown: a new session is refused, a remaining one is closed.
    SERVER_SHUTDOWN = "server_shutdown"
    #: The process already holds ``max_sessions`` sessions.
    SERVER_BUSY = "server_busy"
    #: The API key already holds ``max_sessions_per_key`` sessions.
    TOO_MANY_SESSIONS = "too_many_sessions"
    #: An ``input.text`` would take the unsynthesized text over ``max_pending_text_chars``.
    TEXT_BACKLOG_FULL = "text_backlog_full"
    #: An engine gave more audio for a segment than its text can take (``max_segment_audio_*``): the rest
    #: was cut, and the engine's work on the segment stopped.
    AUDIO_TRUNCATED = "audio_truncated"
    #: REST only: the API key (or, without keys, the client address) is over ``rate_limit_per_s``.
    RATE_LIMITED = "rate_limited"
    #: HTTP only: the request's headers did not arrive within ``header_timeout_s``.
    HEADER_TIMEOUT = "header_timeout"
    #: HTTP only: the request line and headers are over ``max_header_bytes``.
    HEADER_TOO_LARGE = "header_too_large"
    #: A message would open a context past ``max_contexts`` named contexts open at once.
    TOO_MANY_CONTEXTS = "too_many_contexts"
    # The REST voice routes' refusals (uploads, clips, forms) and the HTTP router's: never on a socket.
    AMBIGUOUS_VOICE_SOURCE = "ambiguous_voice_source"
    AUDIO_TOO_LARGE = "audio_too_large"
    CLIENT_DISCONNECTED = "client_disconnected"
    DUPLICATE_FIELD = "duplicate_field"
    EMBEDDING_TOO_LONG = "embedding_too_long"
    EMPTY_EMBEDDING = "empty_embedding"
    EMBEDDING_NOT_FINITE = "embedding_not_finite"
    FIELD_TOO_LARGE = "field_too_large"
    INVALID_AUDIO = "invalid_audio"
    INVALID_DURATION = "invalid_duration"
    INVALID_EMBEDDING = "invalid_embedding"
    INVALID_FIELD = "invalid_field"
    INVALID_FORM = "invalid_form"
    INVALID_MULTIPART = "invalid_multipart"
    INVALID_NAME = "invalid_name"
    MISSING_CONSENT = "missing_consent"
    MISSING_NAME = "missing_name"
    MISSING_VOICE_SOURCE = "missing_voice_source"
    NAME_TAKEN = "name_taken"
    TOO_MANY_FIELDS = "too_many_fields"
    UNSUPPORTED_AUDIO = "unsupported_audio"
    UNSUPPORTED_CONTENT_TYPE = "unsupported_content_type"
    VOICE_LIMIT_REACHED = "voice_limit_reached"
    VOICE_QUOTA_EXCEEDED = "voice_quota_exceeded"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    # ElevenLabs' pronunciation dictionaries (``protocol.pls``, ``protocol.dictionaries``).
    #: An uploaded PLS lexicon that cannot be used (malformed, a DOCTYPE, no entries, too large).
    INVALID_LEXICON = "invalid_lexicon"
    #: A ``pronunciation_dictionary_locators`` entry (or a route's id) names no dictionary of the key.
    PRONUNCIATION_DICTIONARY_NOT_FOUND = "pronunciation_dictionary_not_found"
    #: The key holds ``max_pronunciation_dictionaries`` dictionaries.
    PRONUNCIATION_DICTIONARY_LIMIT_REACHED = "pronunciation_dictionary_limit_reached"
    #: The key's dictionaries and this one would pass ``max_pronunciation_dictionary_bytes``.
    PRONUNCIATION_DICTIONARY_QUOTA_EXCEEDED = "pronunciation_dictionary_quota_exceeded"


class Failure(NamedTuple):
    """How one failure kind is reported: close code (fatal WebSocket errors), HTTP status, usual field."""

    close_code: CloseCode
    http_status: int
    field: str | None = None


_INVALID, _POLICY = CloseCode.INVALID_DATA, CloseCode.POLICY_VIOLATION
#: The one error table: every surface renders its errors from it (docs/protocol.md section 6).
FAILURES: dict[ErrorCode, Failure] = {
    ErrorCode.INVALID_JSON: Failure(_INVALID, 400),
    ErrorCode.NOT_AN_OBJECT: Failure(_INVALID, 400),
    ErrorCode.UNKNOWN_TYPE: Failure(_POLICY, 400, "$.type"),
    ErrorCode.MESSAGE_TOO_LARGE: Failure(CloseCode.MESSAGE_TOO_BIG, 413),
    ErrorCode.REQUEST_TOO_LARGE: Failure(CloseCode.MESSAGE_TOO_BIG, 413),
    ErrorCode.INVALID_MESSAGE: Failure(_INVALID, 400),
    ErrorCode.BINARY_NOT_ACCEPTED: Failure(_POLICY, 400),
    ErrorCode.CONFIG_REQUIRED: Failure(_POLICY, 400),
    ErrorCode.INVALID_STATE: Failure(_POLICY, 409),
    ErrorCode.UNSUPPORTED_OPTION: Failure(_POLICY, 400),
    ErrorCode.UNSUPPORTED_FORMAT: Failure(_POLICY, 400, "$.response_format"),
    ErrorCode.UNSUPPORTED_RATE: Failure(_POLICY, 400, "$.sample_rate"),
    ErrorCode.EMPTY_INPUT: Failure(_POLICY, 400, "$.input"),
    ErrorCode.VOICE_NOT_FOUND: Failure(_POLICY, 400, "$.voice"),
    ErrorCode.VOICE_REQUIRES_CLONING: Failure(_POLICY, 400, "$.voice"),
    ErrorCode.INVALID_REF_AUDIO: Failure(_POLICY, 400, "$.ref_audio"),
    ErrorCode.VOICE_STORE_UNAVAILABLE: Failure(CloseCode.INTERNAL_ERROR, 503, "$.voice"),
    ErrorCode.ENGINE_ERROR: Failure(CloseCode.INTERNAL_ERROR, 502),
    # Never fatal, as ``engine_error``; 503 with ``Retry-After`` (the upstreams' own) over HTTP.
    ErrorCode.UPSTREAM_BUSY: Failure(CloseCode.INTERNAL_ERROR, 503),
    # The upstream's own 4xx replaces the 400 (``ProtocolError.status``).
    ErrorCode.REQUEST_REFUSED: Failure(_POLICY, 400),
    # Never fatal (per segment); the field differs by surface (``$.text``, REST's ``input``): none named.
    ErrorCode.UNSUPPORTED_SCRIPT: Failure(_POLICY, 400),
    ErrorCode.CONFIG_TIMEOUT: Failure(CloseCode.TIMEOUT, 408),
    ErrorCode.IDLE_TIMEOUT: Failure(CloseCode.TIMEOUT, 408),
    ErrorCode.SLOW_CONSUMER: Failure(CloseCode.SLOW_CONSUMER, 408),
    ErrorCode.INTERNAL_ERROR: Failure(CloseCode.INTERNAL_ERROR, 500),
    ErrorCode.SERVER_SHUTDOWN: Failure(CloseCode.GOING_AWAY, 503),
    # Refused before the WebSocket is accepted: the HTTP status is the answer, no close code is sent.
    ErrorCode.SERVER_BUSY: Failure(CloseCode.GOING_AWAY, 503),
    ErrorCode.TOO_MANY_SESSIONS: Failure(_POLICY, 429),
    # Backpressure, not a rate limit (429 would make clients retry the same text): never sent over HTTP.
    ErrorCode.TEXT_BACKLOG_FULL: Failure(_POLICY, 413, "$.text"),
    # Never fatal; the engine misbehaved, as with ``engine_error``.
    ErrorCode.AUDIO_TRUNCATED: Failure(CloseCode.INTERNAL_ERROR, 502),
    # HTTP only: no WebSocket session exists when these are sent (the close code is never used).
    ErrorCode.RATE_LIMITED: Failure(_POLICY, 429),
    ErrorCode.HEADER_TIMEOUT: Failure(CloseCode.TIMEOUT, 408),
    ErrorCode.HEADER_TOO_LARGE: Failure(CloseCode.MESSAGE_TOO_BIG, 431),
    ErrorCode.TOO_MANY_CONTEXTS: Failure(_POLICY, 429, "$.context_id"),
    ErrorCode.AMBIGUOUS_VOICE_SOURCE: Failure(_POLICY, 400, "$.speaker_embedding"),
    ErrorCode.AUDIO_TOO_LARGE: Failure(_POLICY, 413, "$.audio_sample"),
    ErrorCode.CLIENT_DISCONNECTED: Failure(_POLICY, 400),
    ErrorCode.DUPLICATE_FIELD: Failure(_POLICY, 400),
    ErrorCode.EMBEDDING_TOO_LONG: Failure(_POLICY, 400, "$.speaker_embedding"),
    ErrorCode.EMPTY_EMBEDDING: Failure(_POLICY, 400, "$.speaker_embedding"),
    ErrorCode.EMBEDDING_NOT_FINITE: Failure(_POLICY, 400, "$.speaker_embedding"),
    ErrorCode.FIELD_TOO_LARGE: Failure(_POLICY, 413),
    ErrorCode.INVALID_AUDIO: Failure(_POLICY, 400, "$.audio_sample"),
    ErrorCode.INVALID_DURATION: Failure(_POLICY, 400, "$.audio_sample"),
    ErrorCode.INVALID_EMBEDDING: Failure(_POLICY, 400, "$.speaker_embedding"),
    ErrorCode.INVALID_FIELD: Failure(_POLICY, 400),
    ErrorCode.INVALID_FORM: Failure(_POLICY, 400),
    ErrorCode.INVALID_MULTIPART: Failure(_POLICY, 400),
    ErrorCode.INVALID_NAME: Failure(_POLICY, 400, "$.name"),
    ErrorCode.MISSING_CONSENT: Failure(_POLICY, 400, "$.consent"),
    ErrorCode.MISSING_NAME: Failure(_POLICY, 400, "$.name"),
    ErrorCode.MISSING_VOICE_SOURCE: Failure(_POLICY, 400, "$.audio_sample"),
    ErrorCode.NAME_TAKEN: Failure(_POLICY, 409, "$.name"),
    ErrorCode.TOO_MANY_FIELDS: Failure(_POLICY, 400),
    ErrorCode.UNSUPPORTED_AUDIO: Failure(_POLICY, 415, "$.audio_sample"),
    ErrorCode.UNSUPPORTED_CONTENT_TYPE: Failure(_POLICY, 415),
    ErrorCode.VOICE_LIMIT_REACHED: Failure(_POLICY, 409, "$.name"),
    ErrorCode.VOICE_QUOTA_EXCEEDED: Failure(_POLICY, 409, "$.audio_sample"),
    ErrorCode.NOT_FOUND: Failure(_POLICY, 404),
    ErrorCode.METHOD_NOT_ALLOWED: Failure(_POLICY, 405),
    ErrorCode.INVALID_LEXICON: Failure(_POLICY, 400, "$.file"),
    # 400 in a speech request (a field of it is wrong); the dictionary routes answer 404 for their path's id.
    ErrorCode.PRONUNCIATION_DICTIONARY_NOT_FOUND: Failure(
        _POLICY, 400, "$.pronunciation_dictionary_locators"
    ),
    ErrorCode.PRONUNCIATION_DICTIONARY_LIMIT_REACHED: Failure(_POLICY, 409),
    ErrorCode.PRONUNCIATION_DICTIONARY_QUOTA_EXCEEDED: Failure(_POLICY, 409, "$.file"),
}
#: The message of an ``internal_error``: the details stay in the server log.
INTERNAL_ERROR_MESSAGE = "internal error; see the server log"


def field_path(exc: msgspec.ValidationError) -> str | None:
    """The path of the field a msgspec validation error is about (``$.sample_rate``), if it names one.

    msgspec writes a path for wrong values ("... - at `$.speed`") but names unknown and missing
    fields in the text ("Object contains unknown field `lang`"), relative to the path when nested.
    """
    text = str(exc)
    path, name = _PATH.search(text), _FIELD.search(text)
    base = path[1] if path else "$"
    return f"{base}.{name[1]}" if name else base if path else None


def decoded(decode: Callable[[str | bytes], _T], data: str | bytes, what: str = "") -> _T:
    """``decode(data)`` (a msgspec decoder of one client message or body), its failures as every surface
    reports them.

    Raises:
        ProtocolError: not JSON, nested past the interpreter's stack (``invalid_json``, ``what`` names the
            body), or a field of the wrong type (``invalid_message``, with its path).
    """
    try:
        return decode(data)
    except msgspec.ValidationError as exc:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, str(exc), field=field_path(exc)) from None
    except MALFORMED_JSON as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"invalid JSON{what}: {exc}") from None


class ProtocolError(Exception):
    """A refused request or message, or a failed session, as every surface reports it.

    Args:
        code: what went wrong, for clients to branch on.
        message: human-readable detail, safe to show to the client.
        close_code: the close code to use when the error is fatal; the code's ``FAILURES`` entry if omitted.
        fatal: whether the session must close after reporting it.
        field: the offending field path (``$.sample_rate``); the code's usual field if omitted.
        status: the HTTP status; the code's ``FAILURES`` entry if omitted (an upstream's 4xx sets it).
        context_id: the context the refused message named, if any (reported with the error).
        retry_after: seconds after which a retry may succeed (REST sends it as ``Retry-After``), if known.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        close_code: CloseCode | None = None,
        fatal: bool = False,
        field: str | None = None,
        status: int | None = None,
        context_id: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        failure = FAILURES[code]
        self.code = code
        self.message = message
        self.close_code = failure.close_code if close_code is None else close_code
        self.fatal = fatal
        self.field = failure.field if field is None else field
        self.status = failure.http_status if status is None else status
        self.context_id = context_id
        self.retry_after = retry_after

    @property
    def param(self) -> str | None:
        """The field as OpenAI's ``param`` names it: ``sample_rate`` for ``$.sample_rate``."""
        return None if self.field is None else self.field.removeprefix("$").removeprefix(".") or None
