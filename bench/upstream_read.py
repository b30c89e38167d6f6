"""What reading an upstream's audio stream costs the gateway: CPU per streamed audio second, by HTTP client.

The remote engine reads one WAV stream per segment from vllm-omni; at a few pieces per audio second for
every session it is the gateway's hot path after the WebSocket writes. This starts the CPU stand-in of
vllm-omni (``tests/vllm_omni/server.py``, its real serving layer with Piper speech) and streams the same
answers, ``--concurrency`` at once, through each reader in turn, round after round:

- ``engine``: ``RemoteEngine.synthesize`` as the gateway runs it (aiohttp, ``engine/http_stream.py``);
- ``aiohttp`` and ``httpx``: the bare clients, reading the body and decoding the samples, nothing else.

Each figure is this process's CPU (user + system, ``getrusage``) over a round, divided by the audio seconds
read, ×1000; the upstream's CPU is not counted. Its surveys are switched off (``health_interval_s``), so a
round holds only the speech requests.

    .venv/bin/python bench/upstream_read.py [--concurrency 8] [--rounds 4] [--text TEXT]

Needs the environment ``.ci/vllm_omni_env.sh`` builds; loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import statistics
import sys
from collections.abc import Awaitable, Callable, Sequence

import aiohttp
import httpx
import numpy as np
from _serve import BenchError, Server
from voxgate.engine.base import SynthesisRequest
from voxgate.engine.remote import RemoteEngine
from vs_vllm_omni import upstream_voice, vllm_omni

TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the deep forest where "
    "nobody can ever find it again."
)
WAV_HEADER_BYTES = 44


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Readers:
    """The three ways to read one answer; each returns the audio seconds it read."""

    def __init__(self, url: str, voice: str, text: str) -> None:
        self.url, self.voice, self.text = url, voice, text
        self.body = {
            "input": text,
            "voice": voice,
            "stream": True,
            "stream_format": "audio",
            "response_format": "wav",
        }
        self.engine = RemoteEngine([url], first_byte_timeout_s=60, read_timeout_s=60, health_interval_s=1e6)
        self.aiohttp = aiohttp.ClientSession()
        self.httpx = httpx.AsyncClient(timeout=60)

    async def __aenter__(self) -> Readers:
        await self.engine.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.aclose()
        await self.aiohttp.close()
        await self.httpx.aclose()

    async def read_engine(self) -> float:
        request = SynthesisRequest(text=self.text, voice=self.voice)
        seconds = 0.0
        async for chunk in self.engine.synthesize(request):
            seconds += len(chunk.samples) / chunk.sample_rate
        return seconds

    async def read_aiohttp(self) -> float:
        size = 0
        async with self.aiohttp.post(f"{self.url}/v1/audio/speech", json=self.body) as response:
            _check(response.status)
            while piece := await response.content.readany():
                size += _decode(piece)
        return _seconds(size)

    async def read_httpx(self) -> float:
        size = 0
        async with self.httpx.stream("POST", f"{self.url}/v1/audio/speech", json=self.body) as response:
            _check(response.status_code)
            async for piece in response.aiter_bytes():
                size += _decode(piece)
        return _seconds(size)


def _check(status: int) -> None:
    if status != 200:
        raise BenchError(f"the upstream answered {status}")


def _decode(piece: bytes) -> int:
    """Decode a piece's samples as the engine does (16-bit PCM to float), for a like-for-like cost."""
    even = len(piece) - len(piece) % 2
    np.frombuffer(piece[:even], "<i2").astype(np.float32)
    return len(piece)


def _seconds(size: int, rate: int = 24000) -> float:
    return (size - WAV_HEADER_BYTES) / 2 / rate


async def measure(args: argparse.Namespace, upstream: Server) -> dict[str, list[float]]:
    async with Readers(upstream.url(), upstream_voice(upstream), args.text) as readers:
        fns: dict[str, Callable[[], Awaitable[float]]] = {
            "engine": readers.read_engine,
            "aiohttp": readers.read_aiohttp,
            "httpx": readers.read_httpx,
        }
        results: dict[str, list[float]] = {name: [] for name in fns}
        for fn in fns.values():  # connections opened, code paths warm
            await fn()
        for n in range(args.rounds):
            for name, fn in fns.items():
                start = cpu_s()
                audio_s = sum(await asyncio.gather(*(fn() for _ in range(args.concurrency))))
                ms = 1000 * (cpu_s() - start) / audio_s
                results[name].append(ms)
                print(f"round {n} {name:8s} {audio_s:6.1f} audio s  {ms:.2f} ms CPU per audio s", flush=True)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--text", default=TEXT)
    args = parser.parse_args(argv)
    with vllm_omni() as upstream:
        results = asyncio.run(measure(args, upstream))
    print(f"\n{len(args.text)} characters, {args.concurrency} at once, {args.rounds} rounds")
    print("| reader | ms CPU per audio s, median | min - max |\n|---|---|---|")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} - {max(values):.2f} |")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
