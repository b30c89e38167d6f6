"""The Piper engine's state, grouped: the sessions to build, the loaded model, the work in progress
(``engine.piper``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from piper import PiperVoice


@dataclass(frozen=True, slots=True)
class Sessions:
    """The ONNX Runtime sessions of the model to build (``PiperEngine``'s arguments)."""

    threads: int  #: intra-op threads of each narrow session
    wide_threads: int  #: of the wide session, for a run alone (none unless above ``threads``)
    arena: bool  #: the narrow sessions keep ONNX Runtime's CPU memory arena, freed when idle
    wide_arena: bool  #: the wide session does


@dataclass(slots=True, eq=False)
class Model:
    """The loaded voice (``PiperEngine._load``)."""

    voice: PiperVoice
    wide: PiperVoice | None  #: the same model with ``wide_threads``, for a run alone
    ready_ids: list[int]  #: "Ready." as phoneme ids: the arena shrink's short run


class Busy:
    """What the engine is doing, counted across the worker threads."""

    def __init__(self) -> None:
        self.pieces = 0  #: pieces started: an arena shrink waits for a quiet spell
        self._segments = 0  # segments begun and not ended: at 0 the engine is idle
        # Jobs inferring now. Not the workers' running count: that includes a finished job's housekeeping
        # (``release_freed_memory`` can take tens of ms), and a segment queued right behind the one before
        # it then ran on one thread, though alone (half the first-audio runs of bench/piper_first_audio.py).
        self.inferring = 0
        self._lock = threading.Lock()

    def count(self, change: int) -> int:
        with self._lock:
            self.inferring += change
            return self.inferring

    def begin(self) -> None:
        with self._lock:
            self._segments += 1

    def end(self) -> int:
        """One segment fewer in progress; returns how many are left."""
        with self._lock:
            self._segments -= 1
            return self._segments
