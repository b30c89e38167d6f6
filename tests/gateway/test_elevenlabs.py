"""The ElevenLabs-compatible routes on a real uvicorn with the FakeEngine: wire shapes, keys, errors."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import ssl
import tempfile
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from elevenlabs.client import ElevenLabs
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from voxgate.engine.base import AudioChunk, SynthesisRequest, WordTiming
from voxgate.engine.fake import SECONDS_PER_CHAR, FakeEngine
from voxgate.gateway.app import create_app
from voxgate.gateway.settings import Settings
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.conftest import TIMEOUT_S, self_signed_certificate, serve, serve_engine
from tests.decoding import decoded
from tests.gateway.test_drain import _await_draining, voxgate_serve

MAX_CONTEXTS = Settings.from_env({}).max_contexts

KEY = "eleven-key"


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    with serve_engine(FakeEngine(), api_keys=KEY) as addr:
        yield addr


def _ws(address: str, path: str, query: str = "output_format=pcm_16000", **headers: str) -> ClientConnection:
    conn: ClientConnection = connect(
        f"ws://{address}/v1/text-to-speech/{path}?{query}",
        additional_headers={"xi-api-key": KEY, **headers},
        open_timeout=TIMEOUT_S,
        max_size=None,
    )
    return conn


def _send(ws: ClientConnection, **message: object) -> None:
    ws.send(json.dumps(message))


def _until_closed(ws: ClientConnection) -> tuple[list[dict[str, Any]], int | None]:
    """Every message until the server closes, and its close code."""
    got: list[dict[str, Any]] = []
    try:
        while True:
            got.append(json.loads(ws.recv(timeout=TIMEOUT_S)))
    except ConnectionClosed as closed:
        return got, closed.rcvd.code if closed.rcvd else None


def _sentences(messages: list[dict[str, Any]]) -> list[tuple[bytes, dict[str, Any]]]:
    """Audio messages as sentences, for an engine that times no words (the fake one): each sentence's audio
    comes as it is made with ``alignment`` null, then its whole alignment in a message of no audio."""
    sentences: list[tuple[bytes, dict[str, Any]]] = []
    audio = b""
    for m in messages:
        if "audio" not in m:
            continue
        audio += base64.b64decode(m["audio"])
        if m["alignment"] is not None:
            assert m["audio"] == "" and m["normalizedAlignment"] == m["alignment"]
            sentences.append((audio, m["alignment"]))
            audio = b""
    assert audio == b""  # nothing after the last alignment
    return sentences


def _audio_seconds(messages: list[dict[str, Any]], bytes_per_sample: int, rate: int) -> float:
    return (
        sum(len(base64.b64decode(m["audio"])) for m in messages if m.get("audio")) / bytes_per_sample / rate
    )


def test_stream_input_speaks_each_sentence_with_alignment_then_is_final(address: str) -> None:
    with _ws(address, "tone/stream-input") as ws:
        _send(ws, text=" ", voice_settings={"stability": 0.5, "similarity_boost": 0.8}, xi_api_key=KEY)
        _send(ws, text="Hello there. ", try_trigger_generation=True)
        _send(ws, text="How are you? ")
        _send(ws, text="")
        got, code = _until_closed(ws)
    assert code == 1000
    *audio, final = got
    assert final == {"isFinal": True}
    assert all(set(m) == {"audio", "isFinal", "alignment", "normalizedAlignment"} for m in audio)
    sentences = _sentences(audio)
    assert ["".join(alignment["chars"]) for _, alignment in sentences] == ["Hello there. ", "How are you? "]
    for data, alignment in sentences:
        duration_ms = len(data) / 2 / 16000 * 1000
        assert alignment["charStartTimesMs"][0] == 0
        assert alignment["charStartTimesMs"][-1] + alignment["charDurationsMs"][-1] == round(duration_ms)
    # The fake engine speaks SECONDS_PER_CHAR a character: the audio is the sentences', nothing lost.
    assert _audio_seconds(audio, 2, 16000) == pytest.approx(
        len("Hello there.How are you?") * SECONDS_PER_CHAR
    )


def test_multi_stream_input_keeps_contexts_apart(address: str) -> None:
    with _ws(address, "tone/multi-stream-input", "output_format=ulaw_8000&inactivity_timeout=60") as ws:
        _send(ws, text=" ", context_id="a", voice_settings={"speed": 1.0})
        _send(ws, text="")  # a keep-alive of the socket
        _send(ws, text="First context speaks. ", context_id="a")
        _send(ws, text="Second one. ", context_id="b")
        _send(ws, text="", context_id="b")  # a keep-alive of context b
        _send(ws, context_id="b", close_context=True)
        _send(ws, context_id="a", flush=True)
        _send(ws, close_socket=True)
        got, code = _until_closed(ws)
    assert code == 1000
    by_context = {c: [m for m in got if m["contextId"] == c] for c in ("a", "b")}
    assert {m["contextId"] for m in got} == {"a", "b"}
    for context, text in (("a", "First context speaks. "), ("b", "Second one. ")):
        *audio, final = by_context[context]
        [(data, alignment)] = _sentences(audio)
        assert "".join(alignment["chars"]) == text
        assert final == {"isFinal": True, "contextId": context}
        assert len(data) / 8000 == pytest.approx(len(text.strip()) * SECONDS_PER_CHAR)


def test_multi_stream_input_caps_the_contexts(address: str) -> None:
    with _ws(address, "tone/multi-stream-input") as ws:
        for n in range(MAX_CONTEXTS + 1):
            _send(ws, text=" ", context_id=f"c{n}")
        refused = json.loads(ws.recv(timeout=TIMEOUT_S))
        assert refused["contextId"] == f"c{MAX_CONTEXTS}"
        assert refused["error"] == "max_active_conversations"
        assert f"{MAX_CONTEXTS} contexts are open" in refused["message"]
        _send(ws, close_socket=True)
        got, code = _until_closed(ws)
    assert code == 1000
    assert sorted(m["contextId"] for m in got) == sorted(f"c{n}" for n in range(MAX_CONTEXTS))
    assert all(m["isFinal"] is True for m in got)


@pytest.mark.parametrize(
    ("path", "query", "error", "close_code"),
    [
        ("nobody/stream-input", "output_format=pcm_16000", "voice_not_found", 1008),
        ("tone/stream-input", "output_format=mp3_48000_320", "invalid_output_format", 1008),
        ("tone/multi-stream-input", "output_format=opus_24000_32", "invalid_output_format", 1008),
        ("tone/stream-input", "output_format=pcm_16000&inactivity_timeout=0", "invalid_message", 1007),
    ],
)
def test_websocket_refusals_use_elevenlabs_error_shape(
    address: str, path: str, query: str, error: str, close_code: int
) -> None:
    with _ws(address, path, query) as ws:
        got, code = _until_closed(ws)
    assert code == close_code
    assert [set(m) for m in got] == [{"message", "error", "code"}]
    assert got[0]["error"] == error and got[0]["code"] == close_code


def test_a_malformed_message_is_refused(address: str) -> None:
    with _ws(address, "tone/stream-input") as ws:
        ws.send("{not json")
        got, code = _until_closed(ws)
    assert code == 1007 and got[0]["error"] == "invalid_json"


@pytest.mark.parametrize("path", ["tone/multi-stream-input", "tone/stream-input"])
def test_inactivity_timeout_closes_a_silent_socket(address: str, path: str) -> None:
    with _ws(address, path, "output_format=pcm_16000&inactivity_timeout=1") as ws:
        if path.endswith("/stream-input"):
            _send(ws, text=" ")  # a context is open: its own session times out
        got, code = _until_closed(ws)
    assert code == 1008
    assert [m["error"] for m in got] == ["input_timeout_exceeded"]
    assert got[0]["code"] == 1008


def test_keys_as_elevenlabs_clients_send_them(address: str) -> None:
    with connect(
        f"ws://{address}/v1/text-to-speech/tone/stream-input?output_format=pcm_16000&xi-api-key={KEY}",
        open_timeout=TIMEOUT_S,
    ) as ws:
        _send(ws, text="Hi. ")
        _send(ws, text="")
        got, code = _until_closed(ws)
    assert code == 1000 and got[-1] == {"isFinal": True}
    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://{address}/v1/text-to-speech/tone/stream-input?output_format=pcm_16000")
    assert refused.value.response.status_code == 403
    with pytest.raises(InvalidStatus):
        _ws(address, "tone/stream-input", **{"xi-api-key": "wrong"})
    url = f"http://{address}/v1/text-to-speech/tone?output_format=pcm_16000"
    assert httpx.post(url, json={"text": "Hi."}).status_code == 401
    assert httpx.post(url, json={"text": "Hi."}, headers={"xi-api-key": KEY}).status_code == 200
    bearer = {"authorization": f"Bearer {KEY}"}
    assert httpx.post(url, json={"text": "Hi."}, headers=bearer).status_code == 200


def test_rest_convert_and_timestamps(address: str) -> None:
    headers = {"xi-api-key": KEY}
    base = f"http://{address}/v1/text-to-speech/tone"
    body = {"text": "One. Two three.", "model_id": "eleven_flash_v2_5", "voice_settings": {"speed": 1.0}}
    audio = httpx.post(f"{base}/stream?output_format=pcm_22050", json=body, headers=headers)
    assert audio.status_code == 200 and audio.headers["content-type"] == "audio/pcm"
    assert len(audio.content) / 2 / 22050 == pytest.approx(
        len("One.Two three.") * SECONDS_PER_CHAR, abs=0.001
    )
    whole = httpx.post(f"{base}/with-timestamps?output_format=pcm_22050", json=body, headers=headers).json()
    assert base64.b64decode(whole["audio_base64"]) == audio.content
    assert "".join(whole["alignment"]["characters"]) == "One. Two three. "
    assert whole["alignment"]["character_end_times_seconds"][-1] == pytest.approx(
        len(audio.content) / 2 / 22050, abs=0.001
    )
    lines = httpx.post(f"{base}/stream/with-timestamps?output_format=ulaw_8000", json=body, headers=headers)
    chunks = [json.loads(line) for line in lines.text.splitlines()]
    assert ["".join(c["alignment"]["characters"]) for c in chunks] == ["One. ", "Two three. "]
    first_s = len(base64.b64decode(chunks[0]["audio_base64"])) / 8000
    assert chunks[1]["alignment"]["character_start_times_seconds"][0] == pytest.approx(first_s, abs=0.001)


def test_rest_answers_in_mp3_by_default_a_segment_at_a_time(address: str) -> None:
    url = f"http://{address}/v1/text-to-speech/tone"
    with httpx.stream(
        "POST", f"{url}/stream", json={"text": "One. Two three."}, headers={"xi-api-key": KEY}
    ) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"] == "audio/mpeg"
        pieces = [piece for piece in answer.iter_raw() if piece]
    # One complete mp3 per segment, sent as it is made: the first decodes on its own.
    first, first_rate = decoded(pieces[0])
    assert first_rate == 44100 and len(first) / first_rate == pytest.approx(
        len("One.") * SECONDS_PER_CHAR, abs=0.08
    )
    audio, rate = decoded(b"".join(pieces))
    assert rate == 44100
    # Give or take each segment's encoder padding (two segments).
    assert len(audio) / rate == pytest.approx(len("One.Two three.") * SECONDS_PER_CHAR, abs=0.15)


@pytest.mark.parametrize(("fmt", "rate"), [("mp3_22050_32", 22050), ("opus_48000_64", 48000)])
def test_rest_timestamps_in_compressed_formats_decode_segment_by_segment(
    address: str, fmt: str, rate: int
) -> None:
    url = f"http://{address}/v1/text-to-speech/tone/with-timestamps?output_format={fmt}"
    answer = httpx.post(url, json={"text": "One. Two three."}, headers={"xi-api-key": KEY})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    audio, got_rate = decoded(base64.b64decode(body["audio_base64"]))
    assert got_rate == rate
    assert len(audio) / rate == pytest.approx(len("One.Two three.") * SECONDS_PER_CHAR, abs=0.15)
    # The alignment covers the audio's length as the segments' audio.done stated it.
    ends = body["alignment"]["character_end_times_seconds"]
    assert ends[-1] == pytest.approx(len("One.Two three.") * SECONDS_PER_CHAR, abs=0.02)


@pytest.mark.parametrize(
    ("query", "rate"), [("", 44100), ("output_format=opus_48000_32", 48000)], ids=["default-mp3", "opus"]
)
def test_websocket_streams_compressed_segments_with_alignments(address: str, query: str, rate: int) -> None:
    with _ws(address, "tone/stream-input", query) as ws:
        _send(ws, text=" ")
        _send(ws, text="One. Two three. ")
        _send(ws, text="")
        got, code = _until_closed(ws)
    assert code == 1000
    *audio, final = got
    assert final == {"isFinal": True} and len([m for m in audio if m["audio"]]) > 2  # pieces as they come
    # The pieces make one stream of the encoder, which decodes whole; each sentence's characters follow its
    # audio, in order.
    samples, got_rate = decoded(b"".join(base64.b64decode(m["audio"]) for m in audio))
    assert got_rate == rate
    assert len(samples) / rate == pytest.approx(len("One.Two three.") * SECONDS_PER_CHAR, abs=0.12)
    aligned = ["".join(m["alignment"]["chars"]) for m in audio if m["alignment"] is not None]
    assert aligned == ["One. ", "Two three. "]


@pytest.mark.parametrize(
    ("path", "body", "status", "error"),
    [
        ("nobody?output_format=pcm_16000", {"text": "Hi."}, 400, "voice_not_found"),
        ("tone?output_format=opus_24000_32", {"text": "Hi."}, 400, "invalid_output_format"),
        ("tone?output_format=pcm_16000", {"text": "  "}, 400, "empty_input"),
        ("tone?output_format=pcm_16000", {"words": "Hi."}, 400, "invalid_message"),
        (
            "tone?output_format=pcm_16000",
            {"text": "Hi.", "voice_settings": {"speed": 7}},
            400,
            "invalid_message",
        ),
    ],
)
def test_rest_refusals_use_elevenlabs_error_shape(
    address: str, path: str, body: dict[str, object], status: int, error: str
) -> None:
    response = httpx.post(
        f"http://{address}/v1/text-to-speech/{path}", json=body, headers={"xi-api-key": KEY}
    )
    assert response.status_code == status
    assert response.json()["detail"]["status"] == error


def test_rest_refuses_a_body_that_is_not_json(address: str) -> None:
    url = f"http://{address}/v1/text-to-speech/tone?output_format=pcm_16000"
    response = httpx.post(url, content=b"{", headers={"xi-api-key": KEY})
    assert response.status_code == 400 and response.json()["detail"]["status"] == "invalid_json"


def test_voices_in_elevenlabs_shape(address: str) -> None:
    voices = httpx.get(f"http://{address}/v1/voices", headers={"xi-api-key": KEY}).json()
    assert voices["voices"][0]["voice_id"] == "tone" and voices["voices"][0]["category"] == "premade"


@pytest.fixture(scope="module")
def tls_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A gateway behind TLS with a self-signed certificate for 127.0.0.1 (the SDK's realtime helper
    always connects with wss://); yields its address and the certificate."""
    cert, key = self_signed_certificate(tmp_path_factory.mktemp("tls"))
    with tempfile.TemporaryDirectory(prefix="voxgate-voices-") as voices:
        app = create_app(Settings.from_env({}, api_keys=KEY, voices_dir=voices), engine=FakeEngine())
        # uvicorn's default WebSocket protocol, as this fixture always ran: voxgate serve does not terminate
        # TLS (docs/deploy.md: a proxy does), so its own protocol never runs under TLS.
        with serve(app, ws="auto", ssl_certfile=str(cert), ssl_keyfile=str(key)) as address:
            yield address, cert


# The SDK reads ConnectionClosed.code, which websockets 14+ deprecates, when the server closes normally.
@pytest.mark.filterwarnings("ignore:ConnectionClosed.code is deprecated:DeprecationWarning")
def test_sdk_realtime_helper_streams_text_in(
    tls_address: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, cert = tls_address
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trust the test certificate, as a deployment's CA
    with httpx.Client(verify=ssl.create_default_context(cafile=str(cert))) as http:
        client = ElevenLabs(base_url=f"https://{address}", api_key=KEY, httpx_client=http)
        tokens = iter(["Hello ", "there, ", "how are", " you?"])
        audio = b"".join(
            client.text_to_speech.convert_realtime("tone", text=tokens, output_format="pcm_16000")
        )
    # The fake engine speaks SECONDS_PER_CHAR a character of what it was given.
    assert len(audio) / 2 / 16000 == pytest.approx(len("Hello there, how are you?") * SECONDS_PER_CHAR)


def test_a_context_refused_as_it_opens_is_not_kept(address: str) -> None:
    with _ws(address, "tone/multi-stream-input") as ws:
        _send(ws, text=" ", context_id="a", voice_settings={"speed": 9.0})
        refused = json.loads(ws.recv(timeout=TIMEOUT_S))
        assert refused["contextId"] == "a" and refused["error"] == "invalid_message"
        _send(ws, text="Fine. ", context_id="b")
        _send(ws, close_socket=True)
        got, code = _until_closed(ws)
    assert code == 1000
    assert {m["contextId"] for m in got} == {"b"} and got[-1] == {"isFinal": True, "contextId": "b"}
    assert ["".join(a["chars"]) for _, a in _sentences(got[:-1])] == ["Fine. "]


def test_a_drain_closes_a_socket_with_no_context_left() -> None:
    with tempfile.TemporaryDirectory(prefix="voxgate-voices-") as voices:
        app = create_app(Settings.from_env({}, voices_dir=voices), engine=FakeEngine())
        with TestClient(app) as client:
            path = "/v1/text-to-speech/tone/multi-stream-input?output_format=pcm_16000"
            with client.websocket_connect(path) as ws:
                assert client.portal is not None
                client.portal.start_task_soon(app.state.sessions.drain, 1.0)
                assert ws.receive_json() == {
                    "message": "the server is shutting down",
                    "error": "server_shutdown",
                    "code": 1001,
                }
                with pytest.raises(WebSocketDisconnect) as closed:
                    ws.receive_text()
    assert closed.value.code == 1001


def _refused_ws(address: str, path: str, key: str | None) -> InvalidStatus:
    header = "xi-api-key" if path.startswith("/v1/text-to-speech/") else "authorization"
    headers = {header: key if header == "xi-api-key" else f"Bearer {key}"} if key else {}
    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://{address}{path}", additional_headers=headers, open_timeout=TIMEOUT_S)
    return refused.value


def test_each_socket_is_one_session_under_the_session_caps() -> None:
    keys = ("key-a", "key-b", "key-c")
    multi = "/v1/text-to-speech/tone/multi-stream-input?output_format=pcm_16000"
    single = "/v1/text-to-speech/tone/stream-input?output_format=pcm_16000"
    with serve_engine(FakeEngine(), api_keys=keys, max_sessions=2, max_sessions_per_key=1) as address:
        with _ws(address, "tone/multi-stream-input", **{"xi-api-key": "key-a"}) as a:
            # Two contexts on one socket: one session of key-a, both speak.
            _send(a, text="One. ", context_id="x", flush=True)
            _send(a, text="Two. ", context_id="y", flush=True)
            spoken: set[str] = set()
            while spoken != {"x", "y"}:  # each context's audio comes
                spoken.add(json.loads(a.recv(timeout=TIMEOUT_S))["contextId"])
            for path in (multi, single, "/v1/audio/speech/stream"):
                refused = _refused_ws(address, path, "key-a")
                assert refused.response.status_code == 429 and b"too_many_sessions" in refused.response.body
                assert refused.response.headers["retry-after"] == "1"
            with _ws(address, "tone/stream-input", **{"xi-api-key": "key-b"}):
                refused = _refused_ws(address, multi, "key-c")  # the process holds its 2 sessions
                assert refused.response.status_code == 503 and b"server_busy" in refused.response.body
                rest = httpx.post(
                    f"http://{address}/v1/text-to-speech/tone?output_format=pcm_16000",
                    json={"text": "Hi."},
                    headers={"xi-api-key": "key-c"},
                )
                assert rest.status_code == 503
        # The places are given back as the sockets' handlers end.
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                with _ws(address, "tone/stream-input", **{"xi-api-key": "key-a"}) as again:
                    _send(again, text="Back. ")
                    _send(again, text="")
                    got, code = _until_closed(again)
                break
            except InvalidStatus:
                assert time.monotonic() < deadline, "the place was never given back"
                time.sleep(0.02)
    assert code == 1000 and got[-1] == {"isFinal": True}


def test_a_draining_server_refuses_new_elevenlabs_sockets_and_ends_the_open_one(tmp_path: Path) -> None:
    text = "This sentence is long enough to be spoken over many chunks of the test tone. " * 3
    path = "/v1/text-to-speech/tone/multi-stream-input?output_format=pcm_16000"
    with voxgate_serve(tmp_path) as (proc, address):
        with connect(f"ws://{address}{path}", open_timeout=TIMEOUT_S, max_size=None) as ws:
            _send(ws, text=text, context_id="a")  # no flush: the utterance is open, so in flight
            first = json.loads(ws.recv(timeout=TIMEOUT_S))
            assert first["contextId"] == "a" and first["audio"]
            proc.send_signal(signal.SIGTERM)
            _await_draining(address)
            for route in (path, path.replace("multi-stream-input", "stream-input")):
                refused = _refused_ws(address, route, None)
                assert refused.response.status_code == 503 and b"server_shutdown" in refused.response.body
                assert refused.response.headers["retry-after"] == "5"
            # The open context finishes its utterance, then the drain ends the session.
            _send(ws, context_id="a", flush=True)
            got, code = _until_closed(ws)
        *audio, error = got
        assert audio and all(m["contextId"] == "a" and "audio" in m for m in audio)
        said = "".join("".join(a["chars"]) for _, a in _sentences([first, *audio]))
        assert said.split() == text.split()
        assert error == {"message": "the server is shutting down", "error": "server_shutdown", "code": 1001}
        assert code == 1001
        assert proc.wait(TIMEOUT_S) == 0


def test_inactivity_timeout_bounds_the_context_idle_timeout() -> None:
    with serve_engine(FakeEngine(), context_idle_timeout_s=1.0) as address:
        with _ws(address, "tone/multi-stream-input", "output_format=pcm_16000&inactivity_timeout=3") as ws:
            _send(ws, text=" ", context_id="a")
            # The context's timeout is the server's 1 s (the client asked 3): it ends with isFinal;
            # the socket, silent for its 3 s, is closed after it.
            got, code = _until_closed(ws)
    assert got[0] == {"isFinal": True, "contextId": "a"}
    assert [m.get("error") for m in got[1:]] == ["input_timeout_exceeded"] and code == 1008


def test_the_first_voice_settings_set_the_speed_of_every_context(address: str) -> None:
    with _ws(address, "tone/multi-stream-input") as ws:
        _send(ws, text=" ", context_id="a", voice_settings={"speed": 2.0})
        _send(ws, text=" ", context_id="b", voice_settings={"speed": 0.5})  # ignored: one config a socket
        _send(ws, text="Fast one. ", context_id="a", flush=True)
        _send(ws, text="Fast two. ", context_id="b", flush=True)
        _send(ws, close_socket=True)
        got, code = _until_closed(ws)
    assert code == 1000
    for context, text in (("a", "Fast one."), ("b", "Fast two.")):
        audio = [m for m in got if m["contextId"] == context and m.get("audio")]
        assert _audio_seconds(audio, 2, 16000) == pytest.approx(len(text) * SECONDS_PER_CHAR / 2.0)
    assert sorted(m["contextId"] for m in got if m["isFinal"]) == ["a", "b"]


class _HeldEngine(FakeEngine):
    """The fake engine, holding each segment after its first chunk until ``released`` is set (from the test's
    thread): what the client has by then is what was sent as the audio came."""

    def __init__(self) -> None:
        super().__init__(chunk_s=0.25)
        self.released = threading.Event()

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        first = True
        async for chunk in super().synthesize(req):
            if not first:
                await asyncio.to_thread(self.released.wait, TIMEOUT_S)
            first = False
            yield chunk


@pytest.mark.parametrize(("fmt", "bytes_per_sample"), [("pcm_16000", 2), ("ulaw_8000", 1)])
def test_audio_goes_out_as_it_comes_and_every_character_once(fmt: str, bytes_per_sample: int) -> None:
    engine = _HeldEngine()
    text = "Streaming audio comes chunk by chunk."  # about 2.2 s: nine chunks of 250 ms
    with (
        serve_engine(engine, api_keys=KEY) as address,
        _ws(address, "tone/stream-input", f"output_format={fmt}") as ws,
    ):
        _send(ws, text=" ")
        _send(ws, text=text + " ", flush=True)
        first = json.loads(ws.recv(timeout=TIMEOUT_S))  # the first chunk's audio, while the rest is held
        assert first.get("audio") and first["isFinal"] is None
        engine.released.set()
        _send(ws, text="")
        rest, code = _until_closed(ws)
        url = f"http://{address}/v1/text-to-speech/tone?output_format={fmt}"
        whole = httpx.post(url, json={"text": text}, headers={"xi-api-key": KEY}, timeout=TIMEOUT_S)
    assert code == 1000
    *messages, final = [first, *rest]
    # Byte for byte the audio of the segment at once (REST answers each segment whole).
    assert b"".join(base64.b64decode(m["audio"]) for m in messages) == whole.content
    assert final == {"isFinal": True}
    assert all(set(m) == {"audio", "isFinal", "alignment", "normalizedAlignment"} for m in messages)
    # Every character of the sentence exactly once, in order; the audio is the sentence's, nothing lost.
    aligned = [m["alignment"] for m in messages if m["alignment"] is not None]
    assert "".join(c for a in aligned for c in a["chars"]) == text + " "
    rate = int(fmt.split("_")[1])
    total_ms = _audio_seconds(messages, bytes_per_sample, rate) * 1000
    assert total_ms == pytest.approx(len(text) * SECONDS_PER_CHAR * 1000, abs=1)
    # The alignments tile the audio: added up as pipecat does, they end where it ends.
    assert sum(a["charStartTimesMs"][-1] + a["charDurationsMs"][-1] for a in aligned) == round(total_ms)


class _TimedWords(FakeEngine):
    """An engine that times its words and streams them one chunk a word (300 ms each), as vLLM streams its
    chunks; it holds the rest of a segment after the first word until ``released`` is set."""

    def __init__(self) -> None:
        super().__init__(supported=frozenset({"speed", "seed", "language", "word_timestamps"}))
        self.released = threading.Event()

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        per_word = int(0.3 * self.sample_rate)
        for n, word in enumerate(req.text.split()):
            if n:
                await asyncio.to_thread(self.released.wait, TIMEOUT_S)
            tone = np.full(per_word, 0.1, dtype=np.float32)
            yield AudioChunk(tone, self.sample_rate, (WordTiming(word, 0, per_word),))


def test_word_timings_align_the_audio_as_it_goes_out() -> None:
    engine = _TimedWords()
    text = "Each word comes in its own chunk."
    with serve_engine(engine) as address, _ws(address, "tone/multi-stream-input") as ws:
        _send(ws, text=" ", context_id="c")
        _send(ws, text=text + " ", context_id="c", flush=True)
        first = json.loads(ws.recv(timeout=TIMEOUT_S))  # the first word's audio, while the rest is held
        assert first["audio"] and first["contextId"] == "c"
        engine.released.set()
        _send(ws, close_socket=True)
        rest, code = _until_closed(ws)
    assert code == 1000
    *messages, final = [first, *rest]
    assert final == {"isFinal": True, "contextId": "c"}
    aligned = [m["alignment"] for m in messages if m["alignment"] is not None]
    assert "".join(c for a in aligned for c in a["chars"]) == text + " "  # every character once, in order
    # The words' characters go out with the audio as the next word bounds them, not all at the end: only
    # the last word waits for the segment's length, in a message of no audio.
    assert len([m for m in messages if m["alignment"] is not None and m["audio"]]) >= len(text.split()) - 1
    assert messages[-1]["audio"] == "" and "".join(messages[-1]["alignment"]["chars"]) == "chunk. "
    total_ms = _audio_seconds(messages, 2, 16000) * 1000
    assert total_ms == pytest.approx(0.3 * len(text.split()) * 1000, abs=1)
    # Added up as pipecat does, the alignments' spans end where the audio ends, and each word starts at
    # its own time on that clock (300 ms a word).
    clock, starts = 0, []
    for a in aligned:
        starts += [clock + t for c, t in zip(a["chars"], a["charStartTimesMs"], strict=True) if c != " "]
        clock += a["charStartTimesMs"][-1] + a["charDurationsMs"][-1]
    assert clock == round(total_ms)
    word_starts = [starts[i] for i in (0, len("Each"), len("Eachword"))]
    assert word_starts == [0, 300, 600]
