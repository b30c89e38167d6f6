"""Streaming mp3 / Ogg Opus / ADTS AAC / FLAC encoders, checked with FFmpeg's decoders and by hand-parsing.

Every container is parsed here from its specification (Ogg pages and CRC from RFC 3533, OpusHead from
RFC 7845, ADTS from ISO/IEC 14496-3, STREAMINFO from the FLAC format, MPEG audio frame headers), written
independently of ``voxgate.protocol.encoders``, and every stream is decoded by PyAV (FFmpeg), which is
what a client's player does.
"""

from __future__ import annotations

import io
import struct
from typing import NamedTuple, get_args

import av
import numpy as np
import numpy.typing as npt
import pytest
import soxr
from voxgate.protocol.audio import Samples, to_pcm16
from voxgate.protocol.encoders import (
    COMPRESSED_FORMATS,
    MEDIA_TYPES,
    CompressedFormat,
    StreamEncoder,
    _flac_head,
    _ogg_crc,
    _opus_pre_skip,
    check_rate,
    default_bitrate,
    effective_bitrate,
    encode_whole,
    supported_rates,
)

FORMATS: list[CompressedFormat] = list(get_args(CompressedFormat))
RATE = 24000
CHUNK = 960  # 40 ms at 24 kHz, the packer's usual frame


def chirp(seconds: float, rate: int = RATE) -> Samples:
    """A 200 -> 200 + 600 * seconds Hz sweep: no two lags look alike, so alignment is unambiguous."""
    t = np.arange(round(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * (200 * t + 300 * t**2))).astype(np.float32)


def tone(seconds: float, hz: float = 440.0, rate: int = RATE) -> Samples:
    t = np.arange(round(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def speechy(seconds: float, rate: int = RATE) -> Samples:
    """Harmonics of a gliding pitch with noise: dense enough that a VBR encoder spends its bit rate."""
    t = np.arange(round(rate * seconds)) / rate
    phase = 2 * np.pi * np.cumsum(140 + 40 * np.sin(2 * np.pi * 0.7 * t)) / rate
    noise = np.random.default_rng(0).standard_normal(len(t))
    return (0.25 * sum(np.sin(k * phase) / k for k in range(1, 20)) + 0.03 * noise).astype(np.float32)


def stream(fmt: CompressedFormat, samples: Samples, sizes: list[int] | None = None) -> list[bytes]:
    """Every output of one stream: ``encode()`` of each chunk (``sizes`` cycled, 40 ms each by default),
    then ``finish()``."""
    encoder = StreamEncoder(fmt, RATE)
    outputs: list[bytes] = []
    start, pattern = 0, sizes or [CHUNK]
    while start < len(samples):
        size = pattern[len(outputs) % len(pattern)]
        outputs.append(encoder.encode(samples[start : start + size]))
        start += size
    return [*outputs, encoder.finish()]


def decode(data: bytes) -> tuple[npt.NDArray[np.float64], int]:
    """Decode with FFmpeg: the samples (as floats in [-1, 1]) and the decoder's output rate."""
    with av.open(io.BytesIO(data), "r") as container:
        audio = container.streams.audio[0]
        frames = [frame.to_ndarray() for frame in container.decode(audio)]
        rate = audio.rate
    samples = np.concatenate(frames, axis=1)[0]
    scale = 32768.0 if samples.dtype == np.int16 else 1.0
    return samples / scale, rate


def decode_at(data: bytes, rate: int = RATE) -> npt.NDArray[np.float64]:
    """Decoded samples at ``rate`` (Opus decoders always give 48 kHz)."""
    samples, decoded_rate = decode(data)
    return samples if decoded_rate == rate else soxr.resample(samples, decoded_rate, rate)


# --- Ogg, by hand (RFC 3533) ------------------------------------------------------------------------


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
        table.append(crc & 0xFFFFFFFF)
    return table


CRC_TABLE = _crc_table()


def crc(data: bytes | bytearray) -> int:
    """Ogg's CRC-32, bit by bit from the polynomial: MSB first, initial value 0, no final XOR."""
    value = 0
    for byte in data:
        value = ((value << 8) & 0xFFFFFFFF) ^ CRC_TABLE[(value >> 24) ^ byte]
    return value


class Page(NamedTuple):
    flags: int
    granule: int
    serial: int
    sequence: int
    lacing: bytes
    body: bytes
    crc_ok: bool


def pages(data: bytes) -> list[Page]:
    """Every page of an Ogg stream; fails unless pages follow each other exactly to the end."""
    found, pos = [], 0
    while pos < len(data):
        capture, version, flags, granule, serial, sequence, checksum, count = struct.unpack_from(
            "<4sBBqIIIB", data, pos
        )
        assert (capture, version) == (b"OggS", 0)
        lacing = data[pos + 27 : pos + 27 + count]
        end = pos + 27 + count + sum(lacing)
        assert end <= len(data)
        page = bytearray(data[pos:end])
        page[22:26] = bytes(4)
        found.append(
            Page(
                flags, granule, serial, sequence, lacing, data[pos + 27 + count : end], crc(page) == checksum
            )
        )
        pos = end
    return found


def packets_of(page: Page) -> list[bytes]:
    """The packets of a page whose packets all end on it (the encoder never splits one)."""
    out, pos, size = [], 0, 0
    for value in page.lacing:
        size += value
        if value < 255:
            out.append(page.body[pos : pos + size])
            pos, size = pos + size, 0
    assert size == 0 and pos == len(page.body)
    return out


def opus_samples(packet: bytes) -> int:
    """48 kHz samples in an Opus packet, from its TOC byte (RFC 6716 section 3.1)."""
    config, code = packet[0] >> 3, packet[0] & 3
    if config < 12:
        frame = (480, 960, 1920, 2880)[config % 4]  # SILK: 10, 20, 40, 60 ms
    elif config < 16:
        frame = (480, 960)[config % 2]  # hybrid: 10, 20 ms
    else:
        frame = (120, 240, 480, 960)[config % 4]  # CELT: 2.5, 5, 10, 20 ms
    return frame * (1 if code == 0 else 2 if code < 3 else packet[1] & 0x3F)


# --- every format: decoded by FFmpeg --------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_stream_decodes_to_the_input_delayed_by_the_codec_delay(fmt: CompressedFormat) -> None:
    x = chirp(1.0)
    encoder = StreamEncoder(fmt, RATE)
    data = b"".join(encoder.encode(x[i : i + CHUNK]) for i in range(0, len(x), CHUNK)) + encoder.finish()
    y = decode_at(data)
    # mp3 and AAC decoders output the priming and the last frame's padding; Ogg Opus trims both (pre-skip,
    # EOS granule); FLAC has neither.
    extra = len(y) - len(x)
    if fmt in ("mp3", "aac"):
        assert encoder.delay_samples <= extra < encoder.delay_samples + encoder.frame_samples
    else:
        assert extra == 0
    # The delay the encoder reports is where the input starts in the decoder's output.
    lags = np.correlate(y[: len(x) // 2 + 2000], x[: len(x) // 2], "valid")
    expected_lag = 0 if fmt == "opus" else encoder.delay_samples
    assert int(np.argmax(lags)) == expected_lag
    aligned = y[expected_lag : expected_lag + len(x)]
    assert np.corrcoef(aligned, x)[0, 1] > 0.99


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_tone_keeps_its_frequency_and_the_decoder_its_rate(fmt: CompressedFormat) -> None:
    samples, rate = decode(encode_whole(tone(0.5), fmt, RATE))
    assert rate == (48000 if fmt == "opus" else RATE)  # RFC 7845: Opus decodes at 48 kHz
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    assert np.fft.rfftfreq(len(samples), 1 / rate)[np.argmax(spectrum)] == pytest.approx(440, abs=5)


def test_flac_is_lossless() -> None:
    x = chirp(0.5)
    samples, _ = decode(encode_whole(x, "flac", RATE))
    np.testing.assert_array_equal(np.rint(samples * 32768).astype(np.int16), to_pcm16(x))


@pytest.mark.parametrize("fmt", FORMATS)
def test_output_is_progressive_and_each_prefix_decodes(fmt: CompressedFormat) -> None:
    outputs = stream(fmt, chirp(0.5))
    emitted = b"".join(outputs[:-1])
    # Most of the stream leaves before finish(): finish() only drains the codec's look-ahead.
    assert len(emitted) > 0.5 * (len(emitted) + len(outputs[-1]))
    assert sum(1 for out in outputs[:-1] if out) >= len(outputs[:-1]) // 3
    # What was sent so far already plays: all the input but the latency (mp3 138 ms here, the worst).
    priming = StreamEncoder(fmt, RATE).delay_samples if fmt in ("mp3", "aac") else 0
    assert len(decode_at(emitted)) - priming >= (0.5 - 0.16) * RATE
    if fmt == "opus":
        sent = pages(emitted)
        assert all(page.crc_ok for page in sent) and not any(page.flags & 0x04 for page in sent)


@pytest.mark.parametrize("fmt", FORMATS)
def test_chunk_sizes_do_not_change_the_stream(fmt: CompressedFormat) -> None:
    x = chirp(0.6)
    whole = encode_whole(x, fmt, RATE)
    chunked = b"".join(stream(fmt, x, [0, 1, 37, 4800, 1, 0, 333]))
    if fmt == "opus":
        # The same packets, only the pages around them differ (each encode() call gets its own).
        def packets(data: bytes) -> list[bytes]:
            return [packet for page in pages(data)[2:] for packet in packets_of(page)]

        assert packets(chunked) == packets(whole)
        np.testing.assert_array_equal(decode(chunked)[0], decode(whole)[0])
    else:
        assert chunked == whole


@pytest.mark.parametrize("fmt", FORMATS)
def test_samples_are_clipped(fmt: CompressedFormat) -> None:
    loud = 3 * chirp(0.2)
    assert encode_whole(loud, fmt, RATE) == encode_whole(np.clip(loud, -1, 1), fmt, RATE)


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_sample(fmt: CompressedFormat) -> None:
    encoder = StreamEncoder(fmt, RATE)
    data = encoder.encode(np.array([0.5], dtype=np.float32)) + encoder.finish()
    decoded = len(decode_at(data))
    if fmt in ("opus", "flac"):
        assert decoded == 1
    else:  # whole frames: the priming, the sample, and padding
        assert decoded > encoder.delay_samples and decoded % encoder.frame_samples == 0


def test_an_empty_stream() -> None:
    for fmt in ("mp3", "aac"):
        encoder = StreamEncoder(fmt, RATE)
        assert encoder.encode(np.zeros(0, dtype=np.float32)) + encoder.finish() == b""
    flac = StreamEncoder("flac", RATE)
    assert len(flac.encode(np.zeros(0, dtype=np.float32))) == 42  # fLaC + STREAMINFO, and no frame
    assert flac.finish() == b""
    opus = StreamEncoder("opus", RATE)
    head = pages(opus.encode(np.zeros(0, dtype=np.float32)))
    (end,) = pages(opus.finish())
    assert len(head) == 2
    # No packet ends on the EOS page: granule -1 (RFC 3533).
    assert (end.flags, end.granule, end.lacing, end.crc_ok) == (0x04, -1, b"", True)


# --- Ogg Opus ---------------------------------------------------------------------------------------


def test_ogg_crc_check_value() -> None:
    # CRC-32/CKSUM of "123456789" is 0x765E7680 with a final XOR of ~0; Ogg's has none.
    assert crc(b"123456789") == 0x765E7680 ^ 0xFFFFFFFF
    data = np.random.default_rng(1).integers(0, 256, 1000, dtype=np.uint8).tobytes()
    assert _ogg_crc(data) == crc(data)


def test_ogg_pages() -> None:
    x = speechy(6.0)  # one encode() call of 300 packets: more lacing values than one page holds
    encoder = StreamEncoder("opus", RATE, serial=7)
    data = encoder.encode(x) + encoder.finish()
    found = pages(data)
    assert all(page.crc_ok for page in found)
    assert [page.sequence for page in found] == list(range(len(found)))
    assert {page.serial for page in found} == {7}
    assert [page.flags for page in found] == [0x02] + [0] * (len(found) - 2) + [0x04]  # BOS ... EOS
    assert len(found) > 4 and all(len(page.lacing) <= 255 for page in found)
    # The header pages hold one packet each; granules count the 48 kHz samples of the packets that end
    # on each page, pre-skip included; the last one says where the input ends (end trimming).
    assert [len(packets_of(page)) for page in found[:2]] == [1, 1]
    assert [page.granule for page in found[:2]] == [0, 0]
    pre_skip = struct.unpack_from("<H", found[0].body, 10)[0]
    total = 0
    for page in found[2:-1]:
        total += sum(opus_samples(packet) for packet in packets_of(page))
        assert page.granule == total
    last = sum(opus_samples(packet) for packet in packets_of(found[-1]))
    assert found[-1].granule == pre_skip + 2 * len(x)
    assert total < found[-1].granule <= total + last
    assert len(decode(data)[0]) == 2 * len(x)


def test_ffmpeg_checks_the_pages_crc() -> None:
    data = bytearray(encode_whole(speechy(1.0), "opus", RATE))
    third = data.index(b"OggS", data.index(b"OpusTags"))
    data[third + 22] ^= 0xFF  # the first audio page's CRC
    assert not pages(bytes(data))[2].crc_ok
    assert len(decode(bytes(data))[0]) < 48000  # FFmpeg drops the page


def test_opus_head_and_tags() -> None:
    encoder = StreamEncoder("opus", RATE)
    head, tags = (packets_of(page)[0] for page in pages(encoder.encode(np.zeros(0, dtype=np.float32)))[:2])
    magic, version, channels, pre_skip, rate, gain, mapping = struct.unpack("<8sBBHIhB", head)
    assert (magic, version, channels, rate, gain, mapping) == (b"OpusHead", 1, 1, RATE, 0, 0)
    assert pre_skip == 312 == 2 * encoder.delay_samples  # 6.5 ms of look-ahead, counted at 48 kHz
    (vendor_length,) = struct.unpack_from("<I", tags, 8)
    assert tags[:8] == b"OpusTags" and tags[12 : 12 + vendor_length] == b"voxgate"
    assert struct.unpack_from("<I", tags, 12 + vendor_length) == (0,)  # no user comments
    assert len(tags) == 16 + vendor_length


@pytest.mark.parametrize(("rate", "frame"), [(8000, 160), (16000, 320), (48000, 960)])
def test_opus_rates(rate: int, frame: int) -> None:
    encoder = StreamEncoder("opus", rate)
    data = encoder.encode(chirp(0.3, rate)) + encoder.finish()
    assert encoder.frame_samples == frame  # 20 ms
    assert encoder.delay_samples == 312 * rate // 48000
    head = packets_of(pages(data)[0])[0]
    assert struct.unpack_from("<HI", head, 10) == (312, rate)
    assert len(decode(data)[0]) == 48000 * 0.3


# --- ADTS, STREAMINFO, MPEG audio frames ------------------------------------------------------------


def adts_frames(data: bytes) -> list[dict[str, int]]:
    """The header fields of each ADTS frame, byte by byte from ISO/IEC 14496-3 1.A.2."""
    found, pos = [], 0
    while pos < len(data):
        b = data[pos : pos + 7]
        header = {
            "sync": b[0] << 4 | b[1] >> 4,
            "id": b[1] >> 3 & 1,
            "layer": b[1] >> 1 & 3,
            "protection_absent": b[1] & 1,
            "profile": b[2] >> 6,
            "rate_index": b[2] >> 2 & 0xF,
            "private": b[2] >> 1 & 1,
            "channels": (b[2] & 1) << 2 | b[3] >> 6,
            "flags": b[3] >> 2 & 0xF,
            "length": (b[3] & 3) << 11 | b[4] << 3 | b[5] >> 5,
            "fullness": (b[5] & 0x1F) << 6 | b[6] >> 2,
            "blocks": b[6] & 3,
        }
        found.append(header)
        pos += header["length"]
    assert pos == len(data)
    return found


@pytest.mark.parametrize(("rate", "index"), [(8000, 11), (24000, 6), (44100, 4), (48000, 3)])
def test_adts_headers(rate: int, index: int) -> None:
    frames = adts_frames(encode_whole(chirp(0.3, rate), "aac", rate))
    expected = {"sync": 0xFFF, "id": 0, "layer": 0, "protection_absent": 1, "profile": 1, "rate_index": index}
    expected |= {"private": 0, "channels": 1, "flags": 0, "fullness": 0x7FF, "blocks": 0}
    assert len(frames) == -(-(len(chirp(0.3, rate)) + 1024) // 1024)  # priming + input, in 1024-sample frames
    assert all({k: v for k, v in frame.items() if k != "length"} == expected for frame in frames)


def test_flac_streaminfo() -> None:
    encoder = StreamEncoder("flac", RATE)
    data = encoder.encode(chirp(0.3)) + encoder.finish()
    assert data[:4] == b"fLaC"
    assert data[4] == 0x80 and int.from_bytes(data[5:8], "big") == 34  # last block, STREAMINFO, 34 bytes
    info = data[8:42]
    min_block, max_block = struct.unpack_from(">HH", info)
    fields = int.from_bytes(info[10:18], "big")
    rate, channels, bits, total = (
        fields >> 44,
        (fields >> 41 & 7) + 1,
        (fields >> 36 & 0x1F) + 1,
        fields & (2**36 - 1),
    )
    assert min_block == max_block == encoder.frame_samples == 2304
    assert (rate, channels, bits, total) == (RATE, 1, 16, 0)  # total 0: unknown, a stream
    assert info[18:] == bytes(16)  # no MD5 yet
    assert data[42:44] == b"\xff\xf8"  # the first frame's sync code, fixed block size


MPEG_BITRATES_KBPS = {  # Layer III, by version: MPEG-1, then MPEG-2 and 2.5
    1: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
MPEG_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def mp3_frames(data: bytes) -> list[tuple[int, int]]:
    """(sample rate, kbit/s) of each MPEG audio frame; fails unless they follow each other to the end."""
    found, pos = [], 0
    while pos < len(data):
        b = data[pos : pos + 4]
        version, layer = b[1] >> 3 & 3, b[1] >> 1 & 3
        assert b[0] == 0xFF and b[1] >> 5 == 7 and layer == 1  # frame sync, Layer III
        kbps = MPEG_BITRATES_KBPS[1 if version == 3 else 2][b[2] >> 4]
        rate = MPEG_RATES[version][b[2] >> 2 & 3]
        found.append((rate, kbps))
        pos += (144 if version == 3 else 72) * kbps * 1000 // rate + (b[2] >> 1 & 1)
    assert pos == len(data)
    return found


@pytest.mark.parametrize(("rate", "kbps"), [(8000, 32), (24000, 64), (48000, 128)])
def test_mp3_is_bare_frames(rate: int, kbps: int) -> None:
    data = encode_whole(chirp(0.3, rate), "mp3", rate)
    assert not data.startswith(b"ID3") and b"Xing" not in data and b"Info" not in data[:200]
    assert set(mp3_frames(data)) == {(rate, kbps)}  # constant bit rate, the default for the rate


# --- rates, bit rates, errors -----------------------------------------------------------------------


def test_format_tables() -> None:
    assert COMPRESSED_FORMATS == {"mp3", "opus", "aac", "flac"}
    assert MEDIA_TYPES == {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac"}
    assert supported_rates("opus") == frozenset({8000, 12000, 16000, 24000, 48000})
    assert (
        supported_rates("mp3")
        == supported_rates("aac")
        == frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000})
    )
    assert supported_rates("flac") is None


@pytest.mark.parametrize(
    ("fmt", "rate", "message"),
    [
        ("opus", 44100, "opus takes sample rates 8000, 12000, 16000, 24000, 48000 Hz, not 44100"),
        ("mp3", 7000, "mp3 takes sample rates 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000"),
        ("aac", 7350, "aac takes sample rates 8000, 11025"),
        ("flac", 7999, "flac takes any sample rate from 8000 to 48000 Hz, not 7999"),
        ("flac", 48001, "flac takes any sample rate from 8000 to 48000 Hz, not 48001"),
        ("wav", 24000, "unknown compressed format 'wav'; expected one of aac, flac, mp3, opus"),
    ],
)
def test_check_rate_refuses(fmt: str, rate: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_rate(fmt, rate)


@pytest.mark.parametrize("fmt", FORMATS)
def test_check_rate_accepts(fmt: CompressedFormat) -> None:
    for rate in supported_rates(fmt) or (8000, 37000, 44100, 48000):
        check_rate(fmt, rate)
    with pytest.raises(ValueError, match="not 44100" if fmt == "opus" else "not 7000"):
        StreamEncoder(fmt, 44100 if fmt == "opus" else 7000)


def test_flac_takes_an_odd_rate() -> None:
    x = chirp(0.2, 37000)
    assert len(decode_at(encode_whole(x, "flac", 37000), 37000)) == len(x)


def test_default_bitrates() -> None:
    assert [default_bitrate("mp3", rate) for rate in (8000, 12000, 16000, 24000, 32000, 48000)] == [
        32_000,
        32_000,
        64_000,
        64_000,
        128_000,
        128_000,
    ]
    assert default_bitrate("opus", RATE) == 32_000
    assert (default_bitrate("aac", 8000), default_bitrate("aac", RATE)) == (48_000, 64_000)  # AAC's ceiling
    assert default_bitrate("flac", RATE) is None


def test_the_effective_bitrate_is_none_where_the_format_has_none() -> None:
    assert effective_bitrate("opus", RATE, None) == 32_000
    assert effective_bitrate("mp3", RATE, 48_000) == 48_000
    assert [effective_bitrate(fmt, RATE, 48_000) for fmt in ("flac", "pcm", "wav", "mulaw")] == [None] * 4


@pytest.mark.parametrize(
    ("fmt", "bitrate"), [("opus", 32_000), ("opus", 16_000), ("mp3", 32_000), ("aac", 48_000)]
)
def test_bitrate_is_respected(fmt: CompressedFormat, bitrate: int) -> None:
    seconds = 2.0
    per_second = len(encode_whole(speechy(seconds), fmt, RATE, bitrate)) / seconds
    assert bitrate / 8 / 1.5 < per_second < bitrate / 8 * 1.5


def test_opus_is_an_eighth_of_pcm16_or_less() -> None:
    data = encode_whole(speechy(2.0), "opus", RATE)
    assert len(data) / 2.0 <= 2 * RATE / 8  # 48,000 B/s of pcm16 at 24 kHz


def test_flac_ignores_the_bitrate() -> None:
    x = chirp(0.2)
    assert encode_whole(x, "flac", RATE, 8_000) == encode_whole(x, "flac", RATE)


def test_encode_after_finish_raises() -> None:
    encoder = StreamEncoder("mp3", RATE)
    encoder.encode(chirp(0.1))
    encoder.finish()
    with pytest.raises(RuntimeError, match="finished"):
        encoder.encode(chirp(0.1))
    with pytest.raises(RuntimeError, match="finished"):
        encoder.finish()


def test_mono_only() -> None:
    with pytest.raises(ValueError, match=r"1-D array, got shape \(2, 10\)"):
        StreamEncoder("opus", RATE).encode(np.zeros((2, 10), dtype=np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_codec_takes_a_short_last_frame(fmt: CompressedFormat) -> None:
    # finish() gives the codec the last partial frame as is; the module counts on this capability.
    names = {"mp3": "libmp3lame", "opus": "libopus", "aac": "aac", "flac": "flac"}
    assert av.codec.Codec(names[fmt], "w").capabilities & av.codec.codec.Capabilities.small_last_frame


def test_codec_extradata_is_checked() -> None:
    with pytest.raises(RuntimeError, match="no OpusHead"):
        _opus_pre_skip(None)
    with pytest.raises(RuntimeError, match="no OpusHead"):
        _opus_pre_skip(b"OggS")
    with pytest.raises(RuntimeError, match="no STREAMINFO"):
        _flac_head(None)
    with pytest.raises(RuntimeError, match="no STREAMINFO"):
        _flac_head(bytes(33))


@pytest.mark.parametrize("bitrate", [256_001, 300_000, 320_000])
@pytest.mark.parametrize("rate", [8000, RATE, 48000])
def test_every_documented_bitrate_opens_every_lossy_encoder(bitrate: int, rate: int) -> None:
    """Issue 35 L1: opus above libopus' mono maximum (256 kbit/s) ended the session with a traceback.
    Every bit rate ``session.config`` accepts (up to 320 kbit/s) encodes, at the rate in effect."""
    for fmt in ("opus", "mp3", "aac"):
        assert encode_whole(chirp(0.1, rate), fmt, rate, bitrate)
    assert effective_bitrate("opus", rate, bitrate) == 256_000  # what session.ready reports
    assert effective_bitrate("mp3", rate, bitrate) == bitrate
