"""VoiceStore on a temp folder: round trips, the cap, atomic replacement and unreadable files."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import safetensors.numpy
from safetensors import safe_open
from voxgate.gateway.voices.local import (
    MAX_FILE_BYTES,
    PUBLIC_DIR,
    InvalidVoiceName,
    VoiceLimitReached,
    VoiceStore,
    check_name,
)

OWNER = "0123456789abcdef01234567"


def clip(seed: int, seconds: float = 1.5, rate: int = 16000) -> npt.NDArray[np.float32]:
    """Noise as a 16-bit source decodes (k / 32768), which the store keeps exactly."""
    pcm = np.random.default_rng(seed).integers(-16384, 16384, int(seconds * rate))
    return (pcm / 32768).astype(np.float32)


def file_of(name: str) -> str:
    return hashlib.sha256(name.casefold().encode()).hexdigest()[:32] + ".safetensors"


def voice_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != ".lock")


def test_save_get_list_delete(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    audio = clip(1)
    info = store.save(OWNER, "alice", audio=audio, sample_rate=16000, consent="c-1", ref_text="hi there")
    assert (info.name, info.kind, info.sample_rate, info.consent, info.ref_text) == (
        "alice",
        "audio",
        16000,
        "c-1",
        "hi there",
    )
    assert info.duration_s == pytest.approx(1.5)
    assert info.file_size == os.path.getsize(voice_files(tmp_path / OWNER)[0])
    store.save(
        OWNER, "bob", embedding=np.arange(16, dtype=np.float32), consent="c-2", speaker_description="low"
    )

    data = store.get(OWNER, "alice")
    assert data is not None and data.audio is not None and data.embedding is None
    np.testing.assert_array_equal(data.audio, audio)
    assert data.info == info
    bob = store.get(OWNER, "bob")
    assert bob is not None and bob.embedding is not None and bob.info.embedding_dim == 16
    np.testing.assert_array_equal(bob.embedding, np.arange(16, dtype=np.float32))
    assert [v.name for v in store.list(OWNER)] == ["alice", "bob"]
    assert store.info(OWNER, "bob") == bob.info

    assert store.delete(OWNER, "alice")
    assert not store.delete(OWNER, "alice")
    assert store.get(OWNER, "alice") is None and store.info(OWNER, "alice") is None
    assert [v.name for v in store.list(OWNER)] == ["bob"]


def test_names_match_in_any_case(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.save(OWNER, "Alice", audio=clip(1), sample_rate=16000, consent="c")
    found = store.get(OWNER, "ALICE")
    assert found is not None and found.info.name == "Alice"
    assert store.info(OWNER, "alice") is not None
    store.save(OWNER, "alice", audio=clip(2), sample_rate=16000, consent="c")  # replaces, not a second voice
    assert [v.name for v in store.list(OWNER)] == ["alice"]
    assert store.delete(OWNER, "ALICE") and store.list(OWNER) == []


def test_voices_saved_before_names_ignored_case_are_still_found(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.save(OWNER, "Bob", audio=clip(1), sample_rate=16000, consent="c")
    folder = tmp_path / OWNER
    legacy = folder / (hashlib.sha256(b"Bob").hexdigest()[:32] + ".safetensors")
    (folder / file_of("Bob")).rename(legacy)  # the file name an older gateway gave "Bob"
    assert store.get(OWNER, "Bob") is not None and store.get(OWNER, "BOB") is None
    store.save(OWNER, "Bob", audio=clip(2), sample_rate=16000, consent="c")
    assert not legacy.exists() and len(store.list(OWNER)) == 1
    assert store.delete(OWNER, "BOB")


def test_owners_are_separate_and_names_never_become_paths(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.save("", "shared name", audio=clip(1), sample_rate=16000, consent="c")
    store.save(OWNER, "shared name", audio=clip(2), sample_rate=16000, consent="c")
    tricky = "..  ~$HOME <x> é 🎤"
    store.save(OWNER, tricky, embedding=np.ones(4, np.float32), consent="c")
    assert [v.name for v in store.list("")] == ["shared name"]
    assert sorted(v.name for v in store.list(OWNER)) == sorted(["shared name", tricky])
    assert {p.parent.name for p in voice_files(tmp_path)} == {PUBLIC_DIR, OWNER}
    assert all(len(p.stem) == 32 for p in voice_files(tmp_path))
    assert store.list("fedcba9876543210fedcba98") == []
    for bad_owner in ("../x", "ABC", "a/b", "_public"):
        with pytest.raises(ValueError):
            store.list(bad_owner)


@pytest.mark.parametrize("name", ["", "x" * 65, "a/b", "a\\b", "a\0b", ".", "..", "tab\there"])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    store = VoiceStore(tmp_path)
    with pytest.raises(InvalidVoiceName):
        store.save(OWNER, name, embedding=np.ones(2, np.float32), consent="c")
    check_name("x" * 64)


def test_save_needs_exactly_one_payload(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    with pytest.raises(ValueError, match="exactly one"):
        store.save(OWNER, "v", consent="c")
    with pytest.raises(ValueError, match="exactly one"):
        store.save(
            OWNER, "v", audio=clip(1), sample_rate=16000, embedding=np.ones(2, np.float32), consent="c"
        )
    with pytest.raises(ValueError, match="sample rate"):
        store.save(OWNER, "v", audio=clip(1), consent="c")
    with pytest.raises(ValueError, match="non-empty"):
        store.save(OWNER, "v", embedding=np.ones((2, 2), np.float32), consent="c")


def test_cap_counts_new_names_only(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path, max_voices=2)
    store.save(OWNER, "a", embedding=np.ones(2, np.float32), consent="c")
    store.save(OWNER, "b", embedding=np.ones(2, np.float32), consent="c")
    with pytest.raises(VoiceLimitReached) as raised:
        store.save(OWNER, "c", embedding=np.ones(2, np.float32), consent="c")
    assert raised.value.limit == 2
    store.save(OWNER, "b", embedding=np.zeros(3, np.float32), consent="c2")  # a replacement is not new
    store.save("", "c", embedding=np.ones(2, np.float32), consent="c")  # another owner has its own cap
    store.delete(OWNER, "a")
    store.save(OWNER, "c", embedding=np.ones(2, np.float32), consent="c")
    assert [v.name for v in store.list(OWNER)] == ["b", "c"]


def test_replace_swaps_the_file_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.save(OWNER, "v", audio=clip(1), sample_rate=16000, consent="old")
    before = voice_files(tmp_path)
    second = clip(2, seconds=2.0)
    store.save(OWNER, "v", audio=second, sample_rate=22050, consent="new")
    after = voice_files(tmp_path)
    assert [p.name for p in after] == [p.name for p in before]
    assert not [p for p in after if p.name.startswith(".")]
    data = store.get(OWNER, "v")
    assert data is not None and data.audio is not None
    assert (data.info.consent, data.info.sample_rate) == ("new", 22050)
    np.testing.assert_array_equal(data.audio, second)


def test_unreadable_files_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = VoiceStore(tmp_path)
    store.save(OWNER, "good", audio=clip(1), sample_rate=16000, consent="c")
    store.save(OWNER, "torn", audio=clip(2), sample_rate=16000, consent="c")
    store.save(OWNER, "moved", audio=clip(3), sample_rate=16000, consent="c")
    folder = tmp_path / OWNER
    torn = folder / file_of("torn")
    torn.write_bytes(torn.read_bytes()[:-100])
    (folder / ("0" * 32 + ".safetensors")).write_bytes(b"\xff" * 40)  # garbage
    (folder / ("1" * 32 + ".safetensors")).write_bytes(  # a valid safetensors file that is not a voice
        safetensors.numpy.save({"weights": np.ones(3, np.float32)}, {"format": "pt"})
    )
    moved = folder / file_of("moved")
    moved.rename(folder / ("2" * 32 + ".safetensors"))  # its name no longer matches the file
    (folder / ".half-written.tmp").write_bytes(b"partial")

    with caplog.at_level(logging.WARNING, logger="voxgate.gateway.voices.local"):
        assert [v.name for v in store.list(OWNER)] == ["good"]
        assert store.get(OWNER, "torn") is None and store.info(OWNER, "torn") is None
        assert store.get(OWNER, "good") is not None
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) >= 5 and all("unreadable voice file" in r.getMessage() for r in warned)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="voxgate.gateway.voices.local"):
        store.list(OWNER)
    assert not caplog.records, "the same broken file is reported once, not on every listing"


def test_a_file_with_a_voice_header_but_a_wrong_tensor_or_size_is_skipped(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.save(OWNER, "wide", audio=clip(1), sample_rate=16000, consent="c")
    store.save(OWNER, "huge", audio=clip(1), sample_rate=16000, consent="c")
    path = tmp_path / OWNER / file_of("wide")
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
    path.write_bytes(safetensors.numpy.save({"audio": np.zeros(16000, np.float64)}, meta))
    huge = tmp_path / OWNER / file_of("huge")
    with open(huge, "r+b") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk is used
    assert store.list(OWNER) == []
    assert store.get(OWNER, "wide") is None and store.get(OWNER, "huge") is None


def test_a_second_store_sees_writes_and_deletes_without_restart(tmp_path: Path) -> None:
    first, second = VoiceStore(tmp_path), VoiceStore(tmp_path)
    assert second.list(OWNER) == []
    first.save(OWNER, "v", audio=clip(1), sample_rate=16000, consent="one")
    assert [v.consent for v in second.list(OWNER)] == ["one"]
    replacement = clip(9)
    first.save(OWNER, "v", audio=replacement, sample_rate=16000, consent="two")
    assert [v.consent for v in second.list(OWNER)] == ["two"]
    data = second.get(OWNER, "v")
    assert data is not None and data.audio is not None
    np.testing.assert_array_equal(data.audio, replacement)
    assert second.delete(OWNER, "v")
    assert first.list(OWNER) == [] and first.get(OWNER, "v") is None


def test_stale_temp_files_are_removed_at_startup(tmp_path: Path) -> None:
    folder = tmp_path / OWNER
    folder.mkdir()
    stale, fresh = folder / ".abc.stale.tmp", folder / ".abc.fresh.tmp"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    VoiceStore(tmp_path)
    assert not stale.exists() and fresh.exists()
