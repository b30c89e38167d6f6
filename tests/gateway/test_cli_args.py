"""Argument parsing of every ``voxgate`` subcommand (no server), and the client's URL rules."""

from __future__ import annotations

import argparse

import pytest
from voxgate.engine.piper import PiperSettings
from voxgate.engine.remote_settings import RemoteSettings
from voxgate.gateway.settings import Settings, options
from voxgate.protocol.messages import SessionConfig

from voxgate.cli import build_parser
from voxgate.client import ClientError, http_url, output_problem, ws_url


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Parse ``argv`` expecting argparse's usage error; returns its stderr."""
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def test_a_subcommand_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert "required" in refused(capsys)


def test_serve_flags_map_onto_settings() -> None:
    args = parse(
        "serve", "--host", "0.0.0.0", "--port", "9000", "--engine", "fake, piper", "--piper-threads", "2",
        "--piper-workers", "3", "--config-timeout-s", "5", "--idle-timeout-s", "30",
        "--max-buffered-audio-s", "20", "--send-timeout-s", "7", "--log-level", "debug", "--upstream", "http://a:8091",
        "--upstream", "http://b:8091", "--upstream-model", "m", "--voices-dir", "/v", "--max-voices", "7",
        "--api-keys-file", "/k", "--allowed-origin", "https://app.example", "--vllm-model", "Qwen/x",
        "--vllm-deploy-config", "d.yaml", "--drain-timeout-s", "4", "--max-sessions", "9",
        "--max-sessions-per-key", "3", "--max-pending-text-chars", "100", "--fake-delay-s", "0.5",
        "--max-segment-audio-base-s", "3", "--max-segment-audio-per-char-s", "0.2",
        "--piper-wide-threads", "4", "--ws-compression", "true",
        "--rate-limit-per-s", "2.5", "--rate-limit-burst", "8", "--header-timeout-s", "3",
        "--ws-ping-interval-s", "10", "--ws-ping-timeout-s", "5",
        "--max-header-bytes", "32768", "--trusted-proxy", "10.0.0.1", "--trusted-proxy", "10.1.0.0/16",
        "--wyoming", "0.0.0.0:10200",
    )  # fmt: skip
    fields = {k: v for k, v in vars(args).items() if k != "command"}
    assert fields == {
        "host": "0.0.0.0", "port": 9000, "engine": "fake,piper", "piper_threads": 2,
        "piper_workers": 3, "config_timeout_s": 5.0, "idle_timeout_s": 30.0, "max_buffered_audio_s": 20.0,
        "send_timeout_s": 7.0,
        "log_level": "debug", "upstreams": ["http://a:8091", "http://b:8091"], "upstream_model": "m",
        "voices_dir": "/v", "max_voices": 7, "api_keys_file": "/k", "allowed_origins": ["https://app.example"],
        "vllm_model": "Qwen/x", "vllm_deploy_config": "d.yaml", "drain_timeout_s": 4.0, "max_sessions": 9,
        "max_sessions_per_key": 3, "max_pending_text_chars": 100, "fake_delay_s": 0.5,
        "max_segment_audio_base_s": 3.0, "max_segment_audio_per_char_s": 0.2, "piper_wide_threads": 4,
        "ws_compression": True, "rate_limit_per_s": 2.5, "rate_limit_burst": 8, "header_timeout_s": 3.0,
        "ws_ping_interval_s": 10.0, "ws_ping_timeout_s": 5.0,
        "max_header_bytes": 32768, "trusted_proxies": ["10.0.0.1", "10.1.0.0/16"], "wyoming": "0.0.0.0:10200",
    }  # fmt: skip
    settings = Settings.from_env({}, **fields)
    assert settings.of(RemoteSettings).upstreams == ("http://a:8091", "http://b:8091")
    assert settings.of(PiperSettings).piper_workers == 3 and settings.max_voices == 7
    assert set(fields) == {opt.name for opt in options() if opt.flag}


@pytest.mark.parametrize(("text", "value"), [("false", False), ("0", False), ("off", False), ("On", True)])
def test_a_boolean_flag_reads_true_and_false(text: str, value: bool) -> None:
    assert parse("serve", "--ws-compression", text).ws_compression is value


def test_a_boolean_flag_refuses_anything_else(capsys: pytest.CaptureFixture[str]) -> None:
    assert "'maybe' is not true or false" in refused(capsys, "serve", "--ws-compression", "maybe")


def test_serve_defaults_leave_everything_to_settings() -> None:
    args = parse("serve")
    assert all(v is None for k, v in vars(args).items() if k != "command")
    assert Settings.from_env(
        {}, **{k: v for k, v in vars(args).items() if k != "command"}
    ) == Settings.from_env({})


def test_serve_refuses_an_unknown_engine(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse("serve", "--engine", "piper,bogus")
    assert exit_.value.code == 2 and "bogus" in capsys.readouterr().err


def test_say_with_every_option() -> None:
    args = parse(
        "say", "Hello there.", "-o", "out.wav", "--url", "https://tts.example", "--api-key", "k",
        "--voice", "joe", "--sample-rate", "16000", "--speed", "1.25", "-q",
    )  # fmt: skip
    assert (args.command, args.text, args.output, args.url, args.api_key) == (
        "say", "Hello there.", "out.wav", "https://tts.example", "k"
    )  # fmt: skip
    assert (args.voice, args.sample_rate, args.speed, args.quiet) == ("joe", 16000, 1.25, True)


def test_say_defaults_read_stdin_and_leave_the_rest_to_the_gateway() -> None:
    args = parse("say", "--output", "-")
    assert (args.text, args.output, args.quiet) == ("-", "-", False)
    assert (args.url, args.api_key, args.voice, args.sample_rate, args.speed) == (None,) * 5


def test_say_help_states_the_sample_rate_a_session_really_gets(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse("say", "--help")
    assert exc.value.code == 0
    help = " ".join(capsys.readouterr().out.split())
    assert "8000 to 48000 (default 24000, whatever the engine)" in help
    # A config without sample_rate gets 24 kHz, not the engine's native rate (Piper's 22050).
    assert SessionConfig().output_rate(native=22050) == 24000


@pytest.mark.parametrize("output", ["out.wav", "OUT.WAV", "out.flac", "out.ogg", "out.pcm", "out.raw", "-"])
def test_say_accepts_known_outputs(output: str) -> None:
    assert parse("say", "hi", "-o", output).output == output


def test_say_needs_an_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert "-o/--output" in refused(capsys, "say", "hi")


@pytest.mark.parametrize("output", ["out.mp4", "out", "out.txt"])
def test_say_refuses_an_output_of_unknown_format(capsys: pytest.CaptureFixture[str], output: str) -> None:
    err = refused(capsys, "say", "hi", "-o", output)
    assert "voxgate say: error: argument -o/--output: cannot tell the format" in err


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--sample-rate", "7999"), ("--sample-rate", "48001"), ("--sample-rate", "16k"),
     ("--sample-rate", "16000.5"), ("--speed", "0.2"), ("--speed", "4.5"), ("--speed", "fast")],
)  # fmt: skip
def test_say_refuses_out_of_range_numbers(capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    assert f"argument {flag}" in refused(capsys, "say", "hi", "-o", "-", flag, value)


def test_say_range_bounds_are_inclusive() -> None:
    args = parse("say", "hi", "-o", "-", "--sample-rate", "8000", "--speed", "4")
    assert (args.sample_rate, args.speed) == (8000, 4.0)


def test_voices_needs_an_action(capsys: pytest.CaptureFixture[str]) -> None:
    assert "required" in refused(capsys, "voices")


def test_voices_list() -> None:
    args = parse("voices", "list")
    assert (args.command, args.action, args.json) == ("voices", "list", False)
    assert (args.url, args.api_key) == (None, None)
    args = parse("voices", "list", "--json", "--url", "http://h:1", "--api-key", "k")
    assert (args.json, args.url, args.api_key) == (True, "http://h:1", "k")


def test_voices_upload_audio_file() -> None:
    args = parse(
        "voices", "upload", "anna", "anna.wav", "--consent", "recorded 2024-05-01",
        "--ref-text", "Hello.", "--description", "warm alto",
    )  # fmt: skip
    assert (args.action, args.name, args.file, args.embedding) == ("upload", "anna", "anna.wav", None)
    assert (args.consent, args.ref_text, args.description) == ("recorded 2024-05-01", "Hello.", "warm alto")


def test_voices_upload_embedding() -> None:
    args = parse("voices", "upload", "anna", "--embedding", "anna.json", "--consent", "yes")
    assert (args.name, args.file, args.embedding, args.consent) == ("anna", None, "anna.json", "yes")
    assert (args.ref_text, args.description) == (None, None)


def test_voices_upload_needs_consent(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--consent" in refused(capsys, "voices", "upload", "anna", "anna.wav")


def test_voices_upload_needs_exactly_one_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert "one of the arguments file --embedding is required" in refused(
        capsys, "voices", "upload", "anna", "--consent", "yes"
    )
    assert "not allowed with" in refused(
        capsys, "voices", "upload", "anna", "anna.wav", "--embedding", "a.json", "--consent", "yes"
    )


def test_voices_delete() -> None:
    args = parse("voices", "delete", "anna", "--url", "http://h:1")
    assert (args.action, args.name, args.url) == ("delete", "anna", "http://h:1")


def test_voices_delete_needs_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert "name" in refused(capsys, "voices", "delete")


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/v1/audio/speech/stream"),
        ("https://tts.example/", "wss://tts.example/v1/audio/speech/stream"),
        ("https://tts.example/voxgate/", "wss://tts.example/voxgate/v1/audio/speech/stream"),
        ("ws://h:1", "ws://h:1/v1/audio/speech/stream"),
        ("wss://h", "wss://h/v1/audio/speech/stream"),
    ],
)
def test_ws_url(base: str, expected: str) -> None:
    assert ws_url(base) == expected


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1/audio/voices"),
        ("https://tts.example/voxgate/", "https://tts.example/voxgate/v1/audio/voices"),
        ("wss://h", "https://h/v1/audio/voices"),
    ],
)
def test_http_url(base: str, expected: str) -> None:
    assert http_url(base, "/v1/audio/voices") == expected


@pytest.mark.parametrize("base", ["ftp://h", "127.0.0.1:8000", "http://"])
def test_bad_gateway_urls_are_reported(base: str) -> None:
    with pytest.raises(ClientError, match="invalid gateway URL"):
        ws_url(base)
    with pytest.raises(ClientError, match="invalid gateway URL"):
        http_url(base, "/v1/audio/voices")


def test_output_problem() -> None:
    assert output_problem("-") is None
    assert output_problem("x.wav") is None
    assert output_problem("x.mp4") is not None
