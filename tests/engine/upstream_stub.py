"""A recording stand-in for a vllm-omni 0.30.0 speech server, for faults the real one cannot produce.

The remote engine is tested against vllm-omni's own serving layer (tests/vllm_omni/); this stub is
kept for what that layer cannot do on demand: 5xx answers, garbage, stalls, resets, a refused key.
For everything else it follows 0.30.0's rules, each citing the line of the ``vllm_omni`` 0.30.0 wheel
it mirrors, and ``tests/vllm_omni/test_stub_drift.py`` sends the same requests to both and compares
status codes, content types and body kinds, so drift shows.

``StubUpstream`` serves ``/health``, ``GET /v1/audio/voices`` (plain names plus vllm-omni's
placeholder ``default``) and ``POST /v1/audio/speech``. With ``forced_aligner`` it stands for a server
launched with ``--forced-aligner``: a non-streamed answer asked for ``word_timestamps`` carries them in
``X-Word-Timestamps`` (the tone's length shared evenly between the words). Every speech body is recorded
(``probes``: the word-timestamp probes, empty inputs that never synthesize); what the
answer is depends on ``mode``, which a test may switch at any time from its own thread. Each streamed
answer gets a ``Stream`` record that says whether the stream ran to its end or was cut by the client
(and when), so a test can check that a cancel or a failover closed the upstream request.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import soundfile
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send
from voxgate.protocol.audio import wav_header

from tests.conftest import TIMEOUT_S, serve

Mode = Literal["ok", "error500", "garbage", "stall_before", "stall_mid", "refuse400", "unauthorized"]
Kind = Literal["CustomVoice", "Base", "VoiceDesign"]

VOICES = ["vivian", "ryan"]
# serving_speech.py:116 ``_DEFAULT_VOICE_NAME`` and :558 ``_get_available_voices``: the voice list
# carries a placeholder that means "no voice" (:2527 turns it into None).
PLACEHOLDER = "default"
# tts_adapters/base.py:29 ``DEFAULT_TTS_LANGUAGES`` (a model's own list comes from its config).
LANGUAGES = frozenset(
    {"Auto", "Chinese", "English", "Japanese", "Korean", "German", "French"}
    | {"Russian", "Portuguese", "Spanish", "Italian"}
)
SAMPLE_RATE = 24000
TONE_HZ = 440.0
REFUSAL = "voice 'nobody' is not supported by this stub"
# serving_speech.py:2555-2565 ``create_speech``: the two word-timestamp refusals, before validation.
WORDS_NOT_STREAMED = (
    "word_timestamps=true is currently supported by the WebSocket /v1/audio/speech/stream path. "
    "Use session.config with stream_audio=true and response_format='pcm'."
)
WORDS_NEED_ALIGNER = "word_timestamps=true requires the server to be launched with --forced-aligner."
# serving_speech.py:2669: the word list travels in a header of at most this many bytes.
WORDS_HEADER_LIMIT = 4096
# Odd on purpose: 16-bit samples then straddle chunk boundaries, as they may over a real network.
PIECE_BYTES = 2401
# Longer than any test waits, so a stall only ends when the client gives up.
STALL_S = 60.0


def tone(seconds: float, rate: int = SAMPLE_RATE) -> np.ndarray:
    """The stub's speech: a 440 Hz sine at a third of full scale, as float32."""
    t = np.arange(round(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)


def pcm16(samples: np.ndarray) -> bytes:
    data: bytes = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    return data


@dataclass
class Stream:
    """One streamed answer, as the stub saw it."""

    body: dict[str, object]
    opened_t: float = field(default_factory=time.monotonic)
    sent_bytes: int = 0
    completed: bool = False
    disconnected_t: float | None = None  # set when the client went away before the end


@dataclass
class StubUpstream:
    """A fake vllm-omni speech server whose behaviour a test switches with ``mode``.

    Args:
        mode: how ``POST /v1/audio/speech`` answers (see the module docstring of the tests).
        seconds: audio per streamed answer.
        pieces_delay_s: sleep between body pieces of a streamed answer.
        voices_html: answer ``GET /v1/audio/voices`` with an HTML page instead of JSON.
        kind: the Qwen3-TTS checkpoint it stands for, which decides the requests it accepts.
        forced_aligner: launched with ``--forced-aligner``: it times words.
        model_id: the model id it lists, standing for a family other than Qwen3-TTS (engine/families.py):
            it then lists no speakers and refuses nothing (tests/vllm_omni/ checks those families' rules
            against vllm-omni's own adapters).
    """

    mode: Mode = "ok"
    kind: Kind = "CustomVoice"
    rate: int = SAMPLE_RATE
    seconds: float = 0.3
    pieces_delay_s: float = 0.01
    voices_html: bool = False  # answer the voice list with a web page, as a catch-all web app would
    forced_aligner: bool = False
    model_id: str = ""
    requests: list[dict[str, object]] = field(default_factory=list)
    probes: list[dict[str, object]] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health),
                Route("/v1/audio/voices", self._voices),
                Route("/v1/models", self._models),
                Route("/v1/audio/speech", self._speech, methods=["POST"]),
            ]
        )

    def speech_requests(self) -> list[dict[str, object]]:
        """Bodies of the synthesis requests, in order."""
        return list(self.requests)

    @property
    def speakers(self) -> list[str]:
        """Built-in speakers: only a CustomVoice checkpoint has them."""
        return VOICES if self.kind == "CustomVoice" and not self.model_id else []

    def wait_closed(self, stream: Stream, timeout: float = TIMEOUT_S) -> float:
        """Wait until the client cut ``stream``; returns when (monotonic seconds)."""
        deadline = time.monotonic() + timeout
        while stream.disconnected_t is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"the upstream stream was not closed: {stream}")
            time.sleep(0.01)
        return stream.disconnected_t

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _voices(self, request: Request) -> Response:
        if self.voices_html:
            return HTMLResponse("<html><body>Welcome</body></html>")
        # api_server.py:1499: the sorted speakers plus the placeholder (serving_speech.py:558).
        return JSONResponse({"voices": sorted([*self.speakers, PLACEHOLDER]), "uploaded_voices": []})

    async def _models(self, request: Request) -> Response:
        # api_server.py:1968: vllm's OpenAI model list, naming the checkpoint served.
        model_id = self.model_id or f"Qwen/Qwen3-TTS-12Hz-0.6B-{self.kind}"
        model = {"id": model_id, "object": "model", "owned_by": "vllm-omni"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _speech(self, request: Request) -> Response:
        body = await request.json()
        probe = bool(body.get("word_timestamps")) and not str(body.get("input", "")).strip()
        (self.probes if probe else self.requests).append(body)
        mode = self.mode
        if mode == "refuse400":
            return _refused(REFUSAL)
        if mode == "unauthorized":
            return JSONResponse({"error": {"message": "invalid api key", "code": 401}}, status_code=401)
        if mode == "error500":
            return JSONResponse({"error": {"message": "engine core died", "code": 500}}, status_code=500)
        if mode == "garbage":
            return HTMLResponse("<html><body>502 Bad Gateway (a proxy's page)</body></html>")
        streaming = body.get("stream_format") in ("audio", "sse") or bool(body.get("stream"))
        if body.get("word_timestamps") and streaming:
            return _refused(WORDS_NOT_STREAMED)
        if body.get("word_timestamps") and not self.forced_aligner:
            return _refused(WORDS_NEED_ALIGNER)
        if not self.model_id and (refusal := self._refusal(body)) is not None:
            return _refused(refusal)
        fmt = str(body.get("response_format", "wav"))
        # protocol/audio.py:327-331: ``stream_format: "audio"`` streams raw bytes; otherwise
        # ``stream: true`` (or ``stream_format: "sse"``) streams SSE events.
        if body.get("stream_format") == "audio":
            record = Stream(body)
            self.streams.append(record)
            return _StreamedAudio(self, record, mode, fmt)
        if body.get("stream") or body.get("stream_format") == "sse":
            return _sse(pcm16(tone(self.seconds, self.rate)))
        audio = tone(self.seconds, self.rate)
        headers = _word_headers(str(body["input"]), self.seconds) if body.get("word_timestamps") else {}
        if fmt == "pcm":
            return Response(pcm16(audio), media_type="audio/pcm", headers=headers)
        return Response(_wav(audio, self.rate), media_type="audio/wav", headers=headers)

    def _refusal(self, body: dict[str, object]) -> str | None:
        """What vllm-omni 0.30.0 refuses with a 400, in its words; None when it accepts the body."""
        streaming = body.get("stream_format") in ("audio", "sse") or bool(body.get("stream"))
        fmt = body.get("response_format", "wav")
        # protocol/audio.py:336-344 ``validate_streaming_constraints``.
        if streaming and fmt not in ("pcm", "wav"):
            return f"Streaming requires response_format='pcm' or 'wav'. Got response_format='{fmt}'."
        # serving_speech.py:2491 ``_validate_speech_streaming_request``.
        if streaming and body.get("speed") not in (None, 1.0):
            return "Streaming is not supported with speed adjustment."
        voice = body.get("voice")
        if isinstance(voice, str) and voice.lower() == PLACEHOLDER:  # serving_speech.py:2527
            voice = None
        # tts_adapters/qwen3_tts.py:117-250 ``validate``, in its order.
        task = body.get("task_type")
        if task is None and (body.get("ref_audio") is not None or body.get("ref_text") is not None):
            task = "Base"  # :121
        task = task or "CustomVoice"
        if task != self.kind:  # :135
            return f"Qwen3-TTS {self.kind} checkpoint does not support task_type='{task}'."
        if not str(body.get("input", "")).strip():  # :145
            return "Input text cannot be empty"
        language = body.get("language")
        if language is not None and str(language).title() not in LANGUAGES:  # :149-155
            return f"Invalid language '{str(language).title()}'. Supported: {', '.join(sorted(LANGUAGES))}"
        if task == "CustomVoice" and voice is not None and str(voice).lower() not in self.speakers:  # :164
            return f"Invalid voice '{voice}'. Supported: {', '.join(sorted(self.speakers))}"
        x_vector_only = bool(body.get("x_vector_only_mode")) or body.get("speaker_embedding") is not None
        if task == "Base" and voice is None:  # :187-204
            if body.get("ref_audio") is None and body.get("speaker_embedding") is None:
                return "Base task requires 'ref_audio' or 'speaker_embedding' for voice cloning"
            if not x_vector_only and not str(body.get("ref_text") or "").strip():
                return (
                    "Base task requires non-empty 'ref_text' (transcript of the reference audio) "
                    "unless 'x_vector_only_mode' is enabled"
                )
        if task != "Base":  # :240-244
            if body.get("ref_text") is not None:
                return "'ref_text' is only valid for Base task"
            if body.get("x_vector_only_mode") is not None:
                return "'x_vector_only_mode' is only valid for Base task"
        if task == "VoiceDesign" and not body.get("instructions"):  # :247
            return "VoiceDesign task requires 'instructions' to describe the voice"
        return None


def aligner_words(text: str) -> list[str]:
    """The words vllm-omni's aligner times (qwen3_force_align_processor.py ``_tokenize_space_lang``, for
    text without CJK): split at whitespace, keeping letters, digits and apostrophes."""
    kept = ("".join(c for c in token if c.isalnum() or c == "'") for token in text.split())
    return [word for word in kept if word]


def _word_headers(text: str, seconds: float) -> dict[str, str]:
    """serving_speech.py:2666-2679: ``X-Word-Timestamps``, or ``X-Word-Timestamps-Omitted`` past 4 KB.

    The stub's aligner gives each word an equal share of the audio, in integer ms.
    """
    words = aligner_words(text)
    share = seconds * 1000 / max(1, len(words))
    listed = [
        {"word": w, "start_ms": round(i * share), "end_ms": round((i + 1) * share)}
        for i, w in enumerate(words)
    ]
    encoded = json.dumps(listed)
    if len(encoded) <= WORDS_HEADER_LIMIT:
        return {"X-Word-Timestamps": encoded}
    return {"X-Word-Timestamps-Omitted": f"oversize; bytes={len(encoded)}; limit={WORDS_HEADER_LIMIT}"}


def _refused(message: str) -> Response:
    """vLLM's ``create_error_response``: 400 with OpenAI's error shape."""
    error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    return JSONResponse({"error": error}, status_code=400)


def _sse(pcm: bytes) -> Response:
    """serving_speech.py:1856-1873 ``_generate_audio_sse_events``: base64 deltas, then a done event."""
    delta = json.dumps({"type": "speech.audio.delta", "audio": base64.b64encode(pcm).decode()})
    done = json.dumps({"type": "speech.audio.done"})
    text = f"event: speech.audio.delta\ndata: {delta}\n\nevent: speech.audio.done\ndata: {done}\n\n"
    return Response(text, media_type="text/event-stream")


def _wav(samples: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


class _StreamedAudio(Response):
    """Raw PCM in pieces, written by a task that is cancelled as soon as the client disconnects."""

    def __init__(self, stub: StubUpstream, record: Stream, mode: Mode, fmt: str) -> None:
        self.stub, self.record, self.mode, self.fmt = stub, record, mode, fmt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = asyncio.create_task(self._write(send))
        listener = asyncio.create_task(_disconnected(receive))
        await asyncio.wait({writer, listener}, return_when=asyncio.FIRST_COMPLETED)
        if not self.record.completed:
            self.record.disconnected_t = time.monotonic()
        for task in (writer, listener):
            task.cancel()
        await asyncio.gather(writer, listener, return_exceptions=True)

    async def _write(self, send: Send) -> None:
        if self.mode == "stall_before":
            await asyncio.sleep(STALL_S)
        # serving_speech.py:2564: audio/wav or audio/pcm; a streamed WAV starts with a header whose
        # sizes are placeholders (:125 ``_create_wav_header``).
        headers = [(b"content-type", b"audio/wav" if self.fmt == "wav" else b"audio/pcm")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        data = pcm16(tone(self.stub.seconds, self.stub.rate))
        if self.fmt == "wav":
            data = wav_header(self.stub.rate) + data
        pieces = [data[i : i + PIECE_BYTES] for i in range(0, len(data), PIECE_BYTES)]
        for index, piece in enumerate(pieces):
            if self.mode == "stall_mid" and index == 2:
                await asyncio.sleep(STALL_S)
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            self.record.sent_bytes += len(piece)
            await asyncio.sleep(self.stub.pieces_delay_s)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.record.completed = True


async def _disconnected(receive: Receive) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return


@contextmanager
def serve_stub(stub: StubUpstream, sock: socket.socket | None = None) -> Iterator[str]:
    """Run ``stub`` on ``sock`` (a ``bound_socket``) or a fresh one; yields its base URL."""
    with serve(stub.app(), sock) as address:
        yield f"http://{address}"
