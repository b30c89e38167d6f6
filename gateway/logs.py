"""Log records that are always one line: control characters from clients and upstreams are escaped.

What a client or an upstream sends reaches the log: an unknown config field's name, an upstream's 4xx
text, a request path in uvicorn's access line. Logged raw, a newline in it forges a second record
(``...\\n2026-01-01 ERROR voxgate ...``) and an ANSI escape recolours or erases the terminal that tails the
log. ``install_escaping`` fixes it once for every logger: a log record factory (as
``gateway.middleware.auth``'s
redaction) escapes each record as it is made, whatever handler or formatter later renders it, uvicorn's
included, so no logging call has to remember to.

Escaped: C0 controls (newline, carriage return and tab as ``\\n``, ``\\r``, ``\\t``, the others as
``\\xNN``), DEL, the C1 controls and the Unicode line and paragraph separators (``\\x85``, ``\\u2028``,
``\\u2029``: ``str.splitlines`` and some viewers break lines there). The message and each argument are
escaped where they are, so arguments keep their types (uvicorn's access formatter unpacks them, ``%d``
still gets an int); an argument of another type is replaced by its escaped text only when its text has
something to escape. A traceback keeps its own line breaks, but the control characters within its lines
(an exception's message may quote a client) are escaped the same way.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_FORMATTER = logging.Formatter()
_installed = False


def _escaped(match: re.Match[str]) -> str:
    char = match[0]
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def escape(text: str) -> str:
    """``text`` with every control character written as its Python escape (``\\x1b``, ``\\n``)."""
    return _CONTROL.sub(_escaped, text)


def _escape_lines(text: str) -> str:
    """A multi-line text (a traceback) with its line breaks kept and everything else escaped."""
    return "\n".join(escape(line) for line in text.split("\n"))


def _escape_arg(arg: object) -> object:
    if arg is None or isinstance(arg, (int, float)):
        return arg
    if isinstance(arg, str):
        return escape(arg)
    try:
        text = str(arg)
    except Exception:  # an argument that cannot render itself is left to the formatter's own error
        return arg
    return arg if _CONTROL.search(text) is None else escape(text)


def rewrite_record(
    record: logging.LogRecord,
    text: Callable[[str], str],
    arg: Callable[[object], object],
    block: Callable[[str], str],
) -> None:
    """Rewrite a record's message and arguments (keeping their shape: uvicorn's access formatter unpacks
    them), its traceback and its stack, each as it is made (escaping here, ``gateway.middleware.auth``'s
    redaction).

    Args:
        text: for a message that is a string.
        arg: for each argument, and a message of another type.
        block: for the traceback and the stack (several lines).
    """
    record.msg = text(record.msg) if isinstance(record.msg, str) else arg(record.msg)
    if isinstance(record.args, tuple):
        record.args = tuple(arg(a) for a in record.args)
    elif isinstance(record.args, Mapping):
        record.args = {k: arg(v) for k, v in record.args.items()}
    if record.exc_info and not record.exc_text:
        record.exc_text = _FORMATTER.formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = block(record.exc_text)
    if record.stack_info:
        record.stack_info = block(record.stack_info)


def escape_record(record: logging.LogRecord) -> None:
    """Escape control characters in a record's message, arguments, traceback and stack."""
    rewrite_record(record, escape, _escape_arg, _escape_lines)


def install_escaping() -> None:
    """Escape every log record made in this process from now on, by any logger (once; a second call
    does nothing). Install it after ``gateway.middleware.auth.install_redaction``, so it escapes redacted
    text."""
    global _installed
    if _installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        escape_record(record)
        return record

    logging.setLogRecordFactory(factory)
    _installed = True
