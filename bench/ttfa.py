"""Time-to-first-audio benchmark of the gateway with the embedded Piper engine.

Starts ``voxgate serve --engine piper`` as production runs it (``bench/_serve.py``: a subprocess on a free
loopback port) and streams a short paragraph into it the way an LLM would: tokens of 2-5 characters, one
every ``--token-delay-ms``. For every run it also times a Piper engine directly, in this process, with the
gateway's settings, on the same first segment, interleaved with the gateway runs so that machine noise
lands on both sides alike. Then a concurrency sweep. See ``docs/performance.md`` for each figure.

    .venv/bin/python bench/ttfa.py [--runs N] [--json out.json]

Exits non-zero, with the reason on stderr, when anything fails: no figure is printed from a broken run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import msgspec
from _client import PATH, Turn, open_session, speak
from _serve import BenchError, Server, gateway
from _stats import CpuWindow, percentiles, write_json
from _text import PARAGRAPH, tokenize
from voxgate.engine import piper
from voxgate.engine.base import SynthesisRequest
from voxgate.engine.piper import PiperSettings
from voxgate.gateway.settings import Settings
from voxgate.protocol.messages import DEFAULT_MAX_BUFFER_DELAY_MS
from voxgate.protocol.segmenter import Segmenter
from websockets.exceptions import ConnectionClosed, InvalidHandshake

VOICE = "joe"
# A fast hosted LLM streams ~50 tokens/s; slower token rates only make gaps less likely.
TOKEN_DELAY_MS = 20.0
# Generous: a 4-session round on two cores takes ~6 s; a hang must still end the bench.
TIMEOUT_S = 60.0
SWEEP_LEVELS = (1, 2, 4)
# Sessions measured per concurrency level (rounded up to whole rounds of `level` sessions).
SWEEP_SAMPLES = 12
# The budget for the gateway's own share of the first segment's latency (engine time excluded).
OVERHEAD_TARGET_MS = 5.0
# Other processes using more than this share of one core, on average, during the measured runs compete
# with Piper for the two cores often enough to move the paired figures; the report then says so.
BUSY_OTHER_CORES = 0.05


def first_segment(
    tokens: Sequence[str], delay_s: float = 0.0, budget_s: float = DEFAULT_MAX_BUFFER_DELAY_MS / 1000.0
) -> tuple[int, str, int | None]:
    """Which token completes the first segment, its text, and the token that started the cut's clock.

    The gateway uses ``Segmenter("sentence", eager_first=True)`` for a config that leaves both at their
    defaults, and cuts the first segment early (``Segmenter.cut_early``) once ``budget_s`` has passed
    since its first text; token ``i`` is sent at ``i * delay_s``. The third element is None when a token
    completes the segment, else the token whose arrival started that budget: the segment is complete
    ``budget_s`` after it was sent. The text is checked against the first ``audio.start`` of every run.
    """
    segmenter = Segmenter("sentence", eager_first=True)
    first: int | None = None
    for i, token in enumerate(tokens):
        late = first is not None and delay_s and i * delay_s >= first * delay_s + budget_s
        if late and (out := segmenter.cut_early()):
            return i - 1, out[0], first  # the deadline passed before this token was sent
        if out := segmenter.push(token):
            return i, out[0], None
        if first is None and segmenter.eager_pending:
            first = i
    raise BenchError("the paragraph never completes a segment before input.done")


@dataclass(frozen=True)
class Stream:
    """What every session sends: the tokens, the pause between them, and the optional synthesis seed."""

    tokens: list[str]
    delay_s: float
    seed: int | None = None

    def expected_first_segments(self) -> set[str]:
        """The first segments the server may cut: its deadline may fall just before or after a token."""
        budget_s = DEFAULT_MAX_BUFFER_DELAY_MS / 1000.0
        shifts = (-self.delay_s / 2, self.delay_s / 2)
        return {first_segment(self.tokens, self.delay_s, budget_s + shift)[1] for shift in shifts}


@dataclass
class Run:
    """One utterance's figures (ms): the client's, and the server's own from its messages."""

    ttfa_ms: float  # first input.text sent -> first audio frame received
    segment_ttfa_ms: float  # the token completing the first segment sent -> first frame
    wall_ms: float  # first input.text sent -> session.done
    server_ttfa_ms: float  # session.done.first_text_to_first_audio_ms
    server_segment_ms: float  # first audio.done.text_to_first_audio_ms
    server_first_synthesis_ms: float  # first audio.done.synthesis_ms
    synthesis_ms: float
    audio_ms: float
    segments: int
    gaps_ms: list[float]


def _run(turn: Turn, stream: Stream) -> Run:
    """The turn's figures, once everything the bench relies on is checked."""
    if turn.errors:
        raise BenchError(f"server error: {turn.errors[0].get('code')}: {turn.errors[0].get('message')}")
    done = turn.of("session.done")
    if not done or turn.t_done is None or turn.t_first_audio is None:
        raise BenchError("the gateway closed the session early" if turn.closed else "no audio received")
    starts, dones, end = turn.of("audio.start"), turn.of("audio.done"), done[0]
    if failed := [d for d in dones if d.get("error")]:
        raise BenchError(f"the engine failed on segment {failed[0]['sentence_index']}")
    first_text = starts[0]["sentence_text"] if starts else ""
    if first_text not in (expected := stream.expected_first_segments()):
        raise BenchError(f"server's first segment {first_text!r} is none of {sorted(expected)!r}")
    if abs(turn.audio_s * 1000.0 - end["audio_ms"]) > 1.0:
        raise BenchError(
            f"received {turn.audio_s * 1000:.1f} ms of audio, session.done says {end['audio_ms']}"
        )
    first = next(d for d in dones if d["sentence_index"] == 0)
    if end.get("first_text_to_first_audio_ms") is None or first.get("text_to_first_audio_ms") is None:
        raise BenchError("session.done or the first audio.done reports no time to first audio")
    complete_at, _, clock = first_segment(stream.tokens, stream.delay_s)
    budget_s = DEFAULT_MAX_BUFFER_DELAY_MS / 1000.0
    t_complete = turn.sent[complete_at] if clock is None else turn.sent[clock] + budget_s
    if turn.t_first_audio < t_complete:
        raise BenchError("audio arrived before the first segment was complete")
    return Run(
        ttfa_ms=turn.ttfa_ms or 0.0,
        segment_ttfa_ms=(turn.t_first_audio - t_complete) * 1000.0,
        wall_ms=(turn.t_done - turn.sent[0]) * 1000.0,
        server_ttfa_ms=end["first_text_to_first_audio_ms"],
        server_segment_ms=first["text_to_first_audio_ms"],
        server_first_synthesis_ms=first["synthesis_ms"],
        synthesis_ms=end["synthesis_ms"],
        audio_ms=end["audio_ms"],
        segments=end["total_sentences"],
        gaps_ms=[u * 1000.0 for u in turn.player.underruns],
    )


async def session(server: Server, stream: Stream, start: asyncio.Barrier | None = None) -> Run:
    """One new session streams the tokens; with ``start``, its first text waits for the others'."""
    config: dict[str, object] = {"voice": VOICE, "response_format": "pcm"}
    if stream.seed is not None:
        config["seed"] = stream.seed
    ws, _ = await open_session(server.url(PATH, "ws"), config, timeout_s=TIMEOUT_S)
    async with ws:
        if start is not None:
            await start.wait()
        turn = await speak(ws, stream.tokens, stream.delay_s, timeout_s=TIMEOUT_S)
    return _run(turn, stream)


async def together(server: Server, stream: Stream, sessions: int) -> list[Run]:
    """``sessions`` sessions at once; their first ``input.text`` leaves at the same moment."""
    barrier = asyncio.Barrier(sessions)
    return list(await asyncio.gather(*(session(server, stream, barrier) for _ in range(sessions))))


async def direct_first_chunk_ms(engine: piper.PiperEngine, text: str, seed: int | None) -> float:
    """The engine alone, in this process: first segment -> first chunk, drained so its workers are idle."""
    t0 = time.perf_counter()
    first: float | None = None
    async for _ in engine.synthesize(SynthesisRequest(text=text, voice=VOICE, seed=seed)):
        first = first or time.perf_counter() - t0
    if first is None:
        raise BenchError(f"the engine produced no audio for {text!r}")
    return first * 1000.0


# -- report --------------------------------------------------------------------------------------------


def _row(name: str, values: Sequence[float], unit: str = "ms") -> str:
    s = percentiles(values, (50, 90))
    digits = 3 if unit == "x" else 1
    return (
        f"  {name:<46}" + "".join(f"{s[k] or 0.0:>10.{digits}f}" for k in ("p50", "p90", "max")) + f"  {unit}"
    )


ROWS = (  # (figure, label, unit)
    ("ttfa_ms", "time to first audio (first text -> frame)", "ms"),
    ("ttfa_server_ms", "  same, server first_text_to_first_audio_ms", "ms"),
    ("segment_to_first_frame_client_ms", "first segment complete -> first frame (client)", "ms"),
    ("segment_to_first_frame_server_ms", "  same, server text_to_first_audio_ms", "ms"),
    ("engine_direct_first_chunk_ms", "engine direct, first segment -> first chunk", "ms"),
    ("gateway_overhead_ms", "gateway overhead (client - direct)", "ms"),
    ("gateway_overhead_server_side_ms", "  server side (server - direct)", "ms"),
    ("transport_and_client_ms", "  transport + client (client - server)", "ms"),
    ("gateway_overhead_same_run_ms", "same run: client - engine time inside gateway", "ms"),
    ("rtf_synthesis", "RTF synthesis_ms / audio_ms", "x"),
    ("rtf_wall", "RTF wall (first text -> session.done) / audio", "x"),
    ("gap_count", "inter-segment gaps per utterance", "count"),
    ("gap_max_ms", "largest gap per utterance", "ms"),
)


def report(runs: list[Run], direct: list[float], sweep: dict[int, list[Run]], meta: dict[str, Any]) -> Any:
    """Print the tables; return everything as a JSON-able dict."""
    client = [r.segment_ttfa_ms for r in runs]
    server = [r.server_segment_ms for r in runs]
    figures: dict[str, list[float]] = {
        "ttfa_ms": [r.ttfa_ms for r in runs],
        "ttfa_server_ms": [r.server_ttfa_ms for r in runs],
        "segment_to_first_frame_client_ms": client,
        "segment_to_first_frame_server_ms": server,
        "engine_direct_first_chunk_ms": direct,
        "gateway_overhead_ms": [c - d for c, d in zip(client, direct, strict=True)],
        "gateway_overhead_server_side_ms": [s - d for s, d in zip(server, direct, strict=True)],
        "transport_and_client_ms": [c - s for c, s in zip(client, server, strict=True)],
        "gateway_overhead_same_run_ms": [r.segment_ttfa_ms - r.server_first_synthesis_ms for r in runs],
        "rtf_synthesis": [r.synthesis_ms / r.audio_ms for r in runs],
        "rtf_wall": [r.wall_ms / r.audio_ms for r in runs],
        "gap_count": [float(len(r.gaps_ms)) for r in runs],
        "gap_max_ms": [max(r.gaps_ms, default=0.0) for r in runs],
    }
    summary = {k: percentiles(v, (50, 90)) for k, v in figures.items()}
    print(
        f"\nvoxgate TTFA bench: {meta['runs']} runs, {meta['tokens']} tokens every {meta['token_delay_ms']:g}"
        f" ms, {meta['segments']} segments, {runs[0].audio_ms / 1000:.1f} s of audio"
    )
    print(f"first segment: {meta['first_segment']!r} (complete at token {meta['first_segment_token']})")
    print(f"  {'':<46}{'p50':>10}{'p90':>10}{'max':>10}")
    for key, label, unit in ROWS:
        print(_row(label, figures[key], unit))
    paired = summary["gateway_overhead_ms"]["p50"] or 0.0
    same_run = summary["gateway_overhead_same_run_ms"]["p50"] or 0.0
    # Load from other processes only ever adds time, to either side of a pair: the minimums are the
    # least disturbed estimate, the p50s a second opinion, when the paired figures scatter.
    of_p50s = (summary["segment_to_first_frame_client_ms"]["p50"] or 0.0) - (
        summary["engine_direct_first_chunk_ms"]["p50"] or 0.0
    )
    of_mins = min(client) - min(direct)
    verdict = "within" if paired < OVERHEAD_TARGET_MS else "ABOVE"
    print(f"  gateway overhead p50 {paired:.2f} ms: {verdict} the {OVERHEAD_TARGET_MS:g} ms target")
    print(
        f"  (cross-checks: difference of p50s {of_p50s:.2f} ms, difference of minimums {of_mins:.2f} ms,"
        f" same run {same_run:.2f} ms)"
    )
    if meta["other_processes_cores"] > BUSY_OTHER_CORES:
        print(f"  warning: other processes used {meta['other_processes_cores']:.2f} of a core on average")
        print("  during these runs, so p90/max and the paired overhead partly measure them; trust the")
        print("  same-run figure more")
    print(f"\n  concurrency sweep (sessions at once){'':<10}{'p50':>10}{'p90':>10}{'max':>10}")
    sweep_out: dict[str, Any] = {}
    for level, level_runs in sweep.items():
        name = f"{level} session{'s' if level > 1 else ''}"
        ttfa, segment = [r.ttfa_ms for r in level_runs], [r.segment_ttfa_ms for r in level_runs]
        gaps = [g for r in level_runs for g in r.gaps_ms]
        rtf = percentiles([r.synthesis_ms / r.audio_ms for r in level_runs], (50,))
        print(_row(f"{name}: TTFA (n={len(ttfa)})", ttfa))
        print(_row(f"{name}: first segment -> first frame", segment))
        print(
            f"      gaps: {len(gaps)} in {len(level_runs)} utterances, max {max(gaps, default=0.0):.1f} ms;"
            f" RTF synthesis p50 {rtf['p50']:.3f}"
        )
        sweep_out[str(level)] = {
            "ttfa_ms": percentiles(ttfa, (50, 90)),
            "segment_to_first_frame_client_ms": percentiles(segment, (50, 90)),
            "rtf_synthesis": rtf,
            "gap_count_total": len(gaps),
            "gap_max_ms": max(gaps, default=0.0),
            "raw_ttfa_ms": ttfa,
        }
    overhead = {
        "paired_p50_ms": paired,
        "paired_p90_ms": summary["gateway_overhead_ms"]["p90"],
        "difference_of_p50s_ms": of_p50s,
        "difference_of_minimums_ms": of_mins,
        "same_run_p50_ms": same_run,
        "target_ms": OVERHEAD_TARGET_MS,
        "within_target": paired < OVERHEAD_TARGET_MS,
    }
    return {
        "meta": meta,
        "summary": summary,
        "gateway_overhead": overhead,
        "raw": figures,
        "runs": [asdict(r) for r in runs],
        "concurrency": sweep_out,
    }


# -- main ----------------------------------------------------------------------------------------------


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    stream = Stream(tokenize(PARAGRAPH), args.token_delay_ms / 1000.0, args.seed)
    complete_at, first_text, _ = first_segment(stream.tokens, stream.delay_s)
    settings = Settings(engine="piper").of(PiperSettings)
    started, load_before = time.perf_counter(), os.getloadavg()
    print(
        f"starting voxgate serve --engine piper and a direct Piper engine (threads={settings.piper_threads},"
        f" workers={settings.piper_workers}) ...",
        file=sys.stderr,
    )
    engine = piper.create(settings)
    await engine.start()
    try:
        with gateway("--engine", "piper") as server:
            await session(server, stream)  # warm-up: first-use allocations on both sides
            await direct_first_chunk_ms(engine, first_text, args.seed)
            runs: list[Run] = []
            direct: list[float] = []
            window = CpuWindow(lambda: time.process_time() + server.cpu_s())  # this process and the server
            for i in range(args.runs):
                # Alternate which goes first, so slow drift in machine load does not favour one side.
                if i % 2:
                    runs.append(await session(server, stream))
                direct.append(await direct_first_chunk_ms(engine, first_text, args.seed))
                if not i % 2:
                    runs.append(await session(server, stream))
                print(
                    f"  run {i + 1}/{args.runs}: TTFA {runs[-1].ttfa_ms:.1f} ms, segment -> frame "
                    f"{runs[-1].segment_ttfa_ms:.1f} ms, direct {direct[-1]:.1f} ms",
                    file=sys.stderr,
                )
            _, busy, ours = window.cores()
            other = max(0.0, busy - ours)
            sweep: dict[int, list[Run]] = {}
            for level in args.levels:
                sweep[level] = []
                for _ in range(math.ceil(args.sweep_samples / level)):
                    sweep[level].extend(await together(server, stream, level))
                print(f"  sweep {level}: {len(sweep[level])} sessions done", file=sys.stderr)
    finally:
        await engine.aclose()
    meta = {
        "runs": args.runs,
        "tokens": len(stream.tokens),
        "token_delay_ms": args.token_delay_ms,
        "seed": args.seed,
        "first_segment": first_text,
        "first_segment_token": complete_at,
        "segments": runs[0].segments,
        "paragraph": PARAGRAPH,
        "settings": msgspec.to_builtins(settings),
        "elapsed_s": round(time.perf_counter() - started, 1),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "other_processes_cores": other,
    }
    out: dict[str, Any] = report(runs, direct, sweep, meta)
    load = ", ".join(f"{x:.2f}" for x in load_before)
    print(
        f"\nelapsed {meta['elapsed_s']} s on {meta['cpus']} CPUs; load average before the bench: {load};"
        f" other processes during the runs: {other:.2f} of a core"
    )
    return out


def _levels(text: str) -> list[int]:
    levels = [int(x) for x in text.split(",") if x.strip()]
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("levels are positive integers, e.g. 1,2,4")
    return levels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=20, help="measured single-session runs (default 20)")
    parser.add_argument("--json", help="also write every figure and raw sample to this file")
    parser.add_argument("--token-delay-ms", type=float, default=TOKEN_DELAY_MS, help="pause between tokens")
    parser.add_argument("--seed", type=int, help="synthesis seed: Piper runs noise-free, every run the same")
    parser.add_argument("--levels", type=_levels, default=list(SWEEP_LEVELS), help="sweep levels (1,2,4)")
    parser.add_argument("--sweep-samples", type=int, default=SWEEP_SAMPLES, help="sessions per sweep level")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.sweep_samples < 1:
        parser.error("--runs and --sweep-samples must be at least 1")
    try:
        write_json(asyncio.run(bench(args)), args.json)
    except (BenchError, ConnectionClosed, InvalidHandshake, OSError, TimeoutError) as exc:
        print(f"bench failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
