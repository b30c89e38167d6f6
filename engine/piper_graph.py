"""Piper's ONNX graph as the engine runs it: phoneme durations exposed, convolutions on 2-D kernels."""

from __future__ import annotations

import contextlib
import importlib.util
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

# Word timings need the model's phoneme durations, which Piper exposes by editing the ONNX graph with the
# ``onnx`` package (in the ``piper`` extra): one model serves both, at no cost to requests without them.
ALIGNABLE = importlib.util.find_spec("onnx") is not None


def load_model(path: str) -> str | bytes:
    """The model to load: the voice's, with its phoneme durations exposed and its 1-D convolutions made 2-D.

    Both need the ``onnx`` package (the ``piper`` extra); without it, the voice's file as it is.

    - The durations (``Ceil`` of the duration predictor) are computed anyway; exposing them leaves the
      audio bit for bit the same, so every request runs this one model (``bench/piper_alignment.py``).
    - ``lift_convolutions``: the same convolutions, on ONNX Runtime's faster NCHWc kernels
      (``bench/piper_cpu.py``).

    Patching parses and re-serializes the graph (about a second): build it once and create every ONNX
    Runtime session of the engine from the same bytes.
    """
    if not ALIGNABLE:
        return path
    import onnx
    from piper.patch_voice_with_alignment import add_alignment_output

    model = onnx.load(path)
    with contextlib.suppress(ValueError):  # ValueError: the file already exposes them
        add_alignment_output(model)
    lift_convolutions(model)
    return bytes(model.SerializeToString())


# Parts of the VITS graph whose convolutions run on 2-D kernels: the flow (at the frame rate, 86 a second)
# and the HiFi-GAN decoder (up to the sample rate), nearly all of the work. The duration predictor and the
# text encoder run once per phoneme; they keep their 1-D convolutions, and so their exact numbers (the
# durations are rounded up: a difference in the last bit could change a phoneme's length by a frame).
_LIFTED_PARTS = ("/dec/", "/flow/")
# Elementwise operators carried out on the 2-D tensors between lifted convolutions (no squeeze between).
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "LeakyRelu", "Relu", "Tanh"})


def lift_convolutions(model: onnx.ModelProto, parts: tuple[str, ...] = _LIFTED_PARTS) -> int:
    """Rewrite ``model``'s 1-D ``Conv``/``ConvTranspose`` nodes in ``parts`` as 2-D ones of height 1.

    The arithmetic is the same: weights ``[O, I, K]`` become ``[O, I, 1, K]``, the input gains an axis of
    size 1 (``Unsqueeze``) and the output loses it again (``Squeeze``) only where a consumer needs the
    3-D tensor; elementwise operators with only 4-D or scalar inputs between two lifted convolutions run
    on the 4-D tensors. ONNX Runtime's layout optimizer then runs the 2-D convolutions on its NCHWc
    kernels, which it never does for 1-D ones: measured on this voice, about 10% less CPU per second of
    audio (``bench/piper_cpu.py``), the samples within about 1e-4 of the 1-D graph's (the order of the
    sums differs). Returns the number of convolutions lifted.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    axis = "voxgate_lift_axis"
    added = [numpy_helper.from_array(np.array([2], dtype=np.int64), axis)]
    made = {axis}
    wide: dict[str, str] = {}  # 3-D tensor -> its 4-D twin
    produced: set[str] = set()  # tensors only a lifted node makes (their 3-D name needs a Squeeze)
    squeezed: set[str] = set()
    nodes: list[onnx.NodeProto] = []
    lifted = 0

    def scalar(name: str) -> bool:
        tensor = weights.get(name)
        return tensor is not None and math.prod(tensor.dims) <= 1

    def four_d(name: str) -> str:
        if name not in wide:
            wide[name] = f"{name}__4d"
            nodes.append(helper.make_node("Unsqueeze", [name, axis], [wide[name]]))
        return wide[name]

    def flat(name: str) -> None:
        if name in produced and name not in squeezed:
            nodes.append(helper.make_node("Squeeze", [wide[name], axis], [name]))
            squeezed.add(name)

    for node in graph.node:
        weight = weights.get(node.input[1]) if len(node.input) > 1 else None
        if (
            node.op_type in ("Conv", "ConvTranspose")
            and node.name.startswith(parts)
            and weight is not None
            and len(weight.dims) == 3
            and all(a.name != "output_shape" for a in node.attribute)
        ):
            name = f"{weight.name}__4d"
            if name not in made:
                added.append(numpy_helper.from_array(numpy_helper.to_array(weight)[:, :, None, :], name))
                made.add(name)
            lift = helper.make_node(
                node.op_type,
                [four_d(node.input[0]), name, *node.input[2:]],
                [f"{node.output[0]}__4d"],
                node.name,
            )
            for attribute in node.attribute:
                value = helper.get_attribute_value(attribute)
                if attribute.name in ("kernel_shape", "strides", "dilations", "output_padding"):
                    value = [1, *value]
                elif attribute.name == "pads":
                    value = [0, value[0], 0, value[1]]
                lift.attribute.append(helper.make_attribute(attribute.name, value))
            lifted += 1
        elif (
            node.op_type in _ELEMENTWISE
            and any(i in produced for i in node.input)
            and all(i in produced or scalar(i) for i in node.input)
        ):
            lift = helper.make_node(
                node.op_type,
                [wide[i] if i in produced else i for i in node.input],
                [f"{node.output[0]}__4d"],
                node.name,
            )
            lift.attribute.extend(node.attribute)
        else:
            for name in node.input:
                flat(name)
            nodes.append(node)
            continue
        nodes.append(lift)
        wide[node.output[0]] = lift.output[0]
        produced.add(node.output[0])
    for output in graph.output:
        flat(output.name)
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input} | {i.name for i in graph.input}
    kept = [t for t in graph.initializer if t.name in used] + added
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return lifted
