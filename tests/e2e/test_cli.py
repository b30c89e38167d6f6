"""The real ``voxgate say`` / ``voxgate voices`` console script against real gateways running Piper."""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile
from voxgate.engine import ENGINES

from tests.conftest import TIMEOUT_S, serve_engine

pytestmark = pytest.mark.slow

VOXGATE = Path(sys.executable).with_name("voxgate")
API_KEY = "cli-test-key"
TEXT = "Hello there. The command line speaks through the gateway."


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without any VOXGATE_* of the person running it, and no proxy for loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    return {**env, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", **extra}


def voxgate(*args: str, stdin: bytes = b"", **env: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(VOXGATE), *args],
        input=stdin,
        capture_output=True,
        timeout=TIMEOUT_S,
        env=_env(**env),
        check=False,
    )


def url(address: str) -> str:
    return f"http://{address}"


@pytest.fixture(scope="module")
def keyed_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Piper gateway that needs an API key and keeps its voices in this test's own folder."""
    voices_dir = tmp_path_factory.mktemp("voices")
    with serve_engine(None, engine="piper", voices_dir=str(voices_dir), api_keys=(API_KEY,)) as address:
        yield address


def test_say_writes_a_wav(piper_gateway: str, tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    done = voxgate("say", TEXT, "-o", str(out), "--url", url(piper_gateway))
    assert done.returncode == 0, done.stderr
    assert done.stdout == b""
    summary = done.stderr.decode()
    assert "s of audio at 24000 Hz" in summary and "first audio after" in summary
    audio, rate = soundfile.read(out, dtype="float32")
    assert rate == 24000
    assert audio.ndim == 1 and len(audio) > rate
    assert float(np.sqrt(np.mean(np.square(audio)))) > 0.01  # speech, not silence


def test_say_honours_sample_rate_and_speed(piper_gateway: str, tmp_path: Path) -> None:
    lengths = []
    for speed in ("1.0", "2.0"):
        out = tmp_path / f"out-{speed}.flac"
        done = voxgate("say", TEXT, "-o", str(out), "-q", "--sample-rate", "16000", "--speed", speed,
                       "--url", url(piper_gateway))  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stderr == b""  # -q
        info = soundfile.info(str(out))
        assert info.samplerate == 16000
        lengths.append(info.frames)
    assert lengths[1] < 0.75 * lengths[0]


def test_say_pipes_stdin_to_raw_pcm_on_stdout(piper_gateway: str) -> None:
    text = b"Hello from a pipe.\nThe gateway speaks the lines as they arrive.\n"
    done = voxgate("say", "-o", "-", "-q", "--url", url(piper_gateway), stdin=text)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert len(done.stdout) > 22050 * 2 and len(done.stdout) % 2 == 0
    samples = np.frombuffer(done.stdout, dtype="<i2")
    assert int(np.abs(samples).max()) > 1000


def test_say_speaks_while_stdin_is_still_open(piper_gateway: str) -> None:
    """The first audio comes out before the writer has finished (``llm | voxgate say -o -``)."""
    with subprocess.Popen(
        [str(VOXGATE), "say", "-o", "-", "-q", "--url", url(piper_gateway)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
    ) as proc, selectors.DefaultSelector() as selector:  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            proc.stdin.write(b"Hello there, this sentence has no newline yet. ")
            proc.stdin.flush()
            selector.register(proc.stdout, selectors.EVENT_READ)
            assert selector.select(TIMEOUT_S), "no audio while stdin is open"
            first = os.read(proc.stdout.fileno(), 65536)
            assert first
            proc.stdin.write(b"And this one ends it.")
            proc.stdin.close()
            rest = proc.stdout.read()
            assert proc.wait(TIMEOUT_S) == 0, proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
    assert (len(first) + len(rest)) % 2 == 0 and len(first) + len(rest) > 22050 * 2


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_say_to_a_closed_port_fails_clearly(tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    done = voxgate("say", "Hello.", "-o", str(out), "--url", f"http://127.0.0.1:{_closed_port()}")
    assert done.returncode == 1
    assert done.stdout == b""
    err = done.stderr.decode()
    assert err.startswith("voxgate: error: cannot connect to ws://127.0.0.1:"), err
    assert "Traceback" not in err
    assert not out.exists()


def test_say_reports_a_server_error(piper_gateway: str, tmp_path: Path) -> None:
    done = voxgate(
        "say", "Hello.", "-o", str(tmp_path / "out.wav"), "--voice", "nobody", "--url", url(piper_gateway)
    )
    assert done.returncode == 1
    err = done.stderr.decode()
    assert "voice_not_found" in err and "nobody" in err and "Traceback" not in err


def test_say_usage_error_exits_2(piper_gateway: str) -> None:
    done = voxgate("say", "Hello.", "--url", url(piper_gateway))
    assert done.returncode == 2
    assert b"-o/--output" in done.stderr


def test_api_key_from_flag_or_environment(keyed_gateway: str, tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    refused = voxgate("say", "Hello.", "-o", str(out), "--url", url(keyed_gateway))
    assert refused.returncode == 1
    assert "HTTP 403" in refused.stderr.decode() and "--api-key" in refused.stderr.decode()
    listed = voxgate("voices", "list", "--url", url(keyed_gateway), "--api-key", "wrong")
    assert listed.returncode == 1 and "invalid API key" in listed.stderr.decode()
    spoken = voxgate("say", "Hello.", "-o", str(out), "--url", url(keyed_gateway), "--api-key", API_KEY)
    assert spoken.returncode == 0, spoken.stderr
    from_env = voxgate(
        "say", "Hello.", "-o", str(out), VOXGATE_URL=url(keyed_gateway), VOXGATE_API_KEY=API_KEY
    )
    assert from_env.returncode == 0, from_env.stderr


def test_voices_list(piper_gateway: str) -> None:
    table = voxgate("voices", "list", "--url", url(piper_gateway))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.decode().splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "DETAILS"]
    assert any(line.split()[:2] == ["joe", "built-in"] for line in lines[1:])
    raw = voxgate("voices", "list", "--json", "--url", url(piper_gateway))
    assert raw.returncode == 0, raw.stderr
    assert "joe" in json.loads(raw.stdout)["voices"]


def _uploaded(address: str) -> list[str]:
    done = voxgate("voices", "list", "--json", "--url", url(address), VOXGATE_API_KEY=API_KEY)
    assert done.returncode == 0, done.stderr
    return [v["name"] for v in json.loads(done.stdout)["uploaded_voices"]]


def test_voices_upload_list_delete(keyed_gateway: str, tmp_path: Path) -> None:
    rate = 22050
    t = np.arange(2 * rate) / rate
    rng = np.random.default_rng(0)
    clip = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.02 * rng.standard_normal(t.size)
    sample = tmp_path / "anna.wav"
    soundfile.write(sample, clip.astype(np.float32), rate)
    common = ("--url", url(keyed_gateway), "--api-key", API_KEY)

    done = voxgate("voices", "upload", "anna", str(sample), "--consent", "Anna agreed on 2024-05-01",
                   "--ref-text", "A test tone.", "--description", "a sine", *common)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "anna" in done.stdout.decode()
    # Piper cannot clone: the voice is stored, and the upload says that no engine here can speak it.
    assert "warning:" in done.stderr.decode() and "voice_requires_cloning" in done.stderr.decode()
    assert "anna" in _uploaded(keyed_gateway)
    table = voxgate("voices", "list", *common).stdout.decode()
    names = [line.split()[:2] for line in table.splitlines()[1:]]
    assert ["anna", "uploaded"] in names and [n for n, _ in names].count("anna") == 1

    embedding = tmp_path / "bob.json"
    embedding.write_text(json.dumps([0.01 * i for i in range(64)]))
    done = voxgate("voices", "upload", "bob", "--embedding", str(embedding), "--consent", "yes", *common)
    assert done.returncode == 0, done.stderr
    assert sorted(_uploaded(keyed_gateway)) == ["anna", "bob"]

    for name in ("anna", "bob"):
        done = voxgate("voices", "delete", name, *common)
        assert done.returncode == 0, done.stderr
    assert _uploaded(keyed_gateway) == []
    again = voxgate("voices", "delete", "anna", *common)
    assert again.returncode == 1
    assert again.stderr.decode() == "voxgate: error: voice 'anna' not found\n"


def test_voices_upload_errors_are_the_server_message(keyed_gateway: str, tmp_path: Path) -> None:
    short = tmp_path / "short.wav"
    soundfile.write(short, np.zeros(2205, np.float32), 22050)  # 0.1 s: too short to clone
    done = voxgate("voices", "upload", "tiny", str(short), "--consent", "yes",
                   "--url", url(keyed_gateway), "--api-key", API_KEY)  # fmt: skip
    assert done.returncode == 1
    err = done.stderr.decode()
    assert err.startswith("voxgate: error: audio_sample must be") and "Traceback" not in err
    missing = voxgate("voices", "upload", "x", str(tmp_path / "none.wav"), "--consent", "yes",
                      "--url", url(keyed_gateway), "--api-key", API_KEY)  # fmt: skip
    assert missing.returncode == 1 and "cannot read" in missing.stderr.decode()


def test_serve_with_an_engine_whose_extra_is_not_installed_says_which_in_one_line() -> None:
    done = voxgate("serve", "--engine", "vllm-omni", "--port", "1")
    assert done.returncode == 2
    assert done.stderr.decode().strip().splitlines() == [
        "voxgate: engine 'vllm-omni' needs vllm_omni: pip install 'voxgate[vllm]'"
    ]


def test_serve_remote_without_an_upstream_says_so_in_one_line() -> None:
    done = voxgate("serve", "--engine", "piper,remote", "--port", "1")
    assert done.returncode == 2
    assert done.stderr.decode().strip().splitlines() == [
        "voxgate: engine 'remote' needs an upstream speech server: --upstream URL (repeatable) or "
        "VOXGATE_UPSTREAMS"
    ]
    assert ENGINES["remote"].problem(ENGINES["remote"].settings(upstreams=("http://u:8091",))) is None


def test_an_engine_entry_names_the_extra_of_a_missing_module() -> None:
    entry = dataclasses.replace(ENGINES["piper"], requires=("piper", "no_such_module_here"))
    assert entry.missing() == "needs no_such_module_here: pip install 'voxgate[piper]'"
    assert ENGINES["piper"].missing() is None and ENGINES["remote"].missing() is None


def test_voxgate_alone_prints_its_help_and_says_its_version() -> None:
    alone = voxgate()
    assert alone.returncode == 2 and alone.stdout.decode().startswith("usage: voxgate")
    version = voxgate("--version")
    assert version.returncode == 0 and version.stdout.decode().startswith("voxgate ")
    empty = voxgate("say", "", "-o", "-")
    assert empty.returncode == 2 and "nothing to say" in empty.stderr.decode()
