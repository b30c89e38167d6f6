"""What a newcomer met in the first hour (issue 35): each answer says what will happen next.

An upload an engine here cannot speak is stored with a warning; ``voices list`` shows each voice once;
an option an engine cannot use is ignored with a warning, never refused for one engine and ignored by
another; text with nothing to say goes to no engine; ``voxgate`` alone prints its help; a gateway whose
only upstream is down says so instead of "ready".
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile
from voxgate.engine.fake import FakeEngine

from tests.conftest import recv_message, recv_until, send, serve_engine, session
from voxgate import cli, voice_client

VOICES = "/v1/audio/voices"


def _clip() -> bytes:
    rate = 16000
    t = np.arange(2 * rate) / rate
    out = io.BytesIO()
    soundfile.write(out, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return out.getvalue()


def _upload(address: str, name: str) -> httpx.Response:
    files = {"audio_sample": ("a.wav", _clip(), "audio/wav")}
    return httpx.post(f"http://{address}{VOICES}", data={"name": name, "consent": "yes"}, files=files)


def test_an_upload_no_engine_here_can_speak_is_stored_with_a_warning() -> None:
    with serve_engine(FakeEngine()) as address:
        answer = _upload(address, "anna")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["voice"]["engines"] == []
    assert body["warning"]["code"] == "voice_requires_cloning"
    assert "--engine remote" in body["warning"]["message"]
    with serve_engine(FakeEngine(clones=True)) as address:
        cloned = _upload(address, "anna").json()
    assert cloned["voice"]["engines"] == ["fake"] and "warning" not in cloned


def test_the_cli_prints_the_upload_warning_and_lists_each_voice_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = tmp_path / "anna.wav"
    sample.write_bytes(_clip())
    with serve_engine(FakeEngine()) as address:
        url = f"http://{address}"
        assert cli.main(["voices", "upload", "anna", str(sample), "--consent", "yes", "--url", url]) == 0
        uploaded = capsys.readouterr()
        assert cli.main(["voices", "list", "--url", url]) == 0
        table = capsys.readouterr().out
    assert "uploaded voice 'anna'" in uploaded.out
    assert "warning:" in uploaded.err and "voice_requires_cloning" in uploaded.err
    rows = [line.split()[:2] for line in table.splitlines()[1:]]
    assert [name for name, _ in rows].count("anna") == 1
    assert ["anna", "uploaded"] in rows and ["tone", "built-in"] in rows


def test_an_older_gateways_list_without_details_still_shows_each_voice_once() -> None:
    uploaded = [voice_client.UploadedVoice(name="Anna")]
    listing = voice_client.VoiceList(voices=["joe", "anna"], uploaded_voices=uploaded)
    assert listing.builtin() == ["joe"]


def test_an_option_an_engine_cannot_use_is_ignored_with_a_warning_on_every_surface() -> None:
    params = {"temperature": 0.7}
    with serve_engine(FakeEngine()) as address:
        rest = httpx.post(
            f"http://{address}/v1/audio/speech",
            json={"input": "Hi.", "response_format": "pcm", "extra_params": params, "instructions": "calm"},
        )
        with session(address, extra_params=params, instructions="calm") as ws:
            warnings = [recv_message(ws), recv_message(ws)]
    assert rest.status_code == 200 and rest.content
    warned = {w.strip() for w in rest.headers["x-voxgate-warning"].split(",")}
    assert warned == {"option_ignored=$.extra_params", "option_ignored=$.instructions"}
    assert {(w["type"], w["code"], w["field"]) for w in warnings} == {
        ("warning", "option_ignored", "$.extra_params"),
        ("warning", "option_ignored", "$.instructions"),
    }


def test_what_changes_whose_voice_it_is_is_still_refused_by_name() -> None:
    with serve_engine(FakeEngine()) as address:
        refused = httpx.post(
            f"http://{address}/v1/audio/speech", json={"input": "Hi.", "task_type": "VoiceDesign"}
        )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "task_type"


def test_an_emoji_only_text_reaches_no_engine_on_the_websocket() -> None:
    engine = FakeEngine()
    with serve_engine(engine) as address, session(address) as ws:
        send(ws, type="input.text", text="\U0001f642\U0001f389")
        send(ws, type="input.done")
        done = recv_until(ws, "session.done")
        send(ws, type="input.text", text="Hello. \U0001f642")
        send(ws, type="input.done")
        spoken = recv_until(ws, "session.done")
    assert not done.frames() and not done.messages("error")
    assert spoken.frames()
    assert [r.text for r in engine.requests] == ["Hello."]


def test_voxgate_alone_prints_its_help_and_has_a_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: voxgate") and "serve" in out and "say" in out and "voices" in out
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("voxgate ")


@pytest.mark.parametrize("text", ["", "   "])
def test_say_refuses_an_empty_text(capsys: pytest.CaptureFixture[str], text: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["say", text, "-o", str(tmp_path / "out.wav")])
    assert done.value.code == 2
    assert "nothing to say" in capsys.readouterr().err


def test_a_remote_engine_whose_upstream_is_down_is_not_logged_ready(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="voxgate.gateway.app")
    with serve_engine(None, engine="remote", upstreams=("http://127.0.0.1:9",)):
        pass
    lines = [r.getMessage() for r in caplog.records if r.name == "voxgate.gateway.app"]
    assert not any("ready at" in line for line in lines), lines
    [warning] = [r for r in caplog.records if "NOT ready" in r.getMessage()]
    assert warning.levelno == logging.WARNING and "unreachable" in warning.getMessage()
