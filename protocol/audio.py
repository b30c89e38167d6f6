"""Audio math for the wire: resampling and encoding float32 mono into the session's format.

Formats (``response_format``):

- ``pcm``: signed 16-bit little-endian, mono.
- ``f32``: IEEE float32 little-endian, mono, in [-1, 1].
- ``mulaw``: G.711 u-law, one byte per sample (telephony; usually at 8000 Hz).
- ``wav``: a 44-byte RIFF/WAVE header, then ``pcm`` samples. Streamed, the header's size fields
  hold 0xFFFFFFFF (length unknown, the usual streaming convention); as one message per segment
  (``stream_audio: false``) each message is a complete WAV file with exact sizes.
- ``mp3``, ``opus`` (Ogg), ``aac`` (ADTS), ``flac``: compressed, by ``protocol.encoders``; streamed, one
  encoder stream per utterance; as one message per segment, each message is a complete file.
"""

from __future__ import annotations

import struct
from typing import Literal

import numpy as np
import numpy.typing as npt
import soxr

AudioFormat = Literal["pcm", "f32", "mulaw", "wav", "mp3", "opus", "aac", "flac"]
Samples = npt.NDArray[np.float32]

#: The formats of fixed-size samples (every other format is compressed: ``protocol.encoders``).
BYTES_PER_SAMPLE: dict[str, int] = {"pcm": 2, "f32": 4, "mulaw": 1, "wav": 2}
WAV_HEADER_BYTES = 44
_UNKNOWN_SIZE = 0xFFFFFFFF
# u-law constants from ITU-T G.711 / g711.c: bias 0x84 (132) and the clip level in the 14-bit domain.
_MULAW_BIAS = 0x84
_MULAW_CLIP14 = 8159


def wav_header(sample_rate: int, data_bytes: int | None = None, *, channels: int = 1) -> bytes:
    """Return a 44-byte PCM16 WAV header.

    Args:
        sample_rate: samples per second.
        data_bytes: size of the PCM data that follows, or None for a stream of unknown length.
        channels: interleaved channel count.
    """
    block_align = channels * 2
    if data_bytes is None:
        riff_size = data_size = _UNKNOWN_SIZE
    else:
        data_size = data_bytes
        riff_size = 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff_size)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block_align, block_align, 16)
        + b"data"
        + struct.pack("<I", data_size)
    )


def float_wav(samples: Samples, sample_rate: int) -> bytes:
    """A complete mono IEEE-float32 WAV file of ``samples``: the same bytes for the same clip, always.

    libsndfile's float WAV carries a ``PEAK`` chunk stamped with the time of writing, so the same clip
    written a second apart differs; a reference sent as a data URL is a cache key upstream (vllm-omni's
    reference cache and prefix-cache salt), which must not change with the clock.
    """
    data = np.ascontiguousarray(samples, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHHH", 3, 1, sample_rate, sample_rate * 4, 4, 32, 0)  # IEEE float, cbSize 0
    fact = struct.pack("<I", len(samples))
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"fact" + struct.pack("<I", 4) + fact
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def to_pcm16(samples: Samples) -> npt.NDArray[np.int16]:
    """Clip float samples to [-1, 1] and scale them to int16."""
    # The same arithmetic as ``(np.clip(x, -1, 1) * 32767).round()``, in place on one buffer: np.clip's
    # Python layers cost more than the work on a 40 ms frame.
    out = np.minimum(samples, 1.0)
    np.maximum(out, -1.0, out=out)
    np.multiply(out, 32767.0, out=out)
    np.rint(out, out=out)
    return out.astype("<i2")


def _mulaw_codes(pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.uint8]:
    """G.711 u-law codes of int16 samples, computed as the reference g711.c does."""
    v = pcm.astype(np.int32) >> 2  # 14-bit domain; arithmetic shift as in g711.c
    negative = v < 0
    magnitude = np.minimum(np.where(negative, -v, v), _MULAW_CLIP14) + (_MULAW_BIAS >> 2)
    exponent = np.floor(np.log2(magnitude)).astype(np.int32) - 5
    mantissa = (magnitude >> (exponent + 1)) & 0x0F
    code = np.where(exponent > 7, 0x7F, (exponent << 4) | mantissa)  # past the top segment: the maximum
    mask = np.where(negative, 0x7F, 0xFF)
    return (code ^ mask).astype(np.uint8)


# Every int16 sample's code, indexed by the sample's bits read as uint16: one lookup per sample instead
# of the arithmetic above (a third of the CPU of a telephony stream in bench/load.py), and the same bytes.
_MULAW_TABLE = _mulaw_codes(np.arange(65536, dtype=np.uint16).view(np.int16))


def mulaw_encode(samples: Samples) -> bytes:
    """Encode float samples as G.711 u-law bytes (bit-exact with the reference g711.c)."""
    return _MULAW_TABLE[to_pcm16(samples).view(np.uint16)].tobytes()


def mulaw_decode(data: bytes) -> Samples:
    """Decode G.711 u-law bytes to float samples (the inverse of ``mulaw_encode``, for clients and tests)."""
    u = ~np.frombuffer(data, dtype=np.uint8).astype(np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    magnitude = (((u & 0x0F) << 3) + _MULAW_BIAS) << exponent
    pcm = np.where(u & 0x80, _MULAW_BIAS - magnitude, magnitude - _MULAW_BIAS)
    return (pcm / 32768.0).astype(np.float32)


def encode(samples: Samples, fmt: AudioFormat) -> bytes:
    """Encode float32 mono samples as the payload bytes of ``fmt`` (no WAV header)."""
    if fmt == "f32":
        return np.ascontiguousarray(samples, dtype="<f4").tobytes()
    if fmt == "mulaw":
        return mulaw_encode(samples)
    return to_pcm16(samples).tobytes()


def decode(data: bytes, fmt: AudioFormat) -> Samples:
    """Decode payload bytes of ``fmt`` (no WAV header) back to float32, for clients and tests."""
    if fmt == "f32":
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    if fmt == "mulaw":
        return mulaw_decode(data)
    return (np.frombuffer(data, dtype="<i2") / 32768.0).astype(np.float32)


class Resampler:
    """Stateful sample-rate converter for one continuous stream (one segment of speech).

    soxr keeps its filter state between calls, so chunk edges do not click; ``process(...,
    last=True)`` drains the filter's delay line and ends the stream.

    Args:
        in_rate: the engine's sample rate.
        out_rate: the session's sample rate. Equal rates pass samples through untouched.
    """

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = (
            None
            if in_rate == out_rate
            else soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")
        )

    def process(self, samples: Samples, *, last: bool = False) -> Samples:
        """Resample the next chunk; pass ``last=True`` with the final chunk (it may be empty)."""
        if self._stream is None:
            return np.asarray(samples, dtype=np.float32)
        out = self._stream.resample_chunk(np.asarray(samples, dtype=np.float32), last=last)
        return np.asarray(out, dtype=np.float32)
