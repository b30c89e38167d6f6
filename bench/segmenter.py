"""Segmenter throughput: characters per second for one big push and for LLM-sized tokens.

Run: .venv/bin/python bench/segmenter.py
"""

from __future__ import annotations

import time

from voxgate.protocol.segmenter import Segmenter

TOKENS = ["Hel", "lo", " there", ",", " Dr", ".", " Smith", ".", " 你好", "。", " It", " costs", " 3.5"]


def main() -> None:
    stream = TOKENS * 10_000
    text = "".join(stream)
    for granularity in ("none", "sentence", "clause"):
        seg = Segmenter(granularity)
        started = time.perf_counter()
        for token in stream:
            seg.push(token)
        seg.flush()
        tokens_s = time.perf_counter() - started
        seg = Segmenter(granularity)
        started = time.perf_counter()
        seg.push(text)
        seg.flush()
        bulk_s = time.perf_counter() - started
        tokens_rate, bulk_rate = len(text) / tokens_s / 1e6, len(text) / bulk_s / 1e6
        print(f"{granularity:9s} tokens: {tokens_rate:5.2f} Mchar/s   one push: {bulk_rate:5.2f} Mchar/s")


if __name__ == "__main__":
    main()
