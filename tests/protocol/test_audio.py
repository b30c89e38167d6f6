"""Audio encoders, the WAV header and the streaming resampler."""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt
import pytest
import soundfile
from voxgate.protocol.audio import (
    BYTES_PER_SAMPLE,
    WAV_HEADER_BYTES,
    AudioFormat,
    Resampler,
    Samples,
    decode,
    encode,
    float_wav,
    mulaw_decode,
    mulaw_encode,
    to_pcm16,
    wav_header,
)

FORMATS: list[AudioFormat] = ["pcm", "f32", "mulaw", "wav"]


def f32(*values: float) -> Samples:
    return np.array(values, dtype=np.float32)


def tone(rate: int, seconds: float, hz: float = 440.0) -> Samples:
    t = np.arange(round(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t) + 0.2 * np.sin(2 * np.pi * 3 * hz * t)).astype(np.float32)


# --- WAV header -------------------------------------------------------------------------------------
# Written by hand from the RIFF/WAVE layout: "RIFF", u32 riff size (36 + data), "WAVE", "fmt ", u32 16,
# u16 format 1 (PCM), u16 channels, u32 rate, u32 byte rate, u16 block align, u16 bits 16, "data", u32
# data size; all little-endian. A stream of unknown length has 0xFFFFFFFF in both sizes.
WAV_GOLDEN = [
    (
        (16000, None, 1),
        b"RIFF"
        b"\xff\xff\xff\xff"  # RIFF size: unknown (streaming)
        b"WAVE"
        b"fmt "
        b"\x10\x00\x00\x00"  # fmt chunk size 16
        b"\x01\x00"  # PCM
        b"\x01\x00"  # 1 channel
        b"\x80\x3e\x00\x00"  # 16000 Hz
        b"\x00\x7d\x00\x00"  # 32000 bytes per second
        b"\x02\x00"  # block align 2
        b"\x10\x00"  # 16 bits
        b"data"
        b"\xff\xff\xff\xff",  # data size: unknown (streaming)
    ),
    (
        (16000, 1000, 1),
        b"RIFF"
        b"\x0c\x04\x00\x00"  # 1036 = 36 + 1000
        b"WAVE"
        b"fmt "
        b"\x10\x00\x00\x00"
        b"\x01\x00"
        b"\x01\x00"
        b"\x80\x3e\x00\x00"
        b"\x00\x7d\x00\x00"
        b"\x02\x00"
        b"\x10\x00"
        b"data"
        b"\xe8\x03\x00\x00",  # 1000
    ),
    (
        (8000, 0, 2),
        b"RIFF"
        b"\x24\x00\x00\x00"  # 36
        b"WAVE"
        b"fmt "
        b"\x10\x00\x00\x00"
        b"\x01\x00"
        b"\x02\x00"  # 2 channels
        b"\x40\x1f\x00\x00"  # 8000 Hz
        b"\x00\x7d\x00\x00"  # 32000 bytes per second
        b"\x04\x00"  # block align 4
        b"\x10\x00"
        b"data"
        b"\x00\x00\x00\x00",
    ),
]


@pytest.mark.parametrize(("args", "golden"), WAV_GOLDEN)
def test_wav_header_golden(args: tuple[int, int | None, int], golden: bytes) -> None:
    rate, data_bytes, channels = args
    assert len(golden) == WAV_HEADER_BYTES
    assert wav_header(rate, data_bytes, channels=channels) == golden


def test_wav_header_defaults_to_a_mono_stream() -> None:
    assert wav_header(16000) == WAV_GOLDEN[0][1]


def test_soundfile_reads_the_wav_we_build() -> None:
    samples = tone(22050, 0.25)
    pcm = encode(samples, "pcm")
    data, rate = soundfile.read(io.BytesIO(wav_header(22050, len(pcm)) + pcm), dtype="int16")
    assert rate == 22050
    np.testing.assert_array_equal(data, to_pcm16(samples))


def chunks_of(riff: bytes) -> list[tuple[bytes, int]]:
    """A RIFF/WAVE file's chunk ids and sizes, walked from its header."""
    assert riff[:4] == b"RIFF" and riff[8:12] == b"WAVE"
    assert int.from_bytes(riff[4:8], "little") == len(riff) - 8
    out, at = [], 12
    while at < len(riff):
        size = int.from_bytes(riff[at + 4 : at + 8], "little")
        out.append((riff[at : at + 4], size))
        at += 8 + size + size % 2
    assert at == len(riff)
    return out


def test_a_float_wav_keeps_every_sample_and_no_clock() -> None:
    samples = tone(44100, 0.2) * np.float32(2.5)  # past full scale: a float WAV keeps it
    wav = float_wav(samples, 44100)
    data, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    assert rate == 44100
    np.testing.assert_array_equal(data, samples)
    # fmt (IEEE float, 18 bytes), fact (the sample count), data; no PEAK chunk, whose timestamp would
    # make the same clip's bytes (an upstream cache key) change from one second to the next
    assert chunks_of(wav) == [(b"fmt ", 18), (b"fact", 4), (b"data", 4 * len(samples))]
    assert soundfile.info(io.BytesIO(wav)).subtype == "FLOAT"
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, 44100, format="WAV", subtype="FLOAT")
    assert b"PEAK" in [c for c, _ in chunks_of(buffer.getvalue())]  # what libsndfile would have written
    assert float_wav(samples.astype(np.float64), 44100) == wav


# --- PCM16 and f32 ----------------------------------------------------------------------------------
def test_pcm16_clips_and_rounds() -> None:
    samples = f32(
        -2.0, -1.0, -0.5, 0.0, 0.4 / 32767, 1.6 / 32767, -1.6 / 32767, 0.5, 1.0, 2.0, np.inf, -np.inf
    )
    expected = [-32767, -32767, -16384, 0, 0, 2, -2, 16384, 32767, 32767, 32767, -32767]  # x.5: half to even
    pcm = to_pcm16(samples)
    assert pcm.dtype == np.dtype("<i2")
    assert pcm.tolist() == expected


def test_pcm_bytes_are_little_endian() -> None:
    assert encode(f32(0.5, -0.5, 1.0), "pcm") == b"\x00\x40\x00\xc0\xff\x7f"
    assert encode(f32(0.5), "wav") == b"\x00\x40"  # wav payloads are pcm; the header is the packer's job


def test_pcm_round_trip_is_within_one_step() -> None:
    samples = tone(16000, 0.1)
    back = decode(encode(samples, "pcm"), "pcm")
    assert back.dtype == np.float32
    assert np.max(np.abs(back - samples)) < 2 / 32768


def test_f32_bytes_are_little_endian() -> None:
    assert encode(f32(1.0, -2.0), "f32") == b"\x00\x00\x80\x3f\x00\x00\x00\xc0"


def test_f32_round_trip_is_exact() -> None:
    samples = tone(16000, 0.1)
    back = decode(encode(samples, "f32"), "f32")
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, samples)


def test_f32_encodes_float64_and_strided_input() -> None:
    samples = np.array([0.25, 9.0, -0.75, 9.0], dtype=np.float64)[::2]
    assert encode(samples, "f32") == f32(0.25, -0.75).tobytes()  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", FORMATS)
def test_encoded_size_matches_bytes_per_sample(fmt: AudioFormat) -> None:
    samples = tone(8000, 0.01)
    assert len(encode(samples, fmt)) == len(samples) * BYTES_PER_SAMPLE[fmt]
    assert len(decode(encode(samples, fmt), fmt)) == len(samples)


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_input_encodes_to_nothing(fmt: AudioFormat) -> None:
    assert encode(np.zeros(0, dtype=np.float32), fmt) == b""
    assert len(decode(b"", fmt)) == 0


# --- G.711 u-law --------------------------------------------------------------------------------------
def reference_mulaw(pcm: int) -> int:
    """One sample of G.711 u-law, written out step by step from the recommendation's segment table."""
    value = pcm >> 2  # the 14-bit domain
    mask = 0x7F if value < 0 else 0xFF
    value = min(abs(value), 8159) + 33  # clip, then add the bias (0x84 >> 2)
    segment_ends = [0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF]
    segment = next((i for i, end in enumerate(segment_ends) if value <= end), 8)
    if segment == 8:
        return 0x7F ^ mask
    return ((segment << 4) | ((value >> (segment + 1)) & 0x0F)) ^ mask


def test_mulaw_known_values() -> None:
    assert mulaw_encode(f32(0.0, 1.0, -1.0, 2.0, -2.0)) == bytes([0xFF, 0x80, 0x00, 0x80, 0x00])
    assert mulaw_decode(bytes([0xFF, 0x7F, 0x80, 0x00])).tolist() == [0.0, 0.0, 32124 / 32768, -32124 / 32768]


def test_mulaw_encode_is_bit_exact_over_the_int16_range() -> None:
    samples = (np.arange(-32768, 32768) / 32767).astype(np.float32)
    pcm: npt.NDArray[np.int16] = to_pcm16(samples)
    expected = bytes(reference_mulaw(int(p)) for p in pcm)
    assert mulaw_encode(samples) == expected


def test_mulaw_decode_then_encode_keeps_every_code() -> None:
    codes = bytes(c for c in range(256) if c != 0x7F)  # 0x7F is "negative zero", which encodes as 0xFF
    assert mulaw_encode(mulaw_decode(codes)) == codes
    assert mulaw_encode(mulaw_decode(b"\x7f")) == b"\xff"


def test_mulaw_round_trip_error_is_small() -> None:
    samples = np.linspace(-1.0, 1.0, 100_001, dtype=np.float32)
    back = decode(encode(samples, "mulaw"), "mulaw")
    error = np.abs(back - samples)
    assert back.dtype == np.float32
    assert error.max() < 0.02  # the top segment's half step plus the clip at 32124
    loud = np.abs(samples) > 0.01
    assert np.max(error[loud] / np.abs(samples[loud])) < 0.06  # logarithmic: the error scales with level
    assert np.max(error[~loud]) < 0.0005


# --- Resampler --------------------------------------------------------------------------------------
def resample_in_chunks(resampler: Resampler, samples: Samples, sizes: list[int]) -> Samples:
    out: list[Samples] = []
    start = 0
    for size in sizes:
        out.append(resampler.process(samples[start : start + size]))
        start += size
    assert start >= len(samples)
    out.append(resampler.process(np.zeros(0, dtype=np.float32), last=True))
    return np.concatenate(out)


def test_equal_rates_pass_through() -> None:
    resampler = Resampler(24000, 24000)
    samples = tone(24000, 0.05)
    np.testing.assert_array_equal(resampler.process(samples), samples)
    np.testing.assert_array_equal(resampler.process(samples, last=True), samples)
    as_float32 = resampler.process(samples.astype(np.float64))
    assert as_float32.dtype == np.float32


def test_downsampling_one_second_yields_one_second() -> None:
    resampler = Resampler(22050, 8000)
    body = resampler.process(tone(22050, 1.0))
    tail = resampler.process(np.zeros(0, dtype=np.float32), last=True)
    assert body.dtype == tail.dtype == np.float32
    assert len(tail) > 0  # the filter's delay line is only drained by last=True
    assert abs(len(body) + len(tail) - 8000) <= 1


def test_upsampling_one_second_yields_one_second() -> None:
    out = resample_in_chunks(Resampler(16000, 48000), tone(16000, 1.0), [16000])
    assert abs(len(out) - 48000) <= 1


def test_chunked_resampling_matches_one_shot() -> None:
    samples = tone(22050, 1.0)
    one_shot = Resampler(22050, 8000).process(samples, last=True)
    sizes = np.random.default_rng(1).integers(1, 300, size=len(samples)).tolist()
    chunked = resample_in_chunks(Resampler(22050, 8000), samples, sizes)
    assert len(chunked) == len(one_shot)
    assert np.max(np.abs(chunked - one_shot)) < 1e-6


def test_resampled_tone_has_no_clicks_at_chunk_edges() -> None:
    samples = tone(22050, 1.0)
    chunked = resample_in_chunks(Resampler(22050, 8000), samples, [441] * 50)  # 20 ms chunks
    ideal = tone(8000, 1.0)
    # Away from the very start and end (filter ramp-up), the output is the same tone at the new rate.
    assert np.max(np.abs(chunked[100:-100] - ideal[100:-100])) < 1e-4
