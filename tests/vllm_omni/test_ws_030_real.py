"""vllm-omni 0.30's WebSocket additions, side by side: one session sent to vllm-omni 0.30.0's real streaming
speech handler (``serving_speech_stream.py``, tests/vllm_omni/server.py) and to voxgate (``--engine remote``
in front of that same server), each in vllm-omni's dialect (no subprotocol).

- With ``word_timestamps`` vllm-omni moves the audio into base64 ``audio.chunk`` messages (``timestamps:
  null``) and sends the sentence's words in one trailing ``audio.chunk`` with empty audio. The message
  sequences (runs of audio chunks taken as one) and every message's field set must be the same, and
  ``audio_b64`` must decode to the whole sentence's audio, as long on both sides.
- A sentence whose engine fails after some of its audio: ``error`` with ``partial_audio: true`` and
  ``action: "discard"``, before ``audio.done`` with ``error: true``. The failure is injected into
  server.py's stand-in engine client (``FAILING``: its speech raises after a few pieces of a text that says
  "boom"); vllm-omni's serving layer and voxgate's remote engine see a real failure mid-stream.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from websockets.sync.client import connect

from tests.conftest import Received, recv_until, send, serve_engine
from tests.vllm_omni.conftest import RealUpstreams
from tests.vllm_omni.upstream import (
    START_TIMEOUT_S,
    RealUpstream,
    launched,
    require_vllm_python,
)

pytestmark = pytest.mark.slow

URL = "/v1/audio/speech/stream"
READ_TIMEOUT_S = 120.0
RATE = 24000
#: The stand-in aligner's resolution is the Qwen3 aligner's: 80 ms bins.
BIN_MS = 80
WRITTEN = "It costs $3.50 on 5/12, Dr. Smith said."
ROOT = str(Path(__file__).resolve().parents[2])
# vllm-omni 0.30.0's field sets (serving_speech_stream.py).
CHUNK_FIELDS = (
    *("type", "utterance_index", "sentence_index", "chunk_id", "chunk_start_ms", "chunk_end_ms"),
    *("sample_rate", "audio_b64", "timestamps"),
)
DONE_FIELDS = ("type", "utterance_index", "sentence_index", "total_bytes", "error")
SESSION_DONE_FIELDS = ("type", "utterance_index", "total_sentences")
#: server.py with its stand-in engine client failing mid-sentence: the speech of a text with "boom" raises
#: once three pieces of it are out (the engine client holds one back, so two reach the serving layer).
FAILING = """
import sys
sys.path.insert(0, {root!r})
from tests.vllm_omni import server

speak = server.CpuTtsEngineClient._speak

async def failing(self, text):
    n = 0
    async for piece in speak(self, text):
        if "boom" in text and n == 3:
            raise RuntimeError("stand-in engine failure after audio")
        n += 1
        yield piece

server.CpuTtsEngineClient._speak = failing
server.main(sys.argv[1:])
"""


@contextlib.contextmanager
def failing_upstream() -> Iterator[RealUpstream]:
    """vllm-omni's serving layer (server.py, CustomVoice) whose engine client fails as ``FAILING`` says."""
    model = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
    command = [require_vllm_python(), "-c", FAILING.format(root=ROOT), "--host", "127.0.0.1"]
    command += ["--port", "{port}", "--kind", "CustomVoice", "--served-model-name", model]
    with launched(command, "vllm-omni", "/health", START_TIMEOUT_S, cwd=ROOT) as (url, log_path, process):
        yield RealUpstream(url, model, "CustomVoice", True, False, log_path, process)


@contextlib.contextmanager
def front(upstream: RealUpstream) -> Iterator[str]:
    """voxgate (the remote engine) in front of ``upstream``."""
    with serve_engine(
        None,
        engine="remote",
        upstreams=(upstream.url,),
        upstream_read_timeout_s=READ_TIMEOUT_S,
        upstream_first_byte_timeout_s=READ_TIMEOUT_S,
        upstream_segment_timeout_s=READ_TIMEOUT_S,
    ) as address:
        yield address


def run(url: str, config: dict[str, object], text: str) -> Received:
    """One utterance as a vllm-omni client speaks it: no subprotocol."""
    with connect(url, max_size=None, open_timeout=READ_TIMEOUT_S) as ws:
        assert ws.subprotocol is None
        send(ws, type="session.config", **config)
        send(ws, type="input.text", text=text)
        send(ws, type="input.done")
        return recv_until(ws, "session.done", timeout=READ_TIMEOUT_S)


def both(
    upstream: RealUpstream, address: str, config: dict[str, object], text: str
) -> tuple[Received, Received]:
    config = {"model": upstream.model, "voice": "vivian", **config}
    theirs = run(upstream.url.replace("http://", "ws://") + URL, config, text)
    ours = run(f"ws://{address}{URL}", config, text)
    return theirs, ours


def shape(got: Received) -> list[tuple[str, frozenset[str]]]:
    """Each message's type and field set, in order; a run of audio (frames, or audio chunks) as one."""
    out: list[tuple[str, frozenset[str]]] = []
    for item in got.items:
        if isinstance(item, bytes):
            entry = ("<audio>", frozenset[str]())
        elif item["type"] == "audio.chunk" and item["audio_b64"]:
            entry = ("audio.chunk <audio>", frozenset(item))
        else:
            entry = (str(item["type"]), frozenset(item))
        if not out or out[-1] != entry or "<audio>" not in entry[0]:
            out.append(entry)
    return out


def chunk_audio(got: Received) -> bytes:
    return b"".join(base64.b64decode(str(m["audio_b64"])) for m in got.messages("audio.chunk"))


@pytest.fixture(scope="module")
def aligned(real: RealUpstreams) -> RealUpstream:
    return real("CustomVoice", forced_aligner=True)


def test_word_timestamps_move_the_audio_into_audio_chunks_on_both(aligned: RealUpstream) -> None:
    config = {
        "response_format": "pcm",
        "stream_audio": True,
        "word_timestamps": True,
        "split_granularity": "none",
    }
    with front(aligned) as address:
        theirs, ours = both(aligned, address, config, WRITTEN)
    assert not ours.messages("error"), ours.messages("error")
    assert not theirs.frames() and not ours.frames(), "the audio is in audio_b64"
    start = ("audio.start", frozenset(theirs.messages("audio.start")[0]))
    chunk = ("audio.chunk <audio>", frozenset(CHUNK_FIELDS))
    words = ("audio.chunk", frozenset(CHUNK_FIELDS))  # vllm-omni's send_chunk: one field set for both
    done = ("audio.done", frozenset(DONE_FIELDS))
    assert shape(theirs)[:2] == [start, chunk]
    assert shape(ours) == [start, chunk, words, done, ("session.done", frozenset(SESSION_DONE_FIELDS))]
    assert ours.messages("audio.start") == theirs.messages("audio.start")
    # vllm-omni 0.30.0 itself fails here after the audio: its streamed path hands the aligner stage's output
    # to ``_extract_audio_output`` before checking for timestamps, which iterates the output's single
    # PoolingOutput (its REST path checks first). So it never sends the trailing chunk whose shape its own
    # code and docstring give, and its error says nothing of the audio already sent.
    if not any(m["audio_b64"] == "" for m in theirs.messages("audio.chunk")):
        error = theirs.messages("error")
        assert error and "'PoolingOutput' object is not iterable" in str(error[0]["message"]), theirs.types()
    # The whole sentence's audio in audio_b64, counted by voxgate's audio.done, its length the trailing
    # chunk's end; about as long as vllm-omni's (Piper's speech varies by some ms from one run to the next).
    pcm = chunk_audio(ours)
    assert abs(len(pcm) - len(chunk_audio(theirs))) < 0.1 * len(pcm), (len(pcm), len(chunk_audio(theirs)))
    assert ours.messages("audio.done")[0]["total_bytes"] == len(pcm)
    trailing = ours.messages("audio.chunk")[-1]
    audio_ms = round(len(pcm) / 2 * 1000 / RATE)
    assert trailing["chunk_end_ms"] == audio_ms
    assert max(abs(v) for v in memoryview(pcm).cast("h")) > 1000  # speech, not silence
    # The words as vllm-omni's aligner times them (its 80 ms bins, the last end clamped to the audio), in
    # integer ms from the sentence's start, named as the client wrote them (the aligner says "350", "Dr").
    our_words = cast(list[dict[str, Any]], trailing["timestamps"])
    assert [w["word"] for w in our_words] == WRITTEN.split()
    times = [t for w in our_words for t in (w["start_ms"], w["end_ms"])]
    assert all(isinstance(t, int) for t in times) and times == sorted(times), our_words
    assert all(t % BIN_MS == 0 for t in times[:-1]), times
    assert audio_ms - BIN_MS <= times[-1] <= audio_ms, (times[-1], audio_ms)


def test_a_failure_after_audio_carries_partial_audio_on_both() -> None:
    config = {"response_format": "pcm", "stream_audio": True, "split_granularity": "none"}
    text = "This sentence goes boom in the middle of its audio, after a second or so of it."
    with failing_upstream() as upstream, front(upstream) as address:
        theirs, ours = both(upstream, address, config, text)
    assert theirs.frames() and ours.frames(), "some audio went out before the failure"
    assert shape(ours) == shape(theirs), (shape(ours), shape(theirs))
    for got in (theirs, ours):
        error = got.messages("error")[0]
        assert error["partial_audio"] is True and error["action"] == "discard", error
        done = got.messages("audio.done")[0]
        assert done["error"] is True and done["total_bytes"] == sum(len(f) for f in got.frames())
