"""The ``voxgate`` command line."""

from __future__ import annotations

import argparse
import logging
import sys

from engine import ENGINES
from gateway.settings import Settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxgate", description="Real-time streaming TTS gateway")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument("--engine", choices=sorted(ENGINES), help="TTS engine (default piper)")
    serve.add_argument("--piper-threads", type=int, help="ONNX Runtime threads per Piper inference")
    serve.add_argument("--piper-workers", type=int, help="Piper inferences that may run at once")
    serve.add_argument("--config-timeout-s", type=float, help="seconds to wait for session.config")
    serve.add_argument("--idle-timeout-s", type=float, help="seconds without messages or audio before closing")
    serve.add_argument("--max-buffered-audio-s", type=float, help="audio a client may leave unread before closing")
    serve.add_argument("--log-level", help="debug, info, warning, error")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``voxgate`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "serve":
        import uvicorn

        from gateway.app import create_app

        fields = {k: v for k, v in vars(args).items() if k != "command"}
        settings = Settings.from_env(**fields)
        logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
        # uvicorn's own frame limit sits above ours, so an oversized message gets our error, not a bare 1009.
        uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level,
                    ws_max_size=settings.max_config_bytes + 1024 * 1024)
    return 0


if __name__ == "__main__":
    sys.exit(main())
