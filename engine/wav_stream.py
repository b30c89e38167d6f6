"""Incremental reader of a WAV file that arrives in pieces: the header first, then samples.

The remote engine asks upstreams for ``response_format: "wav"``, so every answer says its own sample
rate in its header: a streamed one (vllm-omni 0.30 with ``stream_format: "audio"``, another voxgate)
has placeholder sizes and ends when the body ends; a whole one (a non-streamed request) has true
sizes. Pieces may split the header, a sample or a frame anywhere, as a network does.

An upstream is not trusted to say something playable: a rate outside ``MIN_RATE_HZ``..``MAX_RATE_HZ``
(1 Hz made 21 s of noise of a 0.3 s answer; 2 GHz made silence that resampled to nothing), more channels
than ``MAX_CHANNELS``, or a sample format other than 16-bit integers or 32-bit floats is a ``WavError``,
which the remote engine counts as that upstream's failure.

Nor is it trusted to keep to one format, or to send all it promised. A second WAV header in the data (an
upstream that concatenates WAV files) is found by its ``WAVEfmt `` mark, however the pieces split it: one
of the same format is skipped (its bytes are not played as a click), one of another rate, channel count or
sample format is a ``WavError`` (played on, it was noise). ``finish``, at the body's end, is a
``WavError`` when the data chunk's stated size has not all come: a body cut short is not complete audio.
"""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt

# Streamed WAV headers carry these in place of sizes they cannot know yet.
_UNKNOWN_SIZES = (0, 0xFFFFFFFF)
_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE
# A header that has not ended after this many bytes is not one a speech server would send.
_MAX_HEADER_BYTES = 64 * 1024
# What every WAV header has at byte 8 (after ``RIFF`` and its size) when its fmt chunk comes first, as
# every speech server's does: 64 bits that samples do not spell by chance.
_MARK = b"WAVEfmt "
# A header found in the data is re-read from its mark, behind the RIFF part it would have had.
_RIFF = b"RIFF\xff\xff\xff\xff"
#: Telephone audio is 8 kHz and studio masters 192 kHz; a speech server answers within them.
MIN_RATE_HZ, MAX_RATE_HZ = 8000, 192000
#: 7.1 surround has 8; a speech server sends 1 (more are averaged to mono).
MAX_CHANNELS = 8


class WavError(ValueError):
    """The data is not a WAV the gateway can play (not a WAV, or a format or rate outside the bounds)."""


class WavStream:
    """Feed body pieces with ``feed``; it returns the mono float32 samples each piece completes.

    Raises ``WavError`` from ``feed`` when the data is not a PCM16 or float32 WAV at a sane rate.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.sample_rate: int | None = None
        self._channels = 1
        self._width = 2
        self._float = False
        self._remaining: int | None = None  # data bytes still to come, when the header says
        self._in_data = False
        self._tail = b""  # the last bytes of data, where a header's mark may have begun

    @property
    def done(self) -> bool:
        """Whether the data chunk's stated size has all come (never for a streamed WAV): read no more."""
        return self._remaining == 0

    def feed(self, data: bytes) -> npt.NDArray[np.float32]:
        """Take the next piece of the body; returns the samples it completes (possibly none).

        Raises ``WavError`` for a header it cannot play, or a header of another format mid-stream.
        """
        if self._in_data and self._remaining is None and not self._buffer and len(data) >= len(_MARK):
            # The usual piece of a stream: whole frames, no header in it nor begun before it.
            edge = self._tail + data[: len(_MARK) - 1]
            if not len(data) % (self._channels * self._width) and _MARK not in edge and _MARK not in data:
                self._tail = data[1 - len(_MARK) :]
                return self._samples(data)
        out: list[npt.NDArray[np.float32]] = []
        while True:
            if not self._in_data:
                self._buffer += data
                self._parse_header()
                if not self._in_data:
                    break
                data = bytes(self._buffer)  # what came after the header
                self._buffer.clear()
            at = self._mark(data) if self._remaining is None else None
            if at is None:
                out.append(self._frames(data))
                break
            # Another header: the samples before it, then the data behind it (a partial frame before it is
            # dropped; when its RIFF part came in the last piece, those 8 bytes were played: 4 samples).
            out.append(self._frames(data[: max(0, at - 8)]))
            header = self._tail[len(self._tail) + at :] + data if at < 0 else data[at:]
            self._buffer = bytearray(_RIFF + header)
            self._in_data, self._tail, data = False, b"", b""
        if len(out) == 1:
            return out[0]
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def _mark(self, data: bytes) -> int | None:
        """Where a header's mark begins, from the start of ``data`` (below 0: in the bytes before it); the
        last bytes are kept, for a mark that the next piece ends."""
        keep = len(_MARK) - 1
        at: int | None = None
        if self._tail:
            edge = (self._tail + data[:keep]).find(_MARK)
            at = edge - len(self._tail) if edge >= 0 else None
        if at is None:
            found = data.find(_MARK)
            at = found if found >= 0 else None
        self._tail = (self._tail + data[-keep:])[-keep:]
        return at

    def finish(self) -> npt.NDArray[np.float32]:
        """The body has ended: no more samples (a partial frame is dropped).

        Raises ``WavError`` when the header did not end, or the data chunk's stated size has not all come.
        """
        if not self._in_data:
            raise WavError("the body ended before its WAV header did (no WAV header)")
        if self._remaining:
            raise WavError(f"the body ended {self._remaining} bytes before its WAV's stated size")
        return np.zeros(0, np.float32)

    def _frames(self, data: bytes) -> npt.NDArray[np.float32]:
        """Data bytes as samples: whole frames, a partial one held for the next piece."""
        frame = self._channels * self._width
        if self._remaining is None and not self._buffer and not len(data) % frame:
            return self._samples(data)  # whole frames, nothing held
        self._buffer += data
        if self._remaining is not None:
            del self._buffer[self._remaining :]
        usable = len(self._buffer) - len(self._buffer) % frame
        raw = bytes(self._buffer[:usable])
        del self._buffer[:usable]
        if self._remaining is not None:
            self._remaining -= usable
        return self._samples(raw)

    def _samples(self, raw: bytes) -> npt.NDArray[np.float32]:
        """Whole frames of data as mono float32 samples (one conversion, no float64 copy)."""
        if self._float:
            samples = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        else:
            samples = np.frombuffer(raw, dtype="<i2").astype(np.float32)
            samples *= np.float32(1 / 32768)
        if self._channels > 1:
            samples = samples.reshape(-1, self._channels).mean(axis=1).astype(np.float32)
        return samples

    def _parse_header(self) -> None:
        buf = self._buffer
        if len(buf) >= 12 and (buf[:4] != b"RIFF" or buf[8:12] != b"WAVE"):
            raise WavError("not a WAV stream: it does not start with a RIFF WAVE header")
        offset = 12
        while len(buf) >= offset + 8:
            chunk_id, size = bytes(buf[offset : offset + 4]), struct.unpack_from("<I", buf, offset + 4)[0]
            body = offset + 8
            if chunk_id == b"data":
                if self.sample_rate is None:
                    raise WavError("WAV data came before its fmt chunk")
                self._remaining = None if size in _UNKNOWN_SIZES else size
                del buf[:body]
                self._in_data = True
                return
            if len(buf) < body + size:
                break
            if chunk_id == b"fmt ":
                self._read_format(bytes(buf[body : body + size]))
            offset = body + size + size % 2  # chunks are padded to even sizes
        if len(buf) > _MAX_HEADER_BYTES:
            raise WavError("WAV header did not end within 64 KiB")

    def _read_format(self, fmt: bytes) -> None:
        before = (self.sample_rate, self._channels, self._float, self._width)
        self._set_format(fmt)
        after = (self.sample_rate, self._channels, self._float, self._width)
        if before[0] is not None and after != before:
            raise WavError(f"the WAV format changed mid-stream: {_describe(*before)} to {_describe(*after)}")

    def _set_format(self, fmt: bytes) -> None:
        if len(fmt) < 16:
            raise WavError("WAV fmt chunk is too short")
        tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", fmt)
        if tag == _EXTENSIBLE and len(fmt) >= 26:
            tag = struct.unpack_from("<H", fmt, 24)[0]  # the sub-format GUID starts with the real tag
        if (tag, bits) not in ((_PCM, 16), (_FLOAT, 32)) or not 1 <= channels <= MAX_CHANNELS:
            raise WavError(f"unsupported WAV format: tag {tag}, {bits} bits, {channels} channels")
        if not MIN_RATE_HZ <= rate <= MAX_RATE_HZ:
            raise WavError(f"unplayable WAV sample rate {rate} Hz (not within {MIN_RATE_HZ}..{MAX_RATE_HZ})")
        self.sample_rate, self._channels = rate, channels
        self._float, self._width = tag == _FLOAT, bits // 8


def _describe(rate: int | None, channels: int, is_float: bool, width: int) -> str:
    kind = "32-bit float" if is_float else f"{8 * width}-bit"
    return f"{rate} Hz, {channels} channel{'s' if channels > 1 else ''}, {kind}"
