"""``voxgate voices import|export``: voxgate's voice store to vllm-omni's speaker folder and back.

The folder format is vllm-omni 0.30's (serving_speech.py ``upload_voice`` / ``upload_voice_embedding`` /
``_restore_uploaded_speakers``); tests/vllm_omni/test_speaker_folder_real.py proves it against vllm-omni's
own code. Here: the round trip, what is skipped and why, and the command line.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import safetensors.numpy
from safetensors import safe_open
from voxgate.gateway.middleware.auth import owner_of
from voxgate.gateway.voices.clips import MAX_TEXT_BYTES, MAX_UPLOAD_EMBEDDING_DIM
from voxgate.gateway.voices.folder import export_folder, import_folder
from voxgate.gateway.voices.local import VoiceStore

from voxgate.cli import main

OWNER = owner_of("key-1")


def clip(seed: int, seconds: float = 1.5, rate: int = 16000) -> npt.NDArray[np.float32]:
    """Noise as a 16-bit source decodes (k / 32768), which the store keeps exactly."""
    pcm = np.random.default_rng(seed).integers(-16384, 16384, int(seconds * rate))
    return (pcm / 32768).astype(np.float32)


def vllm_file(folder: Path, filename: str, tensors: dict[str, npt.NDArray[np.float32]], **meta: str) -> Path:
    """A file as vllm-omni's upload writes it (its metadata header holds strings only)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    path.write_bytes(safetensors.numpy.save(tensors, meta))
    return path


def header(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="numpy") as f:
        return dict(f.metadata() or {})


def test_export_then_import_round_trips_clips_embeddings_and_metadata(tmp_path: Path) -> None:
    source = VoiceStore(tmp_path / "a")
    audio = clip(1)
    source.save(
        OWNER,
        "Alice",
        audio=audio,
        sample_rate=16000,
        consent="c-1",
        ref_text="Hi there.",
        speaker_description="warm",
    )
    source.save(OWNER, "bob", embedding=np.linspace(-1, 1, 1024, dtype=np.float32), consent="c-2")
    source.save("", "someone else's", audio=clip(2), sample_rate=16000, consent="c-3")

    folder = tmp_path / "speakers"
    report = export_folder(source, OWNER, folder)
    assert [m.name for m in report.moved] == ["Alice", "bob"] and report.skipped == []
    files = sorted(folder.glob("*.safetensors"))
    assert [p.name for p in files] == sorted(m.file for m in report.moved)
    alice = header(folder / report.moved[0].file)
    assert {k: alice[k] for k in ("name", "voice_name_lower", "consent", "ref_text", "embedding_source")} == {
        "name": "Alice",
        "voice_name_lower": "alice",
        "consent": "c-1",
        "ref_text": "Hi there.",
        "embedding_source": "audio",
    }
    assert alice["sample_rate"] == "16000" and alice["speaker_description"] == "warm"
    bob = header(folder / report.moved[1].file)
    assert (bob["embedding_source"], bob["embedding_dim"]) == ("direct", "1024")
    # Each export is a later second than the one before (vllm-omni's cache key is name and created_at).
    assert int(bob["created_at"]) > int(alice["created_at"])
    with safe_open(str(folder / report.moved[0].file), framework="numpy") as f:
        assert f.get_tensor("audio").dtype == np.float32

    target = VoiceStore(tmp_path / "b")
    back = import_folder(folder, target, "")
    assert sorted(m.name for m in back.moved) == ["Alice", "bob"] and back.skipped == []
    got = target.get("", "alice")
    assert got is not None and got.audio is not None
    assert (got.info.name, got.info.sample_rate, got.info.ref_text, got.info.consent) == (
        "Alice",
        16000,
        "Hi there.",
        "c-1",
    )
    assert got.info.speaker_description == "warm"
    np.testing.assert_array_equal(got.audio, audio)  # 16-bit values survive float32 and back exactly
    vector = target.get("", "bob")
    assert vector is not None and vector.embedding is not None
    np.testing.assert_array_equal(vector.embedding, np.linspace(-1, 1, 1024, dtype=np.float32))


def test_import_takes_a_clip_as_an_upload_would_be_stored(tmp_path: Path) -> None:
    # vllm-omni stores the clip as libsndfile decoded it: here stereo at 48 kHz, 2 s.
    t = np.arange(96000) / 48000
    stereo = np.stack([0.2 * np.sin(2 * np.pi * 220 * t), 0.4 * np.sin(2 * np.pi * 220 * t)], axis=1)
    folder = tmp_path / "speakers"
    vllm_file(
        folder,
        "Carol_ok_1700000000.safetensors",
        {"audio": stereo.astype(np.float32)},
        name="Carol",
        voice_name_lower="carol",
        consent="ok",
        created_at="1700000000",
        sample_rate="48000",
        embedding_source="audio",
    )
    store = VoiceStore(tmp_path / "voices")
    report = import_folder(folder, store, OWNER)
    assert [m.name for m in report.moved] == ["Carol"], report
    got = store.get(OWNER, "carol")
    assert got is not None and got.audio is not None
    assert got.info.sample_rate == 24000 and got.audio.ndim == 1  # mono, at the stored rate cap
    assert got.info.duration_s == pytest.approx(2.0, abs=0.01)
    assert float(np.abs(got.audio).max()) == pytest.approx(0.3, abs=0.01)  # the mean of the two channels


def test_import_skips_what_is_not_a_voice_and_says_why(tmp_path: Path) -> None:
    folder = tmp_path / "speakers"
    folder.mkdir()
    (folder / "torn.safetensors").write_bytes(b"\x10\x00\x00\x00not a header")
    vllm_file(folder, "nameless.safetensors", {"audio": clip(3)}, consent="ok", sample_rate="16000")
    vllm_file(
        folder,
        "short.safetensors",
        {"audio": clip(4, seconds=0.5)},
        name="short",
        consent="ok",
        sample_rate="16000",
    )
    vllm_file(folder, "nothing.safetensors", {"other": clip(5)}, name="other", consent="ok")
    vllm_file(folder, "good.safetensors", {"audio": clip(6)}, name="good", consent="ok", sample_rate="16000")
    (folder / "notes.txt").write_text("not a voice file")
    store = VoiceStore(tmp_path / "voices")
    report = import_folder(folder, store, "")
    assert [m.name for m in report.moved] == ["good"]
    reasons = {s.what: s.reason for s in report.skipped}
    assert set(reasons) == {
        "torn.safetensors",
        "nameless.safetensors",
        "short.safetensors",
        "nothing.safetensors",
    }
    assert "no voice name" in reasons["nameless.safetensors"]
    assert "1 to 30 s" in reasons["short.safetensors"]
    assert "neither" in reasons["nothing.safetensors"]


def test_a_voice_of_the_same_name_is_kept_unless_replaced(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "voices")
    store.save("", "dora", audio=clip(7), sample_rate=16000, consent="mine")
    folder = tmp_path / "speakers"
    vllm_file(folder, "x.safetensors", {"audio": clip(8)}, name="Dora", consent="theirs", sample_rate="16000")

    kept = import_folder(folder, store, "")
    assert kept.moved == [] and "exists" in kept.skipped[0].reason
    before = store.info("", "dora")
    assert before is not None and before.consent == "mine"
    replaced = import_folder(folder, store, "", replace=True)
    assert [m.name for m in replaced.moved] == ["Dora"]
    after = store.info("", "dora")
    assert after is not None and after.consent == "theirs"

    # Export: the folder's own file of that name stays, unless replaced; then only the new one is left.
    other = VoiceStore(tmp_path / "other")
    other.save("", "DORA", audio=clip(9), sample_rate=16000, consent="third")
    assert "has it" in export_folder(other, "", folder).skipped[0].reason
    assert [p.name for p in folder.glob("*.safetensors")] == ["x.safetensors"]
    report = export_folder(other, "", folder, replace=True)
    assert [p.name for p in folder.glob("*.safetensors")] == [report.moved[0].file]
    assert header(folder / report.moved[0].file)["consent"] == "third"


def test_names_that_make_the_same_file_name_get_their_own_files(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "voices")
    for name in ("a b", "a_b", "a?b"):  # each is a_b in a file name
        store.save("", name, audio=clip(10), sample_rate=16000, consent="c")
    report = export_folder(store, "", tmp_path / "speakers")
    assert (
        len({m.file for m in report.moved}) == 3 == len(list((tmp_path / "speakers").glob("*.safetensors")))
    )


def test_cli_exports_and_imports_without_a_gateway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = VoiceStore(tmp_path / "voices")
    store.save(OWNER, "erin", audio=clip(11), sample_rate=16000, consent="c", ref_text="Hello.")
    folder = tmp_path / "speakers"
    assert (
        main(
            [
                "voices",
                "export",
                str(folder),
                "--voices-dir",
                str(tmp_path / "voices"),
                "--owner-key",
                "key-1",
            ]
        )
        == 0
    )
    assert "exported 'erin'" in capsys.readouterr().out
    assert main(["voices", "import", str(folder), "--voices-dir", str(tmp_path / "copy")]) == 0
    assert "imported 'erin'" in capsys.readouterr().out
    assert VoiceStore(tmp_path / "copy").info("", "erin") is not None
    # A second import finds the voice there: skipped, and the exit status says so.
    assert main(["voices", "import", str(folder), "--voices-dir", str(tmp_path / "copy")]) == 1
    assert "exists" in capsys.readouterr().err
    assert main(["voices", "import", str(tmp_path / "missing"), "--voices-dir", str(tmp_path / "copy")]) == 1
    assert "no folder" in capsys.readouterr().err


def raw_file(folder: Path, filename: str, dtype: str, count: int, **meta: str) -> None:
    """A safetensors file with one ``speaker_embedding`` tensor of ``dtype`` (BF16, F8_E4M3: numpy has
    neither, so the file is written by hand)."""
    width = {"BF16": 2, "F8_E4M3": 1}[dtype]
    spec = {"dtype": dtype, "shape": [count], "data_offsets": [0, width * count]}
    head = json.dumps({"speaker_embedding": spec, "__metadata__": meta}).encode()
    head += b" " * (-len(head) % 8)
    (folder / filename).write_bytes(struct.pack("<Q", len(head)) + head + b"\x3c" * (width * count))


def test_import_reports_each_bad_file_and_imports_every_good_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each file is checked as an upload is (the same functions and limits); a bad one is reported by its
    file name with the reason, and the import goes on."""
    folder = tmp_path / "speakers"
    nan = np.ones(256, dtype=np.float32)
    nan[7] = np.nan
    vllm_file(folder, "a-nan.safetensors", {"speaker_embedding": nan}, name="nan", consent="ok")
    for i in range(3):
        vllm_file(
            folder,
            f"b-good{i}.safetensors",
            {"audio": clip(20 + i)},
            name=f"good{i}",
            consent="ok",
            sample_rate="16000",
        )
        vllm_file(
            folder,
            f"c-vector{i}.safetensors",
            {"speaker_embedding": np.ones(64, np.float32)},
            name=f"vector{i}",
            consent="ok",
        )
    raw_file(folder, "d-bf16.safetensors", "BF16", 64, name="bf16", consent="ok")
    raw_file(folder, "d-f8.safetensors", "F8_E4M3", 64, name="f8", consent="ok")
    vllm_file(
        folder, "e-rate.safetensors", {"audio": clip(30)}, name="rate", consent="ok", sample_rate=str(10**12)
    )
    vllm_file(folder, "e-hz.safetensors", {"audio": clip(31)}, name="hz", consent="ok", sample_rate="1")
    transcript = "word " * (MAX_TEXT_BYTES // 5 + 1)
    vllm_file(
        folder,
        "f-text.safetensors",
        {"audio": clip(32)},
        name="text",
        consent="ok",
        sample_rate="16000",
        ref_text=transcript,
    )
    wide = np.ones(MAX_UPLOAD_EMBEDDING_DIM + 1, np.float32)
    vllm_file(folder, "g-wide.safetensors", {"speaker_embedding": wide}, name="wide", consent="ok")
    voices = tmp_path / "voices"

    assert main(["voices", "import", str(folder), "--voices-dir", str(voices)]) == 1
    out, err = capsys.readouterr()
    imported = sorted(VoiceStore(voices).list(""), key=lambda info: info.name)
    assert [info.name for info in imported] == [f"good{i}" for i in range(3)] + [
        f"vector{i}" for i in range(3)
    ]
    assert out.count("imported ") == 6
    reasons = dict(
        line.removeprefix("skipped ").split(": ", 1)
        for line in err.splitlines()
        if line.startswith("skipped ")
    )
    assert sorted(reasons) == sorted(
        [
            "a-nan.safetensors",
            "d-bf16.safetensors",
            "d-f8.safetensors",
            "e-rate.safetensors",
            "e-hz.safetensors",
            "f-text.safetensors",
            "g-wide.safetensors",
        ]
    )
    assert "NaN" in reasons["a-nan.safetensors"]
    assert "BF16" in reasons["d-bf16.safetensors"] and "F8_E4M3" in reasons["d-f8.safetensors"]
    assert "Hz" in reasons["e-rate.safetensors"] and "Hz" in reasons["e-hz.safetensors"]
    assert (
        "ref_text" in reasons["f-text.safetensors"] and str(MAX_TEXT_BYTES) in reasons["f-text.safetensors"]
    )
    assert str(MAX_UPLOAD_EMBEDDING_DIM) in reasons["g-wide.safetensors"]
    assert "6 imported, 7 skipped" in err
