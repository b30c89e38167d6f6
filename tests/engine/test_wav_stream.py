"""``WavStream``: a WAV read piece by piece, however the pieces split it."""

from __future__ import annotations

import io
import struct

import numpy as np
import numpy.typing as npt
import pytest
import soundfile
from hypothesis import given
from hypothesis import strategies as st
from voxgate.engine.wav_stream import MAX_RATE_HZ, MIN_RATE_HZ, WavError, WavStream
from voxgate.protocol.audio import wav_header

RATE = 24000
SIGNAL = (0.5 * np.sin(np.arange(4000) / 7.0)).astype(np.float32)


def pcm16(samples: npt.NDArray[np.float32]) -> bytes:
    data: bytes = (samples * 32767).astype("<i2").tobytes()
    return data


def whole(samples: npt.NDArray[np.float32], subtype: str, rate: int = RATE, channels: int = 1) -> bytes:
    out = io.BytesIO()
    data = np.repeat(samples[:, None], channels, axis=1) if channels > 1 else samples
    soundfile.write(out, data, rate, format="WAV", subtype=subtype)
    return out.getvalue()


def read(data: bytes, cuts: list[int]) -> tuple[npt.NDArray[np.float32], int | None]:
    wav, pieces, start = WavStream(), [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        pieces.append(wav.feed(data[start:cut]))
        start = cut
    return np.concatenate(pieces), wav.sample_rate


@given(st.lists(st.integers(0, 9000), max_size=12))
def test_a_streamed_wav_reads_the_same_however_it_is_cut(cuts: list[int]) -> None:
    data = wav_header(RATE) + pcm16(SIGNAL)  # placeholder sizes, as vllm-omni streams it
    samples, rate = read(data, cuts)
    assert rate == RATE
    np.testing.assert_allclose(samples, SIGNAL, atol=2 / 32767)


@pytest.mark.parametrize(("subtype", "channels"), [("PCM_16", 1), ("FLOAT", 1), ("PCM_16", 2)])
def test_whole_files_of_each_supported_kind(subtype: str, channels: int) -> None:
    samples, rate = read(whole(SIGNAL, subtype, 16000, channels), [7, 45, 46, 1001])
    assert rate == 16000
    np.testing.assert_allclose(samples, SIGNAL, atol=2 / 32767)


def test_a_true_data_size_ends_the_samples_even_if_bytes_follow() -> None:
    data = wav_header(RATE, 200) + pcm16(SIGNAL)[:200] + b"LIST\x04\x00\x00\x00abcd"
    samples, _ = read(data, [])
    assert len(samples) == 100


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"<html><body>Bad Gateway</body></html>", "not a WAV"),
        (whole(SIGNAL, "PCM_24"), "unsupported WAV format"),
        (b"RIFF\xff\xff\xff\xffWAVEdata\x00\x00\x00\x00", "before its fmt"),
        (b"RIFF\xff\xff\xff\xffWAVEfmt \x04\x00\x00\x00abcd", "too short"),
        (b"RIFF\xff\xff\xff\xffWAVEjunk\xff\xff\x00\x00" + bytes(70000), "did not end"),
    ],
)
def test_what_is_not_a_pcm_wav_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        WavStream().feed(data)


def test_nothing_comes_out_until_the_header_is_complete() -> None:
    wav = WavStream()
    assert len(wav.feed(wav_header(RATE)[:30])) == 0 and wav.sample_rate is None
    assert len(wav.feed(wav_header(RATE)[30:] + b"\x01")) == 0  # half a sample
    assert len(wav.feed(b"\x00")) == 1


@pytest.mark.parametrize(
    ("rate", "channels", "why"),
    [
        (1, 1, "sample rate 1 Hz"),  # 0.3 s at 24 kHz read as 2 hours of noise
        (MIN_RATE_HZ - 1, 1, "sample rate"),
        (MAX_RATE_HZ + 1, 1, "sample rate"),
        (2_000_000_000, 1, "sample rate 2000000000 Hz"),  # resampled to silence
        (RATE, 9, "9 channels"),
        (RATE, 0, "0 channels"),
    ],
)
def test_a_rate_or_layout_nobody_can_play_is_refused(rate: int, channels: int, why: str) -> None:
    block = channels * 2
    fmt = struct.pack("<HHIIHH", 1, channels, rate, (rate * block) & 0xFFFFFFFF, block, 16)
    header = b"RIFF\xff\xff\xff\xffWAVEfmt \x10\x00\x00\x00" + fmt + b"data\xff\xff\xff\xff"
    with pytest.raises(WavError, match=why):
        WavStream().feed(header + bytes(100))


@pytest.mark.parametrize("rate", [MIN_RATE_HZ, MAX_RATE_HZ])
def test_the_bounds_themselves_are_playable(rate: int) -> None:
    samples, got = read(wav_header(rate) + pcm16(SIGNAL), [])
    assert got == rate and len(samples) == len(SIGNAL)


def test_done_once_the_stated_data_has_come() -> None:
    wav = WavStream()
    wav.feed(wav_header(RATE, 200) + pcm16(SIGNAL)[:100])
    assert not wav.done
    wav.feed(pcm16(SIGNAL)[100:200])
    assert wav.done
    streamed = WavStream()
    streamed.feed(wav_header(RATE) + pcm16(SIGNAL))
    assert not streamed.done  # a streamed WAV ends when its body does
