"""Every stored voice is checked when it is read, as an upload is checked (``gateway.voices.clips``): a file
in the
store that an upload would have refused is skipped in listings with a warning, and never served or exported.

The files here are written as a foreign writer (an older version, a hand copy, a tampered bucket) would:
the voice format, the right owner and name, but a payload or metadata no upload could leave.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import safetensors.numpy
from voxgate.gateway.voices.clips import MAX_TEXT_BYTES
from voxgate.gateway.voices.folder import export_folder
from voxgate.gateway.voices.local import FORMAT, VoiceStore

OWNER = "0123456789abcdef01234567"


def voice_file(name: str, tensor: npt.NDArray[np.generic], *, rate: int = 0, **meta: str) -> bytes:
    """A voice file as the store writes one, with whatever tensor and metadata it is given."""
    kind = "audio" if rate else "embedding"
    header = {"format": FORMAT, "name": name, "owner": OWNER, "kind": kind, "consent": "yes"}
    header |= {"created_at": "1700000000.0", "sample_rate": str(rate), **meta}
    return safetensors.numpy.save({kind: tensor}, header)


def file_name(name: str) -> str:
    return hashlib.sha256(name.casefold().encode()).hexdigest()[:32] + ".safetensors"


def bad_voices() -> dict[str, bytes]:
    """Voices no upload could store, by name (and a good one), as the bytes of their files."""
    noise = np.random.default_rng(1).integers(-8000, 8000, 24000).astype(np.int16)
    nan = np.full(24000, 0.1, np.float32)  # float32 clips, as earlier versions stored them
    nan[100] = np.nan
    vector = np.ones(256, np.float32)
    vector[3] = np.inf
    return {
        "good": voice_file("good", noise, rate=16000),
        "nan-clip": voice_file("nan-clip", nan, rate=16000),
        "one-hertz": voice_file("one-hertz", noise[:48000], rate=1),  # "13.3 h"
        "long": voice_file("long", np.zeros(655 * 8000, np.int16), rate=8000),  # 655 s
        "transcript": voice_file("transcript", noise, rate=16000, ref_text="w" * (MAX_TEXT_BYTES + 1)),
        "inf-vector": voice_file("inf-vector", vector),
        "wide-vector": voice_file("wide-vector", np.ones(8193, np.float32)),
    }


def test_voices_an_upload_would_refuse_are_never_listed_served_or_exported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "voices" / OWNER
    folder.mkdir(parents=True)
    for name, data in bad_voices().items():
        (folder / file_name(name)).write_bytes(data)
    store = VoiceStore(tmp_path / "voices")
    with caplog.at_level(logging.WARNING, logger="voxgate.gateway.voices.local"):
        assert [info.name for info in store.list(OWNER)] == ["good"]
        for name in bad_voices():
            if name != "good":
                assert store.get(OWNER, name) is None, name
                assert store.info(OWNER, name) is None, name
    good = store.get(OWNER, "good")
    assert good is not None and good.audio is not None and good.info.duration_s == 1.5
    warned = " ".join(r.getMessage() for r in caplog.records)
    for reason in ("NaN", "1 Hz", "655 s", "ref_text", "8193 values"):
        assert reason in warned, (reason, warned)
    report = export_folder(store, OWNER, tmp_path / "speakers")
    assert [m.name for m in report.moved] == ["good"] and report.skipped == []
