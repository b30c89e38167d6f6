"""The optional 24-byte header in front of each binary audio frame (``frame_header: true``).

Layout, little-endian::

    offset size  field
    0      4     magic  b"VGA1"  (the trailing "1" is the header version)
    4      4     u32    utterance_index
    8      4     u32    sentence_index
    12     4     u32    frame index within the utterance, from 0
    16     8     u64    start_sample: first sample of the frame, counted from the utterance start,
                        at the output sample rate
    24     ...          payload in the session's response_format
"""

from __future__ import annotations

import struct
from typing import Self

import msgspec

from voxgate.protocol.errors import CloseCode, ErrorCode, ProtocolError

MAGIC = b"VGA1"
_HEADER = struct.Struct("<4sIIIQ")
HEADER_BYTES = _HEADER.size  # 24
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1


class FrameHeader(msgspec.Struct, frozen=True):
    """Where a binary frame belongs and where its audio starts.

    Args:
        utterance_index: the utterance the audio belongs to.
        sentence_index: the segment within the utterance.
        frame_index: running count of binary frames in the utterance, from 0.
        start_sample: index of the frame's first sample from the utterance start.
    """

    utterance_index: int
    sentence_index: int
    frame_index: int
    start_sample: int

    def check(self) -> None:
        """Raise ``ValueError`` if a field does not fit its wire width."""
        for name in ("utterance_index", "sentence_index", "frame_index"):
            value = getattr(self, name)
            if not 0 <= value <= _U32_MAX:
                raise ValueError(f"{name} {value} does not fit in u32")
        if not 0 <= self.start_sample <= _U64_MAX:
            raise ValueError(f"start_sample {self.start_sample} does not fit in u64")

    def serialize(self) -> bytes:
        """Return the 24 header bytes; call ``check`` first for untrusted values."""
        return _HEADER.pack(
            MAGIC, self.utterance_index, self.sentence_index, self.frame_index, self.start_sample
        )

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> Self:
        """Parse the header at the start of ``data`` (the payload is ``data[HEADER_BYTES:]``).

        Raises:
            ProtocolError: when the frame is too short or the magic is wrong.
        """
        if len(data) < HEADER_BYTES:
            raise ProtocolError(
                ErrorCode.INVALID_MESSAGE,
                f"frame of {len(data)} bytes is shorter than its header",
                close_code=CloseCode.INVALID_DATA,
            )
        magic, utterance, sentence, frame, start = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ProtocolError(
                ErrorCode.INVALID_MESSAGE, f"bad frame magic {magic!r}", close_code=CloseCode.INVALID_DATA
            )
        return cls(utterance, sentence, frame, start)


def split_frame(data: bytes | bytearray | memoryview) -> tuple[FrameHeader, memoryview]:
    """Split a binary frame into its header and a zero-copy view of its payload."""
    view = memoryview(data)
    return FrameHeader.parse(view), view[HEADER_BYTES:]
