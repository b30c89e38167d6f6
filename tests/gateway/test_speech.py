"""``POST /v1/audio/speech`` on a real uvicorn server with the FakeEngine."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
from voxgate.engine.fake import SECONDS_PER_CHAR, FakeEngine

from tests.conftest import TIMEOUT_S, serve_engine
from tests.decoding import decoded

TEXT = "Hello there. How are you today? Fine, thanks."


def post(address: str, **body: object) -> httpx.Response:
    return httpx.post(f"http://{address}/v1/audio/speech", json=body, timeout=30)


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "aac", "flac"])
def test_container_formats_decode_to_the_whole_text(fmt: str) -> None:
    with serve_engine(FakeEngine()) as address:
        response = post(address, input=TEXT, voice="alloy", response_format=fmt)
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"]
    data, rate = decoded(response.content)  # FFmpeg: libsndfile cannot read a streamed FLAC (length 0)
    assert rate == (48000 if fmt == "opus" else 24000)  # an Ogg Opus decoder speaks at 48 kHz
    spoken = (
        len(TEXT.replace(" ", "")) + TEXT.count(" ") - 2
    )  # segment cuts drop the spaces between sentences
    assert abs(len(data) / rate - spoken * SECONDS_PER_CHAR) < 0.15


def test_pcm_is_headerless_s16le_at_24k_by_default_and_follows_sample_rate() -> None:
    with serve_engine(FakeEngine()) as address:
        default = post(address, input="One two three.", response_format="pcm")
        telephony = post(address, input="One two three.", response_format="pcm", sample_rate=8000)
    assert default.headers["content-type"] == "audio/pcm"
    assert len(default.content) == pytest.approx(
        len("One two three.") * SECONDS_PER_CHAR * 24000 * 2, rel=0.01
    )
    assert len(telephony.content) == pytest.approx(len(default.content) / 3, rel=0.01)
    samples = np.frombuffer(default.content, "<i2") / 32768.0
    peak = np.argmax(np.abs(np.fft.rfft(samples))) * 24000 / len(samples)
    assert abs(peak - 220) < 5


def test_sse_stream_format() -> None:
    with serve_engine(FakeEngine()) as address:
        response = post(address, input=TEXT, response_format="pcm", stream_format="sse")
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"} and events[-1][
        "type"
    ] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    usage = events[-1]["usage"]
    assert set(usage) == {"input_tokens", "output_tokens", "total_tokens"}  # OpenAI's names
    assert usage["input_tokens"] == len(TEXT)
    assert usage["output_tokens"] == round(len(audio) / 2 / 24000 * 12.5)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_instructions_an_engine_cannot_follow_are_ignored_with_a_warning_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level("WARNING", logger="voxgate.gateway.routes.openai"),
        serve_engine(FakeEngine()) as address,
    ):
        response = post(address, input=TEXT, response_format="pcm", instructions="whisper")
    assert response.status_code == 200 and response.content
    assert any("'instructions'" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)


def test_voice_forms_and_aliases() -> None:
    with serve_engine(FakeEngine()) as address:
        for voice in ["alloy", "cedar", "vivian", {"id": "nova"}, "tone", None]:
            body: dict[str, object] = {"input": "Hi.", "response_format": "pcm"}
            if voice is not None:
                body["voice"] = voice
            assert post(address, **body).status_code == 200, voice


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"input": ""}, 400, "input", "invalid_message"),
        ({"input": "x" * 4097}, 400, "input", "invalid_message"),
        ({"input": "hi", "response_format": "vorbis"}, 400, "response_format", "invalid_message"),
        ({"input": "hi", "response_format": "ogg"}, 400, "response_format", "invalid_message"),
        ({"input": "hi", "speed": 9}, 400, "speed", "invalid_message"),
        ({"input": "hi", "voice": "nobody"}, 400, "voice", "voice_not_found"),
        ({"input": "hi", "x_vector_only_mode": True}, 400, "x_vector_only_mode", "unsupported_option"),
        ({"input": "hi", "task_type": "VoiceDesign"}, 400, "task_type", "unsupported_option"),
        ({"input": "hi", "bogus": 1}, 400, "bogus", "invalid_message"),
        (
            {"input": "hi", "response_format": "opus", "sample_rate": 22050},
            400,
            "sample_rate",
            "unsupported_rate",
        ),
        ({"input": " \n "}, 400, "input", "empty_input"),
    ],
)
def test_client_errors_are_4xx_in_openai_shape(
    body: dict[str, object], status: int, param: str, code: str
) -> None:
    with serve_engine(FakeEngine()) as address:
        response = post(address, **body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == code and error["type"] == "invalid_request_error"
    assert response.headers["x-request-id"]


def test_invalid_json_and_oversized_body() -> None:
    with serve_engine(FakeEngine()) as address:
        bad = httpx.post(f"http://{address}/v1/audio/speech", content=b"{nope", timeout=30)
        big = httpx.post(f"http://{address}/v1/audio/speech", content=b"x" * (17 * 1024 * 1024), timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"


def test_model_may_name_an_engine_and_is_otherwise_ignored() -> None:
    engines = [FakeEngine(name="first", sample_rate=16000), FakeEngine(name="second", sample_rate=8000)]
    with serve_engine(engines) as address:
        default = post(address, input="Hi.", model="tts-1", response_format="pcm")
        second = post(address, input="Hi.", model="second", response_format="pcm")
    assert default.headers["x-voxgate-engine"] == "first" and second.headers["x-voxgate-engine"] == "second"


def test_engine_failure_before_first_audio_is_a_server_error() -> None:
    with serve_engine(FakeEngine(fail_on="boom", fail_after_chunks=0)) as address:
        response = post(address, input="boom", response_format="pcm")
    assert response.status_code == 502 and response.json()["error"]["code"] == "engine_error"


def cut_body(address: str, **body: object) -> tuple[int, bytes, bool]:
    """A streamed answer's status, its body as far as it came, and whether it was cut off before its end."""
    received: list[bytes] = []
    url = f"http://{address}/v1/audio/speech"
    with httpx.stream("POST", url, json=body, timeout=TIMEOUT_S) as response:
        try:
            received.extend(response.iter_raw())
        except httpx.RemoteProtocolError:
            return response.status_code, b"".join(received), True
    return response.status_code, b"".join(received), False


def test_engine_failure_after_first_audio_ends_the_stream() -> None:
    text = "This is fine. Then boom here."
    with serve_engine(FakeEngine(fail_on="boom", chunk_s=0.1)) as address:
        status, audio, cut = cut_body(address, input=text, response_format="pcm")
        sse = post(address, input=text, response_format="pcm", stream_format="sse")
    # The status went out with the first audio; the body is the audio made before the failure, and it is cut
    # off without its end, so that no client takes it for complete.
    assert status == 200 and cut
    assert 0 < len(audio) < len(text) * SECONDS_PER_CHAR * 24000 * 2 * 0.8
    events = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "speech.audio.delta" and events[-1]["type"] == "speech.audio.error"


def test_an_engine_bug_before_the_first_audio_is_a_500() -> None:
    engine = FakeEngine(fail_on="boom", fail_after_chunks=0, failure=ValueError)
    with serve_engine(engine) as address:
        response = post(address, input="boom", response_format="pcm")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"


def test_an_engine_bug_mid_stream_truncates_the_body_or_ends_sse_with_an_error() -> None:
    text = "This is fine. Then boom here."
    with serve_engine(FakeEngine(fail_on="boom", chunk_s=0.1, failure=ValueError)) as address:
        status, audio, cut = cut_body(address, input=text, response_format="pcm")
        sse = post(address, input=text, response_format="pcm", stream_format="sse")
    assert status == 200 and cut
    assert 0 < len(audio) < len(text) * SECONDS_PER_CHAR * 24000 * 2 * 0.8
    events = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == {
        "type": "speech.audio.error",
        "error": {"message": "internal error; see the server log", "code": "internal_error"},
    }


def test_request_id_is_echoed() -> None:
    with serve_engine(FakeEngine()) as address:
        response = httpx.post(
            f"http://{address}/v1/audio/speech",
            json={"input": "Hi.", "response_format": "pcm"},
            headers={"x-request-id": "abc-123"},
        )
    assert response.headers["x-request-id"] == "abc-123"
