"""Pronunciations as the normalizer looks them up while text streams in (sans-I/O; ``protocol.normalize``).

An ``Alias`` replaces whole words by what to say instead. ``AliasTable`` indexes a request's aliases for a
reader that sees one token at a time: the entries of one word as one pattern, and for the entries of several
words ("New York") what a token may still become the start of, and which words may begin one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


class Alias:
    """One pronunciation: the whole word ``text`` is spoken as ``alias``.

    Args:
        text: the word as written, or several words ("New York"); matched whole (not inside a longer word).
        alias: what to say instead; None keeps the words as written, out of every other rule (the engine
            says them from phonemes).
        case_sensitive: match ``text`` only in the same case (the default), else in any case.
    """

    __slots__ = ("alias", "case_sensitive", "text")

    def __init__(self, text: str, alias: str | None, *, case_sensitive: bool = True) -> None:
        self.text = text
        self.alias = alias
        self.case_sensitive = case_sensitive

    @property
    def key(self) -> str:
        """``text`` as it is looked up: its words one space apart, in lower case unless case-sensitive."""
        words = " ".join(self.text.split())
        return words if self.case_sensitive else words.lower()


class AliasTable:
    """A normalizer's aliases, indexed for looking them up one token at a time.

    Args:
        aliases: the pronunciations to apply.
    """

    __slots__ = ("_firsts", "_said", "_starts", "_word", "phrases")

    def __init__(self, aliases: Sequence[Alias]) -> None:
        single = [a for a in aliases if len(a.text.split()) == 1]
        self._word = _alias_pattern(single)
        self._said = {a.key: a.alias for a in single}
        #: Entries of several words, longest first: (their words one space apart, as looked up), ...
        self.phrases = sorted(
            ((a.key, a.alias, a.case_sensitive) for a in aliases if len(a.text.split()) > 1),
            key=lambda p: -len(p[0]),
        )
        # What a token may still become the start of (every start of an entry's first word), and what words
        # may be the first ones of an entry of several words: each in the entry's own case, else folded.
        self._starts: tuple[set[str], set[str]] = (set(), set())
        self._firsts: tuple[set[str], set[str]] = (set(), set())
        for a in aliases:
            key = a.key
            first = key.split(" ", 1)[0]
            self._starts[not a.case_sensitive].update(first[:n] for n in range(1, len(first) + 1))
            self._firsts[not a.case_sensitive].update(key[:n] for n, c in enumerate(key) if c == " ")

    def word_at(self, tok: str, i: int) -> tuple[str, int] | None:
        """The entry of one word that starts at ``i`` in ``tok``, if one does: what to say, and where it
        ends."""
        if self._word is None or (m := self._word.match(tok, i)) is None:
            return None
        said = self._said[m[0] if m[0] in self._said else m[0].lower()]
        return (said if said is not None else m[0]), m.end()

    def may_start(self, word: str, lowered: str) -> bool:
        """Whether ``word`` (and ``lowered``, the same in lower case) may still grow into an entry's first
        word."""
        return word in self._starts[0] or lowered in self._starts[1]

    def may_go_on(self, words: str) -> bool:
        """Whether ``words`` and a space begin a pronunciation of several words."""
        return words in self._firsts[0] or words.lower() in self._firsts[1]

    def phrase_start(self, tok: str, i: int) -> int | None:
        """The first word start from ``i`` on where the rest of ``tok`` begins a pronunciation of several
        words (its first words, then a space), if any."""
        for j in range(i, len(tok)):
            if (j == 0 or not tok[j - 1].isalnum()) and self.may_go_on(tok[j:]):
                return j
        return None

    def longest(self, words: str) -> tuple[int, str | None] | None:
        """The longest pronunciation of several words that ``words`` start with (whole words), if any: how
        many characters of ``words`` it takes, and its alias."""
        lowered = words.lower()
        for key, alias, sensitive in self.phrases:
            said = words if sensitive else lowered
            if said.startswith(key) and (len(said) == len(key) or not _is_word(said[len(key)])):
                return len(key), alias
        return None


def _alias_pattern(aliases: Sequence[Alias]) -> re.Pattern[str] | None:
    """One pattern for every alias, longest first, each whole-word (and case-insensitive when asked)."""
    if not aliases:
        return None
    parts = [
        re.escape(a.text) if a.case_sensitive else f"(?i:{re.escape(a.text)})"
        for a in sorted(aliases, key=lambda a: -len(a.text))
    ]
    return re.compile(rf"(?:{'|'.join(parts)})(?!\w)")


def _is_word(char: str) -> bool:
    """Whether ``char`` goes on a word (a match must not end inside one): a letter, digit or underscore."""
    return char.isalnum() or char == "_"
