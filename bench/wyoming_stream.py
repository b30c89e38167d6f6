"""Home Assistant's streaming TTS over Wyoming, against ``voxgate serve --engine piper --wyoming``.

    .venv/bin/python bench/wyoming_stream.py [--runs 5] [--token-ms 30]

Each run opens a connection with the real ``wyoming`` client and sends what Home Assistant sends for an LLM
agent's answer: ``synthesize-start``, the paragraph in LLM-like tokens (``_text.tokenize``) on a fixed
schedule, the whole text again as ``synthesize``, ``synthesize-stop``; it reads as Home Assistant does, to
``synthesize-stopped``. Per run: the first ``audio-start`` after the first token was sent (first audio), how
long before the last token was sent it came (positive: speech began while the text was still arriving), and
the audio's length against the paragraph's. The median of the runs is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _serve import free_port, gateway
from _text import PARAGRAPH, tokenize
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped


async def run(port: int, token_s: float) -> tuple[float, float, float]:
    """One answer: (first audio after the first token, first audio before the last token, audio seconds)."""
    tokens = tokenize(PARAGRAPH)
    sent: list[float] = []
    async with AsyncTcpClient("127.0.0.1", port) as client:

        async def write() -> None:
            await client.write_event(SynthesizeStart().event())
            start = time.perf_counter()
            for n, token in enumerate(tokens):
                await asyncio.sleep(max(0.0, start + n * token_s - time.perf_counter()))
                await client.write_event(SynthesizeChunk(text=token).event())
                sent.append(time.perf_counter())
            await client.write_event(Synthesize(text=PARAGRAPH).event())
            await client.write_event(SynthesizeStop().event())

        writer = asyncio.ensure_future(write())
        first, audio_bytes, rate = 0.0, 0, 0
        while (event := await client.read_event()) is not None and not SynthesizeStopped.is_type(event.type):
            if AudioStart.is_type(event.type) and not first:
                first, rate = time.perf_counter(), AudioStart.from_event(event).rate
            elif AudioChunk.is_type(event.type):
                audio_bytes += len(AudioChunk.from_event(event).audio)
        await writer
    return first - sent[0], sent[-1] - first, audio_bytes / 2 / rate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--token-ms", type=float, default=30.0, help="the LLM's pace: ms between tokens")
    args = parser.parse_args()
    port = free_port()
    with gateway("--engine", "piper", "--wyoming", f"127.0.0.1:{port}"):
        results = [asyncio.run(run(port, args.token_ms / 1000)) for _ in range(args.runs)]
    first, ahead, audio = (statistics.median(r[i] for r in results) for i in range(3))
    print(
        f"{args.runs} runs, {len(tokenize(PARAGRAPH))} tokens every {args.token_ms:g} ms: first audio "
        f"{first * 1000:.0f} ms after the first token, {ahead:.2f} s before the last one; "
        f"{audio:.1f} s of audio"
    )


if __name__ == "__main__":
    main()
