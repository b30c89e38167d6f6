"""A cloned voice sent inline against the same voice uploaded once and named, on vllm-omni's real layer.

Starts vllm-omni 0.30.0's own serving layer on CPU (tests/vllm_omni/server.py: only the engine client is a
stand-in, speaking with Piper) for a family (default Fish Speech), then sends the same request in turn in
the two shapes ``--engine remote`` sends a clone in (engine/upstream_voices.py):

- inline: ``ref_audio`` (the clip as a 16-bit WAV data URL, as engine/remote_requests.py ``data_url`` makes
  it) and ``ref_text`` on every request;
- named: the clip uploaded once through vllm-omni's ``POST /v1/audio/voices``, then ``voice`` only.

For each: the request body's bytes, the time to the answer's first byte and to its end (client side; the
stand-in engine's Piper time is the same in both), and how many prompts reached the engine without the
speaker cache's key (``voice_name``): each is a reference the real model would encode again.

    .venv/bin/python bench/speaker_cache.py [--family fish_tts] [--requests 20] [--clip-s 10]

Needs the vllm-omni env of .ci/vllm_omni_env.sh ($VOXGATE_VLLM_OMNI_PYTHON).
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from voxgate.protocol.audio import encode, wav_header  # noqa: E402

from tests.vllm_omni.upstream import real_upstream  # noqa: E402

TEXT = "Hello there, how are you today?"
TRANSCRIPT = "The quick brown fox jumps over the lazy dog."
RATE = 24000


def data_url(seconds: float) -> tuple[str, bytes]:
    """A clip as remote.py sends it: a 16-bit WAV data URL; and the WAV's bytes."""
    t = np.arange(int(seconds * RATE)) / RATE
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2).astype(np.float32)
    pcm = encode(audio, "pcm")
    wav = wav_header(RATE, len(pcm)) + pcm
    return "data:audio/wav;base64," + base64.b64encode(wav).decode(), wav


def timed(client: httpx.Client, url: str, body: dict[str, object]) -> tuple[float, float]:
    """Seconds to the first byte and to the end of one streamed answer."""
    start = time.perf_counter()
    first = None
    with client.stream("POST", f"{url}/v1/audio/speech", json=body) as response:
        if response.status_code != 200:
            raise SystemExit(f"upstream answered {response.status_code}: {response.read()[:300]!r}")
        for _ in response.iter_bytes():
            first = first or time.perf_counter()
    end = time.perf_counter()
    return (first or end) - start, end - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--family", default="fish_tts", help="server.py's --family, or qwen3_tts_base (default fish_tts)"
    )
    parser.add_argument("--requests", type=int, default=20, help="requests of each shape")
    parser.add_argument("--clip-s", type=float, default=10.0, help="reference clip length, seconds")
    args = parser.parse_args()
    ref_audio, wav = data_url(args.clip_s)
    common = {"input": TEXT, "response_format": "wav", "stream": True, "stream_format": "audio"}
    inline = {**common, "ref_audio": ref_audio, "ref_text": TRANSCRIPT}
    named = {**common, "voice": "voxgate-bench"}
    family = None if args.family.startswith("qwen3") else args.family
    with real_upstream("Base", family=family) as upstream, httpx.Client(timeout=120) as client:
        uploaded = client.post(
            f"{upstream.url}/v1/audio/voices",
            data={"name": "voxgate-bench", "consent": "bench", "ref_text": TRANSCRIPT},
            files={"audio_sample": ("voice.wav", wav, "audio/wav")},
        )
        uploaded.raise_for_status()
        for body in (inline, named):  # warm-up: the first request of each builds what later ones reuse
            timed(client, upstream.url, body)
        since = len(upstream.log())
        times: dict[str, list[tuple[float, float]]] = {"inline": [], "named": []}
        for _ in range(args.requests):  # interleaved, so the machine's load lands on both alike
            times["inline"].append(timed(client, upstream.url, inline))
            times["named"].append(timed(client, upstream.url, named))
        log = upstream.log()[since:]
    print(f"family {args.family}, clip {args.clip_s:g} s at {RATE} Hz, {args.requests} requests each")
    print(f"{'shape':8} {'body bytes':>10} {'first byte ms p50':>18} {'whole ms p50':>13}")
    for shape, body in (("inline", inline), ("named", named)):
        firsts = [1000 * f for f, _ in times[shape]]
        wholes = [1000 * w for _, w in times[shape]]
        print(
            f"{shape:8} {len(json.dumps(body)):>10} {statistics.median(firsts):>18.1f} "
            f"{statistics.median(wholes):>13.1f}"
        )
    print(
        f"prompts without voice_name: {log.count('voice_name=None')}, "
        f"with: {log.count('voice_name=voxgate-bench')}"
    )


if __name__ == "__main__":
    main()
