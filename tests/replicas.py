"""Gateway replicas as real processes (``voxgate serve``), which a test can SIGKILL or SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.conftest import TIMEOUT_S
from tests.redis_server import free_port


class Replica:
    """One ``voxgate serve --engine fake`` process on a loopback port, its log in ``folder``."""

    def __init__(self, folder: Path, name: str, env: Mapping[str, str]) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.log = folder / f"{name}.log"
        host, port = self.address.split(":")
        environ = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
        environ.update({"VOXGATE_VOICES_DIR": str(folder / f"{name}-voices"), **env})
        command = [sys.executable, "-m", "voxgate.cli", "serve", "--engine", "fake", "--host", host]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [*command, "--port", port], env=environ, stdout=log, stderr=subprocess.STDOUT
            )

    def wait_ready(self) -> None:
        """Wait until ``/readyz`` answers 200."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            assert self.process.poll() is None, self.log.read_text()
            try:
                if httpx.get(f"http://{self.address}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{self.address} never got ready:\n{self.log.read_text()}"
            time.sleep(0.05)

    def signal(self, signum: signal.Signals) -> None:
        self.process.send_signal(signum)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(TIMEOUT_S)


@contextmanager
def replica(folder: Path, name: str, env: Mapping[str, str]) -> Iterator[Replica]:
    """A ready replica, killed afterwards if it still runs."""
    started = Replica(folder, name, env)
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()
