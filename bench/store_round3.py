"""Figures of issue 35's storage and fleet rows, each against a real server (SeaweedFS, redis-server).

``lock`` (M4): ``--replicas`` S3 stores each save a new voice at once into a quota of 2.5 voices that holds
one, every voice PUT held ``--put-delay`` s by a proxy, the lock's staleness at its production value
(5 s): the bytes stored against the quota.

``restart`` (M5): cap 3 held as 2 + 1 sessions on two gateways sharing Redis; Redis restarted ``--rounds``
times, and each time as many more sessions opened as the gateways admit. ``--no-settle`` runs the acquire
as it was before (admissions not held after Redis is found empty).

``oversized`` (L2): a stub S3 whose HEAD says 4 KiB and whose GET sends ``--mib`` MiB; the peak RSS of
reading the voice, ``--whole`` as before (the GET's body collected whole) or through ``S3VoiceStore.get``.

    .venv/bin/python -m bench.store_round3 lock
    .venv/bin/python -m bench.store_round3 restart [--no-settle]
    .venv/bin/python -m bench.store_round3 oversized [--whole]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
import uuid
from pathlib import Path

import obstore
from voxgate.gateway.voices.s3 import S3VoiceStore

from tests.gateway import test_voice_store_s3_bounds as bounds
from tests.gateway.test_fleet_limits import over_cap_after_restarts
from tests.gateway.test_voice_store_s3_lock import SlowPuts, stored_bytes
from tests.redis_server import redis_server
from tests.seaweed_server import seaweed_server


def lock(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as folder, seaweed_server(Path(folder)) as seaweed:
        proxy = SlowPuts(("127.0.0.1", seaweed.s3_port), args.put_delay)
        os.environ.update({**seaweed.env, "AWS_ENDPOINT_URL": proxy.endpoint})
        started = time.monotonic()
        used, quota, outcomes = stored_bytes(args.replicas, f"bench-{uuid.uuid4().hex[:8]}")
        print(
            f"stored {used} of {quota} bytes ({used / quota:.2f}x the quota); saves: {outcomes}; "
            f"{time.monotonic() - started:.1f} s"
        )


def restart(args: argparse.Namespace) -> None:
    from voxgate.gateway.middleware import shared_limits

    if args.no_settle:
        init = shared_limits.SharedLimits.__init__

        def unsettled(self: shared_limits.SharedLimits, *a: object, **k: object) -> None:
            init(self, *a, **k)  # type: ignore[arg-type]
            self.settle_s = 0.0

        shared_limits.SharedLimits.__init__ = unsettled  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as folder, redis_server(Path(folder)) as redis:
        over = over_cap_after_restarts(redis, rounds=args.rounds)
    rounds = f"over it in {sum(map(bool, over))} of {len(over)} restarts"
    print(f"sessions admitted over the cap of 3, per restart: {over}; {rounds}")


def oversized(args: argparse.Namespace) -> None:
    bounds.BODY_BYTES = args.mib << 20
    with bounds.lying_server() as env:
        os.environ.update(env)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        store = S3VoiceStore("voxgate", "p")
        if args.whole:  # what S3VoiceStore.get did before
            data = bytes(obstore.get(store._s3, "_public/x.safetensors").bytes())
            got = f"{len(data) >> 20} MiB read whole"
            del data
        else:
            got = f"get() -> {store.get('', 'maria')}"
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(f"{got}; the store sent {bounds.LyingS3.sent >> 20} MiB; peak RSS {before} -> {peak} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description="issue 35's storage and fleet figures")
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("lock")
    one.add_argument("--replicas", type=int, default=3)
    one.add_argument("--put-delay", type=float, default=6.0)
    two = commands.add_parser("restart")
    two.add_argument("--rounds", type=int, default=6)
    two.add_argument("--no-settle", action="store_true")
    three = commands.add_parser("oversized")
    three.add_argument("--mib", type=int, default=2048)
    three.add_argument("--whole", action="store_true")
    args = parser.parse_args()
    {"lock": lock, "restart": restart, "oversized": oversized}[args.command](args)


if __name__ == "__main__":
    main()
