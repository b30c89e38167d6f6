"""How well a cut between two words reads aloud: the one scoring that every cut inside a sentence uses.

A segment cut before its sentence ends (``protocol.segmenter``, to be in time for the listener) and a
Piper piece cut inside a long sentence (``engine.piper_text``) both ask :func:`score` which gap to cut
at. A reader pauses at a clause mark; less, but naturally, before a word that opens a phrase ("and",
"because", "with"); anywhere else a cut is a break in the phrase ("streaming text | into speech" was
heard as "streaming text, and to speech"). So the best gap is the last one of the highest score.
"""

from __future__ import annotations

from typing import Final

#: No cut: inside a word.
NONE: Final = 0
#: After a word that leans on the next ("the | calendar", "I | can", "to | check"): a last resort.
BOUND: Final = 1
#: Between two words of one phrase.
WORD: Final = 2
#: Before a word that opens a phrase: a conjunction, a relative or a common preposition.
PHRASE: Final = 3
#: After a clause mark: ``,`` ``;`` ``:`` ``—`` ``–`` (CJK ``，、；：``).
CLAUSE: Final = 4
#: After a sentence end.
SENTENCE: Final = 5

SENTENCE_MARKS: Final = frozenset(".!?…。！？｡")
CJK_CLAUSE_MARKS: Final = frozenset("，、；：")
CLAUSE_MARKS: Final = frozenset(",;:—–") | CJK_CLAUSE_MARKS
#: Closing quotes and brackets, kept with the mark before them; opening ones, kept with the word after.
CLOSERS: Final = "\"')]}”’»」』）】》〉〕］｝"
OPENERS: Final = "\"'([{“‘«「『（【《〈¿¡"
# English words a phrase opens with. Not "of" / "the" / "a": a cut before them splits a noun phrase.
PHRASE_WORDS: Final = frozenset(
    "and but or nor so yet because since although though while whereas unless until if when where "
    "which who whom whose that than then after before to for with without from into onto in on at by "
    "about through during over under between against like as".split()
)
# English words that lean on the word after them: articles, possessives, subject pronouns, prepositions.
LEANING_WORDS: Final = PHRASE_WORDS | frozenset(
    "a an the my your our their his her its this these those i we you he she they it of not no very "
    "will would can could shall should may might must is are was were be been am do does did has have had "
    "some any every each".split()
)


def score(before: str, after: str) -> int:
    """Score a cut between the word ``before`` and the word ``after`` (each with its punctuation).

    Args:
        before: the last word before the gap, as written (``"text,"``, ``"you."``, ``"—"``).
        after: the first word after it; empty when unknown (scored as if it opened no phrase).

    Returns:
        ``SENTENCE``, ``CLAUSE``, ``PHRASE``, ``WORD`` or ``BOUND``; ``NONE`` when ``before`` is empty.
    """
    if not before.strip():
        return NONE
    mark = before.rstrip().rstrip(CLOSERS)[-1:]
    if mark in SENTENCE_MARKS:
        return SENTENCE
    if mark in CLAUSE_MARKS:
        return CLAUSE
    head = after.strip()
    if head.startswith(("—", "–")):
        return CLAUSE  # "text — and": the dash is the clause mark
    if head[:1] and head[0] in OPENERS or head.lower().rstrip(",;:") in PHRASE_WORDS:
        return PHRASE
    return BOUND if before.strip().lstrip(OPENERS).lower() in LEANING_WORDS else WORD
