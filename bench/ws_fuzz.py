"""WebSocket fuzz: seeded hostile messages against a real gateway; crashes, tracebacks and hangs must be 0.

    .venv/bin/python bench/ws_fuzz.py                       # 20,000 messages, seed 1, own server
    .venv/bin/python bench/ws_fuzz.py --seed 7 --messages 50000 --json fuzz.json
    .venv/bin/python bench/ws_fuzz.py --url ws://127.0.0.1:8000/v1/audio/speech/stream

The server, the scenarios, the hostile messages and what is counted: docs/performance.md ("ws_fuzz.py").
Prints a JSON summary; exit status 1 when crashes, tracebacks, hangs, errors_without_code, internal_errors
or unexpected_closes is not 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _client import PATH
from _serve import Server, gateway
from _stats import write_json
from voxgate.protocol.dialect import EXTENSIONS_SUBPROTOCOL
from voxgate.protocol.errors import FAILURES, ErrorCode
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.typing import Subprotocol

MAX_CONFIG_BYTES = 64 * 1024  # of the server this script starts
MAX_MESSAGE_BYTES = 128 * 1024  # the default
WS_MAX_SIZE = MAX_CONFIG_BYTES + 1024 * 1024  # uvicorn's frame limit as voxgate serve sets it
SEND_TIMEOUT_S = 2.0


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
    refused_handshakes: int = 0
    traceback_kinds: dict[str, int] = field(default_factory=dict)
    error_codes: dict[str, int] = field(default_factory=dict)
    close_codes: dict[str, int] = field(default_factory=dict)
    scenarios: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    hang_samples: list[str] = field(default_factory=list)
    unexpected_samples: list[str] = field(default_factory=list)


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

    async def until(self, kind: str) -> dict[str, Any]:
        while True:
            item = await self.recv()
            if isinstance(item, dict) and item.get("type") == kind:
                return item

    async def send(self, data: str | bytes, text: bool) -> None:
        self.report.messages += 1
        await self.ws.send(data, text=text)


def _close_code(exc: ConnectionClosed) -> int | None:
    return exc.rcvd.code if exc.rcvd is not None else None


async def run_connection(index: int, args: argparse.Namespace, report: Report, budget: list[int]) -> None:
    rng = random.Random(args.seed * 1_000_003 + index)
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


async def fuzz(args: argparse.Namespace, report: Report) -> None:
    budget = [args.messages]
    queue: asyncio.Queue[int] = asyncio.Queue()
    next_index = 0

    async def worker() -> None:
        while budget[0] > 0:
            index = await queue.get()
            await run_connection(index, args, report, budget)

    # Indices are handed out in order; the scenario of each depends only on the seed and its index.
    workers = [asyncio.create_task(worker()) for _ in range(args.concurrency)]
    while budget[0] > 0 and not all(w.done() for w in workers):
        while queue.qsize() < args.concurrency:
            queue.put_nowait(next_index)
            next_index += 1
        await asyncio.sleep(0.01)
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)


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
        await fuzz(args, report)
        await asyncio.sleep(1.0)  # let the server log what the last connections did
        if server is not None and server.proc.poll() is not None:
            report.crashes += 1
    if server is not None:
        report.traceback_kinds = server.tracebacks()
        report.tracebacks = sum(report.traceback_kinds.values())
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
    bad += report.internal_errors + report.unexpected_closes
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
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
