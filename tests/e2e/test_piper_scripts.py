"""Text the Piper voice cannot read (a script its language does not use) is refused on every surface.

espeak-ng would read each letter's name ("Chinese letter"); the engine refuses the segment before any
work instead, with ``unsupported_script`` naming the voice's language, and speaks the rest.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import TIMEOUT_S, recv_until, send, session

pytestmark = pytest.mark.slow

REFUSAL = "voice 'joe' speaks English (en-US) and cannot read '中', '文' (CJK)"


def test_a_websocket_segment_in_chinese_is_refused_and_the_others_are_spoken(piper_gateway: str) -> None:
    with session(piper_gateway, response_format="pcm") as ws:
        for text in ["Hello there. ", "你好，世界。", " Goodbye now."]:
            send(ws, type="input.text", text=text)
        send(ws, type="input.done")
        got = recv_until(ws, "session.done")
    dones = [(d["sentence_index"], d["error"], d["total_bytes"] != 0) for d in got.messages("audio.done")]
    assert dones == [(0, False, True), (1, True, False), (2, False, True)]
    (error,) = got.messages("error")
    assert (error["code"], error["fatal"], error["utterance_index"]) == ("unsupported_script", False, 0)
    assert str(error["message"]).startswith("voice 'joe' speaks English (en-US) and cannot read '你', '好'")
    assert got.messages("session.done")[0]["total_sentences"] == 3


@pytest.mark.parametrize("text", ["中文", "Hello 中文."])
def test_openai_speech_in_chinese_is_a_400_naming_the_language(piper_gateway: str, text: str) -> None:
    body = {"model": "piper", "input": text, "voice": "joe"}
    answer = httpx.post(f"http://{piper_gateway}/v1/audio/speech", json=body, timeout=TIMEOUT_S)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["type"]) == ("unsupported_script", "invalid_request_error")
    assert error["message"].startswith(REFUSAL)


def test_elevenlabs_speech_in_chinese_is_a_400(piper_gateway: str) -> None:
    answer = httpx.post(
        f"http://{piper_gateway}/v1/text-to-speech/joe", json={"text": "中文"}, timeout=TIMEOUT_S
    )
    assert answer.status_code == 400
    assert answer.json()["detail"]["status"] == "unsupported_script"
    assert answer.json()["detail"]["message"].startswith(REFUSAL)


def test_digits_punctuation_symbols_and_lone_greek_letters_are_spoken(piper_gateway: str) -> None:
    body = {"input": "π is about 3.14; Δt = 5 ms, ＯＫ? 😀", "voice": "joe", "response_format": "pcm"}
    answer = httpx.post(f"http://{piper_gateway}/v1/audio/speech", json=body, timeout=TIMEOUT_S)
    assert answer.status_code == 200, answer.text
    assert len(answer.content) > 24000  # over half a second of 24 kHz s16le speech
