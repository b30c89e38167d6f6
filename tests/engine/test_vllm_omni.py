"""The in-process vllm-omni engine, against test doubles of what cannot run here.

vllm-omni needs an NVIDIA GPU (0.30.0 has no CPU platform: its ``get_omni_ar_worker_cls()`` raises
``NotImplementedError`` without one; see docs/vllm-omni-cpu.md), so these tests replace
``AsyncOmni`` and vllm-omni's prompt helpers with stand-ins; ``bench/gpu_smoke.sh`` runs the real thing.

The stand-ins reproduce the shapes of vllm-omni **0.30.0 as published on PyPI**
(``vllm_omni-0.30.0-py3-none-any.whl``; the wheel records no commit id):

- ``FakeOutput`` mirrors ``OmniRequestOutput`` (``vllm_omni/outputs/__init__.py``): a dataclass with
  ``request_id``, ``outputs`` (``CompletionOutput``s), ``finished``, ``stage_id``, ``final_output_type``,
  ``error`` / ``error_status_code`` / ``error_type``, ``_multimodal_output``, and a ``multimodal_output``
  property that returns the first truthy ``outputs[i].multimodal_output``, else ``_multimodal_output``.
- ``FakePayload`` mirrors ``MultimodalPayload`` (``vllm_omni/outputs/mm_outputs.py``): a ``Mapping`` over
  ``tensors`` then ``metadata``, so ``"audio" in mm``, ``mm["audio"]`` and ``mm.get("sr")`` work. The
  Qwen3-TTS code2wav stage's ``model_outputs`` key arrives renamed to ``"audio"``; ``"sr"`` is a 0-d tensor
  or a list of them; ``"audio"`` is one tensor per step (DELTA) or a growing list (CUMULATIVE), as read by
  ``vllm_omni/entrypoints/openai/serving_speech.py::_generate_audio_chunks``.
- ``FakeOmni`` has ``AsyncOmni.generate(prompt, sampling_params=None, request_id="", *,
  sampling_params_list=..., output_modalities=...)`` as an async generator, ``abort(request_id)``,
  ``shutdown()`` and ``errored`` (``vllm_omni/entrypoints/async_omni.py``, ``omni_base.py``).
- ``FakeTensor`` is numpy-backed, with the torch methods the engine calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from voxgate.engine.base import (
    AudioChunk,
    EngineError,
    SynthesisRequest,
    UnknownVoice,
    UnsupportedOption,
    VoiceReference,
)
from voxgate.engine.qwen3_tts import DEFAULT_MODEL, MIN_CODEC_FRAMES, Qwen3Tools, qwen_language, variant_of
from voxgate.engine.vllm_omni import OmniClient, VllmOmniEngine, to_samples

from tests.conftest import TIMEOUT_S, recv, recv_until, send, serve_engine, session

RATE = 24000
BASE_MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"


class FakeTensor:
    """A numpy-backed stand-in for a torch tensor (bfloat16-like data is stored as float16)."""

    def __init__(self, data: npt.ArrayLike, dtype: npt.DTypeLike = np.float16) -> None:
        self.data = np.asarray(data, dtype=dtype)

    def float(self) -> FakeTensor:
        return FakeTensor(self.data, np.float32)

    def cpu(self) -> FakeTensor:
        return self

    def numpy(self) -> npt.NDArray[Any]:
        return self.data

    def squeeze(self) -> FakeTensor:
        return FakeTensor(np.squeeze(self.data), self.data.dtype)

    def item(self) -> Any:
        return self.data.item()


@dataclass(eq=False)
class FakePayload(Mapping[str, Any]):
    tensors: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.tensors[key] if key in self.tensors else self.metadata[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.tensors
        yield from self.metadata

    def __len__(self) -> int:
        return len(self.tensors) + len(self.metadata)


@dataclass
class FakeCompletion:
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    multimodal_output: FakePayload | None = None


@dataclass
class FakeOutput:
    request_id: str = ""
    outputs: list[FakeCompletion] = field(default_factory=list)
    finished: bool = False
    stage_id: int | None = 1
    final_output_type: str = "audio"
    error: str | None = None
    error_status_code: int | None = None
    error_type: str | None = None
    _multimodal_output: dict[str, Any] = field(default_factory=dict)

    @property
    def multimodal_output(self) -> Any:
        for output in self.outputs:
            if output.multimodal_output:
                return output.multimodal_output
        return self._multimodal_output


def audio_output(audio: Any, sr: Any = None, *, finished: bool = False) -> FakeOutput:
    """An output of the code2wav stage, its payload attached to the completion as AR stages do."""
    tensors: dict[str, Any] = {"audio": audio}
    if sr is not None:
        tensors["sr"] = sr
    return FakeOutput(outputs=[FakeCompletion(multimodal_output=FakePayload(tensors))], finished=finished)


def tone(n: int, start: int = 0) -> npt.NDArray[np.float32]:
    return (0.25 * np.sin(np.arange(start, start + n) / 10.0)).astype(np.float32)


@dataclass
class FakeSamplingParams:
    seed: int | None = None
    max_tokens: int = 4096
    min_tokens: int = 2
    extra_args: dict[str, Any] | None = None
    output_kind: str = "DELTA"


@dataclass
class Call:
    prompt: dict[str, Any]
    request_id: str
    params: list[Any]
    modalities: list[str] | None


Script = Callable[[dict[str, Any]], list[FakeOutput]]


def delta_script(chunks: int = 3, size: int = 480) -> Script:
    """Per-step DELTA form: one tensor per output, ``sr`` a 0-d tensor, then an audio-less end marker."""

    def script(prompt: dict[str, Any]) -> list[FakeOutput]:
        sr = FakeTensor(RATE, np.int64)
        out = [audio_output(FakeTensor(tone(size, i * size)), sr) for i in range(chunks)]
        return [FakeOutput(stage_id=0), *out, FakeOutput(finished=True)]

    return script


class FakeOmni:
    """``AsyncOmni`` as this engine uses it: ``generate`` yields the script's outputs, one per ``delay_s``."""

    def __init__(
        self, script: Script | None = None, *, delay_s: float = 0.0, fail: Exception | None = None
    ) -> None:
        self.script = script or delta_script()
        self.delay_s = delay_s
        self.fail = fail
        self.calls: list[Call] = []
        self.aborted: list[str] = []
        self.closed: list[str] = []
        self.errored = False
        self.shut_down = False
        self.yielded = asyncio.Event()  # set at the first output; used inside one event loop only

    async def generate(
        self,
        prompt: Any,
        sampling_params: Any = None,
        request_id: str = "",
        *,
        sampling_params_list: Sequence[Any] | None = None,
        output_modalities: list[str] | None = None,
    ) -> AsyncGenerator[FakeOutput, None]:
        self.calls.append(Call(prompt, request_id, list(sampling_params_list or []), output_modalities))
        try:
            for output in self.script(prompt):
                await asyncio.sleep(self.delay_s)
                if request_id in self.aborted:
                    return  # the real abort ends the stream with a terminal output
                if self.fail is not None:
                    raise self.fail
                output.request_id = request_id
                self.yielded.set()
                yield output
        finally:
            self.closed.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def shutdown(self) -> None:
        self.shut_down = True


#: Shared, like vllm-omni's ``default_sampling_params_list``: the engine must never change them.
DEFAULT_PARAMS = (FakeSamplingParams(), FakeSamplingParams(max_tokens=65536, min_tokens=0))


@dataclass
class FakeTools:
    """vllm-omni's prompt helpers: the real one sizes the placeholder with the model's tokenizer."""

    variant: str | None = "CustomVoice"
    speakers: list[str] = field(default_factory=lambda: ["Vivian", "Ryan"])
    languages: frozenset[str] | None = frozenset({"Auto", "English", "Chinese"})
    codec_frame_rate: float | None = 12.5
    streaming: bool = True  # async_chunk on, as in vllm-omni's qwen3_tts.yaml
    tokens_per_text: int | None = None  # what the tokenizer counts; None: no tokenizer
    word_timestamps: bool = False  # the pipeline has vllm-omni's forced-aligner stage
    #: What the aligner "finds", per call of ``words`` (the real one reads vllm-omni's pooling output).
    timed: list[tuple[str, int, int]] | None = None
    words_asked: list[tuple[str, str | None]] = field(default_factory=list)

    def prompt(self, info: dict[str, list[Any]], task_type: str, cache_salt: str) -> dict[str, Any]:
        return {
            "prompt_token_ids": [1] * len(info["text"][0]),
            "additional_information": info,
            "cache_salt": cache_salt,
        }

    def stream_params(self, *, words: bool = False) -> list[Any]:
        return list(DEFAULT_PARAMS)

    def text_tokens(self, text: str) -> int | None:
        return self.tokens_per_text

    def modalities(self, words: bool) -> list[str]:
        return ["audio", "timestamps"] if words else ["audio"]

    def is_words(self, output: Any) -> bool:
        return bool(output.final_output_type == "timestamps")

    def words(self, output: Any, text: str, language: str | None) -> list[tuple[str, int, int]] | None:
        self.words_asked.append((text, language))
        return self.timed


def make_engine(omni: FakeOmni, tools: FakeTools | None = None, model: str = DEFAULT_MODEL) -> VllmOmniEngine:
    def build_omni() -> OmniClient:
        return omni

    def build_tools(_: OmniClient) -> Qwen3Tools:
        return tools or FakeTools()

    return VllmOmniEngine(model=model, omni_factory=build_omni, tools_factory=build_tools)


def request(text: str = "Hello there.", voice: str = "vivian", **kw: Any) -> SynthesisRequest:
    return SynthesisRequest(text=text, voice=voice, **kw)


def speak(engine: VllmOmniEngine, req: SynthesisRequest) -> list[AudioChunk]:
    async def run() -> list[AudioChunk]:
        await engine.start()
        try:
            async with contextlib.aclosing(engine.synthesize(req)) as chunks:
                return [c async for c in chunks]
        finally:
            await engine.aclose()

    return asyncio.run(run())


# -- audio out ----------------------------------------------------------------------------------------


def test_per_step_tensors_are_emitted_one_chunk_each() -> None:
    chunks = speak(make_engine(FakeOmni(delta_script(chunks=3, size=480))), request())
    assert [c.sample_rate for c in chunks] == [RATE] * 3
    assert all(c.samples.dtype == np.float32 for c in chunks)  # float() ran before numpy()
    joined = np.concatenate([c.samples for c in chunks])
    np.testing.assert_allclose(joined, tone(1440), atol=1e-3)  # float16 storage rounds


def test_cumulative_lists_emit_only_new_items() -> None:
    parts = [FakeTensor(tone(300, i * 300)) for i in range(3)]
    srs = [FakeTensor(RATE, np.int64) for _ in range(3)]

    def script(prompt: dict[str, Any]) -> list[FakeOutput]:
        growing = [audio_output(parts[: i + 1], srs[: i + 1]) for i in range(3)]
        return [*growing, audio_output(parts, srs, finished=True)]

    chunks = speak(make_engine(FakeOmni(script)), request())
    assert len(chunks) == 3
    np.testing.assert_allclose(np.concatenate([c.samples for c in chunks]), tone(900), atol=1e-3)


def test_a_cumulative_stream_may_start_with_a_lone_tensor() -> None:
    # MultimodalPayload merges a second tensor into a list: [a], then [a, b], as vllm-omni accumulates.
    a, b = FakeTensor(tone(200)), FakeTensor(tone(200, 200))
    omni = FakeOmni(lambda prompt: [audio_output(a, RATE), audio_output([a, b], [RATE])])
    chunks = speak(make_engine(omni), request())
    assert len(chunks) == 2
    np.testing.assert_allclose(np.concatenate([c.samples for c in chunks]), tone(400), atol=1e-3)


# With async_chunk: false in the deploy config, vllm-omni keeps the request FINAL_ONLY and its audio is
# cumulative snapshots, each one all the audio so far (serving_speech.py::_generate_audio_bytes keeps the
# last non-empty one). tests/vllm_omni/test_inprocess_engine.py feeds real OmniRequestOutputs the same way.
SNAPSHOTS = [tone(1200), tone(3000), tone(4800)]
SNAPSHOT_SCRIPTS: dict[str, Script] = {
    "final history list": lambda prompt: [
        audio_output([FakeTensor(s) for s in SNAPSHOTS], FakeTensor(RATE, np.int64), finished=True)
    ],
    "final list sent again, empty tail": lambda prompt: [
        audio_output([FakeTensor(s) for s in SNAPSHOTS], RATE, finished=True),
        audio_output([*(FakeTensor(s) for s in SNAPSHOTS), FakeTensor(np.zeros(0))], [RATE], finished=True),
    ],
    "growing tensors": lambda prompt: [
        audio_output(FakeTensor(s), RATE, finished=i == 2) for i, s in enumerate(SNAPSHOTS)
    ],
}


@pytest.mark.parametrize("name", list(SNAPSHOT_SCRIPTS))
def test_cumulative_snapshots_without_async_chunk_come_out_once(name: str) -> None:
    omni = FakeOmni(SNAPSHOT_SCRIPTS[name])
    chunks = speak(make_engine(omni, FakeTools(streaming=False)), request())
    joined = np.concatenate([c.samples for c in chunks])
    assert joined.size == 4800 and {c.sample_rate for c in chunks} == {RATE}
    np.testing.assert_allclose(joined, tone(4800), atol=1e-3)


def test_with_async_chunk_on_a_list_is_read_as_chunks() -> None:
    # The same history list with streaming on is chunks, as serving_speech.py's streaming path reads it.
    omni = FakeOmni(SNAPSHOT_SCRIPTS["final history list"])
    chunks = speak(make_engine(omni), request())
    assert sum(c.samples.size for c in chunks) == 1200 + 3000 + 4800


SR_FORMS = [FakeTensor(22050, np.int64), [FakeTensor(16000), FakeTensor(22050, np.int64)], 22050]


@pytest.mark.parametrize("sr", SR_FORMS, ids=["tensor", "list", "int"])
def test_sample_rate_as_tensor_or_list(sr: Any) -> None:
    # The second output carries no "sr": the rate of the stream so far holds.
    second = audio_output(FakeTensor(tone(99)))
    omni = FakeOmni(lambda prompt: [audio_output(FakeTensor(tone(100)), sr), second])
    assert [c.sample_rate for c in speak(make_engine(omni), request())] == [22050, 22050]


def test_a_sample_rate_change_mid_stream_is_an_engine_error() -> None:
    omni = FakeOmni(
        lambda prompt: [
            audio_output(FakeTensor(tone(100)), FakeTensor(RATE, np.int64)),
            audio_output(FakeTensor(tone(100)), FakeTensor(16000, np.int64)),
        ]
    )
    with pytest.raises(EngineError, match="24000 Hz to 16000 Hz"):
        speak(make_engine(omni), request())
    assert len(omni.closed) == 1  # vllm-omni's generator was closed, which aborts on its side


def test_an_output_with_an_error_is_an_engine_error() -> None:
    failed = FakeOutput(finished=True, error="CUDA out of memory", error_status_code=500)
    omni = FakeOmni(lambda prompt: [audio_output(FakeTensor(tone(100)), RATE), failed])
    with pytest.raises(EngineError, match="CUDA out of memory"):
        speak(make_engine(omni), request())


def test_a_failing_generate_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="stage died"):
        speak(make_engine(FakeOmni(fail=RuntimeError("stage died"))), request())


def test_samples_are_squeezed_and_multichannel_refused() -> None:
    assert to_samples(FakeTensor(np.ones((1, 5)))).shape == (5,)
    assert to_samples(np.ones(3, dtype=np.float64)).dtype == np.float32
    with pytest.raises(EngineError, match="mono"):
        to_samples(FakeTensor(np.ones((2, 5))))


# -- cancel and lookahead -----------------------------------------------------------------------------


def test_closing_the_stream_early_aborts_its_request() -> None:
    omni = FakeOmni(delta_script(chunks=50), delay_s=0.01)
    engine = make_engine(omni)

    async def run() -> None:
        await engine.start()
        stream = engine.synthesize(request())
        async with contextlib.aclosing(stream) as chunks:
            async for _ in chunks:
                break
        assert omni.aborted == [omni.calls[0].request_id] == [stream.request_id]
        assert omni.closed == [stream.request_id]
        await engine.aclose()

    asyncio.run(run())


def test_cancelling_the_consumer_aborts_its_request() -> None:
    omni = FakeOmni(delta_script(chunks=50), delay_s=0.01)
    engine = make_engine(omni)

    async def consume() -> None:
        async with contextlib.aclosing(engine.synthesize(request())) as chunks:
            async for _ in chunks:
                pass

    async def run() -> None:
        await engine.start()
        task = asyncio.create_task(consume())
        await asyncio.wait_for(omni.yielded.wait(), TIMEOUT_S)
        task.cancel()
        await asyncio.wait([task])
        assert omni.aborted == [omni.calls[0].request_id]
        await engine.aclose()

    asyncio.run(run())


def test_a_finished_stream_is_not_aborted() -> None:
    omni = FakeOmni()
    speak(make_engine(omni), request())
    assert omni.aborted == [] and len(omni.calls) == 1


def test_segments_are_submitted_before_they_are_read() -> None:
    omni = FakeOmni(delta_script(chunks=2), delay_s=0.01)
    engine = make_engine(omni)

    async def run() -> None:
        await engine.start()
        first, second = engine.synthesize(request("One.")), engine.synthesize(request("Two."))
        await asyncio.sleep(0)  # the tasks start; nothing has been read yet
        assert [c.prompt["additional_information"]["text"] for c in omni.calls] == [["One."], ["Two."]]
        for stream in (first, second):
            async with contextlib.aclosing(stream) as chunks:
                assert len([c async for c in chunks]) == 2
        assert first.request_id != second.request_id and omni.aborted == []
        await engine.aclose()

    asyncio.run(run())


def test_aclose_aborts_open_streams_and_shuts_down() -> None:
    omni = FakeOmni(delta_script(chunks=50), delay_s=0.01)
    engine = make_engine(omni)

    async def run() -> None:
        assert not await engine.ready()
        await engine.start()
        assert await engine.ready()
        omni.errored = True
        assert not await engine.ready()
        stream = engine.synthesize(request())
        await asyncio.wait_for(omni.yielded.wait(), TIMEOUT_S)
        await engine.aclose()
        assert omni.aborted == [stream.request_id] and omni.shut_down
        assert not await engine.ready()

    asyncio.run(run())


def test_throwing_into_the_stream_aborts_and_raises() -> None:
    omni = FakeOmni(delta_script(chunks=50), delay_s=0.01)
    engine = make_engine(omni)

    async def run() -> None:
        await engine.start()
        stream = engine.synthesize(request())
        await anext(stream)
        with pytest.raises(KeyError):
            await stream.athrow(KeyError("stop"))
        assert omni.aborted == [stream.request_id]
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
        await engine.aclose()

    asyncio.run(run())


def test_a_failed_start_shuts_vllm_omni_down() -> None:
    omni = FakeOmni()
    engine = make_engine(omni, FakeTools(speakers=[]))
    with pytest.raises(EngineError, match="no speakers"):
        asyncio.run(engine.start())
    assert omni.shut_down and not asyncio.run(engine.ready())


def test_synthesis_before_start_is_an_engine_error() -> None:
    async def run() -> None:
        async with contextlib.aclosing(make_engine(FakeOmni()).synthesize(request())) as chunks:
            async for _ in chunks:
                pass

    with pytest.raises(EngineError, match="not started"):
        asyncio.run(run())


# -- what reaches vllm-omni ----------------------------------------------------------------------------


def test_request_fields_reach_the_prompt_and_sampling_params() -> None:
    omni = FakeOmni()
    options: dict[str, object] = {
        "seed": 7,
        "language": "en-US",
        "instructions": "Speak softly.",
        "max_new_tokens": 900,
        "initial_codec_chunk_frames": 2,
        "task_type": "CustomVoice",
    }
    speak(make_engine(omni), request("Hi.", voice="Ryan", seed=7, options=options))
    (call,) = omni.calls
    info = call.prompt["additional_information"]
    assert info == {
        "text": ["Hi."],
        "task_type": ["CustomVoice"],
        "language": ["English"],
        "speaker": ["ryan"],
        "instruct": ["Speak softly."],
        "max_new_tokens": [900],
        "initial_codec_chunk_frames": [2],
    }
    assert call.modalities == ["audio"] and call.request_id.startswith("voxgate-")
    assert len(call.prompt["cache_salt"]) == 32
    talker, code2wav = call.params
    assert (talker.seed, talker.extra_args) == (7, {"tts_local_seed": 7})
    assert (talker.max_tokens, talker.min_tokens) == (900, 2)
    assert code2wav is DEFAULT_PARAMS[1]
    assert DEFAULT_PARAMS[0] == FakeSamplingParams()  # the shared defaults are untouched


def test_defaults_when_a_request_sets_nothing() -> None:
    omni = FakeOmni()
    speak(make_engine(omni), request())
    (call,) = omni.calls
    assert call.prompt["additional_information"] == {
        "text": ["Hello there."],
        "task_type": ["CustomVoice"],
        "language": ["Auto"],
        "speaker": ["vivian"],
        "instruct": [""],
        "max_new_tokens": [2048],
    }
    assert call.params == list(DEFAULT_PARAMS)


def test_an_uploaded_voice_reaches_a_base_model_as_reference_audio() -> None:
    omni = FakeOmni()
    clip = tone(RATE * 3 + 1000)
    ref = VoiceReference(name="alice", audio=clip, sample_rate=RATE, ref_text="This is Alice.")
    engine = make_engine(omni, FakeTools(variant="Base", speakers=[]), model=BASE_MODEL)
    assert engine.clones
    speak(engine, request("Hi.", voice=engine.default_voice, seed=3, reference=ref))
    (call,) = omni.calls
    info = call.prompt["additional_information"]
    assert info["task_type"] == ["Base"] and "speaker" not in info
    ((wav, sr),) = info["ref_audio"]
    assert sr == RATE and np.allclose(wav, clip)
    assert info["ref_text"] == ["This is Alice."] and info["x_vector_only_mode"] == [False]
    assert info["ref_code_length"] == [math.ceil(len(clip) / RATE * 12.5)]
    # With no max_new_tokens, a Base request's budget follows the text's length.
    assert call.params[0].seed == 3 and call.params[0].max_tokens == MIN_CODEC_FRAMES


def test_a_base_budget_follows_the_tokenizer_when_there_is_one() -> None:
    omni = FakeOmni()
    ref = VoiceReference(name="alice", audio=tone(RATE * 3), sample_rate=RATE, ref_text="This is Alice.")
    engine = make_engine(omni, FakeTools(variant="Base", speakers=[], tokens_per_text=40), model=BASE_MODEL)
    speak(engine, request("Hi." * 40, voice=engine.default_voice, reference=ref))
    # vllm-omni's adapter: 12 codec frames per text token, at least 192, at most the deploy default.
    assert omni.calls[0].params[0].max_tokens == 40 * 12
    assert omni.calls[0].params[0].extra_args is None  # no seed anywhere: the code predictor is left alone


def test_a_reference_without_transcript_clones_from_the_speaker_embedding_of_its_audio() -> None:
    omni = FakeOmni()
    engine = make_engine(omni, FakeTools(variant="Base", speakers=[]), model=BASE_MODEL)
    speak(
        engine,
        request(
            voice="reference", reference=VoiceReference(name="bob", audio=tone(RATE * 4), sample_rate=RATE)
        ),
    )
    info = omni.calls[0].prompt["additional_information"]
    assert info["x_vector_only_mode"] == [True] and "ref_text" not in info
    assert info["ref_code_length"] == [50]  # sent for every clip, as vllm-omni's adapter does; unused here


def test_an_uploaded_embedding_becomes_a_voice_clone_prompt() -> None:
    omni = FakeOmni()
    engine = make_engine(omni, FakeTools(variant="Base", speakers=[]), model=BASE_MODEL)
    embedding = np.array([0.5, -0.25], dtype=np.float32)
    speak(engine, request(voice="reference", reference=VoiceReference(name="eve", embedding=embedding)))
    info = omni.calls[0].prompt["additional_information"]
    assert info["voice_clone_prompt"] == [{"ref_spk_embedding": [0.5, -0.25]}]
    assert info["x_vector_only_mode"] == [True]
    assert "ref_audio" not in info


def test_a_base_model_without_a_reference_is_an_engine_error() -> None:
    engine = make_engine(FakeOmni(), FakeTools(variant="Base", speakers=[]), model=BASE_MODEL)
    with pytest.raises(EngineError, match="only uploaded voices"):
        speak(engine, request(voice="reference"))


# -- what it refuses -----------------------------------------------------------------------------------


def test_voices_come_from_the_model_config() -> None:
    engine = make_engine(FakeOmni())

    async def run() -> list[str]:
        await engine.start()
        names = [v.name for v in await engine.voices()]
        await engine.aclose()
        return names

    assert asyncio.run(run()) == ["vivian", "ryan"] and engine.default_voice == "vivian" and not engine.clones


@pytest.mark.parametrize(
    ("voice", "options", "field"),
    [
        ("vivian", {"word_timestamps": True}, "word_timestamps"),
        ("vivian", {"speed": 1.5}, "speed"),
        ("vivian", {"ref_audio": "https://example.invalid/a.wav"}, "ref_audio"),
        ("vivian", {"ref_text": "hello"}, "ref_text"),
        ("vivian", {"x_vector_only_mode": True}, "x_vector_only_mode"),
        ("vivian", {"task_type": "Base"}, "task_type"),
        ("vivian", {"language": "Klingon"}, "language"),
    ],
)
def test_options_it_cannot_honour_are_refused_by_name(
    voice: str, options: dict[str, object], field: str
) -> None:
    engine = make_engine(FakeOmni())
    asyncio.run(engine.start())
    with pytest.raises(UnsupportedOption) as info:
        engine.check(voice, options)
    assert info.value.field == field and info.value.engine == "vllm-omni"
    engine.check("Vivian", {"seed": 1, "language": "zh", "instructions": "calm", "non_streaming_mode": False})
    with pytest.raises(UnknownVoice):
        engine.check("alloy", {})


def test_each_variant_checks_its_own_options() -> None:
    base = make_engine(FakeOmni(), FakeTools(variant="Base", speakers=[]), model=BASE_MODEL)
    asyncio.run(base.start())
    base.check("reference", {"x_vector_only_mode": False, "task_type": "Base"})
    design = make_engine(FakeOmni(), FakeTools(variant="VoiceDesign", speakers=[]))
    asyncio.run(design.start())
    with pytest.raises(UnsupportedOption) as info:
        design.check(design.default_voice, {})
    assert info.value.field == "instructions"
    design.check(design.default_voice, {"instructions": "A warm, low voice."})


def test_model_names_and_languages() -> None:
    assert variant_of("Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign") == "VoiceDesign"
    assert variant_of("/models/Qwen3-TTS-12Hz-0.6B-Base/") == "Base"
    assert variant_of("custom_voice") == "CustomVoice" and variant_of("Qwen/Qwen3-8B") is None
    names = [qwen_language(v) for v in ("en-US", "zh_CN", "english", "AUTO")]
    assert names == ["English", "Chinese", "English", "Auto"]


# -- through the gateway ------------------------------------------------------------------------------


def test_the_gateway_streams_audio_from_the_engine() -> None:
    omni = FakeOmni(delta_script(chunks=4, size=2400))
    engine = make_engine(omni)
    with serve_engine(engine) as address, session(address, voice="vivian", seed=5, language="en") as ws:
        ready_engine = omni.calls == []  # nothing is generated before text arrives
        send(ws, type="input.text", text="Hello from the GPU engine.")
        send(ws, type="input.done")
        got = recv_until(ws, "session.done")
    assert ready_engine
    (start,) = got.messages("audio.start")
    assert start["sample_rate"] == RATE
    pcm = b"".join(got.frames())
    assert len(pcm) == 4 * 2400 * 2  # four chunks of s16le at the engine's rate
    (done,) = got.messages("audio.done")
    assert done["error"] is False
    (call,) = omni.calls
    assert call.params[0].seed == 5 and call.prompt["additional_information"]["language"] == ["English"]
    assert omni.shut_down  # the lifespan closed the engine


def test_a_cancel_through_the_gateway_aborts_the_request() -> None:
    omni = FakeOmni(delta_script(chunks=200, size=2400), delay_s=0.02)
    with serve_engine(make_engine(omni)) as address, session(address, voice="vivian") as ws:
        send(
            ws, type="input.text", text="A long sentence that takes a while to speak. And it goes on and on."
        )
        send(ws, type="input.done")
        recv_until(ws, "audio.start")
        # A gate, not a race: cancel only once the second sentence has been submitted ahead.
        deadline = time.monotonic() + TIMEOUT_S
        while len(omni.calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        send(ws, type="input.cancel")
        recv_until(ws, "audio.cancelled")
        while len(omni.aborted) < len(omni.calls) and time.monotonic() < deadline:
            time.sleep(0.01)
    # Two sentences: the second was submitted ahead, and both are aborted.
    assert len(omni.calls) == 2
    assert sorted(omni.aborted) == sorted(call.request_id for call in omni.calls)


def test_the_next_segment_is_submitted_while_the_first_streams() -> None:
    omni = FakeOmni(delta_script(chunks=50, size=2400), delay_s=0.02)
    with serve_engine(make_engine(omni)) as address, session(address, voice="vivian") as ws:
        send(ws, type="input.text", text="First sentence here. Second sentence follows. Third one.")
        send(ws, type="input.done")
        recv_until(ws, "audio.start")
        assert isinstance(recv(ws), bytes)
        submitted_during_first = len(omni.calls)
        recv_until(ws, "session.done")
    assert submitted_during_first == 2 and len(omni.calls) == 3


def test_engine_is_registered_and_needs_the_extra_only_when_started() -> None:
    from voxgate.engine import ENGINES
    from voxgate.engine.vllm_omni import VllmOmniSettings

    engine = ENGINES["vllm-omni"](VllmOmniSettings(vllm_model="Qwen/Qwen3-TTS-12Hz-0.6B-Base"))
    assert engine.name == "vllm-omni"


def test_a_deploy_seed_reaches_the_code_predictor_when_the_request_sets_none() -> None:
    # vllm-omni's Qwen3-TTS adapter: extra_args.setdefault("tts_local_seed", <stage-0 default seed>).
    seeded = (FakeSamplingParams(seed=5), DEFAULT_PARAMS[1])
    tools = FakeTools()

    def stream_params(*, words: bool = False) -> list[Any]:
        return list(seeded)

    tools.stream_params = stream_params  # type: ignore[method-assign]
    omni = FakeOmni()
    speak(make_engine(omni, tools), request())
    assert omni.calls[0].params[0].extra_args == {"tts_local_seed": 5}
    assert seeded[0].extra_args is None  # the shared defaults are untouched


# -- word timestamps (vllm-omni's forced-aligner stage) ---------------------------------------------------


def aligned_script(prompt: dict[str, Any]) -> list[FakeOutput]:
    """Two audio steps, then the aligner stage's output (its final output type is "timestamps")."""
    sr = FakeTensor(RATE, np.int64)
    audio = [audio_output(FakeTensor(tone(2400, i * 2400)), sr) for i in range(2)]
    return [*audio, FakeOutput(stage_id=2, final_output_type="timestamps", finished=True)]


def test_words_come_from_the_aligner_stage_with_the_audio_they_describe() -> None:
    # The aligner's words as vllm-omni segments them, in ms from the start of the segment's audio.
    tools = FakeTools(word_timestamps=True, timed=[("Dr", 0, 90), ("Smith", 90, 150), ("said", 160, 200)])
    omni = FakeOmni(aligned_script)
    chunks = speak(make_engine(omni, tools), request("Dr. Smith said.", options={"word_timestamps": True}))
    assert omni.calls[0].modalities == ["audio", "timestamps"]
    (chunk,) = chunks  # the audio was held until the aligner's output: words and audio go out together
    np.testing.assert_allclose(chunk.samples, tone(4800), atol=1e-3)
    assert chunk.words == (("Dr.", 0, 2160), ("Smith", 2160, 3600), ("said.", 3840, 4800))
    assert tools.words_asked == [("Dr. Smith said.", None)]


def test_without_word_timestamps_the_aligner_is_not_asked() -> None:
    tools = FakeTools(word_timestamps=True)
    omni = FakeOmni(delta_script())
    chunks = speak(make_engine(omni, tools), request())
    assert omni.calls[0].modalities == ["audio"] and len(chunks) == 3 and not tools.words_asked


def test_a_segment_the_aligner_could_not_time_still_plays() -> None:
    tools = FakeTools(word_timestamps=True, timed=None)  # vllm-omni's "timestamps: null"
    chunks = speak(
        make_engine(FakeOmni(aligned_script), tools), request("...", options={"word_timestamps": True})
    )
    assert [len(c.samples) for c in chunks] == [4800] and chunks[0].words == ()


def test_word_timestamps_are_accepted_only_with_the_aligner_stage() -> None:
    engine = make_engine(FakeOmni(), FakeTools(word_timestamps=True))
    asyncio.run(engine.start())
    engine.check("vivian", {"word_timestamps": True})
    plain = make_engine(FakeOmni())
    asyncio.run(plain.start())
    with pytest.raises(UnsupportedOption) as info:
        plain.check("vivian", {"word_timestamps": True})
    assert info.value.field == "word_timestamps" and "VOXGATE_VLLM_FORCED_ALIGNER" in str(info.value)
