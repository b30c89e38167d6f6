"""Pronunciations through a real gateway with the Piper engine. With the same ``seed``: a text with an ``ipa``
entry is the same audio as the text with the word written as Piper's own phoneme input (``[[...]]``, read as
sent under ``text_normalization: off``), over REST and the WebSocket; a text with an alias of several words,
its words streamed in separate messages, is the same audio as the text with the words replaced by hand. A
symbol the voice has no phoneme for is refused by field (``invalid_message``)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from websockets.sync.client import ClientConnection

from tests.conftest import TIMEOUT_S, recv_message, recv_until, send, serve_engine, voxgate_connect

TEXT = "Please call Nguyen, today."
IPA = "ŋwˈiən"
DIRECT = f"Please call [[{IPA}]], today."
ENTRY = [{"text": "nguyen", "ipa": IPA, "case_sensitive": False}]


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    with serve_engine(None, engine="piper", piper_workers=1) as address:
        yield address


def rest(address: str, **body: object) -> httpx.Response:
    body = {"response_format": "pcm", "seed": 7, **body}
    return httpx.post(f"http://{address}/v1/audio/speech", json=body, timeout=TIMEOUT_S)


def stream(ws: ClientConnection, text: str) -> bytes:
    for at in range(0, len(text), 4):  # as an LLM streams it
        send(ws, type="input.text", text=text[at : at + 4])
    send(ws, type="input.done")
    return b"".join(recv_until(ws, "session.done").frames())


def configure(ws: ClientConnection, **config: object) -> dict[str, object]:
    # Cut at sentences only: an eager first segment is cut by time, which a loaded machine would move.
    send(ws, type="session.config", response_format="pcm", seed=7, eager_first_segment=False, **config)
    return recv_message(ws)


def test_rest_speaks_the_ipa_as_piper_speaks_those_phonemes(gateway: str) -> None:
    said = rest(gateway, input=TEXT, pronunciations=ENTRY)
    direct = rest(gateway, input=DIRECT, text_normalization="off")
    plain = rest(gateway, input=TEXT)
    assert said.status_code == direct.status_code == plain.status_code == 200
    assert said.content == direct.content
    assert said.content != plain.content


def test_the_websocket_speaks_the_ipa_as_piper_speaks_those_phonemes(gateway: str) -> None:
    uri = f"ws://{gateway}/v1/audio/speech/stream"
    with voxgate_connect(uri, max_size=None, open_timeout=TIMEOUT_S) as ws:
        assert configure(ws, pronunciations=ENTRY)["type"] == "session.ready"
        said = stream(ws, TEXT)
        assert configure(ws, text_normalization="off")["type"] == "session.ready"
        direct = stream(ws, DIRECT)
    assert said and said == direct


def test_an_alias_of_several_words_streamed_apart_is_the_audio_of_the_words_replaced_by_hand(
    gateway: str,
) -> None:
    uri = f"ws://{gateway}/v1/audio/speech/stream"
    alias = [{"text": "New York", "alias": "the big apple"}]
    with voxgate_connect(uri, max_size=None, open_timeout=TIMEOUT_S) as ws:
        assert configure(ws, pronunciations=alias)["type"] == "session.ready"
        said = stream(ws, "We fly to New York tomorrow.")  # "New" and "York" in separate messages
        assert configure(ws)["type"] == "session.ready"
        by_hand = stream(ws, "We fly to the big apple tomorrow.")
    assert said and said == by_hand


def test_a_symbol_the_voice_has_no_phoneme_for_is_refused_by_field(gateway: str) -> None:
    bad = [{"text": "Nguyen", "alias": "win"}, {"text": "Nguyen", "ipa": "ŋw[iə]n"}]
    response = rest(gateway, input=TEXT, pronunciations=bad)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_message", "pronunciations[1].ipa")  # OpenAI's form
    uri = f"ws://{gateway}/v1/audio/speech/stream"
    with voxgate_connect(uri, max_size=None, open_timeout=TIMEOUT_S) as ws:
        refused = configure(ws, pronunciations=bad)
    assert (refused["type"], refused["code"], refused["field"]) == (
        "error",
        "invalid_message",
        "$.pronunciations[1].ipa",
    )
    assert "'[' (U+005B)" in str(refused["message"])
