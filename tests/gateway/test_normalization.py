"""``text_normalization`` on the real sockets (issue 33): the fake engine speaks ``SECONDS_PER_CHAR`` a
character of what it is given, so the audio's length tells what the engine was asked to say."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from voxgate.engine.fake import SECONDS_PER_CHAR, FakeEngine
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.conftest import TIMEOUT_S, recv, recv_until, send, serve_engine, session

KEY = "eleven-key"
REPLY = "**Hi** there."


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    with serve_engine(FakeEngine(), api_keys=KEY) as addr:
        yield addr


@pytest.fixture(scope="module")
def open_address() -> Iterator[str]:
    with serve_engine(FakeEngine()) as addr:
        yield addr


def _eleven(address: str, query: str) -> tuple[float, str, list[dict[str, Any]]]:
    """``REPLY`` over ElevenLabs' stream-input: seconds of audio (pcm 16 kHz), the alignment's characters, the
    messages."""
    url = f"ws://{address}/v1/text-to-speech/tone/stream-input?output_format=pcm_16000&{query}"
    got: list[dict[str, Any]] = []
    with connect(url, additional_headers={"xi-api-key": KEY}, open_timeout=TIMEOUT_S) as ws:
        try:
            for message in ({"text": " "}, {"text": REPLY + " "}, {"text": ""}):
                ws.send(json.dumps(message))
            while True:
                got.append(json.loads(ws.recv(timeout=TIMEOUT_S)))
        except ConnectionClosed:
            pass
    audio = sum(len(base64.b64decode(m["audio"])) for m in got if m.get("audio")) / 2 / 16000
    chars = "".join("".join(m["alignment"]["chars"]) for m in got if m.get("alignment"))
    return audio, chars, got


def test_elevenlabs_reads_no_markup_by_default_and_names_the_clients_characters(address: str) -> None:
    audio, chars, _ = _eleven(address, "")
    assert audio == pytest.approx(len("Hi there.") * SECONDS_PER_CHAR)
    assert chars == "Hi** there. "


def test_elevenlabs_apply_text_normalization_off_reads_the_text_as_sent(address: str) -> None:
    audio, chars, _ = _eleven(address, "apply_text_normalization=off")
    assert audio == pytest.approx(len(REPLY) * SECONDS_PER_CHAR)
    assert chars == REPLY + " "


def test_elevenlabs_refuses_another_value_naming_it(address: str) -> None:
    url = f"ws://{address}/v1/text-to-speech/tone/stream-input?apply_text_normalization=sometimes"
    with connect(url, additional_headers={"xi-api-key": KEY}, open_timeout=TIMEOUT_S) as ws:
        error = json.loads(ws.recv(timeout=TIMEOUT_S))
    assert error["error"] == "invalid_message" and "apply_text_normalization" in error["message"]


def test_voxgate_socket_normalizes_and_refuses_an_unknown_value_by_field(open_address: str) -> None:
    address = open_address
    for mode, said in (("auto", "Hi there."), ("off", REPLY)):
        with session(address, text_normalization=mode, response_format="pcm", sample_rate=16000) as ws:
            send(ws, type="input.text", text=REPLY)
            send(ws, type="input.done")
            got = recv_until(ws, "session.done")
        seconds = sum(len(f) for f in got.frames()) / 2 / 16000
        assert seconds == pytest.approx(len(said) * SECONDS_PER_CHAR)
        assert [m["sentence_text"] for m in got.messages("audio.start")] == [
            "Hi** there." if mode == "auto" else REPLY
        ]
    with session(address) as ws:
        send(ws, type="session.config", text_normalization="loud")
        error = recv(ws)
    assert isinstance(error, dict)
    assert (error["type"], error["code"], error["field"]) == (
        "error",
        "invalid_message",
        "$.text_normalization",
    )
