"""The rule for letters a voice cannot read (``engine.scripts``): scripts, not digits or symbols."""

from __future__ import annotations

import pytest
from voxgate.engine.scripts import SCRIPTS, describe, script, unreadable

ENGLISH = SCRIPTS["en"]


@pytest.mark.parametrize(
    "text",
    [
        "Hello there, 3.14 and 42%!",
        "café naïve façade Øresund łódź ẞ",  # Latin with diacritics
        "ＦＵＬＬ width, 𝐛𝐨𝐥𝐝, the ﬁle, 1ª",  # compatibility forms fold to Latin
        "π r², Δt, 5 µs, α and β",  # lone Greek letters are symbols, read by name
        "😀 → ★ ♪ ©",  # symbols and emoji
        "don\u02bct, ˈstress",  # modifier letters
        "Done。",  # the ideographic full stop is punctuation
    ],
)
def test_english_reads_latin_digits_punctuation_and_symbols(text: str) -> None:
    assert unreadable(text, ENGLISH) == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("中文", {"中": "CJK", "文": "CJK"}),
        ("Hello 世界.", {"世": "CJK", "界": "CJK"}),
        ("مرحبا", {"م": "ARABIC", "ر": "ARABIC", "ح": "ARABIC", "ب": "ARABIC", "ا": "ARABIC"}),
        ("да", {"д": "CYRILLIC", "а": "CYRILLIC"}),
        ("αβ", {"α": "GREEK", "β": "GREEK"}),  # two Greek letters in a row are a word
        ("かな", {"か": "HIRAGANA", "な": "HIRAGANA"}),
        ("한", {"한": "HANGUL"}),
    ],
)
def test_english_refuses_letters_of_other_scripts(text: str, expected: dict[str, str]) -> None:
    assert unreadable(text, ENGLISH) == expected


def test_each_letter_is_listed_once_in_text_order() -> None:
    assert list(unreadable("文中文 and 中", ENGLISH)) == ["文", "中"]


def test_script_is_none_for_what_is_not_a_letter() -> None:
    assert [script(c) for c in "a7.,😀\u0301"] == ["LATIN", None, None, None, None, None]


def test_describe_lists_five_letters_and_counts_the_rest() -> None:
    assert describe({"中": "CJK", "文": "CJK"}) == "'中', '文' (CJK)"
    found = unreadable("Привет, かな", ENGLISH)
    assert describe(found) == "'П', 'р', 'и', 'в', 'е' and 3 more (Cyrillic, Hiragana)"
