"""The rest of the REST speech API side by side: the same requests to vllm-omni 0.30.0's real serving layer
(tests/vllm_omni/server.py: its routes, schemas and Qwen3-TTS adapter, with a CPU engine client) and to a
voxgate (``--engine remote``) in front of it give the same status codes and the same JSON shape.

Covered: the batch route (defaults and per-item overrides, a failing item, 33 items), ``speaker``,
``extra_params``, ``instructions`` over 500 characters, ``max_new_tokens`` 4097, ``speaker_embedding``
lengths, ``word_timestamps`` without an aligner, and the voice list and upload answer.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
from collections.abc import Iterator, Mapping

import httpx
import pytest
import soundfile

from tests.conftest import serve_engine
from tests.vllm_omni.conftest import RealUpstreams
from tests.vllm_omni.upstream import RealUpstream

pytestmark = pytest.mark.slow

TIMEOUT_S = 120.0
BATCH = "/v1/audio/speech/batch"
SPEECH = "/v1/audio/speech"
VOICES = "/v1/audio/voices"


@pytest.fixture(scope="module")
def upstream(real: RealUpstreams) -> RealUpstream:
    return real("CustomVoice")


@pytest.fixture(scope="module")
def both(upstream: RealUpstream) -> Iterator[tuple[str, str]]:
    """(vllm-omni's base URL, voxgate's base URL in front of it)."""
    with serve_engine(
        None, engine="remote", upstreams=(upstream.url,), upstream_read_timeout_s=TIMEOUT_S
    ) as address:
        yield upstream.url, f"http://{address}"


def post_both(both: tuple[str, str], path: str, body: Mapping[str, object]) -> tuple[httpx.Response, ...]:
    return tuple(httpx.post(base + path, json=body, timeout=TIMEOUT_S) for base in both)


def shape(value: object) -> object:
    """A JSON value's shape: objects as their sorted keys with their values' shapes, lists by their items."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


def assert_same_error(responses: tuple[httpx.Response, ...], status: int = 400) -> None:
    for response in responses:
        assert response.status_code == status, (response.request.url, response.text[:500])
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]


def batch_results(responses: tuple[httpx.Response, ...]) -> list[list[dict[str, object]]]:
    """Each side's results, after checking both answered 200 with the same shape of envelope."""
    bodies = []
    for response in responses:
        assert response.status_code == 200, (response.request.url, response.text[:500])
        body = response.json()
        assert set(body) == {"id", "results", "total", "succeeded", "failed"}
        assert body["id"].startswith("speech-batch-")
        bodies.append(body)
    vllm, voxgate = bodies
    assert (vllm["total"], vllm["succeeded"], vllm["failed"]) == (
        voxgate["total"],
        voxgate["succeeded"],
        voxgate["failed"],
    )
    return [b["results"] for b in bodies]


def test_batch_with_defaults_and_overrides(both: tuple[str, str]) -> None:
    body = {
        "voice": "vivian",
        "response_format": "wav",
        "items": [
            {"input": "Hello there."},
            {"input": "A second one, in another voice.", "voice": "ryan", "response_format": "pcm"},
            {"input": "A third, by speaker.", "speaker": "serena", "speed": 1.0},
        ],
    }
    vllm, voxgate = batch_results(post_both(both, BATCH, body))
    assert [shape(r) for r in voxgate] == [shape(r) for r in vllm]
    for theirs, ours in zip(vllm, voxgate, strict=True):
        assert (ours["index"], ours["status"], ours["media_type"]) == (
            theirs["index"],
            theirs["status"],
            theirs["media_type"],
        )
    for results in (vllm, voxgate):
        audio, rate = soundfile.read(io.BytesIO(base64.b64decode(str(results[0]["audio_data"]))))
        assert rate == 24000 and len(audio) > rate // 2


def test_batch_with_a_failing_item(both: tuple[str, str]) -> None:
    body = {
        "voice": "vivian",
        "items": [
            {"input": "This one is fine."},
            {"input": "Nobody speaks this.", "voice": "nobody"},
            {"input": "Too long a style.", "instructions": "x" * 501},
            {"input": "Too many tokens.", "max_new_tokens": 4097},
        ],
    }
    vllm, voxgate = batch_results(post_both(both, BATCH, body))
    assert [r["status"] for r in vllm] == [r["status"] for r in voxgate] == ["success"] + ["error"] * 3
    assert [set(r) for r in voxgate[1:]] == [set(r) for r in vllm[1:]] == [{"index", "status", "error"}] * 3


@pytest.mark.parametrize("count", [33, 0])
def test_batch_of_too_many_or_no_items(both: tuple[str, str], count: int) -> None:
    assert_same_error(post_both(both, BATCH, {"items": [{"input": "Hi."}] * count}))


def test_speaker_is_an_alias_of_voice(both: tuple[str, str]) -> None:
    body = {"input": "Spoken by speaker.", "speaker": "ryan", "response_format": "wav"}
    for response in post_both(both, SPEECH, body):
        assert response.status_code == 200, response.text[:500]
        assert response.headers["content-type"].startswith("audio/wav")
    assert_same_error(post_both(both, SPEECH, {"input": "Hi.", "speaker": "nobody"}))


def test_extra_params_are_taken(both: tuple[str, str], upstream: RealUpstream) -> None:
    body = {"input": "With extra parameters.", "voice": "vivian", "response_format": "wav"}
    since = len(upstream.log())
    for response in post_both(both, SPEECH, {**body, "extra_params": {"temperature": 0.7, "top_k": 20}}):
        assert response.status_code == 200, response.text[:500]
    # vllm-omni applied them both times: voxgate's remote engine forwarded them as vllm-omni's own field.
    assert upstream.log()[since:].count("Applied extra_params: {'temperature': 0.7, 'top_k': 20}") == 2
    assert_same_error(post_both(both, SPEECH, {**body, "extra_params": [1, 2]}))


@pytest.mark.parametrize(
    "extra",
    [
        {"instructions": "x" * 501},
        {"max_new_tokens": 4097},
        {"speaker_embedding": [0.1] * 8193},
        {"speaker_embedding": [0.1] * 10, "task_type": "Base"},
        {"word_timestamps": True},  # no --forced-aligner upstream
        {"word_timestamps": True, "stream": True},
    ],
    ids=["instructions", "max_new_tokens", "embedding_8193", "embedding_10", "words", "words_streamed"],
)
def test_limits_refuse_the_same_requests(both: tuple[str, str], extra: dict[str, object]) -> None:
    body = {"input": "Hello there.", "voice": "vivian", "response_format": "wav", **extra}
    assert_same_error(post_both(both, SPEECH, body))


def test_instructions_and_max_new_tokens_at_the_limits_are_taken(both: tuple[str, str]) -> None:
    body = {"input": "Hello.", "voice": "vivian", "response_format": "wav", "instructions": "calm " * 100}
    for response in post_both(both, SPEECH, {**body, "max_new_tokens": 4096}):
        assert response.status_code == 200, response.text[:500]


def test_voice_upload_answer_and_list(both: tuple[str, str]) -> None:
    answers = []
    for base in both:
        too_long = httpx.post(
            base + VOICES,
            data={"name": "longvec", "consent": "c1", "speaker_embedding": json.dumps([0.1] * 4097)},
            timeout=TIMEOUT_S,
        )
        assert too_long.status_code == 400, too_long.text[:500]
        uploaded = httpx.post(
            base + VOICES,
            data={"name": "myvec", "consent": "c1", "speaker_embedding": json.dumps([0.1] * 1024)},
            timeout=TIMEOUT_S,
        )
        assert uploaded.status_code == 200, uploaded.text[:500]
        answers.append(uploaded.json())
        listing = httpx.get(base + VOICES, timeout=TIMEOUT_S).json()
        assert "myvec" in listing["voices"]
        entry = next(v for v in listing["uploaded_voices"] if v["name"] == "myvec")
        assert (entry["embedding_source"], entry["embedding_dim"]) == ("direct", 1024)
        with contextlib.suppress(httpx.HTTPError):
            httpx.delete(base + VOICES + "/myvec", timeout=TIMEOUT_S)
    theirs, ours = (a["voice"] for a in answers)
    assert set(theirs) <= set(ours)  # voxgate's answer has vllm-omni's fields (and its own beside them)
    assert (ours["embedding_source"], ours["embedding_dim"]) == (
        theirs["embedding_source"],
        theirs["embedding_dim"],
    )
