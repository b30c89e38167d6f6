"""Streaming compressed audio for the wire: mp3, Ogg Opus, AAC in ADTS and FLAC, from float32 mono.

Containers (each is what its media type names, and each concatenation of outputs is a valid file):

- ``mp3`` (``audio/mpeg``): bare MPEG-1/2/2.5 Layer III frames as LAME makes them; no ID3 tag and no
  Xing/LAME frame, so players do not trim the encoder's priming.
- ``opus`` (``audio/ogg``): an Ogg Opus stream (RFC 7845): a BOS page with ``OpusHead``, a page with
  ``OpusTags``, then audio pages, 20 ms Opus packets; granule positions count 48 kHz samples, pre-skip
  included; the EOS page's granule trims the padding of the last packet.
- ``aac`` (``audio/aac``): AAC-LC raw data blocks, each behind a 7-byte ADTS header (no CRC).
- ``flac`` (``audio/flac``): ``fLaC``, one STREAMINFO block (total samples 0 and MD5 zero: unknown, as
  for any stream), then FLAC frames.

Why the framing is written here and not by a muxer: a stream must leave as soon as its packets exist.
FFmpeg's Ogg muxer holds packets until a page covers ``page_duration`` (1 s by default); its mp3 and FLAC
muxers write a header meant to be rewritten at the end (ID3 + Xing frame, STREAMINFO), seeking back when
the output allows it; ADTS needs nothing but the 7 bytes written here. So PyAV is used as a codec library
only: frames in, packets out, and each ``encode()`` returns every packet the codec has given.

Measured with FFmpeg 8.1.2 (PyAV 18.1) at 24 kHz. *Delay*: the codec's own priming / look-ahead, the
samples a decoder's output has before the input's first sample (Ogg Opus decoders drop them: pre-skip).
*Latency*: input fed but not yet decodable, delay included, when 40 ms chunks come in (the range over a
stream). *CPU*: 60 s of a speech-like signal (harmonics of a gliding pitch, 4 Hz syllables, pauses) in
40 ms chunks, ``time.process_time`` per audio second, best of 3, one Xeon core:

======  ==============  =================  ==============  ========  ====================
format  frame           delay              latency         CPU       default bit rate
======  ==============  =================  ==============  ========  ====================
mp3     576 (24 ms)     1105 (46.0 ms)     118 - 134 ms    5.9 ms    64 kbit/s
opus    480 (20 ms)     156 (6.5 ms)       6.5 ms          7.3 ms    32 kbit/s
aac     1024 (42.7 ms)  1024 (42.7 ms)     85 - 125 ms     3.7 ms    64 kbit/s
flac    2304 (96 ms)    0                  0 - 88 ms       0.5 ms    lossless, ~100 kbit/s
======  ==============  =================  ==============  ========  ====================

mp3's delay is 1105 samples at every rate (LAME's 576 plus the decoder's 529); AAC's is one frame; Opus'
is 6.5 ms at every rate; mp3 frames are 1152 samples from 32 kHz up, FLAC's grow with the rate.
"""

from __future__ import annotations

import struct
import zlib
from fractions import Fraction
from typing import Literal, Protocol, get_args

import av
import numpy as np
from av.audio.codeccontext import AudioCodecContext

from .audio import Samples, to_pcm16

CompressedFormat = Literal["mp3", "opus", "aac", "flac"]
#: The formats ``StreamEncoder`` makes.
COMPRESSED_FORMATS: frozenset[str] = frozenset(get_args(CompressedFormat))
#: The ``Content-Type`` of each format's stream.
MEDIA_TYPES: dict[str, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
}

# The session's rate range (messages.py); FLAC takes any rate in it.
MIN_RATE_HZ = 8000
MAX_RATE_HZ = 48000
# ISO/IEC 14496-3 table 1.18, the ADTS sampling_frequency_index of each AAC rate in the session's range.
_AAC_RATE_INDEX = {48000: 3, 44100: 4, 32000: 5, 24000: 6, 22050: 7, 16000: 8, 12000: 9, 11025: 10, 8000: 11}
_RATES: dict[str, frozenset[int] | None] = {
    # MPEG-1, MPEG-2 and MPEG-2.5 Layer III rates.
    "mp3": frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000}),
    # The rates libopus encodes; any other needs resampling first.
    "opus": frozenset({8000, 12000, 16000, 24000, 48000}),
    "aac": frozenset(_AAC_RATE_INDEX),
    "flac": None,
}
_CODECS: dict[str, Literal["libmp3lame", "libopus", "aac", "flac"]] = {
    "mp3": "libmp3lame",
    "opus": "libopus",
    "aac": "aac",
    "flac": "flac",
}
# Planar and packed float are the same layout for mono; FLAC wants integers, 16 bits as our pcm.
_SAMPLE_FORMATS: dict[str, str] = {"mp3": "fltp", "opus": "flt", "aac": "fltp", "flac": "s16"}
# FFmpeg's initial_padding for these two, which PyAV does not expose before the first packet (its pts is
# minus this): libmp3lame.c adds LAME's encoder delay (576) and the decoder's 528 + 1; aacenc.c primes
# one frame. The tests check both against the decoded output.
_MP3_DELAY_SAMPLES = 1105
_AAC_DELAY_SAMPLES = 1024
# Opus always runs at 48 kHz inside; Ogg granules and OpusHead's pre-skip count 48 kHz samples.
_OPUS_RATE_HZ = 48000
_OPTIONS: dict[str, dict[str, str]] = {
    # 20 ms packets: libopus' default and the usual speech frame; a page per encode() call carries them.
    "opus": {"frame_duration": "20"},
    # FFmpeg's default "twoloop" coder costs 25 ms of CPU per audio second at 24 kHz; "fast" costs 3.7 ms
    # and measured a higher SNR on speech (31 dB against 23 dB at 64 kbit/s).
    "aac": {"aac_coder": "fast"},
}
# RFC 7587 3.1.1 puts fullband speech at 28-40 kbit/s; 32 kbit/s is a twelfth of 16-bit pcm at 24 kHz.
_OPUS_BITRATE = 32_000
#: libopus takes at most 256 kbit/s per channel (``OPUS_SET_BITRATE``); a higher request opens no encoder.
_OPUS_MAX_BITRATE = 256_000
_AAC_BITRATE = 64_000
# AAC carries at most 6144 bits per channel per 1024-sample frame; FFmpeg clamps (and warns) above it.
_AAC_MAX_BITS_PER_FRAME = 6144
_OGG_SERIAL = 0x76786761  # "vxga"; a chained stream (several in one body) needs a distinct one each
_OGG_PAGE = struct.Struct("<4sBBqIIIB")  # capture, version, flags, granule, serial, sequence, CRC, segments
_OGG_CRC_OFFSET = 22
_OGG_BOS, _OGG_EOS = 0x02, 0x04
# One page holds at most 255 lacing values; a 20 ms Opus packet (at most 1275 bytes) needs at most 6, so
# packets never span pages here.
_OGG_MAX_SEGMENTS = 255
_OPUS_HEAD = struct.Struct("<8sBBHIhB")  # magic, version, channels, pre-skip, input rate, gain, mapping
_OPUS_VENDOR = b"voxgate"
_ADTS_HEADER_BYTES = 7
_FLAC_STREAMINFO_BYTES = 34
_BITREVERSE = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def supported_rates(fmt: str) -> frozenset[int] | None:
    """The sample rates ``fmt`` encodes.

    Args:
        fmt: one of ``COMPRESSED_FORMATS``.

    Returns:
        The rates, or None when any rate from ``MIN_RATE_HZ`` to ``MAX_RATE_HZ`` will do (FLAC).

    Raises:
        ValueError: ``fmt`` is not a compressed format.
    """
    if fmt not in _RATES:
        raise ValueError(f"unknown compressed format {fmt!r}; expected one of {', '.join(sorted(_RATES))}")
    return _RATES[fmt]


def check_rate(fmt: str, rate: int) -> None:
    """Refuse a rate ``fmt`` cannot encode; call it when a session picks its format, before any audio.

    Args:
        fmt: one of ``COMPRESSED_FORMATS``.
        rate: the output sample rate in Hz.

    Raises:
        ValueError: the format is unknown or does not take ``rate``; the message names the rates it takes.
    """
    rates = supported_rates(fmt)
    if rates is None:
        if not MIN_RATE_HZ <= rate <= MAX_RATE_HZ:
            raise ValueError(
                f"{fmt} takes any sample rate from {MIN_RATE_HZ} to {MAX_RATE_HZ} Hz, not {rate}"
            )
    elif rate not in rates:
        raise ValueError(f"{fmt} takes sample rates {', '.join(map(str, sorted(rates)))} Hz, not {rate}")


def effective_bitrate(fmt: str, rate: int, requested: int | None) -> int | None:
    """The bit rate a session's audio is encoded at: ``requested`` or the default for the lossy formats,
    None for FLAC and the uncompressed formats (they have none to set). Opus takes at most 256 kbit/s
    (libopus' mono maximum): a higher request is encoded, and reported, at that."""
    if fmt not in COMPRESSED_FORMATS or fmt == "flac":
        return None
    if fmt == "opus":
        return min(requested or _OPUS_BITRATE, _OPUS_MAX_BITRATE)
    return requested or default_bitrate(fmt, rate)


def default_bitrate(fmt: str, rate: int) -> int | None:
    """The bit rate ``StreamEncoder`` uses when none is given: None for FLAC (lossless).

    Args:
        fmt: one of ``COMPRESSED_FORMATS``.
        rate: the sample rate in Hz.
    """
    if fmt == "opus":
        return _OPUS_BITRATE
    if fmt == "aac":
        return min(_AAC_BITRATE, _AAC_MAX_BITS_PER_FRAME * rate // 1024)
    if fmt == "mp3":
        # One bit rate per MPEG-2.5 / MPEG-2 / MPEG-1 rate tier: 2.7 to 4 bits per sample, ample for speech.
        return 32_000 if rate <= 12000 else 64_000 if rate <= 24000 else 128_000
    return None


def _ogg_crc(data: bytes | bytearray) -> int:
    """The CRC-32 of an Ogg page (RFC 3533): polynomial 0x04C11DB7, initial value 0, no reflection.

    zlib's CRC-32 is the same polynomial, bit-reflected, with initial value and final XOR ~0: fed
    bit-reversed bytes from a zero register, its bit-reversed register is the Ogg CRC, at C speed.

    Args:
        data: the page with its CRC field zeroed.
    """
    register = zlib.crc32(data.translate(_BITREVERSE), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{register:032b}"[::-1], 2)


def _ogg_page(packets: list[bytes], *, granule: int, serial: int, sequence: int, flags: int = 0) -> bytes:
    """One Ogg page holding whole ``packets`` (at most 255 lacing values in all).

    Args:
        packets: the packets that end on this page.
        granule: the codec's position after the last packet; -1 when none ends here.
        serial: the logical stream's serial number.
        sequence: the page's number in the stream, from 0.
        flags: ``0x02`` on the first page (BOS), ``0x04`` on the last (EOS).
    """
    lacing = bytearray()
    for packet in packets:
        lacing += b"\xff" * (len(packet) // 255) + bytes((len(packet) % 255,))
    page = bytearray(_OGG_PAGE.pack(b"OggS", 0, flags, granule, serial, sequence, 0, len(lacing)))
    page += lacing
    page += b"".join(packets)
    struct.pack_into("<I", page, _OGG_CRC_OFFSET, _ogg_crc(page))
    return bytes(page)


def _adts_header(payload_bytes: int, rate: int) -> bytes:
    """The 7-byte ADTS header (MPEG-4, AAC-LC, mono, no CRC) of one AAC frame.

    Args:
        payload_bytes: the raw AAC frame's size.
        rate: the sample rate, one of ``supported_rates("aac")``.
    """
    frame_bytes = _ADTS_HEADER_BYTES + payload_bytes
    bits = (
        0xFFF << 44  # syncword; ID 0 (MPEG-4), layer 0
        | 1 << 40  # protection_absent: no CRC
        | 1 << 38  # profile: object type 2 (AAC-LC) minus 1
        | _AAC_RATE_INDEX[rate] << 34
        | 1 << 30  # channel_configuration: mono
        | frame_bytes << 13
        | 0x7FF << 2  # buffer fullness: variable bit rate; one raw data block
    )
    return bits.to_bytes(_ADTS_HEADER_BYTES, "big")


class _Framing(Protocol):
    """A container's framing: its head, then packets as they come out of the codec."""

    def head(self) -> bytes: ...

    def wrap(self, packets: list[bytes], end_samples: int | None) -> bytes: ...


class _Bare:
    """Packets back to back behind a fixed head: mp3 (no head) and FLAC (``fLaC`` + STREAMINFO)."""

    def __init__(self, head: bytes) -> None:
        self._head = head

    def head(self) -> bytes:
        return self._head

    def wrap(self, packets: list[bytes], end_samples: int | None) -> bytes:
        return b"".join(packets)


class _Adts:
    """Each AAC frame behind its ADTS header."""

    def __init__(self, rate: int) -> None:
        self._rate = rate

    def head(self) -> bytes:
        return b""

    def wrap(self, packets: list[bytes], end_samples: int | None) -> bytes:
        return b"".join(_adts_header(len(packet), self._rate) + packet for packet in packets)


class _OggOpus:
    """Ogg pages of Opus packets: every call's packets leave at once, on as few pages as fit."""

    def __init__(self, pre_skip: int, rate: int, packet_samples: int, serial: int) -> None:
        self._pre_skip = pre_skip
        self._rate = rate
        self._scale = _OPUS_RATE_HZ // rate
        self._packet_granules = packet_samples * self._scale
        self._serial = serial
        self._sequence = 0
        self._granule = 0

    def head(self) -> bytes:
        opus_head = _OPUS_HEAD.pack(b"OpusHead", 1, 1, self._pre_skip, self._rate, 0, 0)
        opus_tags = b"OpusTags" + struct.pack("<I", len(_OPUS_VENDOR)) + _OPUS_VENDOR + struct.pack("<I", 0)
        return self._page([opus_head], 0, _OGG_BOS) + self._page([opus_tags], 0, 0)

    def wrap(self, packets: list[bytes], end_samples: int | None) -> bytes:
        pages: list[bytes] = []
        group: list[bytes] = []
        segments = 0
        for packet in packets:
            needed = len(packet) // 255 + 1
            if segments + needed > _OGG_MAX_SEGMENTS:
                pages.append(self._page(group, self._granule, 0))
                group, segments = [], 0
            group.append(packet)
            segments += needed
            self._granule += self._packet_granules
        if end_samples is not None:
            # The EOS page's granule says where the input ended: decoders drop the last packet's padding.
            # An empty stream's EOS page ends no packet: granule -1.
            granule = self._pre_skip + end_samples * self._scale if group else -1
            pages.append(self._page(group, granule, _OGG_EOS))
        elif group:
            pages.append(self._page(group, self._granule, 0))
        return b"".join(pages)

    def _page(self, packets: list[bytes], granule: int, flags: int) -> bytes:
        page = _ogg_page(packets, granule=granule, serial=self._serial, sequence=self._sequence, flags=flags)
        self._sequence += 1
        return page


def _opus_pre_skip(extradata: bytes | None) -> int:
    """The pre-skip libopus wrote into its ``OpusHead`` (the codec's extradata), in 48 kHz samples."""
    if extradata is None or not extradata.startswith(b"OpusHead"):
        raise RuntimeError(f"libopus gave no OpusHead: {extradata!r}")
    pre_skip: int = _OPUS_HEAD.unpack_from(extradata)[3]
    return pre_skip


def _flac_head(extradata: bytes | None) -> bytes:
    """``fLaC`` and the last metadata block, STREAMINFO: the FLAC encoder's extradata when it opens."""
    if extradata is None or len(extradata) != _FLAC_STREAMINFO_BYTES:
        raise RuntimeError(f"the FLAC encoder gave no STREAMINFO: {extradata!r}")
    return b"fLaC" + bytes((0x80,)) + _FLAC_STREAMINFO_BYTES.to_bytes(3, "big") + extradata


def _open_codec(fmt: str, rate: int, bitrate: int | None) -> AudioCodecContext:
    codec = av.CodecContext.create(_CODECS[fmt], "w")
    codec.sample_rate = rate
    codec.layout = "mono"
    codec.format = _SAMPLE_FORMATS[fmt]
    codec.time_base = Fraction(1, rate)
    if fmt != "flac":
        codec.bit_rate = effective_bitrate(fmt, rate, bitrate)
    codec.options = _OPTIONS.get(fmt, {})
    codec.open()
    return codec


class StreamEncoder:
    """Encodes one continuous stream (one file) of float32 mono samples, chunk by chunk.

    Samples may come in any chunk size, 0 and 1 included: they wait in a buffer until a codec frame is
    full, and only full frames reach the codec, the last partial one at ``finish()`` (every codec here
    takes a short last frame). Each ``encode()`` returns every byte complete so far, head first, so the
    concatenation of all ``encode()`` results and ``finish()`` is one valid file.

    Args:
        fmt: one of ``COMPRESSED_FORMATS``.
        sample_rate: the input's rate in Hz; ``check_rate(fmt, sample_rate)`` must accept it.
        bitrate: bits per second; None takes ``default_bitrate(fmt, sample_rate)``. FLAC ignores it.
        serial: the Ogg serial number (Opus only); streams chained in one body need distinct ones.

    Attributes:
        delay_samples: the codec's own delay (priming, look-ahead) at ``sample_rate``: a decoder's output
            starts this many samples before the input's first, except Ogg Opus, where decoders drop
            them (pre-skip).
        frame_samples: the codec's frame: input waits in the buffer until this many samples are there.

    Raises:
        ValueError: an unknown format, or a rate it does not take.
    """

    def __init__(
        self,
        fmt: CompressedFormat,
        sample_rate: int,
        bitrate: int | None = None,
        *,
        serial: int = _OGG_SERIAL,
    ) -> None:
        check_rate(fmt, sample_rate)
        self.fmt: CompressedFormat = fmt
        self.sample_rate = sample_rate
        self._codec = _open_codec(fmt, sample_rate, bitrate)
        self.frame_samples = self._codec.frame_size
        self._framing: _Framing
        if fmt == "opus":
            pre_skip = _opus_pre_skip(self._codec.extradata)
            self.delay_samples = pre_skip * sample_rate // _OPUS_RATE_HZ
            self._framing = _OggOpus(pre_skip, sample_rate, self.frame_samples, serial)
        elif fmt == "aac":
            self.delay_samples = _AAC_DELAY_SAMPLES
            self._framing = _Adts(sample_rate)
        elif fmt == "flac":
            self.delay_samples = 0
            self._framing = _Bare(_flac_head(self._codec.extradata))
        else:
            self.delay_samples = _MP3_DELAY_SAMPLES
            self._framing = _Bare(b"")
        self._head = self._framing.head()
        self._pending: Samples = np.zeros(0, dtype=np.float32)
        self._samples_in = 0
        self._samples_coded = 0  # the next frame's pts
        self._finished = False

    def encode(self, samples: Samples) -> bytes:
        """Add the next chunk of samples; call it as audio arrives.

        Args:
            samples: mono float32 samples, clipped to [-1, 1] here; any length, 0 included.

        Returns:
            Every byte complete so far and not returned before (the head with the first call); b"" while
            a frame fills or the codec holds its look-ahead.

        Raises:
            ValueError: ``samples`` is not one-dimensional.
            RuntimeError: the stream is finished.
        """
        self._check_open()
        chunk = np.asarray(samples, dtype=np.float32)
        if chunk.ndim != 1:
            raise ValueError(f"mono samples only: expected a 1-D array, got shape {chunk.shape}")
        self._samples_in += len(chunk)
        buffer = np.concatenate((self._pending, np.clip(chunk, -1.0, 1.0)))
        full = len(buffer) - len(buffer) % self.frame_samples
        packets: list[bytes] = []
        for start in range(0, full, self.frame_samples):
            packets += map(bytes, self._codec.encode(self._frame(buffer[start : start + self.frame_samples])))
        self._pending = buffer[full:].copy()
        return self._out(packets, None)

    def finish(self) -> bytes:
        """End the stream: encode the buffered samples, drain the codec, and close the container.

        Returns:
            The stream's last bytes (the Ogg EOS page for Opus).

        Raises:
            RuntimeError: the stream is already finished.
        """
        self._check_open()
        self._finished = True
        packets: list[bytes] = []
        if len(self._pending):
            packets += map(bytes, self._codec.encode(self._frame(self._pending)))
        packets += map(bytes, self._codec.encode(None))
        return self._out(packets, self._samples_in)

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError(f"the {self.fmt} stream is finished; start a new StreamEncoder")

    def _frame(self, samples: Samples) -> av.AudioFrame:
        data = to_pcm16(samples) if self.fmt == "flac" else samples
        frame = av.AudioFrame.from_ndarray(
            data.reshape(1, -1), format=_SAMPLE_FORMATS[self.fmt], layout="mono"
        )
        frame.sample_rate = self.sample_rate
        frame.pts = self._samples_coded
        self._samples_coded += len(samples)
        return frame

    def _out(self, packets: list[bytes], end_samples: int | None) -> bytes:
        out = self._head + self._framing.wrap(packets, end_samples)
        self._head = b""
        return out


def encode_whole(
    samples: Samples, fmt: CompressedFormat, sample_rate: int, bitrate: int | None = None
) -> bytes:
    """Encode a whole clip as one complete file of ``fmt``; for one-message segments and REST bodies.

    Args:
        samples: mono float32 samples.
        fmt: one of ``COMPRESSED_FORMATS``.
        sample_rate: the samples' rate in Hz.
        bitrate: bits per second; None takes ``default_bitrate(fmt, sample_rate)``.

    Raises:
        ValueError: an unknown format, a rate it does not take, or samples that are not one-dimensional.
    """
    encoder = StreamEncoder(fmt, sample_rate, bitrate)
    return encoder.encode(samples) + encoder.finish()
