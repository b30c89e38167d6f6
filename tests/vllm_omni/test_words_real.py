"""Word timestamps through ``--engine remote`` from vllm-omni 0.30.0's own forced-aligner path.

The upstream is vllm-omni's serving layer (tests/vllm_omni/server.py) launched with its own
``--forced-aligner`` flag. The aligner stage's output is built by vllm-omni's stage input processor and
pooling-output decoder around a stand-in for the Qwen3-ForcedAligner model's forward pass (no weights, no
GPU here: ``StandInAligner`` puts each word on the 80 ms bin of Piper's own phoneme timing), and read by
vllm-omni's ``extract_word_timestamps`` into the ``X-Word-Timestamps`` header of its non-streamed answer.
What the client of gateway B gets has gone through all of that and through voxgate's remote engine and
session core. Without ``--forced-aligner`` the option is refused by name at session config.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any, cast

import pytest
from voxgate.protocol.audio import decode

from tests.conftest import Received, recv, recv_until, send, serve_engine, session, voxgate_connect
from tests.vllm_omni.conftest import RealUpstreams
from tests.vllm_omni.upstream import RealUpstream

pytestmark = pytest.mark.slow

URL = "/v1/audio/speech/stream"
WRITTEN = "It costs $3.50 on 5/12, Dr. Smith said."
# The stand-in aligner's resolution is the Qwen3 aligner's: 80 ms bins, times rounded to the nearest.
BIN_MS = 80.0
READ_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def aligned(real: RealUpstreams) -> RealUpstream:
    return real("CustomVoice", forced_aligner=True)


@contextlib.contextmanager
def front(upstream: RealUpstream) -> Iterator[str]:
    """Gateway B (the remote engine) in front of ``upstream``."""
    with serve_engine(
        None,
        engine="remote",
        upstreams=(upstream.url,),
        # A cold GPU's first answer (compilation, warm-up) takes far longer than a warm one's.
        upstream_read_timeout_s=READ_TIMEOUT_S,
        upstream_first_byte_timeout_s=READ_TIMEOUT_S,
        upstream_segment_timeout_s=READ_TIMEOUT_S,
    ) as address:
        yield address


@pytest.fixture(scope="module")
def gateway(aligned: RealUpstream) -> Iterator[str]:
    with front(aligned) as address:
        yield address


def speak(ws: Any, text: str) -> Received:
    send(ws, type="input.text", text=text)
    send(ws, type="input.done")
    return recv_until(ws, "session.done", timeout=120)


def words_of(got: Received) -> list[dict[str, Any]]:
    return [w for m in got.messages("audio.chunk") for w in cast(list[dict[str, Any]], m["timestamps"])]


def check_order(got: Received, rate: int) -> None:
    """Each word message comes before any audio it describes: the audio received so far ends at or before
    the start of its stretch; and every word lies inside its stretch, in order, not overlapping."""
    received_ms = 0.0
    for item in got.items:
        if isinstance(item, bytes):
            received_ms += len(decode(item, "pcm")) * 1000 / rate
        elif item["type"] == "audio.chunk":
            begin, end = cast(float, item["chunk_start_ms"]), cast(float, item["chunk_end_ms"])
            assert received_ms <= begin + 0.01, (item, received_ms)
            words = cast(list[dict[str, float]], item["timestamps"])
            bounds = [begin] + [t for w in words for t in (w["start_ms"], w["end_ms"])]
            assert bounds == sorted(bounds), item
            assert words[-1]["end_ms"] <= end + 0.01, item


def test_words_come_from_vllm_omnis_aligner_before_their_audio(gateway: str, aligned: RealUpstream) -> None:
    since = len(aligned.log())
    with session(gateway, response_format="pcm", word_timestamps=True, split_granularity="none") as ws:
        got = speak(ws, WRITTEN)
    assert not got.messages("error"), got.messages("error")
    audio_ms = len(decode(b"".join(got.frames()), "pcm")) * 1000 / 24000
    words = words_of(got)
    # The aligner times "350", "512", "Dr", "said"; voxgate names them as the client wrote them.
    assert [w["word"] for w in words] == WRITTEN.split()
    check_order(got, 24000)
    # The stand-in's times are Piper's (whose words tile the audio), rounded to 80 ms bins: the words reach
    # the end of the audio, and vllm-omni clamped them to it.
    assert audio_ms - BIN_MS <= words[-1]["end_ms"] <= audio_ms + 0.01, (words[-1], audio_ms)
    assert words[0]["start_ms"] < 2 * BIN_MS
    assert all(w["end_ms"] > w["start_ms"] for w in words), words
    # The request went through vllm-omni's aligner stage, as a whole answer.
    log = aligned.log()[since:]
    assert re.search(r"aligner speech-\S+: 8 words", log), log[-3000:]
    assert "modalities=['audio', 'timestamps']" in log


def test_segments_keep_one_clock(gateway: str) -> None:
    text = "Hello there. The 2 cats ate 3 fish! Done."
    with session(gateway, response_format="pcm", word_timestamps=True, split_granularity="sentence") as ws:
        got = speak(ws, text)
    assert not got.messages("error")
    starts = got.messages("audio.start")
    chunks = got.messages("audio.chunk")
    assert len(starts) == len(chunks) == 3
    for start, chunk in zip(starts, chunks, strict=True):
        assert chunk["sentence_index"] == start["sentence_index"]
        begin = int(cast(int, start["start_sample"])) * 1000 / 24000
        assert chunk["chunk_start_ms"] == pytest.approx(begin, abs=0.01)
    assert [w["word"] for w in words_of(got)] == text.split()
    stamps = [t for w in words_of(got) for t in (w["start_ms"], w["end_ms"])]
    assert stamps == sorted(stamps)
    check_order(got, 24000)


def test_without_the_aligner_the_option_is_refused_by_name(real: RealUpstreams) -> None:
    plain = real("CustomVoice")  # launched without --forced-aligner
    since = len(plain.log())
    with front(plain) as address, voxgate_connect(f"ws://{address}{URL}") as ws:
        send(ws, type="session.config", word_timestamps=True)
        refused = recv(ws)
    assert isinstance(refused, dict) and refused["code"] == "unsupported_option", refused
    assert refused["field"] == "$.word_timestamps"
    assert "--forced-aligner" in str(refused["message"]) and "'remote'" in str(refused["message"])
    # Learned from vllm-omni's own refusal of the start-up probe, which ran no synthesis.
    log = plain.log()[since:]
    assert '"POST /v1/audio/speech HTTP/1.1" 400' in log and "generate " not in log, log[-3000:]
