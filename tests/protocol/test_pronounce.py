"""Tests for protocol.pronounce: which pronunciations the normalizer applies and which the engine says."""

from __future__ import annotations

import pytest
from voxgate.protocol.errors import ErrorCode, ProtocolError
from voxgate.protocol.messages import Pronunciation
from voxgate.protocol.normalize import Normalizer
from voxgate.protocol.pronounce import Phonemes, aliases, check, ipa_form, phonemes

ENTRIES = [
    Pronunciation(text="SQL", alias="sequel"),
    Pronunciation(text="Nguyen", ipa="ŋwˈiən"),
    Pronunciation(text="New  York", alias="the big apple", ipa="nˈuː   jˈɔːɹk", case_sensitive=False),
]
SYMBOLS = frozenset("ŋwˈiənuːjɔɹk ")


def _said(text: str, *, phonemes: bool) -> str:
    norm = Normalizer("on", aliases=aliases(ENTRIES, phonemes=phonemes))
    return norm.feed(text) + norm.flush()


def test_an_engine_with_phoneme_input_gets_the_ipa_words_as_written() -> None:
    assert _said("SQL by Nguyen in new york", phonemes=True) == "sequel by Nguyen in new york"
    assert phonemes(ENTRIES, SYMBOLS) == (
        Phonemes("Nguyen", "ŋwˈiən"),
        Phonemes("New York", "nˈuː jˈɔːɹk", case_sensitive=False),
    )
    assert check(ENTRIES, SYMBOLS) == ()
    assert phonemes(ENTRIES, SYMBOLS, "off") == ()  # the text is read as sent


def test_an_engine_without_says_the_alias_else_the_words_as_written_and_names_each_ipa() -> None:
    assert _said("SQL by Nguyen in new york", phonemes=False) == "sequel by Nguyen in the big apple"
    assert check(ENTRIES, frozenset()) == ("pronunciations[1].ipa", "pronunciations[2].ipa")
    assert check(None, frozenset()) == ()
    assert phonemes(ENTRIES, frozenset()) == ()


@pytest.mark.parametrize(
    ("ipa", "said"),
    [("ŋw[iən]", "'[' (U+005B) ']' (U+005D)"), ("ŋwĩən", "'̃' (U+0303)"), ("   ", "no phoneme")],
)
def test_a_symbol_the_voice_has_no_phoneme_for_is_refused_by_field(ipa: str, said: str) -> None:
    entries = [*ENTRIES, Pronunciation(text="x", ipa=ipa)]
    with pytest.raises(ProtocolError) as info:
        check(entries, SYMBOLS)
    assert info.value.code is ErrorCode.INVALID_MESSAGE
    assert info.value.field == "$.pronunciations[3].ipa"
    assert said in str(info.value)


def test_ipa_is_decomposed_as_espeak_writes_it() -> None:
    assert ipa_form(" ɛ̃  ʃɑ̃ ") == "ɛ̃ ʃɑ̃"
    assert ipa_form("\u00e9") == "e\u0301"
