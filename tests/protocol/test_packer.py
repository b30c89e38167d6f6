"""AudioPacker: engine audio of an utterance in, binary WebSocket messages out."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile
from voxgate.protocol.audio import (
    BYTES_PER_SAMPLE,
    WAV_HEADER_BYTES,
    AudioFormat,
    Samples,
    decode,
    to_pcm16,
    wav_header,
)
from voxgate.protocol.frames import HEADER_BYTES, FrameHeader, split_frame
from voxgate.protocol.packer import AudioPacker, payload_samples


def ramp(start: int, count: int) -> Samples:
    """Distinct, exactly representable samples, so every sample can be traced to its frame."""
    return (np.arange(start, start + count) % 20000 / 32768).astype(np.float32)


def packer(
    fmt: AudioFormat = "pcm",
    *,
    sample_rate: int = 16000,
    frame_ms: int = 20,
    frame_header: bool = True,
    stream_audio: bool = True,
) -> AudioPacker:
    return AudioPacker(
        3,
        fmt=fmt,
        sample_rate=sample_rate,
        frame_ms=frame_ms,
        frame_header=frame_header,
        stream_audio=stream_audio,
    )


def headers_and_payloads(messages: list[bytes]) -> list[tuple[FrameHeader, bytes]]:
    out = []
    for message in messages:
        header, payload = split_frame(message)
        out.append((header, payload.tobytes()))
    return out


def test_frame_samples_follow_frame_ms() -> None:
    assert packer(sample_rate=16000, frame_ms=20).frame_samples == 320
    assert packer(sample_rate=22050, frame_ms=10).frame_samples == 220  # 220.5 rounds to even
    assert packer(sample_rate=8000, frame_ms=40).frame_samples == 320


def test_streamed_frames_are_frame_ms_except_the_last_of_a_segment() -> None:
    p = packer()
    assert p.start_segment(0) == 0
    messages = p.push(ramp(0, 1000), 16000)
    assert [len(m) for m in messages] == [HEADER_BYTES + 640] * 3  # 960 of 1000 samples; 40 wait
    messages += p.push(ramp(1000, 500), 16000)
    assert len(messages) == 4
    messages += p.end_segment()
    sizes = [len(payload) // 2 for _, payload in headers_and_payloads(messages)]
    assert sizes == [320, 320, 320, 320, 220]
    assert (p.segment_samples, p.segment_bytes, p.samples_sent) == (1500, 3000, 1500)


def test_headers_count_across_segments_and_samples_are_continuous() -> None:
    p = packer()
    messages: list[bytes] = []
    starts = []
    for sentence, count in enumerate([1500, 700, 100]):
        starts.append(p.start_segment(sentence))
        messages += p.push(ramp(sum([1500, 700, 100][:sentence]), count), 16000)
        messages += p.end_segment()
        assert p.segment_samples == count
    assert starts == [0, 1500, 2200]
    frames = headers_and_payloads(messages)
    assert [h.frame_index for h, _ in frames] == list(range(len(frames)))
    assert {h.utterance_index for h, _ in frames} == {3}
    assert [h.sentence_index for h, _ in frames] == [0] * 5 + [1] * 3 + [2]
    position = 0
    for header, payload in frames:
        assert header.start_sample == position
        position += len(payload) // 2
    assert position == p.samples_sent == 2300
    audio = b"".join(payload for _, payload in frames)
    assert audio == to_pcm16(ramp(0, 2300)).tobytes()  # nothing lost, duplicated or reordered


def test_without_frame_header_messages_are_bare_payloads() -> None:
    p = packer(frame_header=False)
    p.start_segment(0)
    messages = p.push(ramp(0, 700), 16000) + p.end_segment()
    assert [len(m) for m in messages] == [640, 640, 120]
    assert b"".join(messages) == to_pcm16(ramp(0, 700)).tobytes()


@pytest.mark.parametrize("fmt", ["pcm", "f32", "mulaw"])
def test_payload_size_follows_the_format(fmt: AudioFormat) -> None:
    p = packer(fmt, frame_header=False, frame_ms=10)
    p.start_segment(0)
    messages = p.push(ramp(0, 400), 16000) + p.end_segment()
    width = BYTES_PER_SAMPLE[fmt]
    assert [len(m) for m in messages] == [160 * width, 160 * width, 80 * width]
    assert p.segment_bytes == 400 * width
    np.testing.assert_allclose(decode(b"".join(messages), fmt), ramp(0, 400), atol=0.02)


def test_short_pushes_accumulate_into_whole_frames() -> None:
    p = packer(frame_header=False)
    p.start_segment(0)
    sizes = [len(m) for i in range(0, 1000, 50) for m in p.push(ramp(i, 50), 16000)]
    assert sizes == [640, 640, 640]
    assert [len(m) for m in p.end_segment()] == [80]


def test_empty_segment_sends_nothing() -> None:
    p = packer()
    p.start_segment(0)
    assert p.push(np.zeros(0, dtype=np.float32), 16000) == []
    assert p.end_segment() == []
    assert p.start_segment(1) == 0
    assert (p.segment_bytes, p.segment_samples) == (0, 0)


def test_end_segment_on_a_frame_boundary_sends_no_empty_frame() -> None:
    p = packer()
    p.start_segment(0)
    assert len(p.push(ramp(0, 640), 16000)) == 2
    assert p.end_segment() == []


def test_wav_stream_has_one_header_in_front_of_the_first_frame() -> None:
    p = packer("wav")
    messages: list[bytes] = []
    for sentence in range(2):
        p.start_segment(sentence)
        messages += p.push(ramp(0, 700), 16000) + p.end_segment()
    frames = headers_and_payloads(messages)
    assert len(frames) == 6
    first = frames[0][1]
    assert first[:WAV_HEADER_BYTES] == wav_header(16000)  # streaming: sizes unknown
    assert len(first) == WAV_HEADER_BYTES + 640
    assert [len(payload) for _, payload in frames[1:]] == [640, 120, 640, 640, 120]
    # The header is not audio: it moves no sample position.
    assert [h.start_sample for h, _ in frames] == [0, 320, 640, 700, 1020, 1340]


def test_wav_stream_without_frame_header_is_one_playable_stream() -> None:
    p = packer("wav", frame_header=False)
    p.start_segment(0)
    messages = p.push(ramp(0, 1000), 16000) + p.end_segment()
    stream = b"".join(messages)
    assert stream[:WAV_HEADER_BYTES] == wav_header(16000)
    assert stream[WAV_HEADER_BYTES:] == to_pcm16(ramp(0, 1000)).tobytes()
    assert p.segment_bytes == WAV_HEADER_BYTES + 2000


@pytest.mark.parametrize("fmt", ["pcm", "f32", "mulaw"])
def test_unstreamed_audio_is_one_message_per_segment(fmt: AudioFormat) -> None:
    p = packer(fmt, stream_audio=False)
    messages: list[bytes] = []
    for sentence, count in enumerate([1000, 600]):
        p.start_segment(sentence)
        assert p.push(ramp(0, count // 2), 16000) == []
        assert p.push(ramp(count // 2, count // 2), 16000) == []
        messages += p.end_segment()
    frames = headers_and_payloads(messages)
    assert [h for h, _ in frames] == [FrameHeader(3, 0, 0, 0), FrameHeader(3, 1, 1, 1000)]
    assert [len(payload) for _, payload in frames] == [
        1000 * BYTES_PER_SAMPLE[fmt],
        600 * BYTES_PER_SAMPLE[fmt],
    ]
    np.testing.assert_allclose(decode(frames[1][1], fmt), ramp(0, 600), atol=0.02)


def test_unstreamed_wav_is_a_complete_file_per_segment() -> None:
    p = packer("wav", stream_audio=False, frame_header=False)
    files: list[bytes] = []
    for sentence, count in enumerate([1234, 321]):
        p.start_segment(sentence)
        p.push(ramp(0, count), 16000)
        [message] = p.end_segment()
        assert p.segment_bytes == len(message)
        files.append(message)
    for data, count in zip(files, [1234, 321], strict=True):
        assert data[:WAV_HEADER_BYTES] == wav_header(16000, 2 * count)  # exact sizes
        samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
        assert rate == 16000
        np.testing.assert_array_equal(samples, to_pcm16(ramp(0, count)))


def test_unstreamed_empty_segment_sends_nothing() -> None:
    p = packer("wav", stream_audio=False)
    p.start_segment(0)
    assert p.end_segment() == []


def test_push_resamples_to_the_output_rate() -> None:
    p = packer(sample_rate=8000, frame_ms=20)  # 160-sample frames
    p.start_segment(0)
    tone = (0.5 * np.sin(2 * np.pi * 300 * np.arange(22050) / 22050)).astype(np.float32)
    messages = [m for i in range(0, 22050, 2205) for m in p.push(tone[i : i + 2205], 22050)]
    messages += p.end_segment()
    frames = headers_and_payloads(messages)
    sizes = [len(payload) // 2 for _, payload in frames]
    assert all(size == 160 for size in sizes[:-1])
    assert 0 < sizes[-1] <= 160
    assert abs(sum(sizes) - 8000) <= 1  # 1 s in, 1 s out, the filter tail drained at the segment end
    assert [h.start_sample for h, _ in frames] == [160 * i for i in range(len(frames))]
    expected = 0.5 * np.sin(2 * np.pi * 300 * np.arange(8000) / 8000)
    audio = decode(b"".join(payload for _, payload in frames), "pcm")
    assert np.max(np.abs(audio[50:7950] - expected[50:7950])) < 1e-3


def test_engine_rate_change_within_a_segment_drains_the_old_resampler() -> None:
    p = packer(sample_rate=8000, frame_header=False)
    p.start_segment(0)
    messages = p.push(np.zeros(22050, dtype=np.float32), 22050)  # 1 s
    messages += p.push(np.zeros(8000, dtype=np.float32), 16000)  # 0.5 s
    messages += p.push(np.zeros(4000, dtype=np.float32), 8000)  # 0.5 s, passed through
    messages += p.end_segment()
    assert abs(p.segment_samples - 16000) <= 2


def test_each_segment_gets_a_fresh_resampler() -> None:
    p = packer(sample_rate=8000, frame_header=False)
    for sentence in range(3):
        p.start_segment(sentence)
        p.push(np.zeros(11025, dtype=np.float32), 22050)
        p.end_segment()
        assert abs(p.segment_samples - 4000) <= 1
    assert abs(p.samples_sent - 12000) <= 3


@pytest.mark.parametrize(("fmt", "samples"), [("pcm", 50), ("wav", 50), ("f32", 25), ("mulaw", 100)])
def test_payload_samples(fmt: AudioFormat, samples: int) -> None:
    assert payload_samples(100, fmt) == samples
