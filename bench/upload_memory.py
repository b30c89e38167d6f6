"""Server memory taken by voice uploads and inline ``ref_audio``, on a real gateway process.

The clip is the one from issue 10: 29.9 s of silence at 192 kHz with 8 channels, a 46 KB FLAC that is
184 MB once decoded whole. The bench starts ``voxgate serve --engine fake`` as a subprocess, warms it up
with one small upload, then for each level sends that many clips at once and reads the server's peak
resident memory: the kernel's high-water mark (``VmHWM`` in ``/proc/PID/status``, reset before each level
through ``/proc/PID/clear_refs``), checked against ``VmRSS`` sampled every 2 ms. It prints the peak over
the resident memory before the level, and the size of each stored voice file.

    .venv/bin/python bench/upload_memory.py [--levels 1,20] [--mode upload|inline|both] [--json out.json]

``inline`` posts the clip as ``ref_audio`` to ``POST /v1/audio/speech``; the fake engine cannot clone, so
the answer is 400 ``voice_requires_cloning``, which the gateway gives only after decoding the clip
(a clip it could not decode would be ``invalid_ref_audio``). Linux only (``/proc``). Exits 1 with the
reason on stderr when an upload is answered otherwise than expected.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
import soundfile
from _procstat import status_kib
from _serve import free_port, serve_command, stop

MB = 1 << 20
SAMPLE_EVERY_S = 0.002
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 120.0


class BenchError(Exception):
    """A run that cannot give a figure: the server did not start, or answered unexpectedly."""


def issue_flac(seconds: float = 29.9, rate: int = 192000, channels: int = 8) -> bytes:
    """The issue's clip: silence, 16-bit FLAC, written a second at a time."""
    buffer = io.BytesIO()
    second = np.zeros((rate, channels), np.int16)
    with soundfile.SoundFile(buffer, "w", rate, channels, "PCM_16", format="FLAC") as f:
        left = int(seconds * rate)
        while left > 0:
            f.write(second[: min(rate, left)])
            left -= rate
    return buffer.getvalue()


def small_wav() -> bytes:
    buffer = io.BytesIO()
    tone = 0.3 * np.sin(2 * np.pi * 200 * np.arange(16000 * 2) / 16000)
    soundfile.write(buffer, tone.astype(np.float32), 16000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


class RssSampler:
    """Samples a process's ``VmRSS`` on a thread; ``peak`` is the highest seen since ``reset``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                self.peak_kb = max(self.peak_kb, status_kib(self.pid, "VmRSS"))
            time.sleep(SAMPLE_EVERY_S)

    def reset(self) -> None:
        self.peak_kb = status_kib(self.pid, "VmRSS")

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Level:
    """One level's figures, in MB of the server's resident memory."""

    mode: str
    concurrent: int
    rss_before_mb: float
    peak_delta_mb: float  # VmHWM after the level minus VmRSS before it
    sampled_peak_delta_mb: float  # the same from 2 ms samples of VmRSS (a lower bound)
    stored_bytes: list[int]


@contextlib.contextmanager
def gateway(voices_dir: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``voxgate serve --engine fake`` in a subprocess, as this interpreter runs it."""
    port = free_port()
    env = {**os.environ, "VOXGATE_MAX_VOICE_BYTES": "0", "VOXGATE_MAX_VOICES": "100000"}
    command = serve_command(
        "--engine",
        "fake",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--voices-dir",
        voices_dir,
        "--log-level",
        "warning",
    )
    process = subprocess.Popen(command, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise BenchError(f"the gateway exited with status {process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise BenchError("the gateway did not start")
            time.sleep(0.1)
        yield process, url
    finally:
        stop(process)


async def _upload(client: httpx.AsyncClient, name: str, clip: bytes) -> int:
    files = {"audio_sample": ("clip.flac", clip, "audio/flac")}
    response = await client.post("/v1/audio/voices", data={"name": name, "consent": "bench"}, files=files)
    if response.status_code != 200:
        raise BenchError(f"upload {name} answered {response.status_code}: {response.text[:300]}")
    size: int = response.json()["voice"]["file_size"]
    return size


async def _inline(client: httpx.AsyncClient, clip: bytes) -> int:
    body = {"input": "Hello.", "ref_audio": "data:audio/flac;base64," + base64.b64encode(clip).decode()}
    response = await client.post("/v1/audio/speech", json=body)
    code = response.json().get("error", {}).get("code") if response.status_code == 400 else None
    if code != "voice_requires_cloning":  # decoded, then refused by the fake engine, which cannot clone
        raise BenchError(f"inline ref_audio answered {response.status_code}: {response.text[:300]}")
    return 0


async def _send(url: str, mode: str, clip: bytes, count: int, tag: str) -> list[int]:
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        if mode == "upload":
            jobs = [_upload(client, f"{tag}-{i}", clip) for i in range(count)]
        else:
            jobs = [_inline(client, clip) for _ in range(count)]
        return list(await asyncio.gather(*jobs))


def run_level(pid: int, url: str, sampler: RssSampler, mode: str, clip: bytes, count: int) -> Level:
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux 4.0+)
    before_kb = status_kib(pid, "VmRSS")
    sampler.reset()
    stored = asyncio.run(_send(url, mode, clip, count, f"{mode}-{count}"))
    peak_kb = status_kib(pid, "VmHWM")
    return Level(
        mode=mode,
        concurrent=count,
        rss_before_mb=before_kb / 1024,
        peak_delta_mb=(peak_kb - before_kb) / 1024,
        sampled_peak_delta_mb=(sampler.peak_kb - before_kb) / 1024,
        stored_bytes=sorted(set(stored)),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--levels", default="1,20", help="uploads sent at once, one level after another")
    parser.add_argument("--mode", choices=["upload", "inline", "both"], default="both")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    levels = [int(n) for n in args.levels.split(",")]
    modes = ["upload", "inline"] if args.mode == "both" else [args.mode]
    clip = issue_flac()
    results: list[Level] = []
    try:
        with (
            tempfile.TemporaryDirectory(prefix="voxgate-bench-") as voices_dir,
            gateway(voices_dir) as (
                process,
                url,
            ),
        ):
            asyncio.run(_send(url, "upload", small_wav(), 1, "warm-up"))
            with RssSampler(process.pid) as sampler:
                for mode in modes:
                    for count in levels:
                        results.append(run_level(process.pid, url, sampler, mode, clip, count))
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    print(f"clip: {len(clip)} bytes of FLAC, 29.9 s at 192 kHz, 8 channels (184 MB as float32)")
    print(f"{'mode':<8}{'at once':>8}{'RSS before':>12}{'peak delta':>12}{'sampled':>10}  stored file")
    for r in results:
        stored = ", ".join(f"{b} B" for b in r.stored_bytes) if r.mode == "upload" else "-"
        print(
            f"{r.mode:<8}{r.concurrent:>8}{r.rss_before_mb:>9.1f} MB{r.peak_delta_mb:>9.1f} MB"
            f"{r.sampled_peak_delta_mb:>7.1f} MB  {stored}"
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
