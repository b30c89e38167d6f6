"""The ``voxgate`` command line: ``serve`` runs the gateway, ``say`` and ``voices`` talk to a running one.

Argument parsing and dispatch only; the client work lives in ``voxgate.client``. ``voices import|export``
work on the voice store itself, not through a gateway (``gateway.voices.folder``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING

from .engine import ENGINES
from .gateway.settings import Settings, options
from .protocol.messages import DEFAULT_SAMPLE_RATE

if TYPE_CHECKING:
    from .client import ClientSettings
    from .engine import TTSEngine


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``voxgate`` subcommand."""
    parser = argparse.ArgumentParser(
        prog="voxgate",
        description="A real-time voice gateway: text streamed in, speech streamed out.",
        epilog="Start a gateway with 'voxgate serve --engine piper', then try 'voxgate say \"Hello there.\" "
        "-o out.wav'; 'voxgate COMMAND --help' shows a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the gateway")
    add_setting_flags(serve)
    _add_client_commands(commands)
    return parser


def _version() -> str:
    """The installed distribution's version (a checkout that was never installed says so)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("voxgate")
    except PackageNotFoundError:
        return "(not installed)"


def _text(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("nothing to say: give the text, or - (or nothing) to read stdin")
    return text


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting declared with one (``gateway.settings.options()``); unset flags stay None."""
    for opt in options():
        if opt.flag is None:
            continue
        help = opt.help + (f" (engine {opt.group})" if opt.group else "")
        if shown := opt.shown_default().replace("`", ""):
            help += f"; default {shown}"
        if opt.name == "engine":
            kind: Callable[[str], object] = _engines
        elif opt.type is bool:
            kind = _boolean
        elif typing.get_origin(opt.type) is tuple:
            kind = typing.get_args(opt.type)[0]
        else:
            kind = opt.type
        parser.add_argument(
            opt.flag,
            dest=opt.name,
            metavar=opt.flag.removeprefix("--").replace("-", "_").upper(),
            type=kind,
            action="append" if opt.repeat else "store",
            help=help.replace("%", "%%") + (" (repeatable)" if opt.repeat else ""),
        )


def _engines(text: str) -> str:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown engine(s) {unknown or text!r}; choose from {sorted(ENGINES)}"
        )
    return ",".join(names)


def _boolean(text: str) -> bool:
    value = {
        "true": True,
        "1": True,
        "on": True,
        "yes": True,
        "false": False,
        "0": False,
        "off": False,
        "no": False,
    }
    if (parsed := value.get(text.strip().lower())) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return parsed


def _ranged(kind: type[int] | type[float], low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not within {low:g} to {high:g}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _output(text: str) -> str:
    from .client import output_problem

    if problem := output_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


def _add_client_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    gateway = argparse.ArgumentParser(add_help=False)
    gateway.add_argument("--url", help="the gateway (default $VOXGATE_URL or http://127.0.0.1:8000)")
    gateway.add_argument(
        "--api-key", help="API key, sent as Authorization: Bearer (default $VOXGATE_API_KEY)"
    )

    say = commands.add_parser(
        "say",
        parents=[gateway],
        help="speak text with a running gateway",
        description="Stream text to a running gateway and write the speech as it arrives.",
    )
    say.add_argument(
        "text",
        nargs="?",
        default="-",
        type=_text,
        help="what to say; omitted or - reads stdin as it is written",
    )
    say.add_argument(
        "-o",
        "--output",
        required=True,
        type=_output,
        help="a .wav/.flac/.ogg file, a .pcm/.raw file, or - for raw s16le PCM on stdout",
    )
    say.add_argument("--voice", help="voice name (default: the gateway's default voice)")
    say.add_argument(
        "--sample-rate",
        type=_ranged(int, 8000, 48000),
        help=f"Hz, 8000 to 48000 (default {DEFAULT_SAMPLE_RATE}, whatever the engine)",
    )
    say.add_argument("--speed", type=_ranged(float, 0.25, 4.0), help="0.25 to 4.0 (default 1.0)")
    say.add_argument("-q", "--quiet", action="store_true", help="no summary line on stderr")

    voices = commands.add_parser(
        "voices",
        help="list, upload and delete voices of a running gateway; import and export speaker folders",
    )
    actions = voices.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", parents=[gateway], help="built-in and uploaded voices")
    listing.add_argument("--json", action="store_true", help="print the gateway's JSON answer")
    upload = actions.add_parser(
        "upload",
        parents=[gateway],
        help="upload a voice to clone",
        usage="voxgate voices upload NAME (FILE | --embedding FILE.json) --consent TEXT "
        "[--ref-text TEXT] [--description TEXT]",
    )
    upload.add_argument("name", help="the new voice's name")
    source = upload.add_mutually_exclusive_group(required=True)
    source.add_argument("file", nargs="?", help="reference clip: wav, flac, ogg or mp3, 1 to 30 s")
    source.add_argument(
        "--embedding", metavar="FILE.json", help="a speaker embedding: a JSON list of numbers"
    )
    upload.add_argument("--consent", required=True, help="record of the speaker's consent")
    upload.add_argument("--ref-text", help="transcript of the reference clip")
    upload.add_argument("--description", help="a description of the speaker")
    delete = actions.add_parser("delete", parents=[gateway], help="delete an uploaded voice")
    delete.add_argument("name")
    _add_folder_commands(actions)


def _add_folder_commands(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``voices import|export``: work on the voice store itself (``--voices-dir``, ``--voice-store``, as
    ``serve`` reads them), so no gateway needs to run and a store no gateway serves yet can be filled."""
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("folder", metavar="DIR", help="vllm-omni's speaker folder (its SPEAKER_SAMPLES_DIR)")
    store.add_argument(
        "--voices-dir", help="voxgate's voice folder (default $VOXGATE_VOICES_DIR or ~/.cache/voxgate/voices)"
    )
    store.add_argument(
        "--voice-store", help="s3://BUCKET/PREFIX instead of --voices-dir (default $VOXGATE_VOICE_STORE)"
    )
    store.add_argument(
        "--owner-key",
        metavar="API_KEY",
        help="the voices of this API key (default: those uploaded without one)",
    )
    store.add_argument("--replace", action="store_true", help="replace voices of the same name")
    actions.add_parser(
        "import",
        parents=[store],
        help="copy the voices of a vllm-omni speaker folder into the voice store",
        description="Copy every voice of a vllm-omni speaker folder into voxgate's voice store, checked as "
        "an upload is; a running gateway sees them at once.",
    )
    actions.add_parser(
        "export",
        parents=[store],
        help="write the voice store's voices as a vllm-omni speaker folder",
        description="Write voxgate's voices as a vllm-omni speaker folder; vllm-omni loads them when it "
        "starts with SPEAKER_SAMPLES_DIR=DIR.",
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``voxgate`` console script; with no argument it prints its help (status 2)."""
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_help()
        return 2
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "voices" and args.action in ("import", "export"):
        return _voice_folder(args)
    from . import client

    settings = client.ClientSettings.from_env(url=args.url, api_key=args.api_key)
    try:
        _run_client(args, settings)
    except client.ClientError as exc:
        print(f"voxgate: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (``| head``): stop quietly, and keep Python's exit flush quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .gateway.app import engine_names

    fields = {k: v for k, v in vars(args).items() if k != "command"}
    settings = Settings.from_env(**fields)
    for name in engine_names(settings):
        entry = ENGINES.get(name)
        if entry is None:
            problem: str | None = f"is not one of {', '.join(ENGINES)}"
        else:
            problem = entry.problem(settings.engine_settings(name))
        if problem:
            print(f"voxgate: engine {name!r} {problem}", file=sys.stderr)
            return 2
    if settings.wyoming:
        from .gateway.routes.wyoming import parse_address

        try:
            parse_address(settings.wyoming)
        except ValueError as exc:
            print(f"voxgate: {exc}", file=sys.stderr)
            return 2
    configure_logging(settings)
    serve(settings)
    return 0


def serve(settings: Settings, engine: TTSEngine | None = None) -> None:
    """Run the gateway until it is stopped (SIGINT, SIGTERM: drained first); ``engine`` replaces the engines
    the settings name (tests/vllm_omni/inprocess_gateway.py passes the in-process engine over its CPU engine
    client)."""
    from .gateway.app import create_app
    from .gateway.server.config import server_config
    from .gateway.server.serve import DrainingServer

    app = create_app(settings, engine)
    config = server_config(app, settings)
    DrainingServer(config, app.state.sessions).run()


def _voice_folder(args: argparse.Namespace) -> int:
    """``voices import|export``: one line per voice moved or skipped; 1 when any was skipped."""
    from pathlib import Path

    from .gateway.middleware.auth import owner_of
    from .gateway.voices.backend import open_store
    from .gateway.voices.folder import export_folder, import_folder
    from .gateway.voices.local import VoiceStoreUnavailable

    settings = Settings.from_env(voices_dir=args.voices_dir, voice_store=args.voice_store)
    owner = owner_of(args.owner_key) if args.owner_key else ""
    folder = Path(args.folder)
    try:
        store = open_store(settings)
        if args.action == "import":
            report = import_folder(
                folder, store, owner, replace=args.replace, max_rate=settings.max_clip_rate_hz
            )
        else:
            report = export_folder(store, owner, folder, replace=args.replace)
    except (OSError, RuntimeError, ValueError, VoiceStoreUnavailable) as exc:
        print(f"voxgate: error: {exc}", file=sys.stderr)
        return 1
    verb = "imported" if args.action == "import" else "exported"
    for moved in report.moved:
        print(f"{verb} {moved.name!r} ({moved.file})")
    for skipped in report.skipped:
        print(f"skipped {skipped.what}: {skipped.reason}", file=sys.stderr)
    print(f"{len(report.moved)} {verb}, {len(report.skipped)} skipped", file=sys.stderr)
    return 1 if report.skipped else 0


def configure_logging(settings: Settings) -> None:
    """The log of ``voxgate serve``: one line a record on stderr, with API keys redacted
    (``gateway.middleware.auth``) and control characters escaped (``gateway.logs``) in every record the
    process
    makes, uvicorn's access and error lines too (their handlers are configured later, by uvicorn)."""
    from .gateway.logs import install_escaping
    from .gateway.middleware.auth import install_redaction

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    install_redaction(settings.all_api_keys())
    install_escaping()  # after the redaction: it escapes what the redaction left


def _run_client(args: argparse.Namespace, settings: ClientSettings) -> None:
    from . import client, voice_client

    match args.command, getattr(args, "action", None):
        case "say", _:
            options = client.SayOptions(voice=args.voice, sample_rate=args.sample_rate, speed=args.speed)
            texts = client.stdin_texts() if args.text == "-" else [args.text]
            result = client.say(
                settings, texts, args.output, options, stdout=sys.stdout.buffer, stderr=sys.stderr
            )
            if not args.quiet:
                print(result.summary(), file=sys.stderr)
        case "voices", "list":
            voices, raw = voice_client.list_voices(settings)
            print(json.dumps(json.loads(raw), indent=2) if args.json else voice_client.voice_table(voices))
        case "voices", "upload":
            voice, warning = voice_client.upload_voice(
                settings,
                args.name,
                consent=args.consent,
                audio=args.file,
                embedding=args.embedding,
                ref_text=args.ref_text,
                description=args.description,
            )
            print(f"uploaded voice {voice.name!r}: {voice.details()}")
            if warning is not None:
                print(f"voxgate: warning: {warning.message} ({warning.code})", file=sys.stderr)
        case "voices", "delete":
            print(voice_client.delete_voice(settings, args.name))


if __name__ == "__main__":
    sys.exit(main())
