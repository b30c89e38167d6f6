"""Joins without clicks: every segment's first and last milliseconds are faded, however it is chunked."""

from __future__ import annotations

import numpy as np
import pytest
from voxgate.protocol.core import Core
from voxgate.protocol.events import SegmentReady, UtteranceEnded, UtteranceStarted
from voxgate.protocol.joins import FADE_S, Fader, fade
from voxgate.protocol.output import Audio, OutputFormat

RATE = 16000
N = round(FADE_S * RATE)


def test_fade_ramps_both_ends_and_keeps_the_middle() -> None:
    loud = np.full(RATE // 10, 0.8, dtype=np.float32)
    out = fade(loud, RATE)
    assert len(out) == len(loud) and out.dtype == np.float32
    assert abs(out[0]) < 0.01 and abs(out[-1]) < 0.01  # no step from silence, none back to it
    assert np.all(np.diff(out[:N]) > 0) and np.all(np.diff(out[-N:]) < 0)  # a smooth ramp each way
    assert np.array_equal(out[N:-N], loud[N:-N])
    assert np.array_equal(loud, np.full(RATE // 10, 0.8, dtype=np.float32))  # a copy: the input is kept
    short = fade(np.ones(10, dtype=np.float32), RATE)  # shorter than a ramp: both ends in one
    assert len(short) == 10 and short.max() < 1.0
    assert len(fade(np.zeros(0, dtype=np.float32), RATE)) == 0


@pytest.mark.parametrize("sizes", [[1600], [1, 2, 3, 1594], [63, 64, 1473], [30, 0, 30, 1540], [10, 10]])
def test_a_fader_over_any_chunks_is_the_fade_of_the_whole(sizes: list[int]) -> None:
    rng = np.random.default_rng(7)
    whole = rng.uniform(-0.9, 0.9, sum(sizes)).astype(np.float32)
    fader = Fader(RATE)
    out, at = [], 0
    for size in sizes:
        out.append(fader.push(whole[at : at + size]))
        at += size
    out.append(fader.end())
    assert np.allclose(np.concatenate(out), fade(whole, RATE))
    assert len(fader.end()) == 0  # ended: nothing held


def test_every_segment_of_every_engine_starts_and_ends_without_a_step() -> None:
    core = Core(OutputFormat("f32", RATE, frame_ms=20))
    core.receive(UtteranceStarted(0), 0.0)
    core.receive(SegmentReady(0, 0, "One."), 0.0)
    core.receive(SegmentReady(0, 1, "Two."), 0.0)
    core.receive(UtteranceEnded(0, 2), 0.0)
    samples: list[np.ndarray] = []
    for sentence, level in ((0, 0.9), (1, -0.6)):  # chunks that start and stop mid-sound
        core.segment_started(0, sentence)
        for _ in range(3):
            core.audio(0, sentence, np.full(1000, level, dtype=np.float32), RATE)
        core.segment_done(0, sentence, synthesis_s=0.1)
        frames = [o for o in core.data_to_send() if isinstance(o, Audio)]
        samples.append(np.frombuffer(b"".join(f.data for f in frames), dtype=np.float32))
    first, second = samples
    assert len(first) == len(second) == 3000  # nothing lost, nothing added
    assert abs(first[0]) < 0.02 and abs(first[-1]) < 0.02 and abs(second[0]) < 0.02
    joined = np.concatenate(samples)
    # No step at the joins: at most the raised cosine's steepest (pi/2 of the level per ramp), not 0.9.
    assert np.abs(np.diff(joined)).max() < 1.6 * 0.9 / N
