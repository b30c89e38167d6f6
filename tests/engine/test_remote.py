"""The ``remote`` engine against real HTTP upstreams: another gateway (Piper) and a recording stub.

Gateway B runs the remote engine on a real uvicorn; its upstreams are ``StubUpstream`` servers
(tests/engine/upstream_stub.py) whose answers a test switches between ok, failing, garbage, stalled
and refusing, or, in the slow tests, gateway A running the embedded Piper engine.
"""

from __future__ import annotations

import base64
import contextlib
import io
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import soundfile
from voxgate.engine import http_stream
from voxgate.engine.qwen3_tts import qwen_language
from voxgate.engine.remote_settings import DEFAULT_REFERENCE_TEXT
from voxgate.protocol.audio import decode
from voxgate.protocol.joins import fade
from websockets.sync.client import ClientConnection

from tests.conftest import (
    TIMEOUT_S,
    Received,
    bound_socket,
    recv,
    recv_until,
    send,
    serve_engine,
    session,
    voxgate_connect,
)
from tests.engine.upstream_stub import (
    REFUSAL,
    SAMPLE_RATE,
    Kind,
    StubUpstream,
    pcm16,
    serve_stub,
    tone,
)

URL = "/v1/audio/speech/stream"
# Small enough that a stall or a dead upstream shows within a second or two; TIMEOUT_S stays the
# limit for anything that should simply work.
READ_TIMEOUT_S = 1.0
FAST: dict[str, object] = {
    "upstream_read_timeout_s": READ_TIMEOUT_S,
    "upstream_connect_timeout_s": 1.0,
    "upstream_first_byte_timeout_s": READ_TIMEOUT_S,
    "upstream_health_interval_s": 0.2,
    "upstream_breaker_failures": 2,
    "upstream_breaker_cooldown_s": 30.0,
}
# Well above READ_TIMEOUT_S, well below the 30 s a stalled request would otherwise take.
PROMPT_S = 8 * READ_TIMEOUT_S
# A closed client connection reaches the upstream within milliseconds; this is a generous bound.
CLOSE_S = 2.0


@contextlib.contextmanager
def gateway(*urls: str, **settings: object) -> Iterator[str]:
    """Gateway B: the remote engine (unless ``engine`` says otherwise) in front of ``urls``."""
    settings.setdefault("engine", "remote")
    with serve_engine(None, upstreams=urls, **{**FAST, **settings}) as address:
        yield address


@contextlib.contextmanager
def stubs(*stubs: StubUpstream) -> Iterator[list[str]]:
    """Serve each stub; yields their base URLs in the same order."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(serve_stub(stub)) for stub in stubs]


@contextlib.contextmanager
def configured(address: str, **config: object) -> Iterator[tuple[ClientConnection, dict[str, object]]]:
    """A WebSocket session like ``conftest.session``, also yielding its ``session.ready``."""
    with voxgate_connect(f"ws://{address}{URL}", max_size=None, open_timeout=TIMEOUT_S) as ws:
        send(ws, type="session.config", **config)
        ready = recv(ws)
        assert isinstance(ready, dict) and ready["type"] == "session.ready", ready
        yield ws, ready


def speak(ws: ClientConnection, *tokens: str, timeout: float = TIMEOUT_S) -> Received:
    for token in tokens:
        send(ws, type="input.text", text=token)
    send(ws, type="input.done")
    return recv_until(ws, "session.done", timeout=timeout)


def post_speech(address: str, text: str = "Hello there.", **fields: object) -> httpx.Response:
    body = {"input": text, "response_format": "pcm", **fields}
    return httpx.post(f"http://{address}/v1/audio/speech", json=body, timeout=TIMEOUT_S)


def readyz(address: str) -> httpx.Response:
    return httpx.get(f"http://{address}/readyz", timeout=TIMEOUT_S)


def wait_for(condition: Callable[[], bool], timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def clip(seed: int, seconds: float = 1.5, rate: int = 16000) -> bytes:
    """A WAV of noise to upload as a voice (PCM_16, so B's float32 copy is exact)."""
    noise = np.random.default_rng(seed).uniform(-0.5, 0.5, int(seconds * rate)).astype(np.float32)
    out = io.BytesIO()
    soundfile.write(out, noise, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def samples_of(wav: bytes) -> tuple[npt.NDArray[np.float32], int]:
    audio, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    return audio, rate


def upload(
    address: str, name: str, wav: bytes, key: str | None = None, ref_text: str | None = "The quick brown fox."
) -> None:
    form = {"name": name, "consent": "the speaker agreed on 2024-05-01"}
    if ref_text is not None:
        form["ref_text"] = ref_text
    headers = {"authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(
        f"http://{address}/v1/audio/voices",
        data=form,
        files={"audio_sample": ("clip.wav", wav, "audio/wav")},
        headers=headers,
        timeout=TIMEOUT_S,
    )
    assert response.status_code == 200, response.text


def ref_audio(body: dict[str, object]) -> tuple[npt.NDArray[np.float32], int]:
    """The reference clip a request body carries inline."""
    url = str(body["ref_audio"])
    prefix = "data:audio/wav;base64,"
    assert url.startswith(prefix), url[:40]
    return samples_of(base64.b64decode(url[len(prefix) :]))


# -- chaining: gateway B (remote) in front of gateway A (Piper) ---------------------------------


@pytest.fixture(scope="module")
def chain() -> Iterator[str]:
    """Address of gateway B, whose only upstream is gateway A running Piper."""
    with (
        serve_engine(None, engine="piper") as a,
        gateway(f"http://{a}", upstream_read_timeout_s=TIMEOUT_S) as b,
    ):
        yield b


@pytest.mark.slow
def test_chained_session_streams_real_speech(chain: str) -> None:
    with configured(chain, eager_first_segment=False) as (ws, ready):
        got = speak(ws, "Good morn", "ing. This au", "dio comes ", "from another gate", "way.")
    config = ready["config"]
    assert isinstance(config, dict) and config["engine"] == "remote"
    # Gateway A answers at OpenAI's 24 kHz unless asked otherwise, and B learned that from it.
    assert config["sample_rate"] == 24000
    starts = got.messages("audio.start")
    assert [m["sentence_text"] for m in starts] == ["Good morning.", "This audio comes from another gateway."]
    assert all(m["sample_rate"] == config["sample_rate"] for m in starts)
    assert not any(m["error"] for m in got.messages("audio.done")) and not got.messages("error")
    audio = decode(b"".join(got.frames()), "pcm")
    done = got.messages("session.done")[0]
    assert float(done["audio_ms"]) > 1000  # type: ignore[arg-type]
    assert done["audio_ms"] == pytest.approx(len(audio) * 1000 / 24000, abs=1)
    assert np.abs(audio).max() > 0.05  # speech, not silence


@pytest.mark.slow
def test_chained_gateway_is_ready_and_serves_rest(chain: str) -> None:
    ready = readyz(chain)
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "engines": {"remote": "ready"}}
    response = post_speech(chain, "Testing the chained speech route.")
    assert response.status_code == 200, response.text
    assert (
        response.headers["content-type"] == "audio/pcm" and response.headers["x-voxgate-engine"] == "remote"
    )
    rate = int(response.headers["x-sample-rate"])
    audio = decode(response.content, "pcm")
    assert rate == 24000 and len(audio) > rate  # over a second of speech
    assert np.abs(audio).max() > 0.05


# -- what reaches the upstream -------------------------------------------------------------------


def test_session_options_reach_the_upstream() -> None:
    stub = StubUpstream()
    config = {
        "voice": "ryan",
        "seed": 42,
        "language": "en-US",
        "instructions": "Speak calmly.",
        "task_type": "CustomVoice",
        "max_new_tokens": 900,
        "initial_codec_chunk_frames": 4,
        "non_streaming_mode": True,
    }
    with stubs(stub) as urls, gateway(*urls, upstream_model="Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice") as b:
        with configured(b, eager_first_segment=False, **config) as (ws, ready):
            got = speak(ws, "Hello the", "re. How are", " you?")
    bodies = stub.speech_requests()
    assert [body["input"] for body in bodies] == ["Hello there.", "How are you?"]
    # A raw WAV stream: vllm-omni 0.30 answers a bare ``stream: true`` with SSE; the header says the
    # rate. The language tag becomes the name vllm-omni accepts.
    expected = {
        **config,
        "language": "English",
        "model": "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
        "response_format": "wav",
        "stream": True,
        "stream_format": "audio",
    }
    assert all({k: v for k, v in body.items() if k != "input"} == expected for body in bodies)
    # The stub's 16-bit samples straddle its odd-sized body pieces; they arrive whole and in order.
    assert ready["config"]["sample_rate"] == SAMPLE_RATE  # type: ignore[index]
    assert not got.messages("error")
    audio = decode(b"".join(got.frames()), "pcm")
    # Each segment's first and last 4 ms are faded in and out, on every engine (protocol/joins.py).
    expected_audio = fade(decode(pcm16(tone(stub.seconds)), "pcm"), SAMPLE_RATE)
    assert len(audio) == 2 * len(expected_audio)
    np.testing.assert_allclose(audio, np.tile(expected_audio, 2), atol=2 / 32768)


def test_speed_is_served_by_a_whole_answer_per_segment() -> None:
    """vllm-omni refuses to stream with ``speed`` other than 1, and makes a whole answer instead."""
    stub = StubUpstream()
    with stubs(stub) as urls, gateway(*urls) as b:
        with configured(b, speed=1.25) as (ws, _):
            got = speak(ws, "Hello there.")
        rest = post_speech(b, "Hello there.", speed=1.25)
    assert not got.messages("error") and got.frames()
    assert rest.status_code == 200 and len(decode(rest.content, "pcm")) == round(stub.seconds * SAMPLE_RATE)
    for body in stub.speech_requests():
        assert body["speed"] == 1.25 and body["response_format"] == "wav"
        assert "stream" not in body and "stream_format" not in body


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ("en", "English"),
        ("EN_gb", "English"),
        ("zh-Hans-CN", "Chinese"),
        ("auto", "Auto"),
        ("german", "German"),
    ],
)
def test_language_codes_become_vllm_omni_names(given: str, sent: str) -> None:
    assert qwen_language(given) == sent


def test_an_unknown_language_is_refused_with_a_4xx_naming_it() -> None:
    stub = StubUpstream()
    with stubs(stub) as urls, gateway(*urls) as b:
        with configured(b, language="tlh") as (ws, _):
            got = speak(ws, "Hello there.")
        rest = post_speech(b, "Hello there.", language="tlh")
    error = got.messages("error")[0]
    assert error["code"] == "request_refused" and error["field"] == "language", error
    assert "Invalid language 'Tlh'" in str(error["message"])
    assert rest.status_code == 400, rest.text
    assert rest.json()["error"]["param"] == "language" and rest.json()["error"]["code"] == "request_refused"
    assert "Invalid language 'Tlh'" in rest.json()["error"]["message"]


def test_the_engine_learns_voices_and_rate_from_the_upstream() -> None:
    stub = StubUpstream(rate=16000)
    with stubs(stub) as urls, gateway(*urls) as b:
        listed = httpx.get(f"http://{b}/v1/audio/voices", timeout=TIMEOUT_S).json()
        # No start-up synthesis, which a Base checkpoint would refuse (the word-timestamp probe runs none).
        assert stub.requests == []
        with configured(b) as (ws, ready):
            got = speak(ws, "Hello.")
        with voxgate_connect(f"ws://{b}{URL}") as refused_ws:
            send(refused_ws, type="session.config", voice="nobody")
            refused = recv(refused_ws)
    # vllm-omni's placeholder ``default`` is not a voice.
    assert listed["voices"] == ["ryan", "vivian"]
    assert ready["config"] == {**ready["config"], "voice": "vivian", "sample_rate": SAMPLE_RATE}  # type: ignore[dict-item]
    # The answer's WAV header said 16 kHz: the gateway resampled it to the session's 24 kHz.
    audio = decode(b"".join(got.frames()), "pcm")
    assert len(audio) == pytest.approx(stub.seconds * SAMPLE_RATE, abs=SAMPLE_RATE * 0.01)
    assert (
        isinstance(refused, dict)
        and refused["code"] == "voice_not_found"
        and "ryan" in str(refused["message"])
    )


@pytest.mark.parametrize("kind", ["Base", "VoiceDesign"])
def test_base_and_voice_design_upstreams_start_without_refusals(kind: Kind) -> None:
    stub = StubUpstream(kind=kind)
    with stubs(stub) as urls, gateway(*urls) as b:
        report = readyz(b)
        listed = httpx.get(f"http://{b}/v1/audio/voices", timeout=TIMEOUT_S).json()
        time.sleep(5 * FAST["upstream_health_interval_s"])  # type: ignore[operator]
        assert stub.requests == []
        designed = post_speech(b, "Hello there.", instructions="A calm voice.")
    assert report.status_code == 200
    assert "default" not in listed["voices"]
    # No speaker is named to a checkpoint that has none, and a VoiceDesign one is told its task (it
    # takes a request without one as CustomVoice and refuses it).
    assert "voice" not in stub.requests[0]
    assert stub.requests[0]["task_type"] == kind
    assert designed.status_code == 200, designed.text
    if kind == "Base":  # a Base checkpoint speaks only from a reference: the default one, transcript and all
        assert stub.requests[0]["ref_text"] == DEFAULT_REFERENCE_TEXT
        assert ref_audio(stub.requests[0])[1] == 24000


def test_an_upstream_whose_voice_list_is_not_json_still_serves() -> None:
    stub = StubUpstream(voices_html=True)
    with stubs(stub) as urls, gateway(*urls) as b:
        report = readyz(b)
        with session(b) as ws:
            got = speak(ws, "Hello.")
    assert report.status_code == 200
    assert got.frames() and not got.messages("error")
    assert stub.speech_requests()[0]["voice"] == "vivian"


def test_word_timestamps_are_refused_by_name_without_the_aligner() -> None:
    stub = StubUpstream()  # a vllm-omni launched without --forced-aligner
    with stubs(stub) as urls, gateway(*urls) as b, voxgate_connect(f"ws://{b}{URL}") as ws:
        send(ws, type="session.config", word_timestamps=True)
        refused = recv(ws)
    assert isinstance(refused, dict) and refused["code"] == "unsupported_option", refused
    assert refused["field"] == "$.word_timestamps", refused
    assert "'remote'" in str(refused["message"]) and "--forced-aligner" in str(refused["message"])
    # Learned at start-up by the probe, which synthesizes nothing.
    assert stub.requests == [] and [p["input"] for p in stub.probes] == [""]


WRITTEN = "It costs $3.50 on 5/12, Dr. Smith said."


def word_messages(got: Received) -> list[dict[str, object]]:
    return [m for m in got.messages("audio.chunk")]


def words_of(got: Received) -> list[dict[str, float | str]]:
    return [w for m in word_messages(got) for w in m["timestamps"]]  # type: ignore[attr-defined]


def test_word_timestamps_come_from_the_upstream_aligner_before_the_audio() -> None:
    stub = StubUpstream(forced_aligner=True)
    with stubs(stub) as urls, gateway(*urls) as b:
        with configured(b, word_timestamps=True) as (ws, _):
            got = speak(ws, WRITTEN)
    assert not got.messages("error")
    (body,) = stub.speech_requests()
    # vllm-omni times words only on a whole answer: no stream fields.
    assert body["word_timestamps"] is True and "stream" not in body and "stream_format" not in body
    words = words_of(got)
    # The aligner's words ("350", "Dr") named as the client wrote them.
    assert [w["word"] for w in words] == WRITTEN.split()
    # vllm-omni's ms from the answer's start, on the utterance's clock: the stub shares 300 ms evenly.
    share = stub.seconds * 1000 / len(words)
    for i, w in enumerate(words):
        assert w["start_ms"] == pytest.approx(i * share, abs=1) and w["end_ms"] == pytest.approx(
            (i + 1) * share, abs=1
        )
    # The words come before any of the audio they describe.
    first_audio = next(i for i, item in enumerate(got.items) if isinstance(item, bytes))
    first_words = next(
        i for i, item in enumerate(got.items) if isinstance(item, dict) and item["type"] == "audio.chunk"
    )
    assert first_words < first_audio


def test_words_left_out_for_size_are_asked_for_in_halves() -> None:
    stub = StubUpstream(forced_aligner=True)
    text = " ".join(["a"] * 140) + "."  # over vllm-omni's 4 KB header as one answer, under it in halves
    with stubs(stub) as urls, gateway(*urls) as b:
        with configured(b, word_timestamps=True, split_granularity="none") as (ws, _):
            got = speak(ws, text)
    assert not got.messages("error")
    inputs = [str(body["input"]) for body in stub.speech_requests()]
    assert inputs[0] == text and len(inputs) == 3 and " ".join(inputs[1:]) == text
    words = words_of(got)
    assert [w["word"] for w in words] == text.split()
    starts = [float(w["start_ms"]) for w in words]
    assert starts == sorted(starts) and starts[70] == pytest.approx(stub.seconds * 1000, abs=1)


def test_words_go_only_to_upstreams_with_the_aligner() -> None:
    plain, aligned = StubUpstream(), StubUpstream(forced_aligner=True)
    with stubs(plain, aligned) as urls, gateway(*urls) as b:
        with configured(b, word_timestamps=True) as (ws, _):
            got = speak(ws, "One. ", "Two. ", "Three.")
        with configured(b) as (ws, _):
            untimed = speak(ws, "Four.")
    assert [w["word"] for w in words_of(got)] == ["One.", "Two.", "Three."]
    assert plain.speech_requests() == [] or all("word_timestamps" not in r for r in plain.speech_requests())
    assert [r["input"] for r in aligned.speech_requests() if r.get("word_timestamps")] == [
        "One.",
        "Two.",
        "Three.",
    ]
    assert not untimed.messages("audio.chunk") and untimed.frames()


def test_uploaded_voice_travels_inline_as_ref_audio() -> None:
    stub = StubUpstream(kind="Base")
    wav = clip(seed=1)
    with stubs(stub) as urls, gateway(*urls) as b:
        upload(b, "narrator", wav)
        with session(b, voice="narrator") as ws:
            got = speak(ws, "Read this in my voice.")
        rest = post_speech(b, "And this.", voice="narrator")
    assert got.frames() and not got.messages("error")
    assert rest.status_code == 200 and rest.content
    bodies = stub.speech_requests()
    assert len(bodies) == 2
    for body in bodies:
        assert "voice" not in body
        assert body["task_type"] == "Base" and body["ref_text"] == "The quick brown fox."
        assert "x_vector_only_mode" not in body  # the transcript allows in-context cloning
        assert body["stream_format"] == "audio" and body["response_format"] == "wav"
        sent, rate = ref_audio(body)
        uploaded, uploaded_rate = samples_of(wav)
        assert rate == uploaded_rate == 16000 and len(sent) == len(uploaded)
        np.testing.assert_allclose(sent, uploaded, atol=2 / 32768)


def test_a_voice_without_transcript_clones_from_the_speaker_embedding_alone() -> None:
    """vllm-omni refuses a Base clone with no ``ref_text`` unless ``x_vector_only_mode`` is sent."""
    stub = StubUpstream(kind="Base")
    with stubs(stub) as urls, gateway(*urls) as b:
        upload(b, "quiet", clip(seed=3), ref_text=None)
        with session(b, voice="quiet") as ws:
            got = speak(ws, "No transcript was given.")
        rest = post_speech(b, "Still cloned.", voice="quiet")
    assert got.frames() and not got.messages("error")
    assert rest.status_code == 200, rest.text
    for body in stub.speech_requests():
        assert body["x_vector_only_mode"] is True and "ref_text" not in body and "ref_audio" in body


def test_a_replaced_voice_sends_the_new_clip() -> None:
    stub = StubUpstream(kind="Base")
    first, second = clip(seed=1), clip(seed=2)  # the same length and rate, different audio
    with stubs(stub) as urls, gateway(*urls) as b:
        upload(b, "narrator", first)
        assert post_speech(b, "One.", voice="narrator").status_code == 200
        upload(b, "narrator", second)
        assert post_speech(b, "Two.", voice="narrator").status_code == 200
    before, after = (ref_audio(body)[0] for body in stub.speech_requests())
    np.testing.assert_allclose(before, samples_of(first)[0], atol=2 / 32768)
    np.testing.assert_allclose(after, samples_of(second)[0], atol=2 / 32768)


def test_each_owner_gets_their_own_voice_of_the_same_name() -> None:
    stub = StubUpstream(kind="Base")
    clips = {"key-one": clip(seed=1), "key-two": clip(seed=2)}
    with stubs(stub) as urls, gateway(*urls, api_keys=tuple(clips)) as b:
        for key, wav in clips.items():
            upload(b, "me", wav, key=key)
        for key in clips:
            response = httpx.post(
                f"http://{b}/v1/audio/speech",
                json={"input": "Hi.", "voice": "me", "response_format": "pcm"},
                headers={"authorization": f"Bearer {key}"},
                timeout=TIMEOUT_S,
            )
            assert response.status_code == 200, response.text
    for body, wav in zip(stub.speech_requests(), clips.values(), strict=True):
        np.testing.assert_allclose(ref_audio(body)[0], samples_of(wav)[0], atol=2 / 32768)


# -- failover, breaker, stalls, refusals ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["error500", "garbage", "unauthorized"])
def test_failover_before_the_first_byte(mode: str) -> None:
    bad, good = StubUpstream(mode=mode), StubUpstream()  # type: ignore[arg-type]
    with stubs(bad, good) as urls, gateway(*urls, upstream_breaker_failures=10) as b:
        with session(b, eager_first_segment=False) as ws:
            # Ties rotate, so of two requests in a row one tries the bad upstream first.
            got = [speak(ws, "First one."), speak(ws, "Second one.")]
    for received in got:
        assert received.frames() and not received.messages("error")
        assert not any(m["error"] for m in received.messages("audio.done"))
    assert len(bad.speech_requests()) >= 1
    assert [body["input"] for body in good.speech_requests()] == ["First one.", "Second one."]


def test_breaker_keeps_a_failing_upstream_out_until_the_cooldown() -> None:
    bad, good = StubUpstream(mode="error500"), StubUpstream()
    cooldown_s = 2.0
    with stubs(bad, good) as urls, gateway(*urls, upstream_breaker_cooldown_s=cooldown_s) as b:
        for _ in range(10):
            if len(bad.speech_requests()) == 2:
                break
            assert post_speech(b).status_code == 200
        opened_t = time.monotonic()
        assert len(bad.speech_requests()) == 2  # upstream_breaker_failures
        served = len(good.speech_requests())
        for _ in range(4):
            assert post_speech(b).status_code == 200
        assert time.monotonic() - opened_t < cooldown_s, "too slow to check the open circuit"
        assert len(bad.speech_requests()) == 2 and len(good.speech_requests()) == served + 4
        bad.mode = "ok"
        time.sleep(cooldown_s)
        for _ in range(4):  # half-open: offered again; its success closes the circuit
            assert post_speech(b).status_code == 200
    assert any(stream.completed for stream in bad.streams)


def test_stall_before_the_first_byte_fails_over() -> None:
    stalled, good = StubUpstream(mode="stall_before"), StubUpstream()
    with stubs(stalled, good) as urls, gateway(*urls, upstream_breaker_failures=10) as b:
        started = time.monotonic()
        responses = [post_speech(b, "First one."), post_speech(b, "Second one.")]
        elapsed = time.monotonic() - started
        assert stalled.streams
        stalled.wait_closed(stalled.streams[0], CLOSE_S)
    assert all(r.status_code == 200 and r.content for r in responses)
    assert [body["input"] for body in good.speech_requests()] == ["First one.", "Second one."]
    assert elapsed < 2 * PROMPT_S


def test_stall_before_the_first_byte_with_one_upstream_is_an_engine_error() -> None:
    stub = StubUpstream(mode="stall_before")
    with stubs(stub) as urls, gateway(*urls) as b, session(b) as ws:
        started = time.monotonic()
        got = speak(ws, "Anyone there?", timeout=PROMPT_S)
        elapsed = time.monotonic() - started
        stub.mode = "ok"
        again = speak(ws, "Now it works.")
    assert elapsed < PROMPT_S
    error = got.messages("error")[0]
    assert error["code"] == "engine_error" and error["fatal"] is False
    assert urls[0] in str(error["message"])
    assert again.frames() and not again.messages("error")


def test_stall_mid_stream_fails_the_segment_and_the_session_goes_on() -> None:
    stub = StubUpstream(mode="stall_mid")
    with stubs(stub) as urls, gateway(*urls) as b, session(b) as ws:
        got = speak(ws, "This one stalls.", timeout=PROMPT_S)
        stub.wait_closed(stub.streams[0], CLOSE_S)
        stub.mode = "ok"
        again = speak(ws, "This one does not.")
    assert got.frames()  # the audio from before the stall was delivered
    assert [m["error"] for m in got.messages("audio.done")] == [True]
    error = got.messages("error")[0]
    assert error["code"] == "engine_error" and "mid-stream" in str(error["message"])
    assert got.types()[-1] == "session.done"
    assert again.frames() and not again.messages("error")
    # A failure after audio is not retried elsewhere: the listener would hear the start twice.
    assert [body["input"] for body in stub.speech_requests()] == ["This one stalls.", "This one does not."]


def test_a_refusal_is_reported_and_neither_retried_nor_held_against_the_upstream() -> None:
    first, second = StubUpstream(mode="refuse400"), StubUpstream(mode="refuse400")
    with stubs(first, second) as urls, gateway(*urls, upstream_breaker_failures=1) as b:
        with session(b, eager_first_segment=False) as ws:
            got = speak(ws, "Say this.")
        assert len(first.speech_requests()) + len(second.speech_requests()) == 1  # no failover
        rest = post_speech(b)
        first.mode = second.mode = "ok"
        assert all(post_speech(b).status_code == 200 for _ in range(4))
    error = got.messages("error")[0]
    # The upstream's 4xx is the request's fault: a 4xx for the client, with the upstream's message
    # and the field it names.
    assert error["code"] == "request_refused" and error["field"] == "voice"
    assert REFUSAL in str(error["message"]) and "400" in str(error["message"])
    assert [m["error"] for m in got.messages("audio.done")] == [True]
    assert rest.status_code == 400 and REFUSAL in rest.json()["error"]["message"]
    assert rest.json()["error"]["code"] == "request_refused"
    # Had the refusals opened a circuit (one failure is enough here), one upstream would get all four.
    assert any(s.completed for s in first.streams) and any(s.completed for s in second.streams)


# -- closing the upstream stream -----------------------------------------------------------------


def test_cancel_closes_the_upstream_stream() -> None:
    stub = StubUpstream(seconds=10.0, pieces_delay_s=0.05)  # 10 s of audio over about 10 s
    with stubs(stub) as urls, gateway(*urls) as b, session(b) as ws:
        send(ws, type="input.text", text="A long sentence.")
        send(ws, type="input.done")
        recv_until(ws, "audio.start")
        assert isinstance(recv(ws), bytes)
        cancelled_t = time.monotonic()
        send(ws, type="input.cancel")
        recv_until(ws, "audio.cancelled")
        closed_t = stub.wait_closed(stub.streams[0])
        stub.seconds = 0.3
        again = speak(ws, "Next.")
    assert closed_t - cancelled_t < CLOSE_S
    assert not stub.streams[0].completed
    assert again.frames() and stub.streams[1].completed


def test_disconnect_closes_the_upstream_stream() -> None:
    stub = StubUpstream(seconds=10.0, pieces_delay_s=0.05)
    with stubs(stub) as urls, gateway(*urls) as b:
        with session(b) as ws:
            send(ws, type="input.text", text="A long sentence.")
            send(ws, type="input.done")
            recv_until(ws, "audio.start")
            assert isinstance(recv(ws), bytes)
        left_t = time.monotonic()
        closed_t = stub.wait_closed(stub.streams[0])
    assert closed_t - left_t < CLOSE_S and not stub.streams[0].completed


def test_rest_client_leaving_closes_the_upstream_stream() -> None:
    stub = StubUpstream(seconds=10.0, pieces_delay_s=0.05)
    with stubs(stub) as urls, gateway(*urls) as b:
        body = {"input": "A long sentence.", "response_format": "pcm"}
        with httpx.stream("POST", f"http://{b}/v1/audio/speech", json=body, timeout=TIMEOUT_S) as response:
            assert response.status_code == 200
            next(response.iter_bytes())
        left_t = time.monotonic()
        closed_t = stub.wait_closed(stub.streams[0], CLOSE_S)
    assert closed_t - left_t < CLOSE_S and not stub.streams[0].completed


# -- upstreams down ------------------------------------------------------------------------------


def test_all_upstreams_down_at_start_then_recovery() -> None:
    stub = StubUpstream()
    with contextlib.closing(bound_socket()) as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with gateway(url) as b:
            down = readyz(b)
            with session(b) as ws:
                started = time.monotonic()
                failed = speak(ws, "Is anybody there?", timeout=PROMPT_S)
                elapsed = time.monotonic() - started
                with serve_stub(stub, sock):
                    wait_for(lambda: readyz(b).status_code == 200)
                    again = speak(ws, "Now there is.")
    assert down.status_code == 503
    assert down.json() == {"status": "unavailable", "engines": {"remote": "unavailable"}}
    assert elapsed < PROMPT_S
    error = failed.messages("error")[0]
    assert error["code"] == "engine_error" and error["fatal"] is False
    assert url in str(error["message"]) and "unavailable" in str(error["message"])
    assert again.frames() and not again.messages("error")
    assert [body["input"] for body in stub.speech_requests()] == ["Now there is."]


def test_voices_learned_after_a_late_start_are_served() -> None:
    with contextlib.closing(bound_socket()) as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with gateway(url) as b, serve_stub(StubUpstream(), sock):
            wait_for(lambda: readyz(b).status_code == 200)
            listed = httpx.get(f"http://{b}/v1/audio/voices", timeout=TIMEOUT_S).json()
            with voxgate_connect(f"ws://{b}{URL}") as ws:
                send(ws, type="session.config", voice="ryan")
                answer = recv(ws)
    assert isinstance(answer, dict) and answer["type"] == "session.ready", answer
    assert listed["voices"] == ["ryan", "vivian"]


def test_a_down_engine_fails_only_its_own_sessions() -> None:
    with contextlib.closing(bound_socket()) as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with gateway(url, engine="fake,remote") as b:
            report = readyz(b)
            with session(b) as fake_ws:
                fine = speak(fake_ws, "Fake engines never fail.")
            with configured(b, model="remote") as (remote_ws, ready):
                failed = speak(remote_ws, "This needs the upstream.", timeout=PROMPT_S)
            with session(b) as fake_ws:
                still = speak(fake_ws, "Still fine.")
    assert report.status_code == 503
    assert report.json()["engines"] == {"fake": "ready", "remote": "unavailable"}
    assert fine.frames() and not fine.messages("error")
    assert ready["config"]["engine"] == "remote"  # type: ignore[index]
    error = failed.messages("error")[0]
    assert error["code"] == "engine_error" and url in str(error["message"])
    assert not failed.frames()
    assert still.frames() and not still.messages("error")


def test_an_upstream_that_refuses_our_key_leaves_readyz_once_its_circuit_opens() -> None:
    stub = StubUpstream(mode="unauthorized")
    with (
        stubs(stub) as urls,
        gateway(*urls, upstream_breaker_failures=2, upstream_breaker_cooldown_s=60) as b,
    ):
        assert readyz(b).status_code == 200  # /health answers without a key
        for _ in range(2):
            with session(b) as ws:
                failed = speak(ws, "Hello.")
            assert "401" in str(failed.messages("error")[0]["message"])
        down = readyz(b)
    assert down.status_code == 503 and down.json()["engines"] == {"remote": "unavailable"}


@pytest.mark.parametrize(
    ("env", "url", "expected"),
    [
        ({}, "http://vllm:8091", None),
        ({"HTTP_PROXY": "http://proxy:3128"}, "http://vllm:8091", "http://proxy:3128"),
        ({"http_proxy": "http://proxy:3128", "NO_PROXY": "vllm"}, "http://vllm:8091", None),
        ({"HTTP_PROXY": "http://proxy:3128"}, "https://vllm:8091", None),
        ({"HTTPS_PROXY": "http://tls-proxy:3128"}, "https://vllm:8091", "http://tls-proxy:3128"),
        (
            {"ALL_PROXY": "http://any:3128", "HTTP_PROXY": "http://proxy:3128"},
            "http://vllm:8091",
            "http://proxy:3128",
        ),
        ({"ALL_PROXY": "http://any:3128"}, "https://vllm:8091", "http://any:3128"),
    ],
)
def test_the_speech_requests_take_the_proxy_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str, expected: str | None
) -> None:
    # As httpx does for the probes: HTTP(S)_PROXY by scheme, NO_PROXY by host (read once per upstream).
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    http_stream.proxy_for.cache_clear()
    try:
        assert http_stream.proxy_for(url) == expected
    finally:
        http_stream.proxy_for.cache_clear()
