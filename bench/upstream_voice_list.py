"""The cost of a hostile upstream's voice list (issue 35 L4): CPU per request, listing and error sizes.

A scripted upstream (tests/engine/test_remote_upstream_faults.py) lists ``--voices`` names; the gateway in
front of it (the remote engine, in this process) answers ``--requests`` ``POST /v1/audio/speech`` that name a
voice (``vivian``, the first listed: each request resolves it against the list). The CPU is this whole
process's (client, gateway and upstream), so the figure to compare is the difference from a run with
``--voices 1``.

    .venv/bin/python -m bench.upstream_voice_list --voices 100000
"""

from __future__ import annotations

import argparse
import time

import httpx

from tests.conftest import TIMEOUT_S
from tests.engine.test_remote import gateway, post_speech
from tests.engine.test_remote_hostile import FAST
from tests.engine.test_remote_upstream_faults import Scripted, scripted


def main() -> None:
    parser = argparse.ArgumentParser(description="the cost of a hostile upstream's voice list")
    parser.add_argument("--voices", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    server = Scripted(voices=["vivian", *(f"v{i}" for i in range(args.voices - 1))])
    with scripted(server) as url, gateway(url, **FAST) as b:
        for _ in range(3):
            post_speech(b, "Warm up.")
        started = time.process_time()
        for _ in range(args.requests):
            assert post_speech(b, "Hello there.", voice="vivian").status_code == 200
        per_request_ms = (time.process_time() - started) / args.requests * 1000
        listing = httpx.get(f"http://{b}/v1/audio/voices", timeout=TIMEOUT_S)
        unknown = post_speech(b, "Hello there.", voice="nobody")
    print(
        f"voices {args.voices}: CPU {per_request_ms:.1f} ms per request (whole process), "
        f"listing {len(listing.content) / 1e6:.2f} MB, "
        f"unknown-voice error {len(unknown.content) / 1e3:.1f} KB"
    )


if __name__ == "__main__":
    main()
