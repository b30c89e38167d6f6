"""espeak-ng drops the words of a clause past a few hundred spoken words; ``phonemize_whole`` loses none.

The real espeak-ng (the one Piper phonemizes with) reads 300 emoji as 202 words instead of 600 and loses
what follows a long hash in the same clause; the engine phonemizes such text in halves.
"""

from __future__ import annotations

import pytest
from voxgate.engine.piper_text import phonemize_whole

espeak = pytest.importorskip("piper.phonemize_espeak")


def _words(sentences: list[list[str]]) -> int:
    return sum(len("".join(s).split()) for s in sentences)


def _real(text: str) -> list[list[str]]:
    phonemes: list[list[str]] = espeak.EspeakPhonemizer().phonemize("en-us", text)
    return phonemes


def _truncating(text: str) -> list[list[str]]:
    """espeak's behaviour, reduced: a clause keeps at most 200 of its words."""
    return [[" ".join(["x"] * min(len(text.split()), 200))]]


def test_a_clause_espeak_would_cut_is_phonemized_in_halves_and_loses_nothing() -> None:
    text = " ".join(["w"] * 700)
    assert _words(_truncating(text)) == 200  # what one call gives
    assert _words(phonemize_whole(_truncating, text)) == 700


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\U0001f600" * 300, 600),  # each read as "grinning face"
        ("\U0001f44d\U0001f3fd" * 120, None),  # a thumbs up with its skin tone, never split apart
    ],
)
def test_the_real_espeak_reads_every_emoji(text: str, expected: int | None) -> None:
    whole = phonemize_whole(_real, text)
    one = _words(_real(text[:1] if expected is not None else text[:2]))
    assert _words(whole) == (expected if expected is not None else 120 * one) and one > 1
    assert _words(_real(text)) < _words(whole)  # espeak alone drops some


def test_words_after_a_long_hash_are_not_lost() -> None:
    text = "The hash is " + "a3f9" * 75 + " and then the last words are spoken"
    tail = _real("and then the last words are spoken")
    whole = phonemize_whole(_real, text)
    assert "".join("".join(s) for s in whole).endswith("".join("".join(s) for s in tail).rstrip())


def test_normal_text_is_phonemized_in_one_call() -> None:
    calls: list[str] = []

    def counting(text: str) -> list[list[str]]:
        calls.append(text)
        return _real(text)

    text = (
        "A normal sentence of about twenty words, with a comma or two, is never split, however long it reads."
    )
    assert phonemize_whole(counting, text) == _real(text)
    assert calls[0] == text and len(calls) == 3  # the whole, then the two halves that say the same
    assert phonemize_whole(counting, "Short.") == _real("Short.") and calls[3:] == ["Short."]
