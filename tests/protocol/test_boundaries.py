"""The one scoring of cuts inside a sentence (segmenter and Piper's pieces)."""

from __future__ import annotations

import pytest
from voxgate.protocol import boundaries
from voxgate.protocol.boundaries import BOUND, CLAUSE, NONE, PHRASE, SENTENCE, WORD, score


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ("you.", "Then", SENTENCE),
        ('"stop!"', "he", SENTENCE),
        ("text,", "into", CLAUSE),
        ("first:", "the", CLAUSE),
        ("text", "— and", CLAUSE),
        ("今天，", "我们", CLAUSE),
        ("gateway", "and", PHRASE),
        ("parcel", "with", PHRASE),
        ("said", "(quietly)", PHRASE),
        ("check", "the", WORD),
        ("streaming", "text", WORD),
        ("the", "calendar", BOUND),
        ("I", "can", BOUND),
        ("(the", "end", BOUND),
        ("", "word", NONE),
        ("word", "", WORD),
    ],
)
def test_score(before: str, after: str, expected: int) -> None:
    assert score(before, after) == expected


def test_scores_are_ordered_from_no_cut_to_a_sentence_end() -> None:
    assert NONE < BOUND < WORD < PHRASE < CLAUSE < SENTENCE
    assert "of" not in boundaries.PHRASE_WORDS and "and" in boundaries.PHRASE_WORDS
