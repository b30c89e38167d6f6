"""CPU time of the gateway's audio path alone: fake engine -> resample -> encode -> frames.

Drives ``AudioPacker`` directly with the fake engine's chunks, no sockets, and prints the CPU time
(``time.process_time``, best of 5) per second of audio for three outputs. CPU time, unlike wall time,
barely moves when other processes share the machine, so two trees compare fairly:

    PYTHONPATH=/path/to/tree .venv/bin/python bench/_audio_path.py
"""

from __future__ import annotations

import asyncio
import time

from voxgate.engine.base import SynthesisRequest
from voxgate.engine.fake import FakeEngine
from voxgate.protocol.audio import AudioFormat
from voxgate.protocol.packer import AudioPacker

TEXT = "Each sentence is spoken as soon as it ends, so the listener hears the first words almost at once."
SEGMENTS = 100
RUNS = 5
OUTPUTS: tuple[tuple[AudioFormat, int, int], ...] = (
    ("pcm", 24000, 40),
    ("pcm", 16000, 40),
    ("mulaw", 8000, 40),
)


async def cpu_ms_per_audio_s(fmt: AudioFormat, rate: int, frame_ms: int) -> float:
    engine = FakeEngine()
    start, audio_s = time.process_time(), 0.0
    for u in range(SEGMENTS):
        packer = AudioPacker(
            u, fmt=fmt, sample_rate=rate, frame_ms=frame_ms, frame_header=False, stream_audio=True
        )
        packer.start_segment(0)
        async for chunk in engine.synthesize(SynthesisRequest(text=TEXT, voice="tone")):
            packer.push(chunk.samples, chunk.sample_rate)
        packer.end_segment()
        audio_s += packer.samples_sent / rate
    return (time.process_time() - start) * 1000.0 / audio_s


def main() -> None:
    for fmt, rate, frame_ms in OUTPUTS:
        best = min(asyncio.run(cpu_ms_per_audio_s(fmt, rate, frame_ms)) for _ in range(RUNS))
        print(f"{fmt} {rate} Hz, {frame_ms} ms frames: {best:.3f} ms CPU per audio second")


if __name__ == "__main__":
    main()
