"""engine.base.demands: explicit neutral values ask nothing of an engine."""

from __future__ import annotations

from voxgate.engine.base import demands
from voxgate.engine.fake import FakeEngine


def test_neutral_values_are_not_demands() -> None:
    options: dict[str, object] = {
        "x_vector_only_mode": False,
        "non_streaming_mode": False,
        "instructions": "",
        "seed": 0,
        "x_vector_only_mode_extra": None,
    }
    assert demands(options) == {"seed": 0, "x_vector_only_mode_extra": None}
    assert demands({"x_vector_only_mode": True}) == {"x_vector_only_mode": True}


def test_an_engine_without_the_feature_accepts_an_explicit_false() -> None:
    engine = FakeEngine()
    engine.check("tone", {"x_vector_only_mode": False, "non_streaming_mode": False, "instructions": ""})
