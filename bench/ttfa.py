"""Time-to-first-audio benchmark of the gateway with the embedded Piper engine.

Runs a real gateway (uvicorn in a background thread, loopback, free port) and streams a short paragraph
into it the way an LLM would: tokens of 2-5 characters, one every ``--token-delay-ms``. For every run it
also times the Piper engine directly, in this process, on the same first segment, interleaved with the
gateway runs so that machine noise lands on both sides alike. See ``bench/README.md`` for each figure.

    .venv/bin/python bench/ttfa.py [--runs N] [--json out.json]

Exits non-zero, with the reason on stderr, when anything fails: no figure is printed from a broken run.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import uvicorn
from _text import PARAGRAPH, tokenize
from starlette.applications import Starlette
from voxgate.engine import piper
from voxgate.engine.base import SynthesisRequest
from voxgate.engine.piper import PiperSettings
from voxgate.gateway.app import create_app
from voxgate.gateway.settings import Settings
from voxgate.protocol.audio import BYTES_PER_SAMPLE
from voxgate.protocol.messages import DEFAULT_MAX_BUFFER_DELAY_MS
from voxgate.protocol.segmenter import Segmenter
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

PATH = "/v1/audio/speech/stream"
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


class BenchError(Exception):
    """The benchmark could not measure what it claims to measure."""


# -- the gateway under test --------------------------------------------------------------------------


@contextlib.contextmanager
def serve(app: Starlette) -> Iterator[str]:
    """Run ``app`` on uvicorn in a daemon thread on a free loopback port; yields ``host:port``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="uvicorn")
    thread.start()
    deadline = time.monotonic() + TIMEOUT_S  # the lifespan loads and warms up the Piper model
    while not server.started:
        if not thread.is_alive():
            raise BenchError("uvicorn exited during startup (see its log above)")
        if time.monotonic() > deadline:
            raise BenchError(f"uvicorn did not start within {TIMEOUT_S:g} s")
        time.sleep(0.01)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(TIMEOUT_S)
        sock.close()


# -- the text stream ---------------------------------------------------------------------------------


def first_segment(
    tokens: Sequence[str], delay_s: float = 0.0, budget_s: float = DEFAULT_MAX_BUFFER_DELAY_MS / 1000.0
) -> tuple[int, str]:
    """Which token completes the first segment, and its text, as the server's default segmenter cuts it.

    The gateway uses ``Segmenter("sentence", eager_first=True)`` for a config that leaves both at their
    defaults, and cuts the first segment early (``Segmenter.cut_early``) once ``budget_s`` has passed
    since its first text; token ``i`` is sent at ``i * delay_s``. The result is checked against the
    first ``audio.start`` of every run.
    """
    segmenter = Segmenter("sentence", eager_first=True)
    first_t: float | None = None
    for i, token in enumerate(tokens):
        t = i * delay_s
        if first_t is not None and delay_s and t >= first_t + budget_s and (out := segmenter.cut_early()):
            return i - 1, out[0]  # the deadline passed before this token was sent
        if out := segmenter.push(token):
            return i, out[0]
        if first_t is None and segmenter.eager_pending:
            first_t = t
    raise BenchError("the paragraph never completes a segment before input.done")


def expected_first_segments(tokens: Sequence[str], delay_s: float) -> set[str]:
    """The first segments the server may cut: its deadline may fall just before or just after a token."""
    budget_s = DEFAULT_MAX_BUFFER_DELAY_MS / 1000.0
    return {first_segment(tokens, delay_s, budget_s + shift)[1] for shift in (-delay_s / 2, delay_s / 2)}


@dataclass(frozen=True)
class Stream:
    """What every session sends: the tokens, the pause between them, and the optional synthesis seed."""

    tokens: list[str]
    delay_s: float
    seed: int | None = None


# -- one session ---------------------------------------------------------------------------------------


@dataclass
class Frame:
    t: float  # client perf_counter when received
    audio_s: float


@dataclass
class Run:
    """Client-side timings (perf_counter seconds) and server metrics of one utterance."""

    t_first_text: float = 0.0
    t_segment_complete: float = 0.0
    t_session_done: float = 0.0
    frames: list[Frame] = field(default_factory=list)
    first_sentence_text: str = ""
    server_text_to_first_audio_ms: float | None = None
    server_first_segment_synthesis_ms: float = 0.0
    server_first_text_to_first_audio_ms: float | None = None
    synthesis_ms: float = 0.0
    audio_ms: float = 0.0
    segments: int = 0

    @property
    def ttfa_ms(self) -> float:
        return (self.frames[0].t - self.t_first_text) * 1000.0

    @property
    def segment_ttfa_ms(self) -> float:
        return (self.frames[0].t - self.t_segment_complete) * 1000.0

    @property
    def wall_ms(self) -> float:
        return (self.t_session_done - self.t_first_text) * 1000.0

    def gaps_ms(self) -> list[float]:
        """Underruns of a player that starts at the first frame's arrival and plays continuously.

        Checked at every frame, not only at segment starts; a segment's frames arrive in one burst (Piper
        makes a segment's audio in one piece), so in practice an underrun is a late segment start.
        """
        gaps: list[float] = []
        play_end = self.frames[0].t
        for frame in self.frames:
            if frame.t > play_end:
                if frame is not self.frames[0]:
                    gaps.append((frame.t - play_end) * 1000.0)
                play_end = frame.t
            play_end += frame.audio_s
        return gaps


def _as_dict(message: str | bytes) -> dict[str, Any]:
    if isinstance(message, bytes):
        raise BenchError(f"expected a JSON message, got {len(message)} bytes of audio")
    data = json.loads(message)
    if not isinstance(data, dict):
        raise BenchError(f"expected a JSON object, got {message[:200]!r}")
    return data


def _check(data: dict[str, Any], kind: str) -> dict[str, Any]:
    if data.get("type") != kind:
        raise BenchError(f"expected {kind}, got {json.dumps(data)[:300]}")
    return data


def _send_tokens(
    ws: ClientConnection, tokens: Sequence[str], complete_at: int, delay_s: float, run: Run
) -> None:
    next_t = time.perf_counter()
    for i, token in enumerate(tokens):
        pause = next_t - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        now = time.perf_counter()
        if i == 0:
            run.t_first_text = now
        if i == complete_at:
            run.t_segment_complete = now
        ws.send(json.dumps({"type": "input.text", "text": token}))
        next_t += delay_s  # a fixed cadence, not sleep-after-send, so send cost does not slow the stream
    ws.send(json.dumps({"type": "input.done"}))


def speak(address: str, stream: Stream, start: threading.Barrier | None = None) -> Run:
    """Stream the tokens through one new session and record when everything arrives."""
    tokens, delay_s = stream.tokens, stream.delay_s
    complete_at, _ = first_segment(tokens, delay_s)
    run = Run()
    width = BYTES_PER_SAMPLE["pcm"]
    # voxgate.v1: session.ready and the timings this benchmark reads.
    with connect(
        f"ws://{address}{PATH}",
        subprotocols=[Subprotocol("voxgate.v1")],
        max_size=None,
        open_timeout=TIMEOUT_S,
    ) as ws:
        config: dict[str, object] = {"type": "session.config", "voice": VOICE, "response_format": "pcm"}
        if stream.seed is not None:
            config["seed"] = stream.seed
        ws.send(json.dumps(config))
        _check(_as_dict(ws.recv(timeout=TIMEOUT_S)), "session.ready")
        if start is not None:
            start.wait(TIMEOUT_S)
        failure: list[BaseException] = []

        def sender() -> None:
            try:
                _send_tokens(ws, tokens, complete_at, delay_s, run)
            except BaseException as exc:  # the thread boundary: hand the failure to the receiving side
                failure.append(exc)

        thread = threading.Thread(target=sender, name="bench-sender", daemon=True)
        thread.start()
        rate = 0  # set by the first audio.start
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while True:
                message = ws.recv(timeout=max(0.01, deadline - time.monotonic()))
                now = time.perf_counter()
                if isinstance(message, bytes):
                    if not rate:
                        raise BenchError("audio arrived before any audio.start")
                    run.frames.append(Frame(now, len(message) / width / rate))
                    continue
                data = _as_dict(message)
                match data.get("type"):
                    case "audio.start":
                        rate = data["sample_rate"]
                        if not run.first_sentence_text:
                            run.first_sentence_text = data["sentence_text"]
                    case "audio.done":
                        if data.get("error"):
                            raise BenchError(f"the engine failed on segment {data['sentence_index']}")
                        if data["sentence_index"] == 0:
                            run.server_text_to_first_audio_ms = data["text_to_first_audio_ms"]
                            run.server_first_segment_synthesis_ms = data["synthesis_ms"]
                    case "session.done":
                        run.t_session_done = now
                        run.server_first_text_to_first_audio_ms = data["first_text_to_first_audio_ms"]
                        run.synthesis_ms, run.audio_ms = data["synthesis_ms"], data["audio_ms"]
                        run.segments = data["total_sentences"]
                        break
                    case "error":
                        raise BenchError(f"server error: {data.get('code')}: {data.get('message')}")
        except TimeoutError:
            raise BenchError(f"no session.done within {TIMEOUT_S:g} s") from None
        except ConnectionClosed as exc:
            raise BenchError(f"the gateway closed the session early: {exc}") from None
        finally:
            thread.join(TIMEOUT_S)
        if failure:
            raise BenchError(f"sending tokens failed: {failure[0]!r}") from failure[0]
    _validate(run, tokens, delay_s)
    return run


def _validate(run: Run, tokens: Sequence[str], delay_s: float) -> None:
    expected = expected_first_segments(tokens, delay_s)
    if run.first_sentence_text not in expected:
        raise BenchError(
            f"server's first segment {run.first_sentence_text!r} is none of {sorted(expected)!r}"
        )
    if not run.frames or run.audio_ms <= 0:
        raise BenchError("no audio received")
    received_ms = sum(f.audio_s for f in run.frames) * 1000.0
    if abs(received_ms - run.audio_ms) > 1.0:
        raise BenchError(f"received {received_ms:.1f} ms of audio, session.done says {run.audio_ms} ms")
    if run.server_first_text_to_first_audio_ms is None:
        raise BenchError("session.done reports no first_text_to_first_audio_ms")
    if run.server_text_to_first_audio_ms is None:
        raise BenchError("the first audio.done reports no text_to_first_audio_ms")
    if run.frames[0].t < run.t_segment_complete:
        raise BenchError("audio arrived before the first segment was complete")


def speak_together(address: str, stream: Stream, sessions: int) -> list[Run]:
    """Run ``sessions`` sessions at once; their first ``input.text`` leaves at the same moment."""
    barrier = threading.Barrier(sessions)
    with concurrent.futures.ThreadPoolExecutor(sessions, thread_name_prefix="bench-session") as pool:
        futures = [pool.submit(speak, address, stream, barrier) for _ in range(sessions)]
        return [f.result(timeout=TIMEOUT_S * 2) for f in futures]  # re-raises a session's failure


# -- the engine alone ----------------------------------------------------------------------------------


class DirectEngine:
    """A second Piper engine in this process, configured as the gateway's, timed without the gateway."""

    def __init__(self, settings: Settings, seed: int | None) -> None:
        self._seed = seed
        self._runner = asyncio.Runner()
        self._engine = piper.create(settings.of(PiperSettings))
        self._runner.run(self._engine.start())

    def first_chunk_ms(self, text: str) -> float:
        return self._runner.run(self._time(text))

    async def _time(self, text: str) -> float:
        t0 = time.perf_counter()
        first: float | None = None
        # Drained to the end, so the worker is idle again before the next gateway run starts.
        async for _ in self._engine.synthesize(SynthesisRequest(text=text, voice=VOICE, seed=self._seed)):
            if first is None:
                first = time.perf_counter() - t0
        if first is None:
            raise BenchError(f"the engine produced no audio for {text!r}")
        return first * 1000.0

    def close(self) -> None:
        self._runner.run(self._engine.aclose())
        self._runner.close()


class OtherCpu:
    """CPU time that processes other than this one used since creation, from ``/proc/stat`` (Linux)."""

    def __init__(self) -> None:
        self._t0, self._own0, self._busy0 = time.perf_counter(), time.process_time(), _busy_cpu_s()

    def cores(self) -> float | None:
        """Average number of cores the rest of the machine kept busy; None where it cannot be read."""
        busy = _busy_cpu_s()
        if busy is None or self._busy0 is None:
            return None
        own = time.process_time() - self._own0
        return max(0.0, (busy - self._busy0 - own) / (time.perf_counter() - self._t0))


def _busy_cpu_s() -> float | None:
    try:
        fields = Path("/proc/stat").read_text(encoding="ascii").splitlines()[0].split()
    except OSError:
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


# -- statistics and report -----------------------------------------------------------------------------


def summary(values: Sequence[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {
        "n": int(a.size),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "max": float(a.max()),
        "min": float(a.min()),
    }


def _row(name: str, values: Sequence[float], unit: str = "ms") -> str:
    s = summary(values)
    digits = 3 if unit == "x" else 1
    cells = "".join(f"{s[k]:>10.{digits}f}" for k in ("p50", "p90", "max"))
    return f"  {name:<46}{cells}  {unit}"


def report(
    runs: list[Run], direct_ms: list[float], sweep: dict[int, list[Run]], meta: dict[str, Any]
) -> dict[str, Any]:
    """Print the tables; return everything as a JSON-able dict."""
    seg_client = [r.segment_ttfa_ms for r in runs]
    seg_server = [float(r.server_text_to_first_audio_ms or 0.0) for r in runs]
    overhead = [c - d for c, d in zip(seg_client, direct_ms, strict=True)]
    overhead_server = [s - d for s, d in zip(seg_server, direct_ms, strict=True)]
    gaps = [r.gaps_ms() for r in runs]
    figures: dict[str, list[float]] = {
        "ttfa_ms": [r.ttfa_ms for r in runs],
        "ttfa_server_ms": [float(r.server_first_text_to_first_audio_ms or 0.0) for r in runs],
        "segment_to_first_frame_client_ms": seg_client,
        "segment_to_first_frame_server_ms": seg_server,
        "engine_direct_first_chunk_ms": direct_ms,
        "gateway_overhead_ms": overhead,
        "gateway_overhead_server_side_ms": overhead_server,
        "transport_and_client_ms": [c - s for c, s in zip(seg_client, seg_server, strict=True)],
        "gateway_overhead_same_run_ms": [
            r.segment_ttfa_ms - r.server_first_segment_synthesis_ms for r in runs
        ],
        "rtf_synthesis": [r.synthesis_ms / r.audio_ms for r in runs],
        "rtf_wall": [r.wall_ms / r.audio_ms for r in runs],
        "gap_count": [float(len(g)) for g in gaps],
        "gap_max_ms": [max(g, default=0.0) for g in gaps],
    }
    header = f"  {'':<46}{'p50':>10}{'p90':>10}{'max':>10}"
    print()
    print(
        f"voxgate TTFA bench: {meta['runs']} runs, {meta['tokens']} tokens every"
        f" {meta['token_delay_ms']:g} ms, {meta['segments']} segments,"
        f" {runs[0].audio_ms / 1000:.1f} s of audio"
    )
    print(f"first segment: {meta['first_segment']!r} (complete at token {meta['first_segment_token']})")
    print(header)
    print(_row("time to first audio (first text -> frame)", figures["ttfa_ms"]))
    print(_row("  same, server first_text_to_first_audio_ms", figures["ttfa_server_ms"]))
    print(_row("first segment complete -> first frame (client)", seg_client))
    print(_row("  same, server text_to_first_audio_ms", seg_server))
    print(_row("engine direct, first segment -> first chunk", direct_ms))
    print(_row("gateway overhead (client - direct)", overhead))
    print(_row("  server side (server - direct)", overhead_server))
    print(_row("  transport + client (client - server)", figures["transport_and_client_ms"]))
    print(_row("same run: client - engine time inside gateway", figures["gateway_overhead_same_run_ms"]))
    print(_row("RTF synthesis_ms / audio_ms", figures["rtf_synthesis"], "x"))
    print(_row("RTF wall (first text -> session.done) / audio", figures["rtf_wall"], "x"))
    print(_row("inter-segment gaps per utterance", figures["gap_count"], "count"))
    print(_row("largest gap per utterance", figures["gap_max_ms"]))
    p50_overhead = summary(overhead)["p50"]
    verdict = "within" if p50_overhead < OVERHEAD_TARGET_MS else "ABOVE"
    # Load from other processes only ever adds time, to either side of a pair: the minimums are the
    # least disturbed estimate, the p50s a second opinion, when the paired figures scatter.
    of_p50s = summary(seg_client)["p50"] - summary(direct_ms)["p50"]
    of_mins = min(seg_client) - min(direct_ms)
    print(f"  gateway overhead p50 {p50_overhead:.2f} ms: {verdict} the {OVERHEAD_TARGET_MS:g} ms target")
    same_run = summary(figures["gateway_overhead_same_run_ms"])["p50"]
    print(
        f"  (cross-checks: difference of p50s {of_p50s:.2f} ms, difference of minimums {of_mins:.2f} ms,"
        f" same run {same_run:.2f} ms)"
    )
    others = meta["other_processes_cores"]
    if others is not None and others > BUSY_OTHER_CORES:
        print(f"  warning: other processes used {others:.2f} of a core on average during these runs, so")
        print("  p90/max and the paired overhead partly measure them; trust the same-run figure more")
    print()
    print(f"  concurrency sweep (sessions at once){'':<10}{'p50':>10}{'p90':>10}{'max':>10}")
    sweep_out: dict[str, Any] = {}
    for level, level_runs in sweep.items():
        ttfa = [r.ttfa_ms for r in level_runs]
        level_gaps = [r.gaps_ms() for r in level_runs]
        print(_row(f"{level} session{'s' if level > 1 else ''}: TTFA (n={len(ttfa)})", ttfa))
        print(
            _row(
                f"{level} session{'s' if level > 1 else ''}: first segment -> first frame",
                [r.segment_ttfa_ms for r in level_runs],
            )
        )
        gap_total = sum(len(g) for g in level_gaps)
        gap_max = max((max(g, default=0.0) for g in level_gaps), default=0.0)
        rtf = summary([r.synthesis_ms / r.audio_ms for r in level_runs])["p50"]
        print(
            f"  {'':<4}gaps: {gap_total} in {len(level_runs)} utterances, max {gap_max:.1f} ms; "
            f"RTF synthesis p50 {rtf:.3f}"
        )
        sweep_out[str(level)] = {
            "ttfa_ms": summary(ttfa),
            "segment_to_first_frame_client_ms": summary([r.segment_ttfa_ms for r in level_runs]),
            "rtf_synthesis": summary([r.synthesis_ms / r.audio_ms for r in level_runs]),
            "gap_count_total": gap_total,
            "gap_max_ms": gap_max,
            "raw_ttfa_ms": ttfa,
        }
    print()
    return {
        "meta": meta,
        "summary": {k: summary(v) for k, v in figures.items()},
        "gateway_overhead": {
            "paired_p50_ms": p50_overhead,
            "paired_p90_ms": summary(overhead)["p90"],
            "difference_of_p50s_ms": of_p50s,
            "difference_of_minimums_ms": of_mins,
            "same_run_p50_ms": same_run,
            "target_ms": OVERHEAD_TARGET_MS,
            "within_target": p50_overhead < OVERHEAD_TARGET_MS,
        },
        "raw": figures,
        "runs": [_run_json(r) for r in runs],
        "concurrency": sweep_out,
    }


def _run_json(run: Run) -> dict[str, Any]:
    out = {k: v for k, v in asdict(run).items() if k != "frames"}
    out.update(
        frames=len(run.frames),
        ttfa_ms=run.ttfa_ms,
        segment_ttfa_ms=run.segment_ttfa_ms,
        gaps_ms=run.gaps_ms(),
    )
    return out


# -- main ----------------------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> dict[str, Any]:
    tokens = tokenize(PARAGRAPH)
    complete_at, first_text = first_segment(tokens, args.token_delay_ms / 1000.0)
    stream = Stream(tokens, args.token_delay_ms / 1000.0, args.seed)
    settings = Settings(engine="piper")
    started = time.perf_counter()
    load_before = os.getloadavg()
    print(
        f"starting gateway and a direct Piper engine (threads={settings.of(PiperSettings).piper_threads}, "
        f"workers={settings.of(PiperSettings).piper_workers}) ...",
        file=sys.stderr,
    )
    direct = DirectEngine(settings, args.seed)
    try:
        with serve(create_app(settings)) as address:
            speak(address, stream)  # warm-up: first-use allocations on both sides
            direct.first_chunk_ms(first_text)
            runs: list[Run] = []
            direct_ms: list[float] = []
            others = OtherCpu()
            for i in range(args.runs):
                # Alternate which goes first, so slow drift in machine load does not favour one side.
                if i % 2:
                    runs.append(speak(address, stream))
                    direct_ms.append(direct.first_chunk_ms(first_text))
                else:
                    direct_ms.append(direct.first_chunk_ms(first_text))
                    runs.append(speak(address, stream))
                print(
                    f"  run {i + 1}/{args.runs}: TTFA {runs[-1].ttfa_ms:.1f} ms, segment -> frame "
                    f"{runs[-1].segment_ttfa_ms:.1f} ms, direct {direct_ms[-1]:.1f} ms",
                    file=sys.stderr,
                )
            other_cores = others.cores()
            sweep: dict[int, list[Run]] = {}
            for level in args.levels:
                sweep[level] = []
                for _ in range(math.ceil(args.sweep_samples / level)):
                    sweep[level].extend(speak_together(address, stream, level))
                print(f"  sweep {level}: {len(sweep[level])} sessions done", file=sys.stderr)
    finally:
        direct.close()
    meta = {
        "runs": args.runs,
        "tokens": len(tokens),
        "token_delay_ms": args.token_delay_ms,
        "seed": args.seed,
        "first_segment": first_text,
        "first_segment_token": complete_at,
        "segments": runs[0].segments,
        "paragraph": PARAGRAPH,
        "settings": msgspec.to_builtins(settings.of(PiperSettings)),
        "elapsed_s": round(time.perf_counter() - started, 1),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "other_processes_cores": other_cores,
    }
    out = report(runs, direct_ms, sweep, meta)
    load = ", ".join(f"{x:.2f}" for x in meta["load_average_before"])
    print(
        f"elapsed {meta['elapsed_s']} s on {meta['cpus']} CPUs; load average before the bench: {load}", end=""
    )
    if other_cores is not None:
        print(f"; other processes during the runs: {other_cores:.2f} of a core", end="")
    print()
    return out


def _levels(text: str) -> list[int]:
    levels = [int(x) for x in text.split(",") if x.strip()]
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("levels are positive integers, e.g. 1,2,4")
    return levels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=20, help="measured single-session runs (default 20)")
    parser.add_argument("--json", type=Path, help="also write every figure and raw sample to this file")
    parser.add_argument("--token-delay-ms", type=float, default=TOKEN_DELAY_MS, help="pause between tokens")
    parser.add_argument(
        "--seed",
        type=int,
        help="synthesis seed: Piper then runs noise-free, so every run speaks identical audio",
    )
    parser.add_argument(
        "--levels", type=_levels, default=list(SWEEP_LEVELS), help="concurrency sweep levels (default 1,2,4)"
    )
    parser.add_argument(
        "--sweep-samples",
        type=int,
        default=SWEEP_SAMPLES,
        help="sessions measured per sweep level (default 12)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.sweep_samples < 1:
        parser.error("--runs and --sweep-samples must be at least 1")
    try:
        out = bench(args)
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    except (ConnectionClosed, InvalidHandshake, OSError) as exc:  # the gateway is unreachable or went away
        print(f"bench failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
