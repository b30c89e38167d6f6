"""Soak test: N WebSocket sessions stream text into a real gateway for T minutes while the server's RSS,
open file descriptors and threads are sampled from /proc.

    .venv/bin/python bench/soak.py --engine fake --sessions 200 --minutes 30 --json soak-fake.json
    .venv/bin/python bench/soak.py --engine piper --sessions 4 --minutes 30 --json soak-piper.json

Sessions take the surfaces in turn (``--surfaces``, default the three sockets): the voxgate session socket,
ElevenLabs' ``multi-stream-input`` (a context per utterance) and a Twilio-framed session (marks echoed, one
utterance in ten cleared by a barge-in); ``batch`` (opt in) posts small batches to
``POST /v1/audio/speech/batch`` (2-6 items, mixed formats, one request in five dropped after its first
bytes), every item of which must succeed. What it does and reports: docs/performance.md ("soak.py").
Exit status 1 when the server died, a session got an ``error`` or an unexpected close, or the server logged
a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from _client import PATH, SessionRefused, open_session, speak
from _serve import gateway
from _text import tokenize
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

SENTENCES = (
    "The gateway turns a stream of words into speech while the model is still writing.",
    "Short pauses between sentences sound natural to the listener.",
    "A soak test runs for a long time to find what slowly leaks.",
    "Memory, file handles and threads should stay flat once it is warm.",
)
#: Bound on any wait for the server (a reply, a close): past it the session counts a hang.
REPLY_TIMEOUT_S = 120.0
# The pause between text pieces: an LLM's pace.
TOKEN_DELAY_S = 0.02
SURFACES = ("voxgate", "elevenlabs", "twilio")
#: Surfaces a soak may take besides the default ones.
OPT_IN = ("batch",)
BATCH_PATH = "/v1/audio/speech/batch"
BATCH_FORMATS = ("wav", "pcm", "flac", "mp3", "opus")
ELEVENLABS_PATH = "/v1/text-to-speech/{voice}/multi-stream-input"
# The voice each engine speaks on the ElevenLabs path (which names it).
VOICES = {"fake": "tone", "piper": "joe"}


@dataclass
class Counters:
    utterances: int = 0
    connections: int = 0
    audio_bytes: int = 0
    audio_s: float = 0.0
    errors: int = 0
    unexpected_closes: int = 0
    hangs: int = 0
    refused: int = 0
    error_codes: dict[str, int] = field(default_factory=dict)
    by_surface: dict[str, int] = field(default_factory=dict)  # utterances of each surface
    barge_ins: int = 0  # carrier clears sent mid-utterance
    positions: int = 0  # playback.position answers to echoed marks


def sample(pid: int, t_s: float) -> dict[str, float]:
    """RSS in MB, open fds and threads of ``pid`` (Linux /proc), at ``t_s`` into the run."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    rss_mb = round(int(status["VmRSS"].split()[0]) / 1024, 2)
    return {
        "t_s": round(t_s, 2),
        "rss_mb": rss_mb,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(status["Threads"]),
    }


def slope_per_min(samples: list[dict[str, float]], after_s: float) -> float | None:
    """Least-squares slope of RSS (MB per minute) over the samples taken after ``after_s``."""
    points = [(s["t_s"] / 60, s["rss_mb"]) for s in samples if s["t_s"] >= after_s]
    if len(points) < 3:
        return None
    x, y = np.array(points).T
    return float(np.polyfit(x, y, 1)[0])


async def run_session(index: int, ws_url: str, stop_at: float, every: int, counters: Counters) -> None:
    """A voxgate-protocol session, reconnecting every ``every`` utterances until ``stop_at``."""
    rng = random.Random(index)
    await asyncio.sleep(rng.uniform(0, 2.0))  # spread the connects
    while time.monotonic() < stop_at:
        try:
            ws, ready = await open_session(ws_url, timeout_s=REPLY_TIMEOUT_S)
            async with ws:
                counters.connections += 1
                rate = int(ready.get("config", {}).get("sample_rate", 24000))
                for _ in range(every):
                    if time.monotonic() >= stop_at or not await utterance(ws, rng, counters, rate):
                        break
        except SessionRefused:
            counters.errors += 1
            return
        except InvalidHandshake:
            counters.refused += 1
            await asyncio.sleep(1.0)
        except TimeoutError:
            counters.hangs += 1
        except (ConnectionClosed, OSError):
            counters.unexpected_closes += 1
            await asyncio.sleep(0.5)


async def utterance(ws: ClientConnection, rng: random.Random, counters: Counters, rate: int) -> bool:
    """One sentence in pieces of 2-5 characters; False when the connection closed under it."""
    tokens = tokenize(rng.choice(SENTENCES), rng.randrange(1 << 30))
    turn = await speak(ws, tokens, TOKEN_DELAY_S, timeout_s=REPLY_TIMEOUT_S)
    counters.audio_bytes += turn.bytes
    counters.audio_s += turn.bytes / 2 / rate  # pcm16 mono
    if turn.t_done is not None:
        bump(counters.by_surface, "voxgate")
    for error in turn.errors:
        counters.errors += 1
        code = str(error.get("code"))
        counters.error_codes[code] = counters.error_codes.get(code, 0) + 1
    if turn.t_done is not None:
        counters.utterances += 1
    if turn.closed:
        counters.unexpected_closes += 1
        await asyncio.sleep(0.5)
    return not turn.closed


# -- the ElevenLabs and phone-carrier surfaces ------------------------------------------------------------


async def run_surface(
    index: int, surface: str, base: str, voice: str, stop_at: float, every: int, counters: Counters
) -> None:
    """An ElevenLabs ``multi-stream-input`` socket (a context per utterance) or a Twilio-framed session
    (marks echoed as the carrier does, one utterance in ten cleared by a barge-in), reconnecting every
    ``every`` utterances until ``stop_at``."""
    rng = random.Random(index)
    await asyncio.sleep(rng.uniform(0, 2.0))
    while time.monotonic() < stop_at:
        try:
            if surface == "elevenlabs":
                url = f"{base}{ELEVENLABS_PATH.format(voice=voice)}?output_format=pcm_16000"
                ws = await connect(url, max_size=None, open_timeout=REPLY_TIMEOUT_S, ping_interval=None)
            else:
                sid = f"MZsoak{index:026x}"
                config = {"framing": "twilio", "stream_sid": sid}
                ws, _ = await open_session(f"{base}{PATH}", config, timeout_s=REPLY_TIMEOUT_S)
            async with ws:
                counters.connections += 1
                for n in range(every):
                    if time.monotonic() >= stop_at:
                        break
                    async with asyncio.timeout(REPLY_TIMEOUT_S):
                        if surface == "elevenlabs":
                            await elevenlabs_utterance(ws, rng, counters, f"u{n}", first=n == 0)
                        else:
                            await carrier_utterance(ws, rng, counters, sid)
                    counters.utterances += 1
                    bump(counters.by_surface, surface)
        except SessionRefused:
            counters.errors += 1
            return
        except InvalidHandshake:
            counters.refused += 1
            await asyncio.sleep(1.0)
        except TimeoutError:
            counters.hangs += 1
        except (ConnectionClosed, OSError):
            counters.unexpected_closes += 1
            await asyncio.sleep(0.5)


async def run_batches(index: int, base: str, stop_at: float, counters: Counters) -> None:
    """Small batches to ``POST /v1/audio/speech/batch`` until ``stop_at``: every item must come back whole;
    one request in five is dropped after its first bytes (the server stops its work and frees its place)."""
    rng = random.Random(index)
    await asyncio.sleep(rng.uniform(0, 2.0))
    async with httpx.AsyncClient(timeout=REPLY_TIMEOUT_S) as client:
        while time.monotonic() < stop_at:
            items = [{"input": rng.choice(SENTENCES)} for _ in range(rng.randint(2, 6))]
            body = {"items": items, "response_format": rng.choice(BATCH_FORMATS)}
            try:
                async with client.stream("POST", f"{base}{BATCH_PATH}", json=body) as response:
                    counters.connections += 1
                    if response.status_code != 200:
                        _error(counters, f"http {response.status_code}")
                        continue
                    if rng.random() < 0.2:  # a client that goes away after the first bytes
                        async for _ in response.aiter_raw():
                            break
                        bump(counters.by_surface, "batch_abandoned")
                        continue
                    answer = json.loads(await response.aread())
                if answer["succeeded"] != len(items):
                    _error(counters, "batch item failed")
                for result in answer["results"]:
                    counters.audio_bytes += len(result.get("audio_data") or "") * 3 // 4
                counters.utterances += len(items)
                bump(counters.by_surface, "batch")
            except httpx.TimeoutException:
                counters.hangs += 1
            except (httpx.HTTPError, OSError, ValueError, KeyError):
                counters.unexpected_closes += 1
                await asyncio.sleep(0.5)


def bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def _error(counters: Counters, code: object) -> None:
    counters.errors += 1
    bump(counters.error_codes, str(code))


async def elevenlabs_utterance(
    ws: ClientConnection, rng: random.Random, counters: Counters, context: str, *, first: bool
) -> None:
    """One sentence into its own context at an LLM's pace, flushed and closed; read to its ``isFinal``."""
    opening: dict[str, Any] = {"text": " ", "context_id": context}
    if first:
        opening["voice_settings"] = {"stability": 0.5, "similarity_boost": 0.8, "speed": 1.0}
    await ws.send(json.dumps(opening))
    for token in tokenize(rng.choice(SENTENCES), rng.randrange(1 << 30)):
        await ws.send(json.dumps({"text": token, "context_id": context, "try_trigger_generation": True}))
        await asyncio.sleep(TOKEN_DELAY_S)
    await ws.send(json.dumps({"context_id": context, "flush": True}))
    await ws.send(json.dumps({"context_id": context, "close_context": True}))
    while True:
        message = json.loads(await ws.recv())
        if message.get("audio"):
            audio = base64.b64decode(message["audio"])
            counters.audio_bytes += len(audio)
            counters.audio_s += len(audio) / 2 / 16000  # pcm_16000
        elif "error" in message:
            _error(counters, f"elevenlabs:{message['error']}")
        if message.get("isFinal") and message.get("contextId") == context:
            return


async def carrier_utterance(ws: ClientConnection, rng: random.Random, counters: Counters, sid: str) -> None:
    """One sentence at an LLM's pace on a Twilio-framed session, read to its ``session.done`` (or, for a
    barge-in, to the ``audio.cancelled`` of the carrier's ``clear`` sent on its first audio)."""
    barge_in = rng.random() < 0.1
    for token in tokenize(rng.choice(SENTENCES), rng.randrange(1 << 30)):
        await ws.send(json.dumps({"type": "input.text", "text": token}))
        await asyncio.sleep(TOKEN_DELAY_S)
    await ws.send('{"type": "input.done"}')
    cleared = False
    while True:
        message = json.loads(await ws.recv())
        event, kind = message.get("event"), message.get("type")
        if event == "media":
            audio = base64.b64decode(message["media"]["payload"])
            counters.audio_bytes += len(audio)
            counters.audio_s += len(audio) / 8000  # mu-law at 8 kHz
            if barge_in and not cleared:
                await ws.send(json.dumps({"event": "clear", "streamSid": sid}))
                cleared = True
                counters.barge_ins += 1
        elif event == "mark":  # played at once: the carrier echoes it
            echo = {"event": "mark", "streamSid": sid, "mark": message["mark"]}
            await ws.send(json.dumps(echo))
        elif kind == "playback.position":
            counters.positions += 1
        elif kind == "error":
            _error(counters, message.get("code"))
            if message.get("fatal"):
                return
        if kind == "session.done" or (kind == "audio.cancelled" and cleared):
            return


async def sample_loop(
    pid: int, start: float, stop_at: float, every_s: float, out: list[dict[str, float]]
) -> None:
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError):
            out.append(sample(pid, time.monotonic() - start))
        if time.monotonic() >= stop_at:
            return
        await asyncio.sleep(min(every_s, max(0.0, stop_at - time.monotonic())))


async def main_async(args: argparse.Namespace) -> int:
    out = Path(args.json) if args.json else None
    log_path = Path(args.log or (f"{out}.server.log" if out else f"/tmp/soak-{os.getpid()}.log"))
    flags = [
        "--engine",
        args.engine,
        "--max-sessions",
        str(max(512, args.sessions * 2)),
        "--log-level",
        "warning",
    ]
    if args.engine == "fake":
        flags += ["--fake-delay-s", str(args.fake_delay_s)]
    counters, samples = Counters(), list[dict[str, float]]()
    with gateway(*flags, log=log_path) as server:
        start = time.monotonic()
        stop_at = start + args.minutes * 60
        sampler = asyncio.create_task(sample_loop(server.pid, start, stop_at, args.sample_s, samples))
        url, every = server.url(PATH, "ws"), args.reconnect_every
        base, voice = server.url("", "ws"), VOICES.get(args.engine, args.engine)

        def session(i: int) -> Coroutine[Any, Any, None]:
            surface = args.surfaces[i % len(args.surfaces)]
            if surface == "voxgate":
                return run_session(i, url, stop_at, every, counters)
            if surface == "batch":
                return run_batches(i, server.url(""), stop_at, counters)
            return run_surface(i, surface, base, voice, stop_at, every, counters)

        await asyncio.gather(*(session(i) for i in range(args.sessions)))
        await sampler
        closed: dict[str, float] = {}
        with contextlib.suppress(
            OSError, ValueError, KeyError
        ):  # after every session closed: not in the slope
            closed = sample(server.pid, time.monotonic() - start)
        alive = server.proc.poll() is None
    warm_s = args.warmup_min * 60
    slope = slope_per_min(samples, warm_s)
    after = [s for s in samples if s["t_s"] >= warm_s] or samples

    def span(key: str) -> dict[str, float | None]:
        first, last = (samples[0][key], samples[-1][key]) if samples else (None, None)
        most = max((s[key] for s in samples), default=None)
        return {"start": first, "end": last, "after_close": closed.get(key), "max": most}

    summary: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "engine": args.engine,
        "sessions": args.sessions,
        "minutes": args.minutes,
        "warmup_min": args.warmup_min,
        "server_alive_at_end": alive,
        "server_tracebacks": sum(server.tracebacks().values()),
        "rss_mb": span("rss_mb")
        | {
            "after_warmup": after[0]["rss_mb"] if after else None,
            "slope_mb_per_min_after_warmup": None if slope is None else round(slope, 4),
            "slope_mb_per_hour_after_warmup": None if slope is None else round(slope * 60, 2),
        },
        "fds": span("fds"),
        "threads": span("threads"),
        **asdict(counters),
        "audio_hours": round(counters.audio_s / 3600, 2),
        "load_avg": os.getloadavg(),
    }
    if out:
        out.write_text(json.dumps({"summary": summary, "samples": samples}, indent=1))
    print(json.dumps(summary, indent=1))
    failed = counters.errors or counters.unexpected_closes or counters.hangs or summary["server_tracebacks"]
    return 1 if failed or not alive else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", default="fake", help="engine of the server: fake (default) or piper")
    parser.add_argument("--sessions", type=int, default=50, help="concurrent sessions")
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the sessions stream")
    parser.add_argument("--warmup-min", type=float, default=None, help="minutes left out of the slope")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between /proc samples")
    parser.add_argument("--reconnect-every", type=int, default=20, help="utterances per connection")
    parser.add_argument("--fake-delay-s", type=float, default=0.25, help="fake engine's pace per 250 ms")
    parser.add_argument(
        "--surfaces",
        default=",".join(SURFACES),
        help="comma-separated surfaces the sessions take in turn: voxgate (the session socket), elevenlabs "
        "(multi-stream-input, a context per utterance), twilio (the session socket with carrier framing), "
        "batch (small batches on the REST batch route; not in the default)",
    )
    parser.add_argument("--json", help="write samples and summary here")
    parser.add_argument("--log", help="server log file (default: next to --json)")
    args = parser.parse_args(argv)
    args.surfaces = [name for name in args.surfaces.split(",") if name]
    if unknown := set(args.surfaces) - set(SURFACES) - set(OPT_IN):
        parser.error(f"unknown surfaces {sorted(unknown)}: choose from {', '.join(SURFACES + OPT_IN)}")
    if args.warmup_min is None:
        args.warmup_min = min(5.0, args.minutes / 3)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
