"""How every bench runs a server: ``voxgate serve`` itself, as production runs it, on a free loopback port.

The real command line (``voxgate.cli.main``), so a bench measures what ``voxgate serve`` runs: uvicorn with
``uvicorn_ws_options`` (the read-receipts protocol and its coalescing writes), the header timeout, the
drain. ``Server`` runs any command in its own process group and keeps every line it prints with its arrival
time (``time.perf_counter``), so a bench can match log lines to its own stamps.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from _stats import group_cpu_s

# This interpreter, so the gateway runs from the same environment (and tree) as the bench.
VOXGATE = [sys.executable, "-c", "import sys; from voxgate.cli import main; sys.exit(main())"]
STARTUP_TIMEOUT_S = 120.0  # Piper loads and warms its model in the lifespan

_TOP_TRACEBACK = re.compile(r"^(?:Traceback \(most recent call last\)|\s*\+ Exception Group Traceback)")
_EXCEPTION_LINE = re.compile(r"^[\s|]*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\w*): (.*)")


class BenchError(Exception):
    """The benchmark could not measure what it claims to measure."""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """A subprocess in its own process group; every line it prints is kept with its arrival time."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        port: int,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self.name, self.port = name, port
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self._lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._log: IO[str] | None = log.open("a", encoding="utf-8") if log else None
        self._reader = threading.Thread(target=self._read, name=f"log-{name}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def url(self, path: str = "", scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            stamp = time.perf_counter()
            with self._lock:
                self._lines.append((stamp, line.rstrip("\n")))
            if self._log is not None:
                self._log.write(line)
                self._log.flush()

    def lines(self, since: int = 0) -> list[tuple[float, str]]:
        with self._lock:
            return self._lines[since:]

    def mark(self) -> int:
        with self._lock:
            return len(self._lines)

    def tail(self, n: int = 40) -> str:
        return "\n".join(line for _, line in self.lines()[-n:])

    def save(self, path: Path) -> None:
        """The output so far, each line after its arrival time (perf_counter seconds)."""
        path.write_text("".join(f"{stamp:.4f} {line}\n" for stamp, line in self.lines()))

    def tracebacks(self) -> dict[str, int]:
        """Tracebacks in the output (an exception group counts once), by their innermost exception."""
        found: dict[str, int] = {}
        lines = [line for _, line in self.lines()]
        for i, line in enumerate(lines):
            if _TOP_TRACEBACK.match(line):
                kind = "?"
                for later in lines[i + 1 : i + 200]:
                    if (m := _EXCEPTION_LINE.match(later)) and "ExceptionGroup" not in m[1]:
                        kind = f"{m[1]}: {m[2][:100]}"
                        break
                found[kind] = found.get(kind, 0) + 1
        return found

    def wait_ready(self, path: str, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Poll ``path`` until it answers 200; fail if the process exits or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(urllib.error.URLError, OSError):
                with urllib.request.urlopen(self.url(path), timeout=2.0) as response:
                    if response.status == 200:
                        return
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: {path} not ready within {timeout_s:g} s:\n{self.tail()}")
            time.sleep(0.1)

    def cpu_s(self) -> float:
        """CPU seconds used so far by the live processes of this server's process group."""
        return group_cpu_s(self.pid)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (a gateway drains), and SIGKILL if it has not exited within ``timeout_s``."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._reader.join(5)
        if self._log is not None:
            self._log.close()


@contextlib.contextmanager
def gateway(
    *flags: str,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    timeout_s: float = STARTUP_TIMEOUT_S,
) -> Iterator[Server]:
    """``voxgate serve FLAGS`` on a free loopback port with an empty voices folder, ready; stopped on exit.

    Settings the flags do not give come from ``env`` (``VOXGATE_*``) and the defaults, as in production.
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="voxgate-bench-") as voices:
        argv = [*VOXGATE, "serve", "--host", "127.0.0.1", "--port", str(port), "--voices-dir", voices]
        server = Server("voxgate", [*argv, *flags], port, env, log, cwd=voices)
        try:
            server.wait_ready("/readyz", timeout_s)
            yield server
        finally:
            server.stop()
