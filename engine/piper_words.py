"""Word timings for Piper: its phoneme durations, mapped back to the words of the input text.

Piper speaks phonemes that espeak-ng made from the text, and espeak rewrites as it goes: ``$3.50`` becomes
"dollar three point five zero", ``5/12`` "five slash twelve", ``Dr.`` "doctor" (and ends an espeak
sentence), an emoji its name. The phoneme words therefore do not match the input words one to one. This
module maps them back, in two steps that need no audio:

1. ``plan``: every input word (a run of text between spaces, exactly as the input has it, punctuation
   included: ``"5/12,"``, ``"Dr."``, ``"said."``) is phonemized on its own, and a monotonic alignment
   (dynamic programming over the phoneme letters, stress and punctuation ignored) gives each input word the
   run of spoken phoneme words that best matches it. Input words that espeak does not voice on their own
   (a lone ``-``) are left out. Input words that the alignment gives no phoneme word (espeak merged them
   with a neighbour) share their neighbour's time, split by their phoneme length.
2. ``timings``: once the model has said how many samples each phoneme took (Piper's alignment output),
   each planned word gets exact times in samples from the start of that audio.

The timings tile the audio: a word starts where its first phoneme starts and ends where the next word
starts, so the pause after a word (its space, its comma) counts as part of it; the first word starts after
the model's leading silence, the last ends with the audio. Times are samples at the voice's rate, relative
to the start of the sentence's audio (``AudioChunk.words``).

Pure functions, no Piper import: the engine passes espeak in as a callable (``phonemize_word``).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .base import WordTiming

BOS, EOS, PAD, SPACE = "^", "$", "_", " "
# Phoneme symbols that are not sounds of a word: stress, length, tie and syllable marks, punctuation.
_MARKS = frozenset("ˈˌːˑ‿.|‖'")
# A token may take at most this many more phoneme words than it has on its own (espeak reads in context).
_SLACK = 3
# How far (in phoneme words) a word's end may be from where the words' own lengths put it.
_BAND = 8


@dataclass(frozen=True, slots=True)
class Group:
    """Input words that own one run of spoken phonemes of a sentence, starting at phoneme ``first``.

    Usually one word; several when espeak voiced them as one (their ``weights`` share the time).
    """

    words: tuple[str, ...]
    weights: tuple[int, ...]
    first: int


@dataclass(frozen=True, slots=True)
class _Spoken:
    sentence: int
    first: int  # index of its first phoneme in the sentence
    letters: str


def letters(phonemes: Sequence[str] | str) -> str:
    """The sounds of a phoneme string: stress, length, punctuation and spaces removed."""
    return "".join(
        p for p in phonemes if p not in _MARKS and not p.isspace() and unicodedata.category(p)[0] not in "PZ"
    )


def _spoken_words(sentences: Sequence[Sequence[str]]) -> list[_Spoken]:
    found: list[_Spoken] = []
    for s, phonemes in enumerate(sentences):
        start: int | None = None
        for i, p in enumerate([*phonemes, SPACE]):
            if p == SPACE:
                if start is not None:
                    sounds = letters(phonemes[start:i])
                    if sounds:
                        found.append(_Spoken(s, start, sounds))
                start = None
            elif start is None:
                start = i
    return found


def _lcs(a: str, b: str) -> int:
    """Length of the longest common subsequence (bit-parallel, Hyyrö 2004: one big-int step per letter)."""
    if a == b:
        return len(a)
    masks: dict[str, int] = {}
    for i, c in enumerate(b):
        masks[c] = masks.get(c, 0) | 1 << i
    full = (1 << len(b)) - 1
    v = full
    for c in a:
        u = v & masks.get(c, 0)
        v = ((v + u) | (v - u)) & full
    return len(b) - v.bit_count()


def _align(expected: list[str], counts: list[int], spoken: list[str]) -> list[tuple[int, int]]:
    """Give token ``i`` the spoken words ``[start, stop)``: contiguous, in order, every spoken word owned.

    Maximizes the matched phoneme letters minus the unmatched ones (an indel distance), token by token.
    """
    n, m = len(expected), len(spoken)
    worst = float("-inf")
    best = [[worst] * (m + 1) for _ in range(n + 1)]
    back = [[0] * (m + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    scale = m / max(1, sum(counts))
    at = 0
    for i in range(1, n + 1):
        e, limit = expected[i - 1], counts[i - 1] + _SLACK
        at += counts[i - 1]
        # Only ends near where the words alone would put this one: espeak's reading in context differs
        # from the words' own by a few words at most (the band keeps long texts linear, not quadratic).
        centre = round(at * scale)
        lo, hi = (0, m) if i == n else (max(0, centre - _BAND), min(m, centre + _BAND))
        for j in range(lo, hi + 1):
            for k in range(j, max(-1, j - limit - 1), -1):
                if best[i - 1][k] == worst:
                    continue
                run = "".join(spoken[k:j])
                bound = best[i - 1][k] - abs(len(e) - len(run))  # the score if every letter matched
                if bound <= best[i][j]:
                    continue
                score = best[i - 1][k] + 2 * _lcs(e, run) - len(e) - len(run)
                if score > best[i][j]:
                    best[i][j], back[i][j] = score, k
    if best[n][m] == worst:  # more spoken words than the tokens can take: the last one takes the rest
        back[n][m] = max(range(m + 1), key=best[n - 1].__getitem__)
    spans: list[tuple[int, int]] = []
    j = m
    for i in range(n, 0, -1):
        k = back[i][j]
        spans.append((k, j))
        j = k
    spans.reverse()
    return spans


def plan(
    text: str | Sequence[tuple[str, str]],
    sentences: Sequence[Sequence[str]],
    phonemize_word: Callable[[str], str],
) -> list[list[Group]]:
    """Which input words each of Piper's phoneme sentences speaks, and from which phoneme.

    Args:
        text: the input text, as the client sent it; or its words, each as Piper reads it and as the client
            wrote it (``piper_text.with_phonemes``: ``("[[ŋwiən]],", "Nguyen,")``).
        sentences: what espeak made of it (``PiperVoice.phonemize(text)``): phoneme symbols per sentence.
        phonemize_word: espeak on one input word alone, as one phoneme string.

    Returns:
        For each sentence, its groups in order (see ``Group``); empty for a sentence of no input word.
    """
    read = [(t, t) for t in text.split()] if isinstance(text, str) else text
    alone = [(name, phonemize_word(form)) for form, name in read]
    tokens = [(t, letters(p)) for t, p in alone if letters(p)]
    counts = [max(1, len(p.split())) for _, p in alone if letters(p)]
    spoken = _spoken_words(sentences)
    out: list[list[Group]] = [[] for _ in sentences]
    if not tokens or not spoken:
        return out
    spans = _align([e for _, e in tokens], counts, [w.letters for w in spoken])
    pending: list[tuple[str, int]] = []  # tokens with no spoken word yet: they join the next owner
    groups: list[tuple[list[tuple[str, int]], int]] = []  # (words, first spoken word)
    for (token, sounds), (start, stop) in zip(tokens, spans, strict=True):
        if start == stop:
            if groups:
                groups[-1][0].append((token, len(sounds)))
            else:
                pending.append((token, len(sounds)))
            continue
        groups.append(([*pending, (token, len(sounds))], start))
        pending = []
    for words, start in groups:
        w = spoken[start]
        out[w.sentence].append(Group(tuple(t for t, _ in words), tuple(n for _, n in words), w.first))
    return out


def phoneme_samples(
    phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]], id_samples: Sequence[int]
) -> list[int]:
    """Samples per phoneme from Piper's samples per phoneme id.

    Piper's ids are ``BOS PAD (phoneme PAD)* EOS``, skipping phonemes missing from ``id_map``. Returns one
    count for BOS, one per phoneme (0 for a skipped one) and one for EOS; each PAD counts with the symbol
    before it, so the counts add up to the audio's length.
    """
    pad = len(id_map.get(PAD, ()))
    counts: list[int] = []
    at = 0
    for symbol in [BOS, *phonemes, EOS]:
        ids = id_map.get(symbol)
        if ids is None:
            counts.append(0)
            continue
        width = len(ids) + (pad if symbol != EOS else 0)
        counts.append(int(sum(id_samples[at : at + width])))
        at += width
    return counts


def timings(groups: Sequence[Group], samples: Sequence[int], first: int = 0) -> tuple[WordTiming, ...]:
    """The words of one sentence's audio, in samples from its start.

    Args:
        groups: the sentence's plan (``plan``).
        samples: samples per symbol of the audio (``phoneme_samples``): BOS, each phoneme, EOS.
        first: the sentence's phoneme at which this audio starts, when a sentence is synthesized in pieces
            (its words whose first phoneme lies in an earlier piece are not repeated; those starting after
            this piece's phonemes are left for a later piece). A word that goes on into the next piece
            ends with this audio here: ``Timeline`` times it over all its pieces.
    """
    starts = _onsets(groups, samples, first)
    return _tile(starts, int(sum(samples)))


def _onsets(groups: Sequence[Group], samples: Sequence[int], first: int) -> list[tuple[Group, int]]:
    """The groups whose first phoneme lies in this audio (phonemes ``first`` on), with their onsets."""
    last = first + len(samples) - 2
    # +1: the BOS symbol before the audio's first phoneme
    return [(g, int(sum(samples[: g.first - first + 1]))) for g in groups if first <= g.first < last]


def _tile(starts: Sequence[tuple[Group, int]], end: int) -> tuple[WordTiming, ...]:
    """Each group from its onset to the next one's (the last to ``end``), its words sharing it by weight."""
    words: list[WordTiming] = []
    for n, (g, start) in enumerate(starts):
        stop = starts[n + 1][1] if n + 1 < len(starts) else end
        weight = sum(g.weights) or 1
        at, acc = start, 0
        for word, w in zip(g.words, g.weights, strict=True):
            acc += w
            cut = start + (stop - start) * acc // weight
            words.append(WordTiming(word, at, cut))
            at = cut
    return tuple(words)


class Timeline:
    """Word timings of one sentence synthesized in pieces (``engine.piper_text.cuts``), one piece at a time.

    A piece is cut at a gap between phoneme words, but one input word can be many phoneme words (a hash
    or a code spelled out, a URL read part by part, a long number): such a word starts in one piece and
    goes on in the next ones. It gets one timing over all of them, from its onset to where the next word
    starts: the audio from its onset on is held back until that is known, so that its timing comes with
    (before) the audio it describes. An ElevenLabs alignment then spells it where it is spoken, and no
    space is invented inside it. What is held is bounded by one input word's audio (a segment has at most
    ``protocol.segmenter.MAX_SEGMENT_CHARS`` characters); a sentence whose words all end within their
    pieces holds nothing.

    Args:
        groups: the sentence's plan (``plan``).
        starts: the first phoneme of each of its pieces, in order.
    """

    def __init__(self, groups: Sequence[Group], starts: Sequence[int]) -> None:
        self._groups, self._starts = list(groups), list(starts)
        self._next = 0  # the piece ``piece`` takes next
        self._held = 0  # samples held back: the pieces' audio not yet released
        self._open: tuple[Group, int] | None = None  # the word going on, and its onset in the held audio

    def piece(self, samples: Sequence[int]) -> tuple[int, tuple[WordTiming, ...]]:
        """Take the next piece's samples per symbol (``phoneme_samples``).

        Returns:
            How many samples to release, from the start of the held audio followed by this piece's, and
            the timings of the words in them (in samples from the first released one). The rest stays
            held for the next call; the sentence's last piece releases everything.
        """
        k, first = self._next, self._starts[self._next]
        self._next += 1
        held = self._held
        starts = [(g, held + onset) for g, onset in _onsets(self._groups, samples, first)]
        if self._open is not None:
            starts.insert(0, self._open)
        end = held + int(sum(samples))
        self._open, release = None, end
        if starts and self._goes_on(starts[-1][0], k):
            self._open = starts.pop()
            # The words before it go now; a word going on from the piece's first onset holds it all.
            release = self._open[1] if starts else 0
            self._open = (self._open[0], self._open[1] - release)
        self._held = end - release
        return release, _tile(starts, release)

    def _goes_on(self, group: Group, k: int) -> bool:
        """Whether ``group``, the last to start by piece ``k``, still speaks as piece ``k + 1`` starts."""
        if k + 1 >= len(self._starts):
            return False
        later = [g.first for g in self._groups if g.first > group.first]
        return not later or later[0] > self._starts[k + 1]
