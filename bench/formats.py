"""Audio formats: time to first byte, bytes per audio second and server CPU per audio second, per format.

Starts ``voxgate serve --engine piper`` (``bench/_serve.py``) and, round after round with the order turning,
asks for the same three sentences (seeded: noise-free, so every format encodes the same audio) through
``POST /v1/audio/speech`` in each of pcm wav mp3 opus aac flac, as a body and as SSE deltas
(``stream_format: "sse"``), and through the WebSocket ``/v1/audio/speech/stream`` in pcm and opus. Per
format: request sent (WebSocket: the text sent) -> first body byte, first SSE delta or first binary frame;
bytes per second of audio (the audio decoded with PyAV, on the WebSocket ``session.done.audio_ms``); the
server's CPU seconds (``/proc``, over that format's requests, Piper included) per second of audio. A format
the server refuses is reported as refused. Targets: each compressed format's first byte at most 1.2x pcm's
on the same surface, opus at most 1/8 of pcm's bytes per second.

    .venv/bin/python bench/formats.py [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import sys
import time
from typing import Any

import av
import httpx
from _client import PATH, SessionRefused, open_session, speak
from _serve import Server, gateway
from _stats import pct, rotated, uptime_line, write_json
from websockets.exceptions import ConnectionClosed

TEXT = (
    "The gateway turns a stream of words into speech while the model is still writing its answer. "
    "Each sentence is spoken as soon as it ends. Compressed audio should cost little and arrive as soon."
)
REST_FORMATS = ("pcm", "wav", "mp3", "opus", "aac", "flac")
WS_FORMATS = ("pcm", "opus")
VOICE, SEED = "joe", 1  # a seed: Piper noise-free, so every request speaks the same audio
# Issue 17's targets: compression may cost at most a fifth more wait for the first byte, and must pay off.
FIRST_BYTE_TARGET, OPUS_BYTES_TARGET = 1.2, 1 / 8


def audio_s(fmt: str, data: bytes, rate: int) -> float:
    """Seconds of audio in ``data``: raw s16le for pcm, else whatever PyAV decodes from it."""
    if fmt == "pcm":
        return len(data) / 2 / rate
    with av.open(io.BytesIO(data), "r") as container:
        return float(sum(frame.samples / frame.sample_rate for frame in container.decode(audio=0)))


async def rest(client: httpx.AsyncClient, fmt: str, sse: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "tts-1",
        "input": TEXT,
        "voice": VOICE,
        "response_format": fmt,
        "seed": SEED,
    }
    if sse:
        body["stream_format"] = "sse"
    t0, first, data, buffer = time.perf_counter(), None, bytearray(), b""
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        if response.status_code != 200:
            error = json.loads(await response.aread()).get("error", {})
            return {"refused": f"{response.status_code} {error.get('code')}: {error.get('message')}"}
        async for chunk in response.aiter_raw():
            if not sse:
                first, data = first or time.perf_counter(), data + chunk
                continue
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            for event in (json.loads(e.removeprefix(b"data: ")) for e in events if e.strip()):
                if event["type"] == "speech.audio.delta":
                    first, data = first or time.perf_counter(), data + base64.b64decode(event["audio"])
        rate = int(response.headers["x-sample-rate"])
    if first is None:
        return {"refused": "no audio in the answer"}
    return {"first_ms": (first - t0) * 1000.0, "bytes": len(data), "audio_s": audio_s(fmt, bytes(data), rate)}


async def websocket(server: Server, fmt: str) -> dict[str, Any]:
    config = {"voice": VOICE, "response_format": fmt, "seed": SEED}
    try:
        ws, _ = await open_session(server.url(PATH, "ws"), config)
    except SessionRefused as exc:
        return {"refused": f"{exc.reply.get('code')}: {exc.reply.get('message')}"}
    async with ws:
        turn = await speak(ws, [TEXT], width=0, timeout_s=60.0)
    done = turn.of("session.done")
    if turn.errors or not done or turn.ttfa_ms is None:
        return {"refused": f"{turn.errors[:1] or 'no session.done'}"}
    return {"first_ms": turn.ttfa_ms, "bytes": turn.bytes, "audio_s": done[0]["audio_ms"] / 1000.0}


async def measure(server: Server, rounds: int) -> dict[str, dict[str, Any]]:
    cases = [(f"REST {f}", f, "rest") for f in REST_FORMATS]
    cases += [(f"REST {f} sse", f, "sse") for f in REST_FORMATS] + [(f"WS {f}", f, "ws") for f in WS_FORMATS]
    rows: dict[str, dict[str, Any]] = {name: {"runs": [], "cpu_s": 0.0} for name, _, _ in cases}
    async with httpx.AsyncClient(base_url=server.url(), timeout=60.0) as client:
        for r in range(-1, rounds):  # round -1 warms every encoder up, unmeasured
            for name, fmt, surface in rotated(cases, r):
                cpu0 = server.cpu_s()
                try:
                    sse = surface == "sse"
                    got = await (websocket(server, fmt) if surface == "ws" else rest(client, fmt, sse))
                except (httpx.HTTPError, ConnectionClosed, OSError, TimeoutError) as exc:
                    got = {"refused": f"failed: {type(exc).__name__}: {exc}"}  # reported, not a crash
                if r >= 0:
                    rows[name]["cpu_s"] += server.cpu_s() - cpu0
                    rows[name]["runs"].append(got)
            print(f"  round {r + 1}/{rounds}" if r >= 0 else "  warmed up", file=sys.stderr)
    for row in rows.values():
        runs = [run for run in row["runs"] if "refused" not in run]
        if not runs:
            row["refused"] = row["runs"][0]["refused"]
            continue
        seconds = sum(run["audio_s"] for run in runs)
        row["first_ms_p50"] = pct([run["first_ms"] for run in runs], 50)
        row["bytes_per_audio_s"] = sum(run["bytes"] for run in runs) / seconds
        row["cpu_s_per_audio_s"] = row["cpu_s"] / seconds
    return rows


def report(rows: dict[str, dict[str, Any]]) -> None:
    print(f"\n{'':<16}{'first byte p50':>16}{'bytes/audio s':>15}{'CPU s/audio s':>15}{'first vs pcm':>14}")
    for name, row in rows.items():
        if "refused" in row:
            print(f"{name:<16}  refused: {row['refused'][:90]}")
            continue
        base = rows[name.replace(name.split()[1], "pcm", 1)]
        ratio = row["first_ms_p50"] / base["first_ms_p50"] if "first_ms_p50" in base else float("nan")
        row["first_vs_pcm"] = ratio
        mark = "" if ratio <= FIRST_BYTE_TARGET else f"  (above {FIRST_BYTE_TARGET}x)"
        print(
            f"{name:<16}{row['first_ms_p50']:>13.1f} ms{row['bytes_per_audio_s']:>15.0f}"
            f"{row['cpu_s_per_audio_s']:>15.4f}{ratio:>13.2f}x{mark}"
        )
    for surface in ("REST", "WS"):
        opus, pcm = rows[f"{surface} opus"], rows[f"{surface} pcm"]
        if "bytes_per_audio_s" in opus and "bytes_per_audio_s" in pcm:
            share = opus["bytes_per_audio_s"] / pcm["bytes_per_audio_s"]
            verdict = "within" if share <= OPUS_BYTES_TARGET else "ABOVE"
            print(f"{surface} opus bytes/s vs pcm: 1/{1 / share:.1f} ({verdict} the 1/8 target)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds of every format")
    parser.add_argument("--json", help="also write every run's figures here ('-': stdout)")
    args = parser.parse_args(argv)
    print(f"voxgate formats bench: {args.rounds} rounds, {uptime_line()}", file=sys.stderr)
    with gateway("--engine", "piper", "--log-level", "warning") as server:
        rows = asyncio.run(measure(server, args.rounds))
    report(rows)
    print(f"{uptime_line()} at the end")
    write_json({"text": TEXT, "rounds": args.rounds, "formats": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
