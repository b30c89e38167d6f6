"""Server memory before and after work: does a Piper gateway give its memory back after large texts?

Issue 10 measured a fresh gateway at 187 MB reach 627 MB after three normal 300-character sessions, and
1.9 GB after 100k-character texts, never given back. This starts a real ``voxgate serve --engine piper``
in a subprocess on a free loopback port (this tree's code), and reads the server's resident memory
(``VmRSS`` in ``/proc/PID/status``; ``VmHWM`` is the peak) at each step:

1. baseline: once ``/readyz`` answers 200;
2. after ``--normal`` normal sessions (300 characters of prose each, every byte of audio read);
3. after large texts: one session per kind in ``LARGE_TEXTS`` (100,000 characters each: emoji, digits,
   one word with no space, a run-on sentence with no punctuation, combining marks). The text goes in as
   fast as the session's text backlog (``max_pending_text_chars``) admits, the audio is read as it comes,
   and after ``--large-s`` seconds the utterance is cancelled (``input.cancel``): synthesizing all of it
   would take most of an hour per text on two cores, and every segment is at most 300 characters, so the
   work a longer run adds is more of the same;
4. after ``--idle-s`` seconds with no session.

    .venv/bin/python bench/memory_baseline.py [--normal 3] [--large-s 30] [--idle-s 10] [--json out.json]

Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from _procstat import status_kib
from _serve import free_port, stop
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

ROOT = Path(__file__).resolve().parent.parent
PATH = "/v1/audio/speech/stream"
NORMAL_TEXT = (
    "The gateway turns streamed text into speech as it arrives. Each sentence is synthesized while "
    "the one before it is still being sent, so a listener hears the answer almost as soon as it is "
    "written. When the text stops, the audio stops too, and the session can start another utterance."
)[:300]
LARGE_CHARS = 100_000
LARGE_TEXTS = {
    "emoji": "😀🎉🚀" * (LARGE_CHARS // 3),
    "digits": "1234567890" * (LARGE_CHARS // 10),
    "one word": "a" * LARGE_CHARS,
    "run-on": ("and then the gateway kept on speaking " * (LARGE_CHARS // 38 + 1))[:LARGE_CHARS],
    "combining marks": ("e" + "\u0301\u0302\u0303\u0304") * (LARGE_CHARS // 5),
}
# Text per input.text message: well under max_message_bytes (128 KiB) even at 4 UTF-8 bytes a character.
CHUNK_CHARS = 5_000
TIMEOUT_S = 120.0


def memory_mb(pid: int) -> dict[str, float]:
    rss, peak = status_kib(pid, "VmRSS"), status_kib(pid, "VmHWM")
    return {"rss_mb": round(rss / 1024, 1), "peak_mb": round(peak / 1024, 1)}


def start_server(port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    command = [sys.executable, "-m", "voxgate.cli", "serve", "--engine", "piper", "--port", str(port)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1.0).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not become ready")


@contextlib.contextmanager
def open_session(port: int) -> Iterator[ClientConnection]:
    uri = f"ws://127.0.0.1:{port}{PATH}"
    with connect(uri, subprotocols=[Subprotocol("voxgate.v1")], max_size=None, open_timeout=TIMEOUT_S) as ws:
        ws.send(json.dumps({"type": "session.config"}))
        ready = json.loads(ws.recv(timeout=TIMEOUT_S))
        if ready.get("type") != "session.ready":
            raise RuntimeError(f"session refused: {ready}")
        yield ws


def read_until(ws: ClientConnection, kind: str, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        item = ws.recv(timeout=max(0.01, deadline - time.monotonic()))
        if isinstance(item, str):
            msg: dict[str, Any] = json.loads(item)
            if msg.get("type") == kind:
                return msg
            if msg.get("type") == "error" and msg.get("fatal"):
                raise RuntimeError(f"fatal error: {msg}")


def normal_session(port: int) -> float:
    with open_session(port) as ws:
        ws.send(json.dumps({"type": "input.text", "text": NORMAL_TEXT}))
        ws.send(json.dumps({"type": "input.done"}))
        done = read_until(ws, "session.done")
    return float(done["audio_ms"]) / 1000


def large_session(port: int, text: str, seconds: float) -> int:
    """Stream ``text`` as the backlog admits for ``seconds``, reading audio, then cancel; the chars sent."""
    sent = 0
    with open_session(port) as ws:
        end = time.monotonic() + seconds
        while time.monotonic() < end and sent < len(text):
            piece = text[sent : sent + CHUNK_CHARS]
            ws.send(json.dumps({"type": "input.text", "text": piece}))
            refused = False
            # Read what came in (audio, and the answer to that message if it was refused).
            while True:
                try:
                    item = ws.recv(timeout=0.05)
                except TimeoutError:
                    break
                if isinstance(item, str):
                    msg = json.loads(item)
                    if msg.get("type") == "error":
                        if msg.get("code") != "text_backlog_full":
                            raise RuntimeError(f"unexpected error: {msg}")
                        refused = True
            if refused:  # the backlog is full: read audio for a while before trying again
                wait_until = min(end, time.monotonic() + 2.0)
                with contextlib.suppress(TimeoutError):
                    while time.monotonic() < wait_until:
                        ws.recv(timeout=max(0.01, wait_until - time.monotonic()))
            else:
                sent += len(piece)
        ws.send(json.dumps({"type": "input.cancel"}))
        read_until(ws, "audio.cancelled")
        ws.send(json.dumps({"type": "session.close"}))
        with contextlib.suppress(ConnectionClosed):  # the server closes after session.close
            while True:
                ws.recv(timeout=TIMEOUT_S)
    return sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--normal", type=int, default=3, help="normal 300-character sessions")
    parser.add_argument("--large-s", type=float, default=30.0, help="seconds of work per large text")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle seconds before the last reading")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    port = free_port()
    proc = start_server(port)
    steps: list[dict[str, Any]] = []
    try:

        def record(step: str, **extra: object) -> None:
            steps.append({"step": step, **memory_mb(proc.pid), **extra})
            rss, peak = steps[-1]["rss_mb"], steps[-1]["peak_mb"]
            print(f"{step:<40} RSS {rss:8.1f} MB   peak {peak:8.1f} MB {extra or ''}")

        record("baseline (ready)")
        audio_s = [normal_session(port) for _ in range(args.normal)]
        record(f"after {args.normal} normal sessions", audio_s=round(sum(audio_s), 1))
        for kind, text in LARGE_TEXTS.items():
            sent = large_session(port, text, args.large_s)
            record(f"after large text: {kind}", chars_sent=sent)
        time.sleep(args.idle_s)
        record(f"after {args.idle_s:g} s idle")
    finally:
        stop(proc)
    result = {"load_average": list(os.getloadavg()), "cpus": os.cpu_count(), "steps": steps}
    print(f"load average at the end: {result['load_average']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
