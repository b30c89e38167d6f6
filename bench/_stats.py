"""What the benches compute from their samples, and read from ``/proc`` (Linux): percentiles, CPU, memory."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
T = TypeVar("T")


def rotated(items: Sequence[T], turn: int) -> list[T]:
    """``items`` in an order that turns with ``turn``, so that drifting machine load favours none of them."""
    k = turn % len(items)
    return [*items[k:], *items[:k]]


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (linear interpolation); NaN when there are none."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else math.nan


def percentiles(values: Sequence[float], qs: Iterable[int] = (50, 95, 99)) -> dict[str, float | None]:
    """``{"n", "min", "p50", ..., "max"}`` of ``values``; None for each figure when there are none."""
    out: dict[str, float | None] = {"n": len(values), "min": min(values) if values else None}
    out.update({f"p{q}": pct(values, q) if values else None for q in qs})
    out["max"] = max(values) if values else None
    return out


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces; the fields after its closing parenthesis do not.
    return stat[stat.rindex(")") + 2 :].split()


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) that process ``pid`` has used so far; 0 once it is gone."""
    fields = _stat_fields(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) * _TICK_S  # proc(5) fields 14, 15


def group_cpu_s(pgid: int) -> float:
    """CPU seconds used so far by the live processes of process group ``pgid``."""
    total = 0.0
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat_fields(int(entry.name))
        if fields is not None and int(fields[2]) == pgid:
            total += (int(fields[11]) + int(fields[12])) * _TICK_S
    return total


def thread_cpu_s(pid: int, prefix: str) -> float:
    """CPU seconds used so far by the live threads of ``pid`` whose kernel name starts with ``prefix``.

    The embedded engine names its inference threads (``engine.workers.name_os_thread``: ``piper-0``...),
    and the ONNX Runtime pool threads they start inherit the name: this is the engine's share of a server.
    """
    total = 0.0
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
        try:
            if not (task / "comm").read_text().startswith(prefix):
                continue
            stat = (task / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) * _TICK_S
    return total


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid`` in KiB; 0 once it is gone."""
    try:
        statm = Path(f"/proc/{pid}/statm").read_text().split()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return int(statm[1]) * _PAGE_KIB


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, everything but idle and iowait)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) * _TICK_S  # guest time is already in user time


class CpuWindow:
    """Cores kept busy from its creation on: by the whole machine, and by ``ours`` (CPU seconds so far)."""

    def __init__(self, ours: Callable[[], float]) -> None:
        self._ours = ours
        self._t0, self._busy0, self._ours0 = time.perf_counter(), machine_busy_s(), ours()

    def cores(self) -> tuple[float, float, float]:
        """(seconds since creation, cores the machine kept busy, of them ours)."""
        elapsed = time.perf_counter() - self._t0
        return elapsed, (machine_busy_s() - self._busy0) / elapsed, (self._ours() - self._ours0) / elapsed


def uptime_line() -> str:
    """``uptime``'s line, or the load averages and the number of cores where the command is missing."""
    if shutil.which("uptime"):
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    one, five, fifteen = os.getloadavg()
    return f"load average: {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


def write_json(result: object, target: str | Path | None) -> None:
    """Write ``result`` as JSON to the file ``target``, to stdout for ``-``, nowhere for None or ``""``."""
    if str(target) == "-":
        json.dump(result, sys.stdout, indent=2)
        print()
    elif target:
        Path(target).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {target}", file=sys.stderr)
