"""``WavStream`` against an upstream whose WAV changes or ends early mid-stream (issue 35 L5).

A second WAV header in the data of a streamed answer (an upstream that concatenates WAV files, or
switches model mid-answer) was played as samples: 44 bytes of noise when its format was the same, and the
rest of the answer at the wrong rate (noise) when it was not. A body that ended before the size its header
states looked complete. Now a header of the same format is skipped, one of another format is a
``WavError``, and ``finish`` says whether the data the header promised all came.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from voxgate.engine.wav_stream import WavError, WavStream
from voxgate.protocol.audio import wav_header

from tests.engine.test_wav_stream import RATE, SIGNAL, pcm16


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def read(data: bytes, cuts: list[int]) -> npt.NDArray[np.float32]:
    wav = WavStream()
    out = [wav.feed(piece) for piece in pieces(data, cuts)]
    out.append(wav.finish())
    return np.concatenate(out)


HALF = len(SIGNAL) // 2
SAME = wav_header(RATE) + pcm16(SIGNAL[:HALF]) + wav_header(RATE) + pcm16(SIGNAL[HALF:])


@given(st.lists(st.integers(0, len(SAME)), max_size=6))
def test_a_second_header_of_the_same_format_is_skipped_however_the_pieces_cut_it(cuts: list[int]) -> None:
    np.testing.assert_allclose(read(SAME, cuts), pcm16_round_trip(SIGNAL), atol=1e-6)


def pcm16_round_trip(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return np.frombuffer(pcm16(samples), "<i2").astype(np.float32) * np.float32(1 / 32768)


@given(st.lists(st.integers(0, 2 * len(SIGNAL) + 88), max_size=6))
def test_a_rate_change_mid_stream_is_refused_however_the_pieces_cut_it(cuts: list[int]) -> None:
    data = wav_header(RATE) + pcm16(SIGNAL) + wav_header(16000) + pcm16(SIGNAL)
    wav = WavStream()
    with pytest.raises(WavError, match="changed mid-stream: 24000 Hz, 1 channel"):
        for piece in pieces(data, cuts):
            wav.feed(piece)
        wav.finish()


def test_a_body_shorter_than_its_stated_size_is_refused_at_its_end() -> None:
    data = pcm16(SIGNAL)
    wav = WavStream()
    got = wav.feed(wav_header(RATE, len(data)) + data[:-1000])
    assert len(got) == (len(data) - 1000) // 2
    with pytest.raises(WavError, match="ended 1000 bytes before"):
        wav.finish()


def test_a_streamed_wav_and_a_complete_sized_one_finish_cleanly() -> None:
    data = pcm16(SIGNAL)
    streamed, sized = WavStream(), WavStream()
    streamed.feed(wav_header(RATE) + data + b"\x01")  # a streamed one ends where its body ends
    sized.feed(wav_header(RATE, len(data)) + data)
    assert len(streamed.finish()) == 0 and len(sized.finish()) == 0


def test_a_body_that_ends_inside_its_header_is_refused() -> None:
    wav = WavStream()
    wav.feed(wav_header(RATE)[:30])
    with pytest.raises(WavError, match="no WAV header"):
        wav.finish()
