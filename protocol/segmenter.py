"""Incremental text segmentation for streaming speech synthesis.

An LLM emits text in arbitrary pieces ("Hel", "lo", " wor", "ld."). :class:`Segmenter` decides where
to cut that stream into segments that are synthesised one at a time, so audio can start before the
whole text has arrived.

The scanner walks the buffered text one character at a time and never revisits a decided position.
Each decision depends only on the text of the current segment plus at most one character of
look-ahead; when that look-ahead has not arrived yet the scan pauses and resumes on the next
:meth:`Segmenter.push`. Hence the segments are the same for every way of splitting the input into
chunks, and the work per character is constant (amortized linear overall).

Rules, by granularity:

* ``"sentence"``: ``.``/``!``/``?`` (plus closing quotes/brackets) followed by whitespace; CJK
  ``。！？｡`` (plus closing quotes/brackets) without needing whitespace; a blank line. A single ``.``
  does not end a sentence after a known abbreviation ("Dr.", "e.g.", "U.S."), a single capital
  initial ("J."), or inside an ellipsis ("..."); "No." only stays unsplit before a number ("No. 5").
* ``"clause"``: sentence cuts plus ``, ; : — –`` followed by whitespace and CJK ``，、；：``, but only
  once the segment holds at least :data:`MIN_CLAUSE_WORDS` words or :data:`MIN_CLAUSE_CJK_CHARS`
  CJK characters.
* ``"none"``: no punctuation cuts; only the hard cap and :meth:`Segmenter.flush` cut.

With ``eager_first`` (timed cuts) any segment of an utterance (for every granularity, ``"none"``
included) may be cut before its end, but only on :meth:`Segmenter.cut_early`, which the caller makes when
waiting longer would cost the listener: the session core's time budget (``max_buffer_delay_ms``) for the
first segment, its listener clock for the later ones (``protocol.core``). The cut is driven by time,
never by a word count, so a sentence that arrives whole, or in time, is never cut before its end. The
first segment always takes a sentence end. ``cut_early`` cuts only when the sentence end is not in sight
(the text does not end in a possible sentence end awaiting its next character), at the best boundary
:func:`protocol.boundaries.score` finds: the last clause boundary after at least
:data:`MIN_CLAUSE_WORDS` words, else the last gap before a word that opens a phrase ("and", "because",
"with"), else the last word boundary (between words, or between two CJK characters), those two after at
least :data:`EAGER_MIN_WORDS` words (:data:`EAGER_MIN_CJK_CHARS` CJK characters) in a first segment,
:data:`LATE_MIN_WORDS` (:data:`LATE_MIN_CJK_CHARS`) in a later one, whose cut means its listener is about
to run dry (a two-word phrase then beats silence; the cut is as late as the text allows, so short heads
come only from text that arrives barely in time); never inside a word,
and only where at least :data:`EAGER_TAIL_WORDS` words (:data:`EAGER_TAIL_CJK_CHARS` CJK characters) of
the visible text stay behind it, so no word is left to be spoken alone (complete words in a first
segment; in a later one the word still arriving counts too). When no point
qualifies it cuts nothing (the caller tries again when more text arrives). Without calls to
``cut_early`` the segments depend only on the text, never on how it was split into fragments.

No segment exceeds ``max_chars`` characters. When the cap is reached the cut goes to the last
unused punctuation boundary in the second half of the segment, else the last whitespace, else
exactly at the cap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final, Literal

from . import boundaries

# Where a segment may end besides the hard cap: nowhere ("none"), at sentence ends, or also at clauses.
Granularity = Literal["none", "sentence", "clause"]

# About 50 English words, 15-20 s of speech: real sentences almost never reach it, yet a run-on
# stream without punctuation still reaches the engine in bounded, promptly spoken pieces.
MAX_SEGMENT_CHARS: Final = 300
# Words before a timed early cut that is not at a clause boundary: about a second of speech, enough for a
# phrase's intonation; a slow stream waits for them rather than speak "The gateway" alone.
EAGER_MIN_WORDS: Final = 4
# The same for CJK text, in characters.
EAGER_MIN_CJK_CHARS: Final = 6
# The same for a later segment: its timed cut means the listener is about to run dry, and its head need
# only not be one word alone ("I can | definitely help"); a first segment keeps its second of speech.
LATE_MIN_WORDS: Final = 2
LATE_MIN_CJK_CHARS: Final = 4
# Complete words of the visible text that a timed early cut leaves behind it: the rest of the sentence
# then holds at least these and the words still to come, never a lone "dog.".
EAGER_TAIL_WORDS: Final = 2
# The same for CJK text, in characters (about one syllable each).
EAGER_TAIL_CJK_CHARS: Final = 4
# One-word clauses ("Yes," "Well,") would become choppy audio and pay per-request engine overhead.
MIN_CLAUSE_WORDS: Final = 2
# Two CJK characters is typically a single word ("你好，"); four is the shortest natural phrase.
MIN_CLAUSE_CJK_CHARS: Final = 4
# Longest token that can be an abbreviation ("(approx", "U.S.A"); bounds the look-back per period.
_MAX_ABBREVIATION_CHARS: Final = 12
# Closing quotes/brackets kept with the preceding mark ('.")' is two); bounds the look-back.
_MAX_CLOSERS: Final = 4

_ASCII_TERMINATORS: Final = frozenset(".!?")
_CJK_TERMINATORS: Final = frozenset("。！？｡")
_CJK_CLAUSE_MARKS: Final = boundaries.CJK_CLAUSE_MARKS
_CLAUSE_MARKS: Final = boundaries.CLAUSE_MARKS - _CJK_CLAUSE_MARKS
_CLOSERS: Final = frozenset(boundaries.CLOSERS)
_OPENERS: Final = boundaries.OPENERS
# A character that may directly follow a CJK mark (or its closers) without ending its run.
_RUN_CONTINUES: Final = _CLOSERS | _CJK_TERMINATORS | _CJK_CLAUSE_MARKS | _ASCII_TERMINATORS
# A character after which the next non-space character may start a new segment.
_MARK_ENDS: Final = _CLOSERS | _CJK_TERMINATORS | _CJK_CLAUSE_MARKS
# Lower-cased tokens after which "." never ends a sentence: titles and common short forms. "etc."
# and "a.m." at a sentence end are ambiguous; they merge with the next sentence, which only costs
# latency. "no" is handled apart, as it is also an ordinary word.
_ABBREVIATIONS: Final = frozenset(
    "mr mrs ms dr prof st jr sr vs etc fig approx mt inc ltd corp vol dept ave gen col lt capt sgt "
    "rev cf al ph.d".split()
)
# Dotted single letters: "e.g", "i.e", "U.S", "a.m", "U.S.A" (the final dot is the one examined).
_DOTTED_LETTERS: Final = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")
# Plain ASCII letters/digits never start or end a boundary; runs of them are skipped in bulk.
_PLAIN_RUN: Final = re.compile(r"[A-Za-z0-9]+")

# What _boundary() found before a character (plain codes, compared often on the hot path).
_NO_CUT: Final = 0
_SENTENCE: Final = 1
_CLAUSE: Final = 2
_NEED_MORE: Final = 3


def _is_cjk(char: str) -> bool:
    """Return whether ``char`` is a Han ideograph or Japanese kana (scripts written without spaces)."""
    code = ord(char)
    return (
        0x4E00 <= code <= 0x9FFF
        or 0x3040 <= code <= 0x30FF
        or 0x3400 <= code <= 0x4DBF
        or 0x31F0 <= code <= 0x31FF
        or 0xF900 <= code <= 0xFAFF
        or 0xFF66 <= code <= 0xFF9F
        or 0x20000 <= code <= 0x2FFFF
    )


@dataclass(frozen=True, slots=True)
class _Rules:
    """Where a segmenter may cut, fixed when it is made (``Segmenter``'s arguments)."""

    sentences: bool  # at sentence ends (granularity not "none")
    clauses: bool  # at clause marks too (granularity "clause")
    eager_first: bool  # timed cuts on (``Segmenter.cut_early``)
    max_chars: int  # the hard cap on a segment's length


@dataclass(slots=True)
class _CutPoints:
    """Where ``cut_early`` may cut the buffered segment: (position, words before, CJK chars before), and for
    word boundaries the start of the token before (-1 between two CJK characters)."""

    clauses: list[tuple[int, int, int]] = field(default_factory=list)
    words: list[tuple[int, int, int, int]] = field(default_factory=list)


class Segmenter:
    """Cut a stream of text fragments into segments for a TTS engine.

    Args:
        granularity: ``"sentence"``, ``"clause"`` or ``"none"`` (see the module docstring).
        eager_first: Let :meth:`cut_early` cut any segment of an utterance before its end (timed
            cuts), so audio starts sooner and never runs dry. Applies to every granularity, ``"none"``
            included; the first segment of each utterance then always takes a sentence end.
        max_chars: Hard cap on the length of a segment, in characters after stripping.

    Raises:
        ValueError: If ``granularity`` is unknown or ``max_chars`` is below 1.
    """

    def __init__(
        self,
        granularity: Granularity = "sentence",
        *,
        eager_first: bool = True,
        max_chars: int = MAX_SEGMENT_CHARS,
    ) -> None:
        if granularity not in ("none", "sentence", "clause"):
            raise ValueError(f"unknown granularity {granularity!r}")
        if max_chars < 1:
            raise ValueError("max_chars must be at least 1")
        self._rules = _Rules(granularity != "none", granularity == "clause", eager_first, max_chars)
        self._buf = ""
        self._pos = 0  # next index of _buf to scan
        self._out: list[str] = []
        self._eager = eager_first
        self._new_segment(0)

    @property
    def pending(self) -> str:
        """Buffered text not yet emitted (leading whitespace already dropped)."""
        return self._buf[self._begin :]

    @property
    def eager_pending(self) -> bool:
        """Whether text of a segment that ``cut_early`` may cut is buffered (timed cuts are on)."""
        return self._rules.eager_first and self._has_content

    @property
    def first_pending(self) -> bool:
        """Whether the buffered segment would be the utterance's first (nothing was cut yet)."""
        return self._eager

    def cut_early(self) -> list[str]:
        """Cut the buffered segment now, at the best point the text allows (see the module docstring).

        Returns:
            The segment cut, or nothing: timed cuts off, nothing buffered, its end in sight, or no point
            that leaves enough words on both sides.
        """
        if self.eager_pending and not self._end_in_sight():
            at = self._early_point()
            if at >= 0:
                self._cut(at)
                self._recount(at, self._pos)
                self._compact()
        out, self._out = self._out, []
        return out

    def _end_in_sight(self) -> bool:
        """Whether the scanned text ends in a sentence mark whose next character decides the cut."""
        buf = self._buf
        if self._pos < len(buf):
            return True  # "No." waits for its next character
        last = buf[self._skip_closers(len(buf) - 1)]
        return last in _ASCII_TERMINATORS or last in _CJK_TERMINATORS or last == "…"

    def _early_point(self) -> int:
        """The last clause boundary, else phrase, else word boundary, with enough complete words after
        it; else -1."""
        # The last token may still grow, so a first segment counts only the complete words behind a cut. A
        # later one counts it too: the text goes on, and a word that grows is still a word.
        words = self._words - (1 if self._in_token and self._eager else 0)
        cjk = self._cjk
        for at, words_before, cjk_before in reversed(self._points.clauses):
            if words - words_before >= EAGER_TAIL_WORDS or cjk - cjk_before >= EAGER_TAIL_CJK_CHARS:
                return at
        best, best_score = -1, boundaries.NONE
        min_words, min_cjk = (EAGER_MIN_WORDS, EAGER_MIN_CJK_CHARS) if self._eager else (0, 0)
        for at, words_before, cjk_before, start in reversed(self._points.words):
            head = words_before >= min_words or cjk_before >= min_cjk
            tail = words - words_before >= EAGER_TAIL_WORDS or cjk - cjk_before >= EAGER_TAIL_CJK_CHARS
            # The latest point of each score comes first, so it wins its score.
            if head and tail and (score := self._gap_score(at, start)) > best_score:
                best, best_score = at, score
        return best

    def _gap_score(self, at: int, start: int) -> int:
        """``boundaries.score`` of the gap at ``at`` after the token from ``start`` (-1: between CJK)."""
        if start < 0:
            return boundaries.WORD
        buf = self._buf
        after = buf[at:].lstrip()
        end = next((i for i, ch in enumerate(after) if ch.isspace()), len(after))
        return boundaries.score(buf[start:at], after[:end])

    def push(self, text: str) -> list[str]:
        """Append text to the utterance.

        Args:
            text: The next fragment, of any length (empty is allowed).

        Returns:
            The segments that are now complete, stripped and non-empty; possibly none.
        """
        if text:
            self._buf += text
            self._scan(final=False)
            self._compact()
        out, self._out = self._out, []
        return out

    def flush(self) -> list[str]:
        """End the utterance and return everything still buffered.

        The remainder is cut by the same rules as :meth:`push` (and never exceeds ``max_chars``).
        Afterwards the segmenter is reset, so the next push starts a new utterance and
        ``eager_first`` applies again.

        Returns:
            The remaining segments, stripped and non-empty; possibly none.
        """
        self._scan(final=True)
        self._cut(len(self._buf))
        out = self._out
        self.reset()
        return out

    def commit(self) -> list[str]:
        """Cut everything buffered now, as ``flush`` does, but stay in the same utterance.

        For ``input.commit``: the client declares the text so far final. The eager first segment
        applies only if nothing has been cut yet.

        Returns:
            The segments cut, stripped and non-empty; possibly none.
        """
        self._scan(final=True)
        self._cut(len(self._buf))
        self._compact()
        out, self._out = self._out, []
        return out

    def reset(self) -> None:
        """Drop all buffered text (e.g. on barge-in) and start a new utterance."""
        self._buf = ""
        self._pos = 0
        self._out = []
        self._eager = self._rules.eager_first
        self._new_segment(0)

    def _new_segment(self, begin: int) -> None:
        self._begin = begin  # start of the segment; its first non-space char once _has_content
        self._has_content = False
        self._in_token = False
        self._tok_start = begin
        self._tok_word = False  # the current token contains a letter or digit (was counted)
        self._words = 0
        self._cjk = 0
        self._last_ws = -1
        self._soft = -1  # last punctuation boundary this granularity did not cut at
        self._points = _CutPoints()

    def _compact(self) -> None:
        drop = self._begin
        if drop:
            self._buf = self._buf[drop:]
            self._pos -= drop
            self._begin = 0
            self._tok_start = max(0, self._tok_start - drop)
            self._last_ws = self._last_ws - drop if self._last_ws >= 0 else -1
            self._soft = self._soft - drop if self._soft >= 0 else -1
            points = self._points
            points.clauses = [(at - drop, w, c) for at, w, c in points.clauses]
            points.words = [(at - drop, w, c, t - drop if t >= 0 else -1) for at, w, c, t in points.words]

    def _scan(self, *, final: bool) -> None:
        buf = self._buf
        end = len(buf)
        i = self._pos
        while i < end:
            if not self._step(i, final):
                break
            i += 1
            if self._in_token and self._tok_word:
                run = _PLAIN_RUN.match(buf, i - 1)
                if run is not None:
                    i = max(i, min(run.end(), self._begin + self._rules.max_chars))
        self._pos = i

    def _step(self, i: int, final: bool) -> bool:
        """Process ``_buf[i]``; return False (changing nothing) if it needs text not yet pushed."""
        char = self._buf[i]
        if self._has_content:
            kind = self._boundary(i, char, final)
            if kind == _NEED_MORE:
                return False
            if kind != _NO_CUT:
                if self._takes(kind):
                    self._cut(i)
                else:
                    self._soft = i
                    if self._rules.eager_first and kind == _CLAUSE and self._big_enough():
                        self._points.clauses.append((i, self._words, self._cjk))
        if self._has_content and i - self._begin >= self._rules.max_chars:
            self._cap(i, char)
        self._absorb(i, char)
        return True

    def _big_enough(self) -> bool:
        return self._words >= MIN_CLAUSE_WORDS or self._cjk >= MIN_CLAUSE_CJK_CHARS

    def _long_enough(self) -> bool:
        return self._words >= LATE_MIN_WORDS or self._cjk >= LATE_MIN_CJK_CHARS

    def _takes(self, kind: int) -> bool:
        if kind == _SENTENCE:
            return self._rules.sentences or self._eager
        return self._rules.clauses and self._big_enough()

    def _cap(self, i: int, char: str) -> None:
        if self._soft >= self._begin + self._rules.max_chars // 2:
            at = self._soft
        elif char.isspace():
            at = i
        elif self._last_ws > self._begin:
            at = self._last_ws
        else:
            at = i
        self._cut(at)
        self._recount(at, i)

    def _cut(self, at: int) -> None:
        segment = self._buf[self._begin : at].strip()
        if segment:
            self._out.append(segment)
            self._eager = False
        self._new_segment(at)

    def _recount(self, start: int, stop: int) -> None:
        for k in range(start, stop):
            self._absorb(k, self._buf[k])

    def _absorb(self, k: int, char: str) -> None:
        if char.isspace():
            if self._has_content:
                if self._rules.eager_first and self._in_token and self._long_enough():
                    self._points.words.append((k, self._words, self._cjk, self._tok_start))
                self._last_ws = k
                self._in_token = False
            else:
                self._begin = k + 1
            return
        if not self._has_content:
            self._has_content = True
            self._begin = k
        if not self._in_token:
            self._in_token = True
            self._tok_start = k
            self._tok_word = False
        if not self._tok_word and char.isalnum():
            self._tok_word = True
            self._words += 1
        if char >= "\u3040" and _is_cjk(char):
            if (
                self._rules.eager_first
                and k > self._begin
                and self._long_enough()
                and _is_cjk(self._buf[k - 1])
            ):
                self._points.words.append((k, self._words, self._cjk, -1))
            self._cjk += 1

    def _boundary(self, i: int, char: str, final: bool) -> int:
        """Classify the position before ``_buf[i]``; the segment is known to have content."""
        buf = self._buf
        prev = buf[i - 1]
        if char.isspace():
            if prev.isspace():
                return self._paragraph(i) if char == "\n" else _NO_CUT
            j = self._skip_closers(i - 1)
            mark = buf[j]
            if mark in "!?" or mark in _CJK_TERMINATORS:
                return _SENTENCE
            if mark == ".":
                return self._period(j, i, final)
            if mark in _CLAUSE_MARKS or mark in _CJK_CLAUSE_MARKS:
                return _CLAUSE
            return _NO_CUT
        if prev not in _MARK_ENDS or char in _RUN_CONTINUES:
            return _NO_CUT
        mark = buf[self._skip_closers(i - 1)]
        if mark in _CJK_TERMINATORS:
            return _SENTENCE
        if mark in _CJK_CLAUSE_MARKS:
            return _CLAUSE
        return _NO_CUT

    def _skip_closers(self, j: int) -> int:
        buf = self._buf
        stop = max(self._begin, j - _MAX_CLOSERS)
        while j > stop and buf[j] in _CLOSERS:
            j -= 1
        return j

    def _paragraph(self, i: int) -> int:
        buf = self._buf
        j = i - 1
        while j > self._begin and buf[j] in " \t\r":
            j -= 1
        return _SENTENCE if buf[j] == "\n" else _NO_CUT

    def _period(self, dot: int, i: int, final: bool) -> int:
        """Classify a ``.`` at ``dot`` followed (after closers) by the whitespace at ``i``."""
        buf = self._buf
        begin = self._begin
        if dot > begin and buf[dot - 1] in ".…":
            return _NO_CUT  # ellipsis
        start = dot
        limit = max(begin, dot - _MAX_ABBREVIATION_CHARS)
        while start > limit and not buf[start - 1].isspace():
            start -= 1
        if start == limit and start > begin and not buf[start - 1].isspace():
            return _SENTENCE  # a token this long is no abbreviation (e.g. a URL)
        core = buf[start:dot].lstrip(_OPENERS)
        lowered = core.lower()
        if lowered == "no":  # "No. 5" is an abbreviation, "The answer is no. We" is not
            if i + 1 >= len(buf):
                return _SENTENCE if final else _NEED_MORE
            return _NO_CUT if buf[i + 1].isdigit() else _SENTENCE
        if lowered in _ABBREVIATIONS or (len(core) == 1 and core.isupper()):
            return _NO_CUT
        return _NO_CUT if _DOTTED_LETTERS.fullmatch(core) else _SENTENCE
