"""The 24-byte binary frame header: golden bytes both ways, width checks, malformed frames."""

from __future__ import annotations

import pytest
from voxgate.protocol.errors import CloseCode, ErrorCode, ProtocolError
from voxgate.protocol.frames import HEADER_BYTES, MAGIC, FrameHeader, split_frame

# Written by hand from the layout in the frames.py docstring: magic, then u32 utterance, u32 sentence,
# u32 frame index and u64 start_sample, all little-endian. Each value has distinct bytes, so a swapped
# field or a big-endian field shows up.
GOLDEN = [
    (
        FrameHeader(7, 0x0102, 0xA0B0C0D0, 0x0102030405060708),
        b"VGA1"
        b"\x07\x00\x00\x00"  # utterance_index 7
        b"\x02\x01\x00\x00"  # sentence_index 0x0102
        b"\xd0\xc0\xb0\xa0"  # frame_index 0xA0B0C0D0
        b"\x08\x07\x06\x05\x04\x03\x02\x01",  # start_sample 0x0102030405060708
    ),
    (
        FrameHeader(0, 0, 0, 0),
        b"VGA1\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
    ),
    (
        FrameHeader(2**32 - 1, 2**32 - 1, 2**32 - 1, 2**64 - 1),
        b"VGA1\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    ),
    (
        FrameHeader(1, 2, 3, 48000),
        b"VGA1"
        b"\x01\x00\x00\x00"
        b"\x02\x00\x00\x00"
        b"\x03\x00\x00\x00"
        b"\x80\xbb\x00\x00\x00\x00\x00\x00",  # 48000 = 0xBB80
    ),
]


def test_layout_constants() -> None:
    assert MAGIC == b"VGA1"
    assert HEADER_BYTES == 24


@pytest.mark.parametrize(("header", "golden"), GOLDEN)
def test_golden_round_trip(header: FrameHeader, golden: bytes) -> None:
    assert len(golden) == HEADER_BYTES
    assert FrameHeader.parse(golden) == header
    assert header.serialize() == golden
    header.check()


@pytest.mark.parametrize(("header", "golden"), GOLDEN[:1])
@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview], ids=lambda wrap: wrap.__name__)
def test_parse_accepts_any_buffer_and_ignores_payload(
    header: FrameHeader, golden: bytes, wrap: type[bytes | bytearray | memoryview]
) -> None:
    assert FrameHeader.parse(wrap(golden + b"payload")) == header


@pytest.mark.parametrize("name", ["utterance_index", "sentence_index", "frame_index"])
@pytest.mark.parametrize("value", [-1, 2**32])
def test_check_rejects_u32_overflow(name: str, value: int) -> None:
    fields = {"utterance_index": 0, "sentence_index": 0, "frame_index": 0, "start_sample": 0, name: value}
    with pytest.raises(ValueError, match=f"^{name} {value} does not fit in u32$"):
        FrameHeader(**fields).check()


@pytest.mark.parametrize("value", [-1, 2**64])
def test_check_rejects_u64_overflow(value: int) -> None:
    with pytest.raises(ValueError, match=f"^start_sample {value} does not fit in u64$"):
        FrameHeader(0, 0, 0, value).check()


@pytest.mark.parametrize("size", [0, 1, HEADER_BYTES - 1])
def test_short_frame_is_refused(size: int) -> None:
    with pytest.raises(ProtocolError, match="shorter than its header") as info:
        FrameHeader.parse(GOLDEN[0][1][:size])
    assert info.value.code is ErrorCode.INVALID_MESSAGE
    assert info.value.close_code is CloseCode.INVALID_DATA
    assert info.value.fatal is False


@pytest.mark.parametrize("magic", [b"VGA2", b"vga1", b"\x00\x00\x00\x00", b"RIFF"])
def test_bad_magic_is_refused(magic: bytes) -> None:
    with pytest.raises(ProtocolError, match="bad frame magic") as info:
        FrameHeader.parse(magic + GOLDEN[0][1][4:])
    assert info.value.code is ErrorCode.INVALID_MESSAGE
    assert info.value.close_code is CloseCode.INVALID_DATA


def test_split_frame_returns_header_and_payload_view() -> None:
    header, golden = GOLDEN[0]
    data = golden + b"\x01\x02\x03"
    parsed, payload = split_frame(data)
    assert parsed == header
    assert isinstance(payload, memoryview)
    assert payload.tobytes() == b"\x01\x02\x03"
    assert payload.obj is data  # a view into the frame, not a copy


def test_split_frame_payload_is_zero_copy() -> None:
    header, golden = GOLDEN[3]
    data = bytearray(golden + b"\x00\x00")
    parsed, payload = split_frame(data)
    data[HEADER_BYTES] = 0x7F
    assert parsed == header
    assert payload.tobytes() == b"\x7f\x00"


def test_split_frame_with_empty_payload() -> None:
    header, golden = GOLDEN[1]
    parsed, payload = split_frame(memoryview(golden))
    assert (parsed, payload.nbytes) == (header, 0)


def test_split_frame_refuses_short_frame() -> None:
    with pytest.raises(ProtocolError):
        split_frame(b"VGA1")
