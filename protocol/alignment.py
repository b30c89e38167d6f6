"""Character timings of ElevenLabs' audio messages (``alignment``), from an engine's word timings or spread
evenly over a segment's audio, and their REST shape in seconds.

ElevenLabs' clients read the characters of each audio message with their start times and durations in ms
(``Alignment``); ``with-timestamps`` REST answers carry the same in seconds (``SecondsAlignment``). The
characters always spell the segment's text as written: word timings only time them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from .messages import WordTimestamp


class Alignment(msgspec.Struct, frozen=True):
    """Character timings of one audio message, in ms from the start of that message's audio."""

    chars: list[str]
    charStartTimesMs: list[int]  # noqa: N815 - ElevenLabs' field names
    charDurationsMs: list[int]  # noqa: N815


def spread_alignment(text: str, duration_ms: float) -> Alignment:
    """The alignment of a segment's ``text`` over its audio, each character getting an equal share.

    For engines that do not time words (``word_alignment`` otherwise): ``text`` is the segment as spoken,
    plus the space that separates it from the next one (clients complete a word at a space).
    """
    if not text:
        return Alignment([], [], [])
    return Alignment(list(text), *_spread(len(text), 0.0, duration_ms))


def _spread(n: int, start: float, end: float) -> tuple[list[int], list[int]]:
    """Start times and durations (ms) of ``n`` characters sharing ``start`` to ``end`` evenly."""
    edges = [round(start + i * (end - start) / n) for i in range(n + 1)]
    return edges[:-1], [b - a for a, b in zip(edges, edges[1:], strict=False)]


def word_alignment(text: str, words: list[WordTimestamp], offset_ms: float, duration_ms: float) -> Alignment:
    """The alignment of a segment from the engine's word timings, spelling ``text`` as it is written.

    Each word is looked for in ``text`` in order, from where the one before it ended; its characters and
    those up to the next word found (the space after it, punctuation the engine left out) share the word's
    time evenly, and characters before the first word go with it. The characters are the text's, never
    the words' joined by spaces: a word an engine times in parts (a long token, a URL or a hash split over
    synthesis pieces) is spelled whole, with no space invented inside it. A word not found (an engine
    that normalizes its words) lends its time to the word before it.

    Args:
        text: the segment as spoken, plus the space that separates it from the next one.
        words: the segment's words, in order, on the utterance's clock.
        offset_ms: where the segment's audio starts on that clock.
        duration_ms: the segment's audio; the last span reaches its end, so that a client adding up
            each message's span (pipecat) stays on the audio's clock.
    """
    return _aligned(text, words, offset_ms, duration_ms)[0]


def known_alignment(text: str, words: list[WordTimestamp], offset_ms: float) -> tuple[Alignment, float]:
    """The part of a segment's ``word_alignment`` that is final while its audio still comes.

    The last word found is left out with everything after it: how many characters it spans waits for
    the next word, and where it ends for the segment's end. The characters before it keep the times
    ``word_alignment`` gives them once the segment is done.

    Returns:
        The alignment of the first characters of ``text`` (none before the first word), and where the
        first character left out starts, in ms from the segment's start (0 with no word found).
    """
    return _aligned(text, words, offset_ms, None)


def _aligned(
    text: str, words: list[WordTimestamp], offset_ms: float, duration_ms: float | None
) -> tuple[Alignment, float]:
    """``word_alignment`` (``duration_ms`` None: ``known_alignment``), and where its open part starts."""
    spans: list[tuple[int, float, float]] = []  # each word found: where it starts in text, its times
    folded = text.lower() if len(text.lower()) == len(text) else text
    cursor = 0
    for word in words:
        at = text.find(word.word, cursor)
        if at < 0:
            at = folded.find(word.word.lower(), cursor)
        if at < 0 and spans:
            spans[-1] = (spans[-1][0], spans[-1][1], max(spans[-1][2], word.end_ms))
            continue
        if at < 0:  # the first word is not in the text: its time still starts the alignment
            at = cursor
        else:
            cursor = at + len(word.word)
        spans.append((at, word.start_ms, word.end_ms))
    if duration_ms is None and not spans:
        return Alignment([], [], []), 0.0
    if duration_ms is None:
        limit = math.inf
    elif not spans:
        return spread_alignment(text, duration_ms), duration_ms
    else:
        limit = duration_ms
    chars: list[str] = []
    starts: list[int] = []
    durations: list[int] = []
    bounds = [0, *(at for at, _, _ in spans[1:]), len(text)]
    for n, (start_ms, end_ms) in enumerate((s, e) for _, s, e in spans):
        piece = text[bounds[n] : bounds[n + 1]]
        start = min(max(start_ms - offset_ms, 0.0), limit)
        if n == len(spans) - 1 and duration_ms is None:  # still open: the next word bounds it
            return Alignment(chars, starts, durations), start
        if not piece:  # two words found at one place: the first adds no character
            continue
        end = limit if n == len(spans) - 1 else min(max(end_ms - offset_ms, start), limit)
        spread_starts, spread_durations = _spread(len(piece), start, end)
        chars += piece
        starts += spread_starts
        durations += spread_durations
    return Alignment(chars, starts, durations), limit


class WordNamer:
    """Names an engine's words of one segment in the client's own text (``text_normalization``).

    The engine times the words it said (``text``, the segment as spoken); each is named by the client's
    characters it stands for (``source``, through ``origins``): "twelve" by "$12.99", "sequel" by "**SQL**"'s
    "SQL". Words of one written form after its first name nothing (""), so that the names, in order, never
    repeat a character. A word not found in ``text`` keeps its own spelling.

    Args:
        text: the segment as spoken.
        source: the client's text it stands for (``Normalizer.source``).
        origins: for each character of ``text``, the index in ``source`` of the one it stands for.
    """

    def __init__(self, text: str, source: str, origins: Sequence[int]) -> None:
        self.text, self.source, self.origins = text, source, origins
        self._folded = text.lower() if len(text.lower()) == len(text) else text
        self._cursor = 0  # where in ``text`` the next word is looked for
        self._named = 0  # characters of ``source`` named so far

    def name(self, word: str) -> str:
        """The client's characters for the engine's next ``word``."""
        at = self.text.find(word, self._cursor)
        if at < 0:
            at = self._folded.find(word.lower(), self._cursor)
        if at < 0 or not word:
            return word
        self._cursor = at + len(word)
        start, end = max(self.origins[at], self._named), self.origins[self._cursor - 1] + 1
        self._named = max(self._named, end)
        return self.source[start:end]


class SecondsAlignment(msgspec.Struct, frozen=True):
    """The REST ``with-timestamps`` alignment: characters with start and end times in seconds."""

    characters: list[str]
    character_start_times_seconds: list[float]
    character_end_times_seconds: list[float]


def seconds_alignment(alignment: Alignment, offset_ms: float) -> SecondsAlignment:
    """``alignment`` in the REST shape, its times moved by ``offset_ms`` (where its audio starts)."""
    starts = [round((offset_ms + t) / 1000.0, 3) for t in alignment.charStartTimesMs]
    ends = [
        round((offset_ms + t + d) / 1000.0, 3)
        for t, d in zip(alignment.charStartTimesMs, alignment.charDurationsMs, strict=True)
    ]
    return SecondsAlignment(alignment.chars, starts, ends)
