"""Voice resolution: built-in voices first (any case), then uploaded voices, then aliases."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from voxgate.engine.base import UnknownVoice
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.voices.catalog import Catalog, VoiceNotServable
from voxgate.gateway.voices.local import VoiceStore


def engines() -> tuple[FakeEngine, FakeEngine]:
    local = FakeEngine(name="local")
    upstream = FakeEngine(name="upstream", clones=True)
    upstream.default_voice = "vivian"
    return local, upstream


def test_a_builtin_voice_beats_an_alias_of_the_same_name(tmp_path: Path) -> None:
    local, upstream = engines()
    catalog = Catalog([local, upstream], aliases={"vivian": "", "alloy": ""}, store=VoiceStore(tmp_path))
    resolved = asyncio.run(catalog.resolve("", "vivian"))
    assert (resolved.engine.name, resolved.voice) == ("upstream", "vivian")
    alias = asyncio.run(catalog.resolve("", "alloy"))
    assert (alias.engine.name, alias.voice) == ("local", "tone")


def test_voice_names_match_without_regard_to_case(tmp_path: Path) -> None:
    local, upstream = engines()
    catalog = Catalog([local, upstream], store=VoiceStore(tmp_path))
    resolved = asyncio.run(catalog.resolve("", "VIVIAN"))
    assert (resolved.engine.name, resolved.voice) == ("upstream", "vivian")


def test_an_uploaded_voice_goes_to_a_cloning_engine_and_beats_an_alias(tmp_path: Path) -> None:
    local, upstream = engines()
    store = VoiceStore(tmp_path)
    store.save("", "alloy", audio=np.zeros(16000, np.float32), sample_rate=16000, consent="yes")
    catalog = Catalog([local, upstream], aliases={"alloy": ""}, store=store)
    resolved = asyncio.run(catalog.resolve("", "alloy"))
    assert resolved.engine.name == "upstream" and resolved.reference is not None
    with pytest.raises(VoiceNotServable, match="cannot"):
        asyncio.run(catalog.resolve("", "alloy", model="local"))


def test_unknown_voice_lists_the_engines_voices(tmp_path: Path) -> None:
    catalog = Catalog(list(engines()), store=VoiceStore(tmp_path))
    with pytest.raises(UnknownVoice, match="tone"):
        asyncio.run(catalog.resolve("", "nobody"))


def test_aliases_match_without_regard_to_case(tmp_path: Path) -> None:
    catalog = Catalog(list(engines()), aliases={"Alloy": ""}, store=VoiceStore(tmp_path))
    resolved = asyncio.run(catalog.resolve("", "ALLOY"))
    assert (resolved.engine.name, resolved.voice) == ("local", "tone")
