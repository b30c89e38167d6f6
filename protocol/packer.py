"""Turns an utterance's engine audio into the binary WebSocket messages of the session's format.

One ``AudioPacker`` per utterance: it resamples each segment with a stateful soxr stream, encodes,
cuts ``frame_ms`` frames (the last frame of a segment may be shorter), numbers them and puts the
optional frame header in front. Sample positions count from the utterance start at the output rate.

Compressed formats (``protocol.encoders``) are encoded by one encoder stream for the whole utterance when
streamed: each message holds the bytes the encoder gave for the audio pushed (none while a codec frame
fills, so a message's size follows the codec, not ``frame_ms``), and ``finish`` ends the stream at the
utterance's end. Sample positions then count the audio given to the encoder. Not streamed, each
segment is one complete file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from .audio import BYTES_PER_SAMPLE, AudioFormat, Resampler, Samples, encode, wav_header
from .encoders import COMPRESSED_FORMATS, CompressedFormat, StreamEncoder, encode_whole
from .frames import FrameHeader


@dataclass(slots=True)
class _Numbers:
    """The numbers the frame header gives the next message."""

    utterance_index: int
    context_number: int
    sentence_index: int = 0
    frame_index: int = 0  #: within the utterance


class _Compressor:
    """A compressed format's encoding: one encoder stream for a streamed utterance, begun when its first
    audio comes, or one whole file per segment."""

    def __init__(self, fmt: CompressedFormat, sample_rate: int, bitrate: int | None) -> None:
        self._args = fmt, sample_rate, bitrate
        self._stream: StreamEncoder | None = None

    def whole(self, audio: Samples) -> bytes:
        return encode_whole(audio, *self._args)

    def push(self, audio: Samples) -> bytes:
        """The stream's bytes for ``audio`` (none while a codec frame fills)."""
        if self._stream is None:
            self._stream = StreamEncoder(*self._args)
        return self._stream.encode(audio)

    def finish(self) -> bytes:
        """End the stream: its last bytes (the codec's delay), if it was begun."""
        if self._stream is None:
            return b""
        tail, self._stream = self._stream.finish(), None
        return tail


class AudioPacker:
    """Frames the audio of one utterance.

    Args:
        utterance_index: written into frame headers.
        fmt: the session's ``response_format``.
        sample_rate: the output rate.
        frame_ms: audio per binary message when streaming.
        frame_header: put the frame header in front of each message.
        stream_audio: False sends one message per segment holding the whole encoded segment.
        context_number: the utterance's context, written into frame headers (0, the default context,
            keeps the 24-byte ``VGA1`` header).
        bitrate: a compressed format's bit rate (None: its encoder's default).
    """

    def __init__(
        self,
        utterance_index: int,
        *,
        fmt: AudioFormat,
        sample_rate: int,
        frame_ms: int,
        frame_header: bool,
        stream_audio: bool,
        context_number: int = 0,
        bitrate: int | None = None,
    ) -> None:
        self._numbers = _Numbers(utterance_index, context_number)
        self.fmt: AudioFormat = fmt
        self.sample_rate = sample_rate
        self.frame_samples = max(1, round(sample_rate * frame_ms / 1000))
        self.frame_header = frame_header
        self.stream_audio = stream_audio
        self.samples_sent = 0  # utterance position of the next sample
        self._resampler: Resampler | None = None
        self._pending: list[Samples] = []
        self._pending_len = 0
        self.segment_bytes = 0
        self.segment_samples = 0
        self._compressor: _Compressor | None = None  # a compressed format's
        if fmt in COMPRESSED_FORMATS:
            self._compressor = _Compressor(cast(CompressedFormat, fmt), sample_rate, bitrate)

    def start_segment(self, sentence_index: int) -> int:
        """Begin a segment; returns its ``start_sample``."""
        self._numbers.sentence_index = sentence_index
        self._resampler = None
        self._pending, self._pending_len = [], 0
        self.segment_bytes = self.segment_samples = 0
        return self.samples_sent

    def push(self, samples: Samples, sample_rate: int) -> list[bytes]:
        """Add engine audio of the current segment; returns the messages now complete."""
        if self._resampler is None or self._resampler.in_rate != sample_rate:
            tail = self._drain_resampler()
            self._resampler = Resampler(sample_rate, self.sample_rate)
            self._append(tail)
        self._append(self._resampler.process(samples))
        return self._frames(final=False) if self.stream_audio else []

    def end_segment(self) -> list[bytes]:
        """Finish the current segment; returns its remaining messages (the last may be short)."""
        self._append(self._drain_resampler())
        self._resampler = None
        return self._frames(final=True)

    def finish(self) -> list[bytes]:
        """End the utterance: a streamed compressed format's last bytes (the codec's delay), if any."""
        if self._compressor is None:
            return []
        tail = self._compressor.finish()
        return [self._message(tail, 0)] if tail else []

    def _drain_resampler(self) -> Samples:
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        return self._resampler.process(np.zeros(0, dtype=np.float32), last=True)

    def _append(self, samples: Samples) -> None:
        if len(samples):
            self._pending.append(samples)
            self._pending_len += len(samples)

    def _frames(self, *, final: bool) -> list[bytes]:
        if not self._pending_len:
            return []
        audio = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        if self._compressor is not None:
            return self._compressed(self._compressor, audio)
        if not self.stream_audio:
            cut = len(audio)
        else:
            cut = len(audio) if final else len(audio) - len(audio) % self.frame_samples
        rest = audio[cut:]
        self._pending, self._pending_len = ([rest], len(rest)) if len(rest) else ([], 0)
        if not cut:
            return []
        # One encode for every frame: per 40 ms frame, numpy's per-call overhead cost more than the
        # arithmetic (bench/load.py's profile); every format encodes each sample on its own.
        payload = encode(audio[:cut], self.fmt)
        if not self.stream_audio:
            return [self._message(payload, cut)]
        step, width = self.frame_samples, BYTES_PER_SAMPLE[self.fmt]
        return [
            self._message(payload[i * width : (i + step) * width], min(step, cut - i))
            for i in range(0, cut, step)
        ]

    def _compressed(self, compressor: _Compressor, audio: Samples) -> list[bytes]:
        """Every pending sample through the encoder: its bytes so far, or the segment's whole file."""
        self._pending, self._pending_len = [], 0
        if not self.stream_audio:
            return [self._message(compressor.whole(audio), len(audio))]
        payload = compressor.push(audio)
        if payload:
            return [self._message(payload, len(audio))]
        self.samples_sent += len(audio)  # in the codec, to come out with the next bytes
        self.segment_samples += len(audio)
        return []

    def _message(self, payload: bytes, samples: int) -> bytes:
        if self.fmt == "wav":
            if not self.stream_audio:
                payload = wav_header(self.sample_rate, len(payload)) + payload
            elif self._numbers.frame_index == 0:
                payload = wav_header(self.sample_rate) + payload
        header, n = b"", self._numbers
        if self.frame_header:
            header = FrameHeader(
                n.utterance_index, n.sentence_index, n.frame_index, self.samples_sent, n.context_number
            ).serialize()
        n.frame_index += 1
        self.samples_sent += samples
        self.segment_samples += samples
        self.segment_bytes += len(payload)
        return header + payload


def payload_samples(payload_bytes: int, fmt: AudioFormat) -> int:
    """How many samples ``payload_bytes`` of ``fmt`` audio (without any WAV header) hold."""
    return payload_bytes // BYTES_PER_SAMPLE[fmt]
