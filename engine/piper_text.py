"""Piper's text side: phonemes cut into bounded pieces, and espeak-ng made to drop nothing.

A sentence longer than ``MAX_PIECE_PHONEMES`` is cut into pieces, one ONNX run each, where a reader would
pause: the gaps are scored by ``protocol.boundaries.score``, the one scoring the segmenter uses (a clause
mark, else before a word that opens a phrase, else between words; ``gap_scores`` scores a gap by the input
words on either side, from ``piper_words.plan``, since espeak's phoneme words do not match the text's).
No single run computes minutes of audio (300 emoji are 80 s of speech), and a cancel, or a more urgent
session's piece, waits for at most one piece. ``phonemize_whole`` works around espeak-ng
silently dropping the words of a clause past an internal limit. ``with_phonemes`` writes the words a client
gave phonemes for (``pronunciations`` with ``ipa``) as Piper's own phoneme input, ``[[ŋwiən]]``: Piper says
the phonemes inside as they are and espeak-ng reads the text around them.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Callable, Sequence

from ..protocol import boundaries
from ..protocol.pronounce import Phonemes
from .piper_words import Group

# Joe speaks about 18 phonemes (stress marks and word gaps included) a second: 120 are 6-7 s of
# audio, well under a second of compute on one core. No normal sentence (about 20 words) is cut,
# a cancel waits for at most one such run, and a long sentence cannot hold a worker for minutes.
MAX_PIECE_PHONEMES = 120
# Texts shorter than this are never cut by espeak-ng (``phonemize_whole``): 40 emoji with a skin tone (80
# characters, 200 spoken words) came out whole, 60 (120 characters) did not.
MIN_CHECKED_CHARS = 64
# Phoneme words looked at on each side of a gap when it is scored from the phonemes alone.
_NEAR = 48

#: Scores a word gap of a sentence's phonemes, given its index (``boundaries.score``'s scale).
GapScore = Callable[[int], int]
#: Piper's phoneme input in a text (``PiperVoice.phonemize``): said from the phonemes between the brackets.
_RAW = re.compile(r"\[\[.*?\]\]")


def with_phonemes(text: str, entries: Sequence[Phonemes]) -> tuple[str, list[tuple[str, str]]]:
    """``text`` with the words of each entry (whole words, any spaces between them; the longest first) written
    as Piper's phoneme input, ``[[ipa]]``; and the words of the result, each with the words of ``text`` it
    stands for (``("[[ŋwiən]],", "Nguyen,")``, for ``piper_words.plan``)."""
    if not entries:
        return text, [(word, word) for word in text.split()]
    exact: dict[str, str] = {}
    folded: dict[str, str] = {}
    parts: list[str] = []
    for entry in sorted(entries, key=lambda e: -len(e.text)):
        words = entry.text.split()
        body = r"\s+".join(map(re.escape, words))
        parts.append(body if entry.case_sensitive else f"(?i:{body})")
        if entry.case_sensitive:
            exact.setdefault(" ".join(words), entry.ipa)
        else:
            folded.setdefault(" ".join(words).lower(), entry.ipa)
    pattern = rf"(?<!\w)(?:{'|'.join(parts)})(?!\w)"
    found = re.compile(pattern)

    def said(match: re.Match[str]) -> str:
        words = " ".join(match[0].split())
        ipa = exact.get(words)
        return f"[[{ipa if ipa is not None else folded[words.lower()]}]]"

    tokens = re.finditer(rf"(?:{pattern}|\S)+", text)
    return found.sub(said, text), [(found.sub(said, t[0]), t[0]) for t in tokens]


def phoneme_scores(phonemes: Sequence[str]) -> GapScore:
    """Score each gap from the phoneme words on either side: their pauses (``,`` ``.`` ...) are the text's
    punctuation, so clause and sentence ends are found; any other gap scores as a plain word gap."""

    def score(gap: int) -> int:
        before = "".join(phonemes[max(0, gap - _NEAR) : gap]).rstrip().rsplit(" ", 1)[-1]
        after = "".join(phonemes[gap : gap + _NEAR]).lstrip().split(" ", 1)[0]
        return boundaries.score(before, after)

    return score


def gap_scores(groups: Sequence[Group], phonemes: Sequence[str]) -> GapScore:
    """Score each gap by the input words on either side (``groups``: ``piper_words.plan`` of the sentence),
    as the segmenter scores its cuts; a gap inside one input word's phonemes ("$25": "dollar twenty five")
    is a last resort, and one outside every group is scored from the phonemes."""
    firsts = [group.first for group in groups]
    fallback = phoneme_scores(phonemes)

    def score(gap: int) -> int:
        k = bisect.bisect_right(firsts, gap)
        if not 0 < k < len(groups):
            return fallback(gap)
        if any(p != " " for p in phonemes[gap : firsts[k]]):
            return boundaries.BOUND
        return boundaries.score(groups[k - 1].words[-1], groups[k].words[0])

    return score


def cuts(
    phonemes: list[str],
    limit: int = MAX_PIECE_PHONEMES,
    first: int | None = None,
    score: GapScore | None = None,
) -> list[tuple[int, list[str]]]:
    """Cut one sentence's phonemes into runs of at most ``limit`` phonemes, each with its start index;
    the first run at most ``first`` phonemes when given (a piece wanted sooner).

    Each cut falls at the best-scored word gap (``score``, by default ``phoneme_scores``) in the second
    half of the window, the last of that score; else at the last word gap; else (one word longer than the
    window) at its end. Word gaps at a cut are dropped.
    """
    score = score or phoneme_scores(phonemes)
    out: list[tuple[int, list[str]]] = []
    start = 0
    while len(phonemes) - start > (window := limit if out or first is None else min(first, limit)):
        rest = phonemes[start : start + window]
        gaps = [i for i in range(1, window) if rest[i] == " "]
        late = [i for i in gaps if i >= window // 2]
        cut = max(late, key=lambda i: (score(start + i), i)) if late else gaps[-1] if gaps else window
        out.append((start, rest[:cut]))
        start += cut
        while start < len(phonemes) and phonemes[start] == " ":
            start += 1
    out.append((start, phonemes[start:]))
    return [(at, piece) for at, piece in out if any(p != " " for p in piece)]


def pieces(phonemes: list[str], limit: int = MAX_PIECE_PHONEMES) -> list[list[str]]:
    """``cuts`` without the start indices."""
    return [piece for _, piece in cuts(phonemes, limit)]


def phonemize_whole(phonemize: Callable[[str], list[list[str]]], text: str) -> list[list[str]]:
    """``phonemize(text)``, with nothing dropped.

    espeak-ng silently drops the words of a clause past an internal limit that depends on what the text
    expands to: 120 thumbs-up emoji with a skin tone (600 spoken words) came out as 103 words, 300 plain
    emoji as 202 of 600, and words after a long hash were lost. So a text of ``MIN_CHECKED_CHARS`` or more
    is also phonemized in two halves (split at the space nearest its middle, or inside a long token);
    when the halves say more words than the whole, the whole was cut, and each half is phonemized the
    same way. Normal text says the same words either way and is phonemized whole (the check costs about
    2.6 ms of espeak for a 300-character segment, against hundreds of ms of synthesis).
    """
    sentences = phonemize(text)
    if len(text) < MIN_CHECKED_CHARS:
        return sentences
    left, right = _halves(text)
    if _spoken_words(phonemize(left) + phonemize(right)) <= _spoken_words(sentences):
        return sentences
    return phonemize_whole(phonemize, left) + phonemize_whole(phonemize, right)


def _spoken_words(sentences: list[list[str]]) -> int:
    return sum(len("".join(s).split()) for s in sentences)


def _halves(text: str) -> tuple[str, str]:
    """``text`` cut in two near its middle: at a space when there is one, else between two characters
    that are not joined (a combining mark, a variation selector or a zero-width joiner stays with the
    character before it); never inside Piper's phoneme input (``[[...]]``)."""
    middle = len(text) // 2
    raw = [range(m.start(), m.end()) for m in _RAW.finditer(text)]  # phoneme input is never cut
    spaces = [
        i
        for i, ch in enumerate(text)
        if ch.isspace() and 0 < i < len(text) - 1 and not any(i in r for r in raw)
    ]
    if spaces:
        at = min(spaces, key=lambda i: abs(i - middle))
        return text[:at], text[at + 1 :]
    at = middle
    while 0 < at < len(text) and (_joined(text[at]) or any(r.start < at < r.stop for r in raw)):
        at += 1
    at = at if 0 < at < len(text) else middle
    return text[:at], text[at:]


def _joined(ch: str) -> bool:
    return unicodedata.combining(ch) > 0 or ch in "\u200d\ufe0e\ufe0f" or "\U0001f3fb" <= ch <= "\U0001f3ff"
