"""The optional header in front of each binary audio frame (``frame_header: true``).

Layout, little-endian::

    offset size  field
    0      4     magic  b"VGA1"  (the trailing "1" is the header version)
    4      4     u32    utterance_index
    8      4     u32    sentence_index
    12     4     u32    frame index within the utterance, from 0
    16     8     u64    start_sample: first sample of the frame, counted from the utterance start,
                        at the output sample rate
    24     ...          payload in the session's response_format

Frames of a named context (``context_id``) carry the context header instead: magic b"VGC1", the same
fields, then ``u32 context_number`` at offset 24 (announced by ``context.opened``), and the payload at
offset 28. Frames of the default context keep the 24-byte header byte for byte, so clients that use no
contexts see no change, and a parser that knows only ``VGA1`` refuses a context frame loudly.
"""

from __future__ import annotations

import struct
from typing import Self

import msgspec

from .errors import CloseCode, ErrorCode, ProtocolError

MAGIC = b"VGA1"
_HEADER = struct.Struct("<4sIIIQ")
HEADER_BYTES = _HEADER.size  # 24
#: The header of a named context's frames: the same fields, then the context number.
MAGIC_CONTEXT = b"VGC1"
_CONTEXT_HEADER = struct.Struct("<4sIIIQI")
CONTEXT_HEADER_BYTES = _CONTEXT_HEADER.size  # 28
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1


class FrameHeader(msgspec.Struct, frozen=True):
    """Where a binary frame belongs and where its audio starts.

    Args:
        utterance_index: the utterance the audio belongs to.
        sentence_index: the segment within the utterance.
        frame_index: running count of binary frames in the utterance, from 0.
        start_sample: index of the frame's first sample from the utterance start.
        context_number: the utterance's context (``context.opened``); 0, the default context, is
            written as the 24-byte ``VGA1`` header.
    """

    utterance_index: int
    sentence_index: int
    frame_index: int
    start_sample: int
    context_number: int = 0

    @property
    def size(self) -> int:
        """Bytes of this header on the wire: 24 (``VGA1``), or 28 with a context number (``VGC1``)."""
        return CONTEXT_HEADER_BYTES if self.context_number else HEADER_BYTES

    def check(self) -> None:
        """Raise ``ValueError`` if a field does not fit its wire width."""
        for name in ("utterance_index", "sentence_index", "frame_index", "context_number"):
            value = getattr(self, name)
            if not 0 <= value <= _U32_MAX:
                raise ValueError(f"{name} {value} does not fit in u32")
        if not 0 <= self.start_sample <= _U64_MAX:
            raise ValueError(f"start_sample {self.start_sample} does not fit in u64")

    def serialize(self) -> bytes:
        """Return the header bytes (``size`` of them); call ``check`` first for untrusted values."""
        fields = (self.utterance_index, self.sentence_index, self.frame_index, self.start_sample)
        if self.context_number:
            return _CONTEXT_HEADER.pack(MAGIC_CONTEXT, *fields, self.context_number)
        return _HEADER.pack(MAGIC, *fields)

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> Self:
        """Parse the header at the start of ``data`` (the payload is ``data[header.size:]``).

        Raises:
            ProtocolError: when the frame is too short or the magic is wrong.
        """
        layout = _CONTEXT_HEADER if bytes(data[:4]) == MAGIC_CONTEXT else _HEADER
        if len(data) < layout.size:
            raise ProtocolError(
                ErrorCode.INVALID_MESSAGE,
                f"frame of {len(data)} bytes is shorter than its header",
                close_code=CloseCode.INVALID_DATA,
            )
        magic, *fields = layout.unpack_from(data)
        if magic not in (MAGIC, MAGIC_CONTEXT):
            raise ProtocolError(
                ErrorCode.INVALID_MESSAGE, f"bad frame magic {magic!r}", close_code=CloseCode.INVALID_DATA
            )
        return cls(*fields)


def split_frame(data: bytes | bytearray | memoryview) -> tuple[FrameHeader, memoryview]:
    """Split a binary frame into its header and a zero-copy view of its payload."""
    view = memoryview(data)
    header = FrameHeader.parse(view)
    return header, view[header.size :]
