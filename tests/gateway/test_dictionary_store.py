"""The local store of pronunciation dictionaries (``gateway.voices.dictionaries.LocalDictionaries``): records
beside the voices, read back only from their own place, and the caps counted under a lock."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import msgspec
import pytest
from voxgate.gateway.voices.dictionaries import (
    SUBFOLDER,
    DictionaryLimitReached,
    DictionaryQuotaExceeded,
    LocalDictionaries,
)
from voxgate.gateway.voices.local import VoiceStore
from voxgate.protocol.dictionaries import Dictionary, encode, new_id
from voxgate.protocol.messages import Pronunciation

ALICE, BOB = "a1" * 12, "b2" * 12


def dictionary(owner: str = ALICE, **fields: object) -> Dictionary:
    values: dict[str, object] = {
        "id": new_id(),
        "owner": owner,
        "version_id": new_id(),
        "name": "Brands",
        "created_at": 1,
        "rules": [Pronunciation(text="SQL", alias="sequel")],
    }
    return Dictionary(**{**values, **fields})  # type: ignore[arg-type]


def test_records_live_beside_the_voices_and_are_never_voices(tmp_path: Path) -> None:
    store = LocalDictionaries(tmp_path)
    made = dictionary()
    store.add(made)
    assert (tmp_path / ALICE / SUBFOLDER / f"{made.id}.json").is_file()
    assert store.get(ALICE, made.id) == made and store.list(ALICE) == [made]
    assert store.get(BOB, made.id) is None and store.list(BOB) == []
    assert VoiceStore(tmp_path).list(ALICE) == []  # the voice store does not see them
    archived = store.modify(ALICE, made.id, lambda d: msgspec.structs.replace(d, archived_at=2))
    assert archived is not None and archived.archived_at == 2 and store.get(ALICE, made.id) == archived
    assert store.modify(BOB, made.id, lambda d: d) is None  # not Bob's
    assert store.delete(ALICE, made.id) and not store.delete(ALICE, made.id)
    assert store.modify(ALICE, made.id, lambda d: d) is None  # gone
    assert store.get(ALICE, "../../etc/passwd") is None and not store.delete(ALICE, "..")
    assert store.modify(ALICE, "..", lambda d: d) is None


def test_a_change_is_held_to_the_byte_quota_and_a_failed_one_writes_nothing(tmp_path: Path) -> None:
    one = len(encode(dictionary()))
    store = LocalDictionaries(tmp_path, max_bytes=2 * one)
    made = dictionary()
    store.add(made)
    more = [Pronunciation(text=f"w{n}", alias="x" * 100) for n in range(20)]
    with pytest.raises(DictionaryQuotaExceeded):
        store.modify(ALICE, made.id, lambda d: msgspec.structs.replace(d, rules=d.rules + more))
    assert store.get(ALICE, made.id) == made

    def fails(d: Dictionary) -> Dictionary:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        store.modify(ALICE, made.id, fails)
    assert store.get(ALICE, made.id) == made


def test_a_record_out_of_its_place_or_broken_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalDictionaries(tmp_path)
    made = dictionary()
    store.add(made)
    bobs = tmp_path / BOB / SUBFOLDER
    bobs.mkdir(parents=True)
    shutil.copy(tmp_path / ALICE / SUBFOLDER / f"{made.id}.json", bobs / f"{made.id}.json")  # copied by hand
    broken = new_id()
    (bobs / f"{broken}.json").write_bytes(b"{not json")
    (bobs / "notes.json").write_bytes(encode(dictionary(BOB)))  # not a name the server gives
    with caplog.at_level(logging.WARNING):
        assert store.list(BOB) == [] and store.get(BOB, made.id) is None and store.get(BOB, broken) is None
    assert "skipping unreadable pronunciation dictionary" in caplog.text


def test_the_caps_hold_against_concurrent_adds(tmp_path: Path) -> None:
    store = LocalDictionaries(tmp_path, max_dictionaries=3)
    refused: list[Exception] = []

    def add() -> None:
        try:
            LocalDictionaries(tmp_path, max_dictionaries=3).add(dictionary())  # as another process would
        except DictionaryLimitReached as exc:
            refused.append(exc)

    threads = [threading.Thread(target=add) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(store.list(ALICE)) == 3 and len(refused) == 5
    one = len(encode(dictionary()))
    quota = LocalDictionaries(tmp_path, max_bytes=one + one // 2)
    quota.add(dictionary(BOB))
    with pytest.raises(DictionaryQuotaExceeded):
        quota.add(dictionary(BOB))
