"""A real Redis (Debian's ``redis-server``) on a free loopback port for the fleet tests; nothing persisted."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import TIMEOUT_S


def free_port() -> int:
    """A loopback port free right now (the server binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` process that a test may stop and start again on the same port."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is needed (apt-get install redis-server; .ci/run installs it)")
        self.binary = binary
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (again, on the same port, with nothing in it) and wait until it answers."""
        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
        command += ["no", "--dir", str(self.folder)]
        with (self.folder / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + TIMEOUT_S
        while not self._answers():
            assert self.process.poll() is None, (self.folder / "redis.log").read_text()
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Kill it (SIGKILL: what it held is gone) and wait for it to exit."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(TIMEOUT_S)
        self.process = None


@contextmanager
def redis_server(folder: Path) -> Iterator[RedisServer]:
    """A running Redis, killed afterwards."""
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()
