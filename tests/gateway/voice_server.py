"""A gateway process that serves only the voice routes, for the multi-process and crash tests.

Run as ``python -m tests.gateway.voice_server DIRECTORY [--max-voices N] [--key KEY]...``: it binds a
free loopback port, prints it as its first line, then serves until killed. The socket listens before
the port is printed, so a client may connect at once; uvicorn accepts once its lifespan has run.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from voxgate.gateway.middleware.auth import AuthMiddleware
from voxgate.gateway.routes import voices
from voxgate.gateway.voices.local import VoiceStore

ROOT = Path(__file__).resolve().parents[2]
Process = subprocess.Popen[bytes]


def build_app(directory: Path, *, max_voices: int = 1000, keys: Sequence[str] = ()) -> Starlette:
    """The voice routes over a store on ``directory``, behind API keys when ``keys`` is not empty."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, object]]:
        yield {"voices": VoiceStore(directory, max_voices=max_voices)}

    middleware = [Middleware(AuthMiddleware, keys=keys)] if keys else []
    return Starlette(routes=voices.routes, lifespan=lifespan, middleware=middleware)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--max-voices", type=int, default=1000)
    parser.add_argument("--key", action="append", default=[])
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(sock.getsockname()[1], flush=True)
    app = build_app(args.directory, max_voices=args.max_voices, keys=args.key)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).run(sockets=[sock])


def start(directory: Path, *args: str) -> tuple[Process, str]:
    """Start a server process on ``directory``; returns it and its base URL."""
    command = [sys.executable, "-m", "tests.gateway.voice_server", str(directory), *args]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.strip().isdigit():
        stop(process)
        raise RuntimeError(f"voice server did not start: {line!r}")
    return process, f"http://127.0.0.1:{int(line)}"


def stop(process: Process) -> None:
    """Kill a server process and reap it (SIGKILL: the crash test wants no graceful shutdown)."""
    if process.poll() is None:
        process.kill()
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


@contextlib.contextmanager
def running(directory: Path, *args: str) -> Iterator[str]:
    """A server process for the duration of the block; yields its base URL."""
    process, url = start(directory, *args)
    try:
        yield url
    finally:
        stop(process)


if __name__ == "__main__":
    main()
