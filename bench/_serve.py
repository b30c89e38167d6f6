"""What the benches share to run a gateway of their own: a free port, the ``voxgate serve`` command,
and stopping it."""

from __future__ import annotations

import socket
import subprocess
import sys

# This interpreter, so the gateway runs from the same environment (and tree) as the bench.
_VOXGATE = [sys.executable, "-c", "import sys; from voxgate.cli import main; sys.exit(main())"]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM (the gateway drains), and SIGKILL if it has not exited within ``timeout_s``."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def serve_command(*flags: str) -> list[str]:
    """``voxgate serve`` with ``flags``, run by this interpreter."""
    return [*_VOXGATE, "serve", *flags]
