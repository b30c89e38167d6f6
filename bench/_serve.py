"""What the benches share to run a gateway of their own: a free port and the ``voxgate serve`` command."""

from __future__ import annotations

import socket
import sys

# This interpreter, so the gateway runs from the same environment (and tree) as the bench.
_VOXGATE = [sys.executable, "-c", "import sys; from voxgate.cli import main; sys.exit(main())"]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve_command(*flags: str) -> list[str]:
    """``voxgate serve`` with ``flags``, run by this interpreter."""
    return [*_VOXGATE, "serve", *flags]
