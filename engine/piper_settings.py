"""The settings of engine ``piper`` (``voxgate serve --engine piper``): threads, workers and memory arenas."""

from __future__ import annotations

from typing import Annotated

import msgspec

from .options import option


class PiperSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of engine ``piper``."""

    # One intra-op thread per inference and two inferences at once use both cores of a small
    # machine without oversubscription (measured on a 2-core machine like CI's: RTF 0.089 at 1 thread,
    # 0.063 at 2).
    piper_threads: Annotated[int, option("ONNX Runtime threads per Piper inference", flag=True)] = 1
    piper_workers: Annotated[
        int,
        option(
            "Piper inferences that may run at once; waiting segments go earliest deadline first (a first "
            "segment now, a later one when its session's audio runs out)",
            flag=True,
        ),
    ] = 2
    # A run alone on the machine may use every core: on an idle machine first audio then takes what
    # Piper's own best takes (onnxruntime's default threads), not twice that with one thread.
    piper_wide_threads: Annotated[
        int,
        option(
            "ONNX Runtime threads of a Piper inference that runs alone (no other inference in progress); "
            "0 for the cores this process may use, 1 or less than `piper_threads` for none",
            flag=True,
        ),
    ] = 0
    # On: first audio 20-30% sooner (bench/piper_first_audio.py --wide-arena), the arena kept while
    # there is traffic (about 100 MB at most, pieces being bounded) and freed after 5 s idle.
    piper_wide_arena: Annotated[
        bool,
        option(
            "give the wide session ONNX Runtime's memory arena (first audio sooner), freed after 5 s without "
            "work; `false`: no arena, memory given back after each inference",
            shown="`true`",
        ),
    ] = True
    # On: 7-9% less CPU per audio second with two inferences at once (74-75 ms instead of 80-82 on this
    # voice: the page faults of tensors malloc'd and freed on every run go, docs/performance.md), for the
    # arena's pages kept while there is traffic (bounded, pieces being bounded) and freed after 5 s idle.
    piper_arena: Annotated[
        bool,
        option(
            "give the inference sessions ONNX Runtime's memory arena (less CPU under load), freed after 5 s "
            "without work; `false`: no arena, memory given back after each inference",
            shown="`true`",
        ),
    ] = True
