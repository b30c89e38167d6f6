"""vllm-omni's own clients against ``voxgate serve`` on the embedded Piper engine.

Each test sends exactly what one of vllm-omni's clients or tests sends (``examples/online_serving/
text_to_speech/qwen3_tts/*.py`` and ``tests/entrypoints/openai_api/test_qwen3_tts_websocket.py`` in
vllm-project/vllm-omni) over a plain WebSocket, with no voxgate subprotocol, and asserts what they
assert, plus the exact field sets of vllm-omni 0.30's ``serving_speech_stream.py``: no ``session.ready``,
no timings, no error codes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import soundfile
from websockets.sync.client import ClientConnection, connect

from tests.conftest import TIMEOUT_S, recv, session

pytestmark = pytest.mark.slow

PATH = "/v1/audio/speech/stream"
MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"  # not an engine here: ignored, as any unknown model
START_FIELDS = {"type", "utterance_index", "sentence_index", "sentence_text", "format"}
STREAMED_START_FIELDS = START_FIELDS | {"sample_rate"}  # vllm-omni 0.30 sends no channels
DONE_FIELDS = {"type", "utterance_index", "sentence_index", "total_bytes", "error"}


def plain(address: str) -> ClientConnection:
    """A WebSocket as vllm-omni's clients open it: no subprotocol."""
    return connect(f"ws://{address}{PATH}", max_size=None, open_timeout=TIMEOUT_S)


def send(ws: ClientConnection, **message: object) -> None:
    ws.send(json.dumps(message))


def ws_test_config(text_input_mode: str = "buffered") -> dict[str, object]:
    """The ``session.config`` of vllm-omni's WebSocket test (``_session_config``)."""
    return {
        "type": "session.config",
        "model": MODEL,
        "voice": "vivian",
        "language": "English",
        "response_format": "pcm",
        "stream_audio": True,
        "text_input_mode": text_input_mode,
    }


def collect(ws: ClientConnection, prefix: list[str | bytes] | None = None) -> dict[str, Any]:
    """Read one utterance as the vllm-omni test's ``_collect_utterance`` does: any other message fails."""
    starts: list[dict[str, Any]] = []
    dones: list[dict[str, Any]] = []
    chunks: dict[int, list[int]] = {}
    pending = iter(prefix or [])
    while True:
        message = next(pending, None) or ws.recv(timeout=TIMEOUT_S)
        if isinstance(message, bytes):
            assert starts, "audio bytes before audio.start"
            chunks.setdefault(starts[-1]["sentence_index"], []).append(len(message))
            continue
        payload = json.loads(message)
        if payload["type"] == "audio.start":
            starts.append(payload)
            chunks.setdefault(payload["sentence_index"], [])
        elif payload["type"] == "audio.done":
            dones.append(payload)
        elif payload["type"] == "session.done":
            return {"starts": starts, "dones": dones, "chunks": chunks, "session_done": payload}
        else:
            raise AssertionError(f"unexpected WebSocket message: {payload}")


def check_streamed_pcm(result: dict[str, Any]) -> None:
    for start, done in zip(result["starts"], result["dones"], strict=True):
        assert set(start) == STREAMED_START_FIELDS and set(done) == DONE_FIELDS
        assert start["format"] == "pcm" and start["sample_rate"] == 24000 and start["sentence_text"]
        assert (start["utterance_index"], start["sentence_index"]) == (
            done["utterance_index"],
            done["sentence_index"],
        )
        lengths = result["chunks"][done["sentence_index"]]
        assert done["error"] is False and lengths and sum(lengths) == done["total_bytes"] > 0


def test_streaming_pcm_output(piper_gateway: str) -> None:
    with plain(piper_gateway) as ws:
        ws.send(json.dumps(ws_test_config()))
        text = (
            "Hello, this is a websocket streaming test for Qwen three TTS, "
            "and this sentence is intentionally long enough to produce audio chunks. "
            "This is the second sentence."
        )
        send(ws, type="input.text", text=text)
        send(ws, type="input.done")
        result = collect(ws)
    assert result["session_done"] == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}
    assert len(result["starts"]) == len(result["dones"]) == 1
    assert result["starts"][0]["sentence_index"] == 0
    check_streamed_pcm(result)


def test_input_done_flushes_without_closing_connection(piper_gateway: str) -> None:
    texts = [
        "This is the first utterance sent over the websocket connection.",
        "This is the second utterance, reusing the very same connection.",
    ]
    results = []
    with plain(piper_gateway) as ws:
        ws.send(json.dumps(ws_test_config()))
        for text in texts:
            send(ws, type="input.text", text=text)
            send(ws, type="input.done")
            results.append(collect(ws))
        send(ws, type="session.close")
    for index, result in enumerate(results):
        assert result["session_done"] == {
            "type": "session.done",
            "utterance_index": index,
            "total_sentences": 1,
        }
        assert [(s["utterance_index"], s["sentence_index"]) for s in result["starts"]] == [(index, 0)]
        check_streamed_pcm(result)


def test_commitment_mode_streams_before_input_done_and_reuses_connection(piper_gateway: str) -> None:
    with plain(piper_gateway) as ws:
        ws.send(json.dumps(ws_test_config("commitment")))
        send(ws, type="input.text", text="The total is 2026")
        with pytest.raises(TimeoutError):  # unresolved text: nothing may be spoken yet
            ws.recv(timeout=1)
        send(ws, type="input.text", text=" dollars. ")
        prefix: list[str | bytes] = []
        while not any(isinstance(m, bytes) for m in prefix):  # audio before input.done
            message = ws.recv(timeout=TIMEOUT_S)
            if isinstance(message, str):
                assert json.loads(message)["type"] == "audio.start", message
            prefix.append(message)
        send(ws, type="input.text", text="Thank you")
        send(ws, type="input.done")
        first = collect(ws, prefix)
        send(ws, type="input.text", text="The same connection still works!")
        send(ws, type="input.done")
        reused = collect(ws)
        send(ws, type="session.close")
    assert first["session_done"] == {"type": "session.done", "utterance_index": 0, "total_sentences": 2}
    assert [(s["utterance_index"], s["sentence_index"]) for s in first["starts"]] == [(0, 0), (0, 1)]
    assert [s["sentence_text"] for s in first["starts"]] == ["The total is 2026 dollars.", "Thank you"]
    check_streamed_pcm(first)
    assert reused["session_done"] == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}
    assert reused["starts"][0]["sentence_text"] == "The same connection still works!"
    check_streamed_pcm(reused)


def streaming_client(address: str, text: str, config: dict[str, object], simulate_stt: bool) -> Iterator[Any]:
    """What ``streaming_speech_client.py`` does: yields (sentence_index, audio bytes) per audio.done."""
    with plain(address) as ws:
        ws.send(json.dumps({"type": "session.config", **config}))
        words = text.split(" ")
        pieces = (
            [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)] if simulate_stt else [text]
        )
        for piece in pieces:
            send(ws, type="input.text", text=piece)
        send(ws, type="input.done")
        chunks: list[bytes] = []
        while True:
            message = recv(ws)
            if isinstance(message, bytes):
                chunks.append(message)
            elif message["type"] == "audio.start":
                chunks = []
            elif message["type"] == "audio.done":
                yield message, b"".join(chunks)
            elif message["type"] == "session.done":
                yield message, b""
                return
            else:
                raise AssertionError(f"the client prints {message}")


# The client's defaults: speaker Vivian, task CustomVoice, language Auto, wav, speed 1.0.
CLIENT_DEFAULTS = {"speaker": "Vivian", "task_type": "CustomVoice", "language": "Auto", "speed": 1.0}
CLIENT_TEXT = "Hello world. How are you? I am fine."


def test_streaming_client_defaults_get_one_wav_file_per_sentence(piper_gateway: str) -> None:
    got = list(
        streaming_client(piper_gateway, CLIENT_TEXT, {**CLIENT_DEFAULTS, "response_format": "wav"}, False)
    )
    *sentences, (session_done, _) = got
    assert session_done == {"type": "session.done", "utterance_index": 0, "total_sentences": 3}
    assert [done["sentence_index"] for done, _ in sentences] == [0, 1, 2]
    for done, data in sentences:
        assert set(done) == DONE_FIELDS and done["total_bytes"] == len(data) and not done["error"]
        audio, rate = soundfile.read(io.BytesIO(data))  # every sentence file is a complete WAV
        assert rate == 24000 and len(audio) == (len(data) - 44) // 2 > rate // 4


def test_streaming_client_pcm_stream_audio_simulated_stt(piper_gateway: str) -> None:
    config = {**CLIENT_DEFAULTS, "response_format": "pcm", "stream_audio": True}
    got = list(streaming_client(piper_gateway, CLIENT_TEXT, config, True))
    *sentences, (session_done, _) = got
    assert session_done == {"type": "session.done", "utterance_index": 0, "total_sentences": 3}
    assert all(done["total_bytes"] == len(data) > 0 and len(data) % 2 == 0 for done, data in sentences)


def test_token_level_client_hears_audio_before_input_done(piper_gateway: str) -> None:
    chunks = [
        "Hello there, ",
        "this is a token level ",
        "streaming text input test ",
        "for Qwen3 TTS. ",
        "The audio starts playing ",
        "before all the text has been sent.",
    ]
    with plain(piper_gateway) as ws:
        send(ws, type="session.config", voice="vivian", streaming_mode="token_level", response_format="pcm")
        for chunk in chunks[:4]:
            send(ws, type="input.text", text=chunk)
        audio = bytearray()
        while not audio:  # the gate: input.done is held back until audio arrives
            message = recv(ws)
            if isinstance(message, bytes):
                audio.extend(message)
            else:
                assert message["type"] == "audio.start" and message["sample_rate"] == 24000, message
        for chunk in chunks[4:]:
            send(ws, type="input.text", text=chunk)
        send(ws, type="input.done")
        while True:
            message = recv(ws)
            if isinstance(message, bytes):
                audio.extend(message)
            elif message["type"] == "session.done":
                break
            else:
                assert message["type"] in ("audio.start", "audio.done"), message
    assert len(audio) / 2 / 24000 > 2.0


def test_sentence_commit_client_gets_each_commit_confirmed(piper_gateway: str) -> None:
    sentences = [
        "Hello there, this first sentence can begin playing immediately.",
        " The second sentence resumes the same request without resetting the voice.",
        " The final sentence is followed by input.done to release the session.",
    ]
    with plain(piper_gateway) as ws:
        send(
            ws, type="session.config", voice="vivian", streaming_mode="sentence_commit", response_format="pcm"
        )
        committed, texts = [], []
        for index, sentence in enumerate(sentences):
            send(ws, type="input.text", text=sentence)
            send(ws, type="input.commit", commit_id=f"sentence-{index}")
        send(ws, type="input.done")
        while True:
            message = recv(ws)
            if isinstance(message, bytes):
                continue
            if message["type"] == "input.committed":
                committed.append((message["commit_id"], message["sentence_index"]))
            elif message["type"] == "audio.start":
                texts.append(message["sentence_text"])
            elif message["type"] == "session.done":
                break
            else:
                assert message["type"] == "audio.done" and not message["error"], message
    assert committed == [("sentence-0", 0), ("sentence-1", 1), ("sentence-2", 2)]
    assert texts == [s.strip() for s in sentences]


def test_instructions_are_ignored_silently_for_vllm_clients_and_with_a_warning_for_ours(
    piper_gateway: str,
) -> None:
    with plain(piper_gateway) as ws:
        send(
            ws, type="session.config", voice="vivian", instructions="Speak cheerfully", response_format="pcm"
        )
        send(ws, type="input.text", text="Hello.")
        send(ws, type="input.done")
        result = collect(ws)
    assert result["session_done"]["total_sentences"] == 1 and sum(result["chunks"][0]) > 0
    with session(piper_gateway, instructions="Speak cheerfully", future_field=1) as ws:
        warning = recv(ws)
    assert isinstance(warning, dict) and warning["type"] == "warning"
    assert warning["code"] == "option_ignored" and warning["field"] == "$.instructions"


def test_errors_have_vllm_omnis_shape(piper_gateway: str) -> None:
    with plain(piper_gateway) as ws:
        send(ws, type="session.config", voice="nobody")
        error = recv(ws)
    assert isinstance(error, dict) and set(error) == {"type", "message"} and "nobody" in str(error["message"])


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"instructions": "Speak with excitement"},
        {"task_type": "CustomVoice", "language": "Auto"},
    ],
)
def test_openai_speech_client(piper_gateway: str, extra: dict[str, object]) -> None:
    """What ``openai_speech_client.py`` posts, with its defaults and its CustomVoice options."""
    payload = {
        "model": "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
        "input": "Hello, how are you?",
        "voice": "vivian",
        "response_format": "wav",
        **extra,
    }
    response = httpx.post(
        f"http://{piper_gateway}/v1/audio/speech",
        json=payload,
        headers={"Authorization": "Bearer EMPTY"},
        timeout=TIMEOUT_S,
    )
    assert response.status_code == 200, response.text
    assert not response.content.startswith(b'{"error"')
    audio, rate = soundfile.read(io.BytesIO(response.content))
    assert rate == 24000 and len(audio) > rate // 2
