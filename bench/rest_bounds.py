"""REST answers bounded: the memory a batch holds, unread answers, text caps, and a fuzz of the batch route.

    .venv/bin/python bench/rest_bounds.py                      # every scenario, fake engine, own server
    .venv/bin/python bench/rest_bounds.py --scenarios batch_memory --json rest.json
    .venv/bin/python bench/rest_bounds.py --fuzz 400 --seed 3

Each scenario runs against ``voxgate serve --engine fake`` (``bench/_serve.py``), the server's RSS sampled
from /proc every 50 ms:

- ``batch_memory``: ``--batches`` batches at once (each from its own key's address), 32 items of 4,096
  characters, speed 0.25, 48 kHz ``wav``, read at full speed: the server's peak RSS and what it holds after;
- ``unread``: ``--unread`` streamed answers that nobody reads, against ``max_sessions`` of the same number,
  ``send_timeout_s`` 2: when a new request is admitted again, and the peak RSS meanwhile;
- ``text_cap``: 12,000 characters to each speaking route with ``max_pending_text_chars`` 2,000: the status;
- ``batch_fuzz``: ``--fuzz`` seeded hostile batches (bad items, huge fields, wrong types, unknown voices,
  ref_audio junk, nested items); any 5xx, a traceback in the log or an unanswered request fails it.

Prints a JSON summary; exit status 1 when a scenario failed (figures past their bound, a 5xx, a traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from _serve import Server, gateway

SCENARIOS = ("batch_memory", "unread", "text_cap", "batch_fuzz")
#: Bounds the scenarios check: a batch's peak RSS over the server's at rest, and the wait for a free place.
MAX_BATCH_RSS_MB = 400.0
MAX_UNREAD_WAIT_S = 10.0


def rss_mb(pid: int) -> float:
    """The resident memory of process ``pid`` (and only it), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


class Peak:
    """The peak RSS of a process while a block runs (sampled every 50 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_mb = pid, 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Peak:
        async def sample() -> None:
            while True:
                self.peak_mb = max(self.peak_mb, rss_mb(self.pid))
                await asyncio.sleep(0.05)

        self._task = asyncio.create_task(sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def batch_memory(server: Server, batches: int) -> dict[str, Any]:
    text = ("A sentence of a long answer, read slowly. " * 100)[:4096]
    body = {"items": [{"input": text}] * 32, "speed": 0.25, "sample_rate": 48000, "response_format": "wav"}
    rest = rss_mb(server.pid)

    async def one(client: httpx.AsyncClient) -> int:
        size = 0
        async with client.stream("POST", server.url("/v1/audio/speech/batch"), json=body) as response:
            async for chunk in response.aiter_raw():
                size += len(chunk)
        return size

    async with Peak(server.pid) as peak, httpx.AsyncClient(timeout=3600) as client:
        started = time.monotonic()
        sizes = await asyncio.gather(*(one(client) for _ in range(batches)))
        took_s = time.monotonic() - started
    await asyncio.sleep(1.0)
    after = rss_mb(server.pid)
    return {
        "batches": batches,
        "answer_mb": [round(s / 1e6, 1) for s in sizes],
        "rss_at_rest_mb": round(rest, 1),
        "rss_peak_mb": round(peak.peak_mb, 1),
        "rss_after_mb": round(after, 1),
        "seconds": round(took_s, 1),
        "ok": peak.peak_mb - rest <= MAX_BATCH_RSS_MB * batches,
    }


def _unread(server: Server, text: str) -> socket.socket:
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", server.port))
    data = json.dumps({"input": text, "response_format": "pcm", "sample_rate": 48000}).encode()
    head = "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    client.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return client


async def unread(server: Server, count: int) -> dict[str, Any]:
    text = ("Nobody reads this answer, which goes on and on. " * 90)[:4096]
    clients = [_unread(server, text) for _ in range(count)]
    rest = rss_mb(server.pid)
    try:
        async with Peak(server.pid) as peak, httpx.AsyncClient(timeout=30) as client:
            started = time.monotonic()
            statuses: list[int] = []
            while time.monotonic() - started < 120:
                response = await client.post(server.url("/v1/audio/speech"), json={"input": "Hi."})
                statuses.append(response.status_code)
                if response.status_code == 200:
                    break
                await asyncio.sleep(0.25)
            waited = time.monotonic() - started
    finally:
        for c in clients:
            c.close()
    return {
        "unread": count,
        "admitted_after_s": round(waited, 1),
        "refused_meanwhile": sum(s != 200 for s in statuses),
        "rss_peak_over_rest_mb": round(peak.peak_mb - rest, 1),
        "ok": statuses[-1] == 200 and waited <= MAX_UNREAD_WAIT_S,
    }


async def text_cap(server: Server) -> dict[str, Any]:
    text = "Words upon words. " * 667  # 12,006 characters
    routes = {
        "openai": ("/v1/audio/speech", {"input": text[:4096]}),
        "elevenlabs": ("/v1/text-to-speech/tone", {"text": text}),
        "batch_item": ("/v1/audio/speech/batch", {"items": [{"input": text[:4096]}]}),
    }
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=120) as client:
        for name, (path, body) in routes.items():
            response = await client.post(server.url(path), json=body)
            detail = response.json()
            if name == "batch_item":
                detail = detail["results"][0].get("status")
            out[name] = {"status": response.status_code, "answer": detail}
    out["ok"] = out["openai"]["status"] == 413 and out["elevenlabs"]["status"] == 413
    out["ok"] = out["ok"] and out["batch_item"]["answer"] == "error"
    return out


#: Items of the batch schema that a single request would refuse or that are hard to speak.
SCHEMA_ITEMS: list[object] = [
    {"input": ""},
    {"input": "🎉" * 10},
    {"input": "Hi.", "voice": "nobody"},
    {"input": "Hi.", "ref_audio": "data:audio/wav;base64,AAAA"},
    {"input": "Hi.", "ref_audio": "https://example.com/a.wav"},
    {"input": "Hi.", "ref_text": "text without a clip"},
    {"input": "Hi.", "task_type": "VoiceDesign"},
    {"input": "Hi.", "instructions": "x" * 600},
    {"input": "Hi.", "max_new_tokens": 4097},
    {"input": "Hi.", "sample_rate": 22050, "response_format": "opus"},
    {"input": "Fine.", "response_format": "flac"},
    {"input": "Fine.", "response_format": "mp3", "speed": 0.25},
    {"input": "Fine. " * 600},
]


def hostile_batch(rng: random.Random) -> object:
    """One seeded hostile batch body."""
    junk: list[object] = [
        None,
        -1,
        1e308,
        "x" * rng.randint(0, 20000),
        [],
        {},
        {"input": 5},
        {"input": ""},
        {"input": "🎉" * 10},
        {"input": "Hi.", "voice": "nobody"},
        {"input": "Hi.", "speed": 99},
        {"input": "Hi.", "ref_audio": "data:audio/wav;base64,AAAA"},
        {"input": "Hi.", "ref_audio": "https://example.com/a.wav"},
        {"input": "Hi.", "response_format": "ogg"},
        {"input": "Hi.", "sample_rate": 7},
        {"input": "Hi.", "extra_params": [1, 2]},
        {"input": "Hi.", "items": [{"input": "nested"}]},
        {"input": "Hi. " * 1100},
        {"input": "Fine.", "response_format": rng.choice(["pcm", "wav", "flac", "mp3", "opus", "aac"])},
    ]
    shape = rng.random()
    if shape < 0.1:
        return rng.choice(junk)
    # Most batches are of the schema, so that their items are spoken or fail alone.
    items = [rng.choice(junk if shape < 0.2 else SCHEMA_ITEMS) for _ in range(rng.randint(0, 36))]
    body: dict[str, object] = {"items": items}
    if rng.random() < 0.1:
        body[rng.choice(["speed", "voice", "model", "response_format", "bogus"])] = rng.choice(junk)
    return body


async def batch_fuzz(server: Server, count: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    statuses: dict[str, int] = {}
    errors: list[str] = []
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(count):
            body = hostile_batch(rng)
            try:
                response = await client.post(server.url("/v1/audio/speech/batch"), json=body)
                key = str(response.status_code)
                if response.status_code >= 400:
                    key += " " + str(response.json()["error"]["code"])
                if response.status_code == 200:
                    answer = response.json()
                    assert answer["total"] == answer["succeeded"] + answer["failed"]
            except Exception as exc:  # a dropped connection, an answer that is not JSON, a hang
                key = type(exc).__name__
                errors.append(f"{key}: {exc}"[:200])
            statuses[key] = statuses.get(key, 0) + 1
    tracebacks = sum(server.tracebacks().values())
    five = sum(n for k, n in statuses.items() if k.startswith("5"))
    return {
        "batches": count,
        "statuses": statuses,
        "errors": errors[:5],
        "tracebacks": tracebacks,
        "ok": not errors and not five and not tracebacks,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    env = {"VOXGATE_RATE_LIMIT_PER_S": "0"}
    for name in args.scenarios:
        flags = ["--engine", "fake"]
        scenario_env = dict(env)
        if name == "unread":
            scenario_env |= {"VOXGATE_MAX_SESSIONS": str(args.unread), "VOXGATE_SEND_TIMEOUT_S": "2"}
        if name == "text_cap":
            scenario_env |= {"VOXGATE_MAX_PENDING_TEXT_CHARS": "2000"}
        with gateway(*flags, env=scenario_env) as server:
            if name == "batch_memory":
                results[name] = await batch_memory(server, args.batches)
            elif name == "unread":
                results[name] = await unread(server, args.unread)
            elif name == "text_cap":
                results[name] = await text_cap(server)
            else:
                results[name] = await batch_fuzz(server, args.fuzz, args.seed)
        print(json.dumps({name: results[name]}), file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--scenarios", type=lambda s: s.split(","), default=list(SCENARIOS))
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--unread", type=int, default=32)
    parser.add_argument("--fuzz", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = asyncio.run(run(args))
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
