"""What the remote engine makes of an upstream's answers: refusals, busy answers, word timings, WAV bodies.

An upstream's refusal (its 4xx) reaches the client as the one printable line its JSON names, never its raw
body; a busy upstream (429, or 503 with ``Retry-After``) is failed over and, when all are busy, reported
with the shortest wait any asked for; vllm-omni's ``X-Word-Timestamps`` header is read here, and a WAV
body becomes chunks of samples as it comes (``wav_chunks``), failing as the upstream's fault when it is not
a playable WAV.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import re
import time
from collections.abc import AsyncGenerator

import aiohttp

from . import http_stream
from .base import AudioChunk, RequestRefused
from .deadlines import UpstreamTimeout, Waits
from .qwen3_tts import word_triples
from .wav_stream import WavError, WavStream

logger = logging.getLogger(__name__)

_WORD = re.compile(r"[A-Za-z_]+")

# An error answer's text is kept for its message; a few KB say all there is (vllm-omni's are a line).
ERROR_BODY_BYTES = 64 * 1024
# What of an upstream's refusal reaches the client: the message its JSON names, one line at most this long.
# Any other body (an HTML page, a traceback) is never relayed: the client gets the upstream's status.
REFUSAL_CHARS = 300
# What of an error body goes to the log (escaped): enough to tell a traceback from a proxy's page.
LOGGED_BODY_BYTES = 200
# A busy upstream's ``Retry-After`` as the client gets it: at least a second, at most a few minutes (an
# upstream that asks for a day is not waited on for a day).
RETRY_AFTER_S = (1, 300)


def refusal(status: int, content: bytes, body: dict[str, object]) -> RequestRefused:
    """A 4xx answer as a ``RequestRefused``: the message its JSON names (one printable line, bounded),
    and the field it is about; a body that names none (an HTML page, plain text) gives its status alone."""
    text = content[:2000].decode(errors="replace")
    message, field = "", None
    with contextlib.suppress(ValueError):
        payload = json.loads(text)
        error = payload.get("error") if isinstance(payload, dict) else None
        detail = payload.get("detail") if isinstance(payload, dict) else None
        if isinstance(error, dict):  # OpenAI's shape, which vllm-omni answers
            message = str(error.get("message") or message)
            field = str(error["param"]) if error.get("param") else None
        elif isinstance(detail, list) and detail and isinstance(detail[0], dict):  # FastAPI validation
            message = str(detail[0].get("msg") or message)
            location = detail[0].get("loc")
            field = str(location[-1]) if isinstance(location, list) and location else None
        elif isinstance(detail, str):
            message = detail
    message = " ".join("".join(c if c.isprintable() else " " for c in message).split())[:REFUSAL_CHARS]
    if field is None:
        # vllm-omni names the field in its text ("Invalid language 'Xx'", "'ref_text' is only valid
        # for Base task"): take the first word of the message that is a field of the request sent.
        field = next((w for w in _WORD.findall(message) if w.lower() in body), None)
        field = field.lower() if field else None
    said = f": {message}" if message else ""
    return RequestRefused(f"upstream refused the request ({status}){said}", field=field, status=status)


def busy_message(retry_after_s: int) -> str:
    return f"the upstream speech servers are busy; retry after {retry_after_s} s"


def retry_after(value: str | None) -> int:
    """A ``Retry-After`` header (seconds or an HTTP date) as whole seconds within ``RETRY_AFTER_S``."""
    low, high = RETRY_AFTER_S
    seconds: float = low
    if value is not None and value.strip().isdigit():
        seconds = int(value.strip()[:9])
    elif value is not None:
        with contextlib.suppress(TypeError, ValueError, IndexError, OverflowError):
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
    return int(min(max(seconds, low), high))


class UpstreamFailed(Exception):
    """This upstream could not start the stream; another may."""


class Busy(UpstreamFailed):
    """This upstream is busy now (429, or 503 with ``Retry-After``); another may not be."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NoAligner(Exception):
    """This upstream was launched without ``--forced-aligner``; another may have it."""


def parse_words(header: str) -> list[tuple[str, int, int]]:
    """vllm-omni's ``X-Word-Timestamps``: a JSON list of ``{word, start_ms, end_ms}``."""
    try:
        return word_triples(json.loads(header))
    except (ValueError, TypeError, KeyError) as exc:
        logger.info("unreadable word timestamps %r: %s", header[:LOGGED_BODY_BYTES], exc)
        raise UpstreamFailed("upstream sent unreadable word timestamps") from exc


def halves(text: str) -> tuple[str, str] | None:
    """``text`` cut at the whitespace nearest its middle; None for a single word."""
    gaps = [i for i, c in enumerate(text) if c.isspace() and text[:i].strip() and text[i:].strip()]
    if not gaps:
        return None
    cut = min(gaps, key=lambda i: abs(i - len(text) // 2))
    return text[:cut].strip(), text[cut:].strip()


async def wav_chunks(response: aiohttp.ClientResponse, waits: Waits) -> AsyncGenerator[AudioChunk, None]:
    """The WAV body of ``response``, as chunks of samples, until its stated size or its end.

    Raises ``UpstreamFailed`` for a body that is not a playable WAV (or changes format mid-stream),
    that breaks, ends short of its WAV's stated size (or of its ``Content-Length``, or without its last
    chunk: aiohttp's ``ClientPayloadError``) or that misses a deadline (the caller tells before from
    after the first audio).
    """
    wav = WavStream()
    try:
        async with contextlib.aclosing(waits.pieces(http_stream.reader(response))) as pieces:
            async for raw in pieces:
                samples = wav.feed(raw)
                if len(samples) and wav.sample_rate is not None:
                    waits.flowing()
                    yield AudioChunk(samples, wav.sample_rate)
                if wav.done:
                    break
        if wav.sample_rate is None:
            raise UpstreamFailed("answered no WAV header")
        wav.finish()  # a body that ends before its WAV's stated size is cut short, not complete
    except (*http_stream.StreamError, UpstreamTimeout, WavError) as exc:
        raise UpstreamFailed(str(exc) or repr(exc)) from exc
