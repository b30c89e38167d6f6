"""CPU and memory of processes and of the machine, read from ``/proc`` (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) that process ``pid`` has used so far; 0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # The command name (field 2) may hold spaces; the fields after its closing parenthesis do not.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) * _TICK_S


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid`` in KiB; 0 once it is gone."""
    try:
        statm = Path(f"/proc/{pid}/statm").read_text().split()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return int(statm[1]) * _PAGE_KIB


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, everything but idle and iowait)."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()
    ticks = [int(v) for v in first[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    # guest time is already counted in user time
    busy = sum(ticks[:8]) - idle
    return busy * _TICK_S


def uptime_line() -> str:
    """What ``uptime`` says about the load: the load averages and the number of cores."""
    one, five, fifteen = os.getloadavg()
    return f"load average: {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/PID/status`` (``VmRSS``, ``VmHWM``, ...) of process ``pid``."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise ValueError(f"no {field} in /proc/{pid}/status")
