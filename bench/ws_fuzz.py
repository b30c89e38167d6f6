"""WebSocket fuzz: seeded hostile messages against a real gateway; crashes, tracebacks and hangs must be 0.

    .venv/bin/python bench/ws_fuzz.py                       # 20,000 messages, seed 1, own server
    .venv/bin/python bench/ws_fuzz.py --seed 7 --messages 50000 --json fuzz.json
    .venv/bin/python bench/ws_fuzz.py --surfaces elevenlabs,twilio --messages 2000
    .venv/bin/python bench/ws_fuzz.py --url ws://127.0.0.1:8000/v1/audio/speech/stream

Surfaces, taken in turn by the connections: ``voxgate`` (the session socket), ``elevenlabs`` and
``elevenlabs_multi`` (``stream-input``, ``multi-stream-input``), ``twilio`` and ``telnyx`` (the session socket
with carrier ``framing``, relaying the carrier's messages). The server, the scenarios, the hostile messages
and what is counted: docs/performance.md ("ws_fuzz.py").
Prints a JSON summary; exit status 1 when crashes, tracebacks, hangs, errors_without_code, internal_errors,
unexpected_closes, bad_alignments, log_control_lines (raw control characters in the server's log) or
fuzz_failures (this script's own) is not 0.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _client import PATH
from _serve import Server, gateway
from _stats import write_json
from voxgate.protocol.codecs.stream import EXTENSIONS_SUBPROTOCOL
from voxgate.protocol.errors import FAILURES, ErrorCode
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.typing import Subprotocol

MAX_CONFIG_BYTES = 64 * 1024  # of the server this script starts
MAX_MESSAGE_BYTES = 128 * 1024  # the default
WS_MAX_SIZE = MAX_CONFIG_BYTES + 1024 * 1024  # uvicorn's frame limit as voxgate serve sets it
SEND_TIMEOUT_S = 2.0
# A raw control character in a log line (tab aside): a client forged a line or a terminal escape.
_CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass
class Report:
    messages: int = 0
    connections: int = 0
    crashes: int = 0
    tracebacks: int = 0
    hangs: int = 0
    errors_without_code: int = 0
    internal_errors: int = 0
    unexpected_closes: int = 0
    bad_alignments: int = 0  # ElevenLabs audio messages whose alignment lists differ in length
    log_control_lines: int = (
        0  # server log lines with raw control characters (a forged line, a terminal escape)
    )
    log_lines: int = 0
    log_bytes: int = 0
    refused_handshakes: int = 0
    traceback_kinds: dict[str, int] = field(default_factory=dict)
    error_codes: dict[str, int] = field(default_factory=dict)
    close_codes: dict[str, int] = field(default_factory=dict)
    surfaces: dict[str, int] = field(default_factory=dict)  # connections of each
    server_rss_mb: dict[str, float] = field(default_factory=dict)  # start, max, end (a server of its own)
    scenarios: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    hang_samples: list[str] = field(default_factory=list)
    unexpected_samples: list[str] = field(default_factory=list)
    log_control_samples: list[str] = field(default_factory=list)
    fuzz_failures: dict[str, int] = field(default_factory=dict)


def bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


class Hang(Exception):
    """The server neither answered nor closed in time."""


# -- hostile messages -----------------------------------------------------------------------------------


def _nested(rng: random.Random) -> str:
    n = rng.choice([100, 1000, 2000, 5000])
    inner = "[" * n + "]" * n if rng.random() < 0.5 else '{"a":' * n + "1" + "}" * n
    return '{"type": "input.text", "text": ' + inner + "}" if rng.random() < 0.5 else inner


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.4:
        return rng.choice(
            [None, True, False, 0, -1, 2**70, 1.5e300, "", "x" * rng.randint(0, 50), "\u202e\u200b"]
        )
    if roll < 0.7:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["type", "text", "voice", "a", ""]): _random_json(rng, depth + 1) for _ in range(3)}


KINDS = (
    "malformed_json not_an_object wrong_type unknown_type out_of_range deep_nesting oversize binary"
    " invalid_utf8 numbers controls random_json"
).split()
_GOOD = json.dumps({"type": "input.text", "text": "hello"})
_CONFIG = "session.config"
# What each kind picks one of: JSON values (sent dumped), and texts or bytes (sent as they are).
_DUMPED: dict[str, tuple[Any, ...]] = {
    "not_an_object": ([], [1, 2], "input.text", 42, None, True),
    "wrong_type": (
        {"type": "input.text", "text": 123},
        {"type": "input.text", "text": ["a"]},
        {"type": 5},
        {"type": None},
        {"type": "input.commit", "commit_id": {"a": 1}},
        {"type": _CONFIG, "sample_rate": "fast"},
        {"type": _CONFIG, "speed": [1]},
    ),
    "unknown_type": tuple({"type": t} for t in ("input.txt", "session.start", "", "INPUT.TEXT", "x" * 300)),
    "out_of_range": (
        {"type": _CONFIG, "sample_rate": 1},
        {"type": _CONFIG, "speed": 100},
        {"type": _CONFIG, "frame_ms": 0},
        {"type": _CONFIG, "response_format": "mp9"},
        {"type": _CONFIG, "voice": "../../etc/passwd"},
    ),
}
_RAW: dict[str, tuple[str | bytes, ...]] = {
    "malformed_json": ("{", "}", "nul", '{"type": input.text}', "\x00", "'a'"),
    "invalid_utf8": (b"\xff\xfe", b'{"type": "input.text", "text": "\xc3\x28"}', b"\xed\xa0\x80"),
    "numbers": (
        '{"type": "session.config", "speed": NaN}',
        '{"type": "session.config", "speed": 1e400}',
        '{"type": "session.config", "sample_rate": 1' + "0" * 400 + "}",
        '{"type": "input.text", "text": "a", "type": "input.done"}',
    ),
}


def hostile(rng: random.Random) -> tuple[str, str | bytes, bool]:
    """A hostile message: (kind, data, sent as text?)."""
    kind = rng.choice(KINDS)
    data: str | bytes
    match kind:
        case "malformed_json":
            data = rng.choice([_GOOD[: rng.randint(0, len(_GOOD) - 1)], *_RAW[kind]])
        case "invalid_utf8" | "numbers":
            data = rng.choice(_RAW[kind])
        case "not_an_object" | "wrong_type" | "unknown_type" | "out_of_range":
            data = json.dumps(rng.choice(_DUMPED[kind]))
        case "deep_nesting":
            data = _nested(rng)
        case "oversize":
            size = WS_MAX_SIZE + 1024 if rng.random() < 0.02 else MAX_MESSAGE_BYTES + rng.randint(1, 4096)
            data = json.dumps({"type": "input.text", "text": "x" * size})
            kind = "oversize_frame" if size > WS_MAX_SIZE else kind
        case "binary":
            data = rng.randbytes(rng.randint(0, 2048))
        case "controls":
            data = json.dumps({"type": _CONFIG, "voice": "\u202eevil\u0000\u200b"})
        case _:
            data = json.dumps(_random_json(rng))
    return kind, data, not isinstance(data, bytes) or kind == "invalid_utf8"


VALID_TEXTS = ("Hello there. ", "How are you", " today?", "A clause, then", " more. ", "")


def valid(rng: random.Random) -> tuple[str, dict[str, Any]]:
    roll = rng.random()
    if roll < 0.6:
        return "input.text", {"type": "input.text", "text": rng.choice(VALID_TEXTS)}
    if roll < 0.75:
        return "input.done", {"type": "input.done"}
    if roll < 0.85:
        return "input.commit", {"type": "input.commit", "commit_id": str(rng.randint(0, 99))}
    if roll < 0.93:
        return "input.cancel", {"type": "input.cancel"}
    return "session.config", {
        "type": "session.config",
        "response_format": rng.choice(["pcm", "f32", "mulaw"]),
    }


# -- one connection -------------------------------------------------------------------------------------


class Client:
    def __init__(self, ws: ClientConnection, report: Report, timeout: float, extensions: bool) -> None:
        self.ws = ws
        self.report = report
        self.timeout = timeout
        self.extensions = extensions

    async def recv(self) -> dict[str, Any] | bytes:
        try:
            item = await asyncio.wait_for(self.ws.recv(), self.timeout)
        except TimeoutError:
            raise Hang("no message or close in time") from None
        if isinstance(item, bytes):
            return item
        message: dict[str, Any] = json.loads(item)
        if message.get("type") == "error":
            code = message.get("code")
            if code is None and self.extensions:
                self.report.errors_without_code += 1
            bump(self.report.error_codes, str(code) if code is not None else "(none: vllm-omni dialect)")
            if code == "internal_error":
                self.report.internal_errors += 1
        return message

    async def until(self, *kinds: str) -> dict[str, Any]:
        while True:
            item = await self.recv()
            if isinstance(item, dict) and item.get("type") in kinds:
                return item

    async def send(self, data: str | bytes, text: bool) -> None:
        self.report.messages += 1
        await self.ws.send(data, text=text)


def _close_code(exc: ConnectionClosed) -> int | None:
    return exc.rcvd.code if exc.rcvd is not None else None


async def run_connection(index: int, args: argparse.Namespace, report: Report, budget: list[int]) -> None:
    rng = random.Random(args.seed * 1_000_003 + index)
    surface = args.surfaces[index % len(args.surfaces)]  # in turn: a short run reaches every surface
    if surface != "voxgate":
        await run_surface(index, surface, rng, args, report, budget)
        return
    bump(report.surfaces, surface)
    scenario = rng.choices(
        ["configured", "unconfigured", "abrupt", "slow_reader", "stalled"], weights=[80, 10, 6, 3, 1]
    )[0]
    extensions = rng.random() < 0.8 if scenario == "configured" else True
    compression = "deflate" if rng.random() < 0.5 else None
    bump(report.scenarios, scenario)
    subprotocols = [Subprotocol(EXTENSIONS_SUBPROTOCOL)] if extensions else None
    expected_close: set[int | None] = {1000}
    try:
        async with connect(
            args.url,
            subprotocols=subprotocols,
            compression=compression,
            max_size=None,
            open_timeout=args.timeout,
        ) as ws:
            report.connections += 1
            client = Client(ws, report, args.timeout, extensions)
            try:
                if scenario == "unconfigured":
                    kind, data, text = hostile(rng)
                    bump(report.kinds, kind)
                    expected_close = {1007, 1008, 1009, None}
                    await client.send(data, text)
                    await client.until("__never__")
                await client.send(json.dumps({"type": "session.config"}), True)
                if extensions:
                    await client.until("session.ready")
                match scenario:
                    case "configured":
                        await configured(client, rng, args, budget, expected_close)
                    case "abrupt":
                        await client.send(
                            json.dumps({"type": "input.text", "text": "Hello there. " * 20}), True
                        )
                        await client.send(json.dumps({"type": "input.done"}), True)
                        if rng.random() < 0.5:
                            await client.recv()
                        ws.transport.abort()  # no close frame: the server must notice on its own
                        with contextlib.suppress(ConnectionClosed, Hang):
                            await client.until("__never__")
                        return
                    case "slow_reader":
                        await client.send(
                            json.dumps({"type": "input.text", "text": "Hello there. " * 10}), True
                        )
                        await client.send(json.dumps({"type": "input.done"}), True)
                        await asyncio.sleep(rng.uniform(0.1, SEND_TIMEOUT_S / 2))
                        await client.until("session.done")
                    case "stalled":
                        expected_close = {4001, 1000, None}
                        await client.send(
                            json.dumps({"type": "input.text", "text": "Hello there. " * 400}), True
                        )
                        await client.send(json.dumps({"type": "input.done"}), True)
                        ws.transport.pause_reading()  # never reads again
                        await asyncio.sleep(SEND_TIMEOUT_S * 2)
                        ws.transport.resume_reading()
                        # Closed with 4001 if the writes stalled long enough; else everything arrives.
                        await client.until("session.done")
                await client.send(json.dumps({"type": "session.close"}), True)
                await client.until("__never__")
            except ConnectionClosed as closed:
                code = _close_code(closed)
                bump(report.close_codes, str(code))
                if code == 1011:
                    report.internal_errors += 1
                if code not in expected_close:
                    report.unexpected_closes += 1
                    if len(report.unexpected_samples) < 10:
                        report.unexpected_samples.append(f"conn {index} ({scenario}): close {code}")
            except Hang as hang:
                report.hangs += 1
                if len(report.hang_samples) < 10:
                    report.hang_samples.append(f"conn {index} ({scenario}): {hang}")
    except InvalidHandshake:
        report.refused_handshakes += 1
    except OSError as exc:  # the connection reset while sending an oversize frame
        bump(report.close_codes, f"reset: {type(exc).__name__}")


async def configured(
    client: Client, rng: random.Random, args: argparse.Namespace, budget: list[int], expected: set[int | None]
) -> None:
    for _ in range(rng.randint(5, 40)):
        if budget[0] <= 0:
            return
        budget[0] -= 1
        if rng.random() < 0.3:
            kind, message = valid(rng)
            report_kind = f"valid:{kind}"
            bump(client.report.kinds, report_kind)
            await client.send(json.dumps(message), True)
            continue
        if rng.random() < 0.03:  # a valid config with a forged field name: taken, and listed back
            bump(client.report.kinds, "unknown_field")
            await client.send(json.dumps({"type": _CONFIG, _ANSI: 1}), True)
            if client.extensions:  # refused (invalid_state) during an utterance
                await client.until("session.ready", "error")
            continue
        kind, data, text = hostile(rng)
        bump(client.report.kinds, kind)
        if kind in ("oversize_frame", "invalid_utf8"):
            # uvicorn closes: 1009 past its frame limit, 1007 for invalid UTF-8 (a reset while sending, None)
            expected.update({1009, 1007, None})
            await client.send(data, text)
            await client.until("__never__")  # ends with the close (ConnectionClosed) or a Hang
        await client.send(data, text)
        if client.extensions or rng.random() < 0.5:
            answer = await client.until("error")
            code = answer.get("code")
            if answer.get("fatal") and isinstance(code, str) and code in set(ErrorCode):
                expected.add(int(FAILURES[ErrorCode(code)].close_code))


# -- the ElevenLabs and phone-carrier surfaces ------------------------------------------------------------
#
# Their hostile messages are not all answered (ElevenLabs ignores unknown fields, a carrier's stray mark
# echo is dropped), so these connections read on their own task: every message is checked as it arrives,
# and the connection ends with a graceful close that must come within --timeout (else a hang).

SURFACES = ("voxgate", "elevenlabs", "elevenlabs_multi", "twilio", "telnyx")
ELEVENLABS_PATHS = {
    "elevenlabs": "/v1/text-to-speech/{voice}/stream-input",
    "elevenlabs_multi": "/v1/text-to-speech/{voice}/multi-stream-input",
}
# Cheap formats: the fuzz is about the wire, not the encoders (one in ten asks for mp3 all the same).
_EL_FORMATS = ("pcm_16000", "ulaw_8000", "pcm_24000", "pcm_16000", "mp3_22050_32")
_ANSI = "\x1b[31mFORGED\x1b[0m\r\nERROR injected"
_DEEP = 5000


def _deep(n: int = _DEEP) -> str:
    return "[" * n + "]" * n


#: The ElevenLabs kinds that end the socket (ElevenLabs closes on a message that is not its shape), and
#: those a session survives.
EL_FATAL = ("deep_json", "wrong_type", "malformed_json", "binary", "invalid_utf8", "numbers")
EL_UNFATAL = ("huge_value", "unknown_field", "controls", "oversize", "voice_settings")


def _el_variants(kind: str, multi: bool, rng: random.Random) -> list[str | bytes]:
    """Every hostile ``stream-input`` message of ``kind`` (JSON texts; bytes for binary and invalid UTF-8)."""
    context = (
        {"context_id": rng.choice(["c0", "c1", "x" * 20_000, _ANSI, "", "\u202e\u0000"])} if multi else {}
    )
    values: list[Any]
    match kind:
        case "deep_json":
            return [
                _deep(rng.choice([100, 1000, _DEEP])),
                '{"text": "hi", "voice_settings": ' + _deep() + "}",
                '{"text": "hi", "generation_config": ' + '{"a":' * _DEEP + "1" + "}" * _DEEP + "}",
                '{"text": ' + _deep() + "}",
            ]
        case "wrong_type":
            values = [
                {"text": 123},
                {"text": ["a"]},
                {"text": "a", "flush": "yes"},
                {"context_id": 5, "text": "a"},
                {"close_context": 1},
                {"close_socket": "true"},
                {"voice_settings": "fast"},
                {"voice_settings": {"speed": "fast"}},
                {"text": "a", "try_trigger_generation": []},
                [],
                "text",
                None,
            ]
        case "huge_value":
            values = [
                {"text": "a", "voice_settings": {"speed": 99}, **context},
                {"text": "a", "voice_settings": {"speed": 2**70}, **context},
                {"text": "a", "voice_settings": {"stability": -1e300, "speed": 0}, **context},
                {"text": "Hello " * 300, **context},
                {"text": "a", "chunk_length_schedule": [2**63] * 100, **context},
            ]
        case "unknown_field":
            values = [{"text": "Hi. ", "xi_api_key": "k", _ANSI: 1, "\u0000": [], **context}]
        case "controls":
            values = [{"text": "\x00\x07\x1b[2J" + _ANSI + "\u202e. ", **context}]
        case "malformed_json":
            return ["{", '{"text": }', "nul", "\x00", '{"text": "a"', "'a'"]
        case "binary":
            return [rng.randbytes(rng.randint(0, 512))]
        case "invalid_utf8":
            return [b"\xff\xfe", b'{"text": "\xc3\x28"}']
        case "oversize":
            values = [{"text": "x" * (MAX_MESSAGE_BYTES + rng.randint(1, 4096)), **context}]
        case "voice_settings":
            values = [{"text": " ", "voice_settings": {"speed": speed}} for speed in (0, -1, 99, None)]
        case _:  # numbers
            return [
                '{"text": "a", "voice_settings": {"speed": NaN}}',
                '{"text": "a", "voice_settings": {"speed": 1e400}}',
                '{"text": "a", "voice_settings": {"speed": 1' + "0" * 400 + "}}",
            ]
    return [json.dumps(v) for v in values]


def _el_hostile(rng: random.Random, multi: bool, fatal: bool = True) -> tuple[str, str | bytes, bool]:
    """A hostile ``stream-input`` message: (kind, data, sent as text?); ``fatal``: also of the kinds that
    end the socket (drawn less often, so that a connection lives long enough to send its others)."""
    kind = rng.choice([*(EL_FATAL if fatal else ()), *4 * EL_UNFATAL])
    data = rng.choice(_el_variants(kind, multi, rng))
    return kind, data, not isinstance(data, bytes) or kind == "invalid_utf8"


def _el_valid(rng: random.Random, multi: bool) -> dict[str, Any]:
    context = {"context_id": rng.choice(["c0", "c1", "c2"])} if multi else {}
    roll = rng.random()
    if roll < 0.6:
        return {"text": rng.choice(VALID_TEXTS[:-1]), "try_trigger_generation": True, **context}
    if roll < 0.8:
        return {"flush": True, **context}
    if roll < 0.9 and multi:
        return {"close_context": True, **context}
    return {"text": "", **context} if multi else {"text": " ", **context}


_TELEPHONY_EVENTS = ("start", "dtmf", "stop", "connected", "media")


def _bad_framing(sid: str) -> list[dict[str, Any]]:
    """Hostile ``session.config`` messages of a carrier-framed session."""
    return [
        {"type": "session.config", **fields}
        for fields in (
            {"framing": "vonage"},
            {"framing": 5},
            {"framing": "twilio", "stream_sid": 123},
            {"framing": "twilio", "stream_sid": "x" * 60_000},
            {"framing": "twilio", "stream_sid": _ANSI},
            {"framing": "telnyx", "stream_sid": "changed"},
            {"framing": None},
            {"framing": "twilio", "stream_sid": sid, _ANSI: 1},  # an unknown field's name
        )
    ]


CARRIER_KINDS = (
    "bad_base64_media unknown_event mark_without_name wrong_type huge_value deep_json controls"
    " unknown_field foreign_clear bad_framing malformed_json both_keys"
).split()


def _carrier_variants(kind: str, sid: str) -> list[str]:
    """Every hostile message of ``kind`` relayed from a carrier (or a hostile framing config), as JSON."""
    stream = {"streamSid": sid}
    values: list[Any]
    match kind:
        case "bad_base64_media":
            payloads = ["!!!not base64!!!", "=" * 1000, 5, None, "\x00\x1b", "QUJD" * 30_000]
            values = [
                {"event": "media", **stream, "media": {"track": "inbound", "payload": p}} for p in payloads
            ]
        case "unknown_event":
            values = [{"event": e, **stream, "sequenceNumber": "1"} for e in _TELEPHONY_EVENTS]
        case "mark_without_name":
            values = [{"event": "mark", **stream}, {"event": "mark", "mark": {}}]
        case "wrong_type":
            values = [
                {"event": 5},
                {"event": ["mark"]},
                {"event": None, "type": None},
                {"event": "mark", "mark": {"name": 5}},
                {"event": "mark", "mark": "utt-0-seg-0"},
                {"event": "clear", "streamSid": {"a": 1}},
            ]
        case "huge_value":
            values = [
                {"event": "mark", **stream, "sequenceNumber": 2**70, "mark": {"name": "utt-0-seg-0"}},
                {"event": "mark", **stream, "mark": {"name": "m" * (MAX_MESSAGE_BYTES + 10)}},
                {"event": "mark", **stream, "mark": {"name": "m" * 60_000}},
            ]
        case "deep_json":
            return ['{"event": "mark", "mark": ' + _deep(n) + "}" for n in (1000, _DEEP)]
        case "controls":
            values = [{"event": e, "streamSid": _ANSI, "mark": {"name": _ANSI}} for e in ("mark", _ANSI)]
        case "unknown_field":
            values = [{"event": "mark", **stream, _ANSI: 1, "mark": {"name": "utt-9-seg-9", "extra": [1]}}]
        case "foreign_clear":
            values = [{"event": "clear", "streamSid": "MZ-someone-else"}]
        case "bad_framing":
            values = _bad_framing(sid)
        case "malformed_json":
            return ['{"event": mark}', '{"event": "mark"', "{", '{"event"']
        case _:  # both_keys
            values = [{"event": "clear", "type": "input.cancel", **stream}]
    return [json.dumps(v) for v in values]


def _carrier_hostile(rng: random.Random, sid: str) -> tuple[str, str | bytes, bool]:
    """A hostile message relayed from a carrier (or a hostile framing config): (kind, data, as text?)."""
    kind = rng.choice(CARRIER_KINDS)
    return kind, rng.choice(_carrier_variants(kind, sid)), True


class Reader:
    """Reads one ElevenLabs or carrier-framed connection to its close, checking each message."""

    def __init__(self, ws: ClientConnection, report: Report, surface: str) -> None:
        self.ws, self.report, self.surface = ws, report, surface
        self.closes: set[int | None] = {1000}  # close codes that may end it (an error says it is coming)
        self.marks: list[str] = []  # carrier marks received, to echo back
        self.audio_bytes = 0
        self.close_code: int | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for item in self.ws:
                if isinstance(item, bytes):
                    self.audio_bytes += len(item)
                    continue
                self._check(json.loads(item))
        except ConnectionClosed as closed:
            self.close_code = _close_code(closed)
        else:
            close = self.ws.protocol.close_rcvd
            self.close_code = close.code if close is not None else None

    def _check(self, message: dict[str, Any]) -> None:
        report = self.report
        if self.surface.startswith("elevenlabs"):
            if "audio" in message:
                audio = base64.b64decode(message["audio"] or "", validate=True)
                self.audio_bytes += len(audio)
                alignment = message.get("alignment") or {}
                lengths = {
                    len(alignment.get(k) or []) for k in ("chars", "charStartTimesMs", "charDurationsMs")
                }
                if len(lengths) > 1:
                    report.bad_alignments += 1
            elif "message" in message or "error" in message:
                # ``error``: its code; ``code``: the close code of a fatal one (the close follows).
                code, close = message.get("error"), message.get("code")
                if not isinstance(code, str) or not code or not isinstance(close, int | None):
                    report.errors_without_code += 1
                bump(report.error_codes, f"{self.surface}:{code}/{close}")
                if code == "internal_error" or close == 1011:
                    report.internal_errors += 1
                if isinstance(close, int):
                    self.closes.add(close)
            return
        event, kind = message.get("event"), message.get("type")
        if event == "media":
            self.audio_bytes += len(base64.b64decode(message["media"]["payload"], validate=True))
        elif event == "mark":
            self.marks.append(message["mark"]["name"])
        elif kind == "error":
            code = message.get("code")
            if not isinstance(code, str):
                report.errors_without_code += 1
            bump(report.error_codes, f"{self.surface}:{code}")
            if code == "internal_error":
                report.internal_errors += 1
            if message.get("fatal") and isinstance(code, str) and code in set(ErrorCode):
                self.closes.add(int(FAILURES[ErrorCode(code)].close_code))

    async def closed(self, limit_s: float) -> int | None:
        """The close code, once the server closed (a Hang past ``limit_s``)."""
        try:
            await asyncio.wait_for(asyncio.shield(self.task), limit_s)
        except TimeoutError:
            raise Hang("no close in time") from None
        return self.close_code


async def _send(client: Client, data: str | bytes, text: bool, reader: Reader) -> None:
    if reader.task.done():
        raise ConnectionClosed(None, None)
    if isinstance(data, bytes) and text or len(data) > WS_MAX_SIZE:
        reader.closes.update({1007, 1009, None})  # uvicorn: invalid UTF-8, frame too large
    await client.send(data, text)


def _budget(budget: list[int], n: int = 1) -> bool:
    if budget[0] <= 0:
        return False
    budget[0] -= n
    return True


async def run_surface(
    index: int,
    surface: str,
    rng: random.Random,
    args: argparse.Namespace,
    report: Report,
    budget: list[int],
    tour: Tour | None = None,
) -> None:
    """One connection of an ElevenLabs or phone-carrier surface: its scenario drawn from ``rng``, or the
    ``tour`` of one hostile message between valid ones."""
    elevenlabs = surface.startswith("elevenlabs")
    # "hostile": any hostile message (the server may close); "unfatal": only those a session survives, so
    # it must end with the graceful close; "flood": flushes or clears as fast as they go.
    scenarios, weights = ["hostile", "unfatal", "flood", "abrupt", "bad_open"], [55, 25, 8, 6, 6]
    scenario = "tour" if tour is not None else rng.choices(scenarios, weights)[0]
    bump(report.surfaces, surface)
    name = f"{surface}:{scenario}"
    bump(report.scenarios, name)
    base = args.url.split("/v1/")[0]
    sid = f"MZ{index:032x}"
    query = f"?output_format={rng.choice(_EL_FORMATS)}"
    if elevenlabs and scenario == "bad_open":
        voice, query = rng.choice(
            [
                (args.voice, "?output_format=mp9"),
                (args.voice, "?inactivity_timeout=0"),
                (args.voice, "?inactivity_timeout=99999999999999999999"),
                (args.voice, "?seed=x&output_format=pcm_16000"),
                ("no-such-voice", query),
                ("%1b%5b31m" + "v" * 3000, query),
            ]
        )
    else:
        voice = args.voice
    url = base + (ELEVENLABS_PATHS[surface].format(voice=voice) + query if elevenlabs else PATH)
    try:
        async with connect(
            url,
            subprotocols=None if elevenlabs else [Subprotocol(EXTENSIONS_SUBPROTOCOL)],
            compression="deflate" if rng.random() < 0.5 else None,
            max_size=None,
            open_timeout=args.timeout,
        ) as ws:
            report.connections += 1
            client = Client(ws, report, args.timeout, True)
            reader = Reader(ws, report, surface)
            try:
                try:
                    if tour is not None:
                        await _tour(client, reader, rng, tour, sid)
                    elif elevenlabs:
                        await _elevenlabs(
                            client, reader, rng, scenario, surface == "elevenlabs_multi", budget
                        )
                    else:
                        await _carrier(client, reader, rng, scenario, surface, sid, budget)
                except ConnectionClosed:
                    pass  # the server closed under a send: the reader has the close code
                if scenario == "abrupt":
                    ws.transport.abort()  # no close frame: the server must notice on its own
                    with contextlib.suppress(Hang):
                        await reader.closed(args.timeout)
                    return
                code = await reader.closed(args.timeout)
                bump(report.close_codes, f"{name}:{code}")
                if code == 1011:
                    report.internal_errors += 1
                if code not in reader.closes:
                    report.unexpected_closes += 1
                    if len(report.unexpected_samples) < 10:
                        report.unexpected_samples.append(f"conn {index} ({name}): close {code}")
            except Hang as hang:
                report.hangs += 1
                if len(report.hang_samples) < 10:
                    report.hang_samples.append(f"conn {index} ({name}): {hang}")
            finally:
                reader.task.cancel()
                await asyncio.gather(reader.task, return_exceptions=True)
    except InvalidHandshake:
        report.refused_handshakes += 1
    except OSError as exc:  # the connection reset while sending an oversize frame
        bump(report.close_codes, f"{surface}:reset: {type(exc).__name__}")


async def _tour(client: Client, reader: Reader, rng: random.Random, tour: Tour, sid: str) -> None:
    """Open, send the tour's hostile message, then say something and end well."""
    surface, kind, variant = tour
    bump(client.report.kinds, f"{surface}:tour:{kind}")
    before: list[dict[str, Any]]
    after: list[dict[str, Any]]
    if surface.startswith("elevenlabs"):
        context = {"context_id": "c0"} if surface == "elevenlabs_multi" else {}
        data: str | bytes = _el_variants(kind, bool(context), rng)[variant]
        before = [{"text": " ", **context}]
        after = [{"text": "Hello there. ", "flush": True, **context}]
        after.append({"close_socket": True} if context else {"text": ""})
    else:
        data = _carrier_variants(kind, sid)[variant]
        config = {"type": "session.config", "framing": surface, "stream_sid": sid}
        before = [config]
        after = [
            {"type": "input.text", "text": "Hello there. "},
            {"type": "input.done"},
            {"type": "session.close"},
        ]
    for message in before:
        await _send(client, json.dumps(message), True, reader)
    await _send(client, data, not isinstance(data, bytes) or kind == "invalid_utf8", reader)
    for message in after:
        await _send(client, json.dumps(message), True, reader)


async def _elevenlabs(
    client: Client, reader: Reader, rng: random.Random, scenario: str, multi: bool, budget: list[int]
) -> None:
    context = {"context_id": "c0"} if multi else {}
    flood = rng.choice(["flush", "refused"]) if scenario == "flood" else None
    if flood == "refused":
        # A refused first message (its speed) again and again, by a client that reads nothing meanwhile.
        n = min(rng.randint(200, 2000), max(0, budget[0]))
        budget[0] -= n
        bump(client.report.kinds, "elevenlabs:refused_flood")
        client.ws.transport.pause_reading()
        try:
            for _ in range(n):
                await _send(
                    client,
                    json.dumps({"text": " ", "voice_settings": {"speed": 99}, **context}),
                    True,
                    reader,
                )
        finally:
            client.ws.transport.resume_reading()
    budget[0] -= 1  # the opening message goes whatever the budget: the connection must end well
    await _send(client, json.dumps({"text": " ", "voice_settings": {"speed": 1.0}, **context}), True, reader)
    match scenario:
        case "flood" if flood == "flush":  # flushes (on multi, close_context too) as fast as they go
            n = min(rng.randint(200, 2000), max(0, budget[0]))
            budget[0] -= n
            bump(client.report.kinds, "elevenlabs:flush_flood")
            for i in range(n):
                message: dict[str, Any] = {"flush": True, **context}
                if i % 10 == 0:
                    message["text"] = "Hello there. "
                if multi and i % 50 == 49:
                    message = {"close_context": True, "context_id": f"c{i % 3}"}
                await _send(client, json.dumps(message), True, reader)
        case "flood":
            pass
        case _:
            for _ in range(rng.randint(5, 40) if scenario in ("hostile", "unfatal") else 3):
                if not _budget(budget):
                    break
                if rng.random() < 0.3:
                    bump(client.report.kinds, "elevenlabs:valid")
                    await _send(client, json.dumps(_el_valid(rng, multi)), True, reader)
                    continue
                kind, data, text = _el_hostile(rng, multi, fatal=scenario != "unfatal")
                bump(client.report.kinds, f"elevenlabs:{kind}")
                await _send(client, data, text, reader)
    if scenario != "abrupt":
        await _send(client, json.dumps({"close_socket": True} if multi else {"text": ""}), True, reader)


async def _carrier(
    client: Client,
    reader: Reader,
    rng: random.Random,
    scenario: str,
    surface: str,
    sid: str,
    budget: list[int],
) -> None:
    config: dict[str, Any] = {"type": "session.config", "framing": surface, "stream_sid": sid}
    if surface == "telnyx" and rng.random() < 0.5:
        del config["stream_sid"]
    if scenario == "bad_open":  # a hostile first config: refused, and the session must still close well
        config = rng.choice(_bad_framing(sid))
        bump(client.report.kinds, f"{surface}:bad_open")
    budget[0] -= 1  # the opening message goes whatever the budget: the connection must end well
    await _send(client, json.dumps(config), True, reader)

    async def echo_marks() -> None:  # the carrier echoes the marks it played
        while reader.marks:
            name = reader.marks.pop(0)
            await _send(
                client, json.dumps({"event": "mark", "streamSid": sid, "mark": {"name": name}}), True, reader
            )

    match scenario:
        case "flood":  # barge-ins as fast as they go, while audio streams
            n = min(rng.randint(200, 2000), max(0, budget[0]))
            budget[0] -= n
            bump(client.report.kinds, f"{surface}:clear_flood")
            for i in range(n):
                if i % 20 == 0:
                    await _send(
                        client, json.dumps({"type": "input.text", "text": "Hello there. "}), True, reader
                    )
                    await _send(client, '{"type": "input.done"}', True, reader)
                await _send(client, json.dumps({"event": "clear", "streamSid": sid}), True, reader)
        case _:
            for _ in range(rng.randint(5, 40) if scenario in ("hostile", "unfatal") else 3):
                if not _budget(budget):
                    break
                await echo_marks()
                if rng.random() < 0.3:
                    kind, message = valid(rng)
                    if kind == "session.config":
                        kind, message = "clear", {"event": "clear", "streamSid": sid}
                    bump(client.report.kinds, f"{surface}:valid:{kind}")
                    await _send(client, json.dumps(message), True, reader)
                    continue
                kind, data, text = _carrier_hostile(rng, sid)
                bump(client.report.kinds, f"{surface}:{kind}")
                await _send(client, data, text, reader)
    if scenario != "abrupt":
        await _send(client, '{"type": "input.done"}', True, reader)
        await _send(client, '{"type": "session.close"}', True, reader)


Tour = tuple[str, str, int]  # a surface, a hostile kind of it, and one of that kind's messages


def tours(surfaces: list[str]) -> list[Tour]:
    """Every hostile message of the ElevenLabs and carrier surfaces, each on a connection of its own."""
    probe = random.Random(0)  # only counts the messages of each kind
    plan: list[Tour] = []
    for surface in surfaces:
        if surface.startswith("elevenlabs"):
            for kind in (*EL_FATAL, *EL_UNFATAL):
                n = len(_el_variants(kind, surface == "elevenlabs_multi", probe))
                plan += [(surface, kind, v) for v in range(n)]
        elif surface in ("twilio", "telnyx"):
            plan += [
                (surface, kind, v) for kind in CARRIER_KINDS for v in range(len(_carrier_variants(kind, "")))
            ]
    return plan


async def fuzz(args: argparse.Namespace, report: Report) -> None:
    budget = [args.messages]
    planned = tours(args.surfaces) if args.tour else []
    queue: asyncio.Queue[int | None] = asyncio.Queue()
    next_index = 0

    async def worker() -> None:
        while (index := await queue.get()) is not None:
            # A connection closed by the server leaves some of what it took from the budget unsent.
            budget[0] = max(budget[0], args.messages - report.messages)
            try:
                if index < len(planned):
                    surface = planned[index][0]
                    await run_surface(
                        index, surface, random.Random(index), args, report, budget, planned[index]
                    )
                else:
                    await run_connection(index - len(planned), args, report, budget)
            except Exception as exc:  # a bug of this script: shown, and the run fails
                bump(report.fuzz_failures, f"conn {index}: {type(exc).__name__}: {exc}"[:200])

    # The tour first, then random connections until the messages are sent. Indices are handed out in
    # order; the scenario of each depends only on the seed and its index.
    workers = [asyncio.create_task(worker()) for _ in range(args.concurrency)]
    while not all(w.done() for w in workers):
        if next_index >= len(planned) and report.messages >= args.messages:
            break
        while queue.qsize() < args.concurrency:
            queue.put_nowait(next_index)
            next_index += 1
        await asyncio.sleep(0.01)
    for _ in workers:
        queue.put_nowait(None)
    # The connections in flight end as they would (their budget spent, each closes): only a stuck one is cut.
    await asyncio.wait(workers, timeout=args.timeout * 2)
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)


def _rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB (Linux /proc: a small read, not worth a thread)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return round(int(next(x for x in status if x.startswith("VmRSS:")).split()[1]) / 1024, 1)


async def _sample_rss(pid: int, out: dict[str, float], every_s: float = 0.25) -> None:
    """The server's resident memory in MB, as it was at the start, at most, and last."""
    while True:
        with contextlib.suppress(OSError, ValueError, StopIteration):
            rss_mb = _rss_mb(pid)
            out.setdefault("start", rss_mb)
            out["max"], out["end"] = max(out.get("max", 0.0), rss_mb), rss_mb
        await asyncio.sleep(every_s)


async def main_async(args: argparse.Namespace) -> int:
    report = Report()
    started = time.monotonic()
    log_path = Path(args.log or f"/tmp/ws_fuzz-{os.getpid()}.log")
    server: Server | None = None
    async with contextlib.AsyncExitStack() as stack:
        if args.url is None:
            flags = ["--engine", "fake", "--send-timeout-s", str(SEND_TIMEOUT_S), "--log-level", "info"]
            env = {"VOXGATE_MAX_CONFIG_BYTES": str(MAX_CONFIG_BYTES)}
            server = stack.enter_context(gateway(*flags, env=env, log=log_path))
            args.url = server.url(PATH, "ws")
            sampler = asyncio.create_task(_sample_rss(server.pid, report.server_rss_mb))
        await fuzz(args, report)
        await asyncio.sleep(1.0)  # let the server log what the last connections did
        if server is not None:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
        if server is not None and server.proc.poll() is not None:
            report.crashes += 1
    if server is not None:
        report.traceback_kinds = server.tracebacks()
        report.tracebacks = sum(report.traceback_kinds.values())
        for _, line in server.lines():
            report.log_lines += 1
            report.log_bytes += len(line.encode(errors="replace")) + 1
            if _CONTROLS.search(line):
                report.log_control_lines += 1
                if len(report.log_control_samples) < 5:
                    report.log_control_samples.append(ascii(line[:200]))
    summary = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "seed": args.seed,
        "elapsed_s": round(time.monotonic() - started, 1),
        "server_log": str(log_path) if server is not None else None,
        "load_avg": os.getloadavg(),
        **asdict(report),
    }
    write_json(summary, args.json)
    print(json.dumps(summary, indent=1))
    bad = report.crashes + report.tracebacks + report.hangs + report.errors_without_code
    bad += (
        report.internal_errors + report.unexpected_closes + report.bad_alignments + report.log_control_lines
    )
    if report.messages < args.messages:
        print(f"ws_fuzz: only {report.messages} of {args.messages} messages were sent", file=sys.stderr)
        bad += 1
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--messages", type=int, default=20_000, help="hostile and valid messages to send")
    parser.add_argument("--concurrency", type=int, default=32, help="connections at once")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for an answer or close")
    parser.add_argument("--url", help="fuzz this server instead of starting one (its log is not searched)")
    parser.add_argument("--json", help="write the summary here too")
    parser.add_argument("--log", help="the started server's log file")
    parser.add_argument(
        "--surfaces",
        default=",".join(SURFACES),
        help=f"comma-separated surfaces each connection draws one of (default: all of {', '.join(SURFACES)})",
    )
    parser.add_argument(
        "--tour",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first, every hostile message of the ElevenLabs and carrier surfaces on a connection of its own",
    )
    parser.add_argument(
        "--voice", default="tone", help="the voice of the ElevenLabs paths (the fake engine's)"
    )
    args = parser.parse_args(argv)
    args.surfaces = [name for name in args.surfaces.split(",") if name]
    if unknown := set(args.surfaces) - set(SURFACES):
        parser.error(f"unknown surfaces {sorted(unknown)}: choose from {', '.join(SURFACES)}")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
