"""Form bodies parsed while they stream in (``multipart/form-data`` and urlencoded), within limits.

Every broken limit or malformed body raises ``Rejected`` as soon as it shows, so reading stops there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from ...protocol.errors import ErrorCode
from ..middleware.http import Rejected


@dataclass(frozen=True)
class FormLimits:
    """What a form may hold: sizes in bytes, per part and in all, and how many fields."""

    what: str
    body_bytes: int
    #: Limits of named parts; any other part is text, limited to ``text_bytes``.
    parts: Mapping[str, int]
    text_bytes: int
    #: An urlencoded body is kept whole, so it gets its own, smaller limit.
    urlencoded_bytes: int
    fields: int = 16
    #: The error code of a part over its limit, by part name (default ``field_too_large``).
    too_large_codes: Mapping[str, ErrorCode] = field(default_factory=dict)


@dataclass
class Part:
    """One form field as received: its bytes and, for files, the name and type the client gave."""

    data: bytearray = field(default_factory=bytearray)
    filename: str | None = None
    content_type: str | None = None


class _MultipartForm:
    """Feeds python-multipart's streaming parser and keeps every part within its limit."""

    def __init__(self, boundary: bytes, limits: FormLimits) -> None:
        self._limits = limits
        self.parts: dict[str, Part] = {}
        self._headers: dict[bytes, bytes] = {}
        self._field = self._value = b""
        self._current: tuple[str, Part] | None = None
        self._done = False
        try:
            self._parser = MultipartParser(
                boundary,
                {
                    "on_header_field": self._on_header_field,
                    "on_header_value": self._on_header_value,
                    "on_header_end": self._on_header_end,
                    "on_headers_finished": self._on_headers_finished,
                    "on_part_data": self._on_part_data,
                    "on_end": self._on_end,
                },
            )
        except FormParserError as exc:
            raise Rejected(ErrorCode.INVALID_MULTIPART, f"bad multipart boundary: {exc}") from exc

    def feed(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except FormParserError as exc:
            raise Rejected(ErrorCode.INVALID_MULTIPART, f"malformed multipart body: {exc}") from exc

    def finish(self) -> dict[str, Part]:
        if not self._done:
            raise Rejected(ErrorCode.INVALID_MULTIPART, "multipart body ends before its closing boundary")
        return self.parts

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _on_header_end(self) -> None:
        self._headers[self._field.lower()] = self._value
        self._field = self._value = b""

    def _on_headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition"))
        content_type = self._headers.get(b"content-type")
        self._headers = {}
        if b"name" not in options:
            raise Rejected(ErrorCode.INVALID_MULTIPART, "a multipart part has no name in Content-Disposition")
        name = options[b"name"].decode("utf-8", "replace")
        filename = options[b"filename"].decode("utf-8", "replace") if b"filename" in options else None
        part = Part(filename=filename, content_type=content_type.decode("latin-1") if content_type else None)
        _add_part(self.parts, name, part, self._limits)
        self._current = (name, part)

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        assert self._current is not None, "python-multipart sends data only after headers"
        name, part = self._current
        part.data += data[start:end]
        _check_size(name, part, self._limits)

    def _on_end(self) -> None:
        self._done = True


class _UrlencodedForm:
    """An urlencoded body, small by nature: kept whole, then parsed."""

    def __init__(self, limits: FormLimits) -> None:
        self._limits = limits
        self._body = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._body += chunk
        if len(self._body) > self._limits.urlencoded_bytes:
            limit = self._limits.urlencoded_bytes
            message = f"an urlencoded form is at most {limit} bytes; send files as multipart"
            raise Rejected(ErrorCode.REQUEST_TOO_LARGE, message)

    def finish(self) -> dict[str, Part]:
        parts: dict[str, Part] = {}
        try:
            pairs = parse_qsl(self._body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
        except (UnicodeDecodeError, ValueError) as exc:
            raise Rejected(ErrorCode.INVALID_FORM, f"malformed urlencoded body: {exc}") from exc
        for name, value in pairs:
            part = Part(data=bytearray(value.encode()))
            _add_part(parts, name, part, self._limits)
            _check_size(name, part, self._limits)
        return parts


def _check_size(name: str, part: Part, limits: FormLimits) -> None:
    limit = limits.parts.get(name, limits.text_bytes)
    if len(part.data) > limit:
        code = limits.too_large_codes.get(name, ErrorCode.FIELD_TOO_LARGE)
        raise Rejected(code, f"{name} is larger than {limit} bytes", name)


def _add_part(parts: dict[str, Part], name: str, part: Part, limits: FormLimits) -> None:
    if name in parts:
        raise Rejected(ErrorCode.DUPLICATE_FIELD, f"{name} is given more than once", name)
    if len(parts) >= limits.fields:
        raise Rejected(ErrorCode.TOO_MANY_FIELDS, f"a {limits.what} has at most {limits.fields} fields")
    parts[name] = part


async def read_form(content_type: str, chunks: AsyncIterator[bytes], limits: FormLimits) -> dict[str, Part]:
    """Parse a form body while it streams in, raising ``Rejected`` as soon as it breaks a limit."""
    mime, options = parse_options_header(content_type)
    form: _MultipartForm | _UrlencodedForm
    if mime == b"multipart/form-data":
        if not options.get(b"boundary"):
            raise Rejected(ErrorCode.INVALID_MULTIPART, "multipart Content-Type without a boundary")
        form = _MultipartForm(options[b"boundary"], limits)
    elif mime == b"application/x-www-form-urlencoded":
        form = _UrlencodedForm(limits)
    else:
        raise Rejected(ErrorCode.UNSUPPORTED_CONTENT_TYPE, f"send the {limits.what} as multipart/form-data")
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > limits.body_bytes:
            raise Rejected(
                ErrorCode.REQUEST_TOO_LARGE, f"a {limits.what} is at most {limits.body_bytes} bytes"
            )
        form.feed(chunk)
    return form.finish()


def text_field(parts: dict[str, Part], name: str) -> str | None:
    """The UTF-8 text of part ``name``, None when absent."""
    part = parts.get(name)
    if part is None:
        return None
    try:
        return part.data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejected(ErrorCode.INVALID_FIELD, f"{name} is not UTF-8 text", name) from exc
