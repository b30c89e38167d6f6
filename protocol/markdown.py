"""Markdown read aloud, one token at a time (sans-I/O; the rules are ``protocol.normalize``'s docstring).

``MarkdownReader`` reads the tokens of one context's text (the characters between whitespace) as
``Normalizer`` hands them over, and keeps what a token leaves open for the next one: the kind of line, a code
block, struck text, a tag, image or link URL being left out. It says the words spoken otherwise than written
as it meets them: a pronunciation of one word (``protocol.aliases``), a URL or an e-mail address
(``protocol.addresses``), a number (``protocol.numbers``); it leaves emoji out. Each character said carries
the client index of the one it stands for.
"""

from __future__ import annotations

import re
from typing import Final

from .addresses import domain_at, url_at
from .aliases import AliasTable
from .numbers import spell, spell_at

# Kinds of line, by how its end is spoken.
_PLAIN: Final = 0  # a soft wrap: the newline is a space
_BLOCK: Final = 1  # a list item, heading, table row or code line: its newline ends the segment
_FENCE_INFO: Final = 2  # the rest of a code fence's opening line (its language): left out

# A blank line: the segmenter always cuts at one (a sentence end for every granularity but "none").
_BREAK: Final = "\n\n"
_FENCE: Final = re.compile(r"```|~~~")
_HEADING: Final = re.compile(r"#{1,6}")
_BULLET: Final = frozenset("-*+")
_NUMBERED: Final = re.compile(r"(\d{1,3})[.)]")
_RULE: Final = re.compile(r"([-*_])\1{2,}")  # a thematic break: "---", "***", "___"
_TABLE_RULE: Final = re.compile(r"\|?:?-+:?(?:\|:?-+:?)*\|?")  # "|---|:--:|", "---" in a table row
# Punctuation that reads the same whatever follows it ("!" but at a token's start, where "![" is an image).
_SENTENCE: Final = ".,!?;:"
# Letters and the digits after them ("x86", "GPT4"): kept as they are, in one step.
_WORD: Final = re.compile(r"[^\W\d_][^\W_]*")
# An HTML tag LLMs write (a comparison such as "x <y" is no tag: its rest would be left out up to a ">").
_TAG: Final = re.compile(
    r"<(?:/?(?:a|b|i|u|s|p|em|strong|br|hr|span|div|sup|sub|code|pre|ul|ol|li|h[1-6]|img|table|tr|td|th|del"
    r"|ins|mark|small|kbd|details|summary|blockquote)(?=[\s/>]|$)|!--)",
    re.IGNORECASE,
)


def is_emoji(char: str) -> bool:
    """Whether ``char`` is a pictograph (or a joiner, variation selector or skin tone that builds one)."""
    code = ord(char)
    return (
        0x1F000 <= code <= 0x1FAFF
        or 0x2600 <= code <= 0x27BF
        or 0x2B00 <= code <= 0x2BFF
        or 0x2300 <= code <= 0x23FF
        or code in (0x200D, 0xFE0F, 0x20E3)
        or 0xE0020 <= code <= 0xE007F
    )


class MarkdownReader:
    """Read one context's tokens aloud (see the module docstring).

    What is said collects in ``text``, with the client index of each of its characters in ``at``, until the
    normalizer takes it. ``start`` begins an utterance (no markup open).

    Args:
        aliases: the pronunciations: the reader says those of one word.
        expand_numbers: write numbers out.
        keep_emoji: speak emoji as the engine would (by name); they are left out otherwise.
    """

    __slots__ = (
        "aliases",
        "at",
        "depth",
        "expand_numbers",
        "fence",
        "keep_emoji",
        "line",
        "line_said",
        "line_start",
        "skip",
        "strike",
        "table",
        "text",
    )

    def __init__(self, aliases: AliasTable, *, expand_numbers: bool, keep_emoji: bool) -> None:
        self.aliases = aliases
        self.expand_numbers = expand_numbers
        self.keep_emoji = keep_emoji
        self.text: list[str] = []
        self.at: list[int] = []
        self.start()

    def start(self) -> None:
        """Start an utterance: no markup is open."""
        self.line_start = True  # no token yet on this line
        self.line = _PLAIN
        self.line_said = False  # something of this line was spoken (a table's first pipe is not)
        self.fence = False  # inside a code block
        self.strike = False  # inside ~~struck text~~
        self.skip = ""  # inside what is left out across tokens: "<" a tag, "!" an image, "(" a link's URL
        self.depth = 0  # parentheses open in a link's URL
        self.table = False  # this line is a table row

    def newline(self, at: int) -> None:
        """A line ends at client index ``at``."""
        if self.line == _BLOCK:
            self.text.append(_BREAK)
            self.at.extend((at, at))
        else:
            self.text.append("\n")
            self.at.append(at)
        if self.line_start and not self.fence:  # a blank line: what a tag, link or ~~ left open ends here
            self.skip, self.strike = "", False
        self.line_start = True
        self.line_said = False
        self.table = False
        self.line = _PLAIN

    def block(self, tok: str, at: int, done: int) -> tuple[str, int] | None:
        """Read what a token (read up to ``done`` so far) does to its line: a code line, a fence, the line's
        markdown, a table's rule. Return what is left of it to read inline, or None when nothing is."""
        if self.line == _FENCE_INFO:
            return None
        if self.fence:
            if not done and self.line_start and _FENCE.match(tok):
                self.fence = False
                self.line_start = False
                return None
            self.line_start = False
            self.line = _BLOCK
            self.text.append(tok[done:])
            self.at.extend(range(at + done, at + len(tok)))
            return None
        if not done and self.line_start and not self.skip and not self.strike:
            tok, at = self._line_marker(tok, at)
        if not done and self.table and _TABLE_RULE.fullmatch(tok):
            return None
        return tok, at

    def _break(self, at: int) -> None:
        """End the segment before a block (a list item, heading, table or fence) that starts at ``at``."""
        self.text.append(_BREAK)
        self.at.extend((at, at))
        self.line = _BLOCK

    def _line_marker(self, tok: str, at: int) -> tuple[str, int]:
        """Read the markdown that opens a line; return what is left of the token to read inline."""
        if _FENCE.match(tok):
            self._break(at)
            self.fence = True
            self.line = _FENCE_INFO
            return "", at
        quote = len(tok) - len(tok.lstrip(">"))
        if quote:
            tok, at = tok[quote:], at + quote
            if not tok:
                return "", at  # the line still starts: "> - item" is a list item
        if _HEADING.fullmatch(tok) or (tok in _BULLET):
            self._break(at)
            self.line_start = False
            return "", at
        if _RULE.fullmatch(tok) or (_TABLE_RULE.fullmatch(tok) and "|" in tok):
            self.line_start = False
            self.line = _BLOCK
            return "", at
        self.line_start = False
        numbered = _NUMBERED.fullmatch(tok)
        if numbered is not None:
            self._break(at)
            number = numbered[1]
            said = spell(number) if self.expand_numbers else number
            self.put(f"{said},", at, len(tok))
            return "", at
        if tok.startswith("|"):
            self._break(at)
            self.table = True
        return tok, at

    def put(self, words: str, at: int, span: int) -> None:
        """Say ``words`` for the ``span`` client characters from ``at``: the first character names the first
        of them, every other one the last (so that the first word said names the whole written form)."""
        self.text.append(words)
        self.at.append(at)
        self.at.extend([at + span - 1] * (len(words) - 1))
        self.line_said = True

    def _keep(self, tok: str, i: int, j: int, at: int) -> None:
        self.text.append(tok[i:j])
        self.at.extend(range(at + i, at + j))
        self.line_said = True

    def inline(self, tok: str, at: int, i: int) -> None:
        """Read one token (no whitespace in it) from ``i`` on, after its line's markdown: inline markup, URLs,
        numbers. What it says for a character depends on the one before it and those after it only."""
        n = len(tok)
        while i < n:
            if self.skip:
                i = self._skipping(tok, i)
                continue
            if self.strike:
                end = tok.find("~~", i)
                if end < 0:
                    return
                self.strike = False
                i = end + 2
                continue
            char = tok[i]
            word_start = i == 0 or not tok[i - 1].isalnum()
            if tok.startswith("~~", i):
                self.strike = True
                i += 2
            elif tok.startswith("![", i) and (
                i == 0 or not (tok[i - 1].isalnum() or tok[i - 1] in _SENTENCE)
            ):
                self.skip = "!"
                i += 2
            elif tok.startswith("](", i):
                self.skip, self.depth = "(", 1
                i += 2
            elif char in "[]`*":
                i += 1
            elif char == "_":
                if 0 < i < n - 1 and tok[i - 1].isalnum() and tok[i + 1].isalnum():
                    self.put(" ", at + i, 1)
                i += 1
            elif char == "@" and i and tok[i - 1].isalnum() and (said := domain_at(tok, i)) is not None:
                words, end = said  # an e-mail address: its user is read as written
                self.put(words, at + i, end - i)
                i = end
            elif char == "#" and i + 1 < n and tok[i + 1].isdigit():
                self.put("number ", at + i, 1)  # "#4821"
                i += 1
            elif char == "#" and word_start:
                i += 1  # a hashtag's mark, or a heading's without its space
            elif char == "|":
                if self.line_said:
                    self.put(",", at + i, 1)
                i += 1
            elif char == "<" and url_at(tok, i + 1) is not None:
                i += 1  # an autolink, <https://...>: its ">" goes with the URL
            elif char == "<" and _TAG.match(tok, i):
                self.skip = "<"
                i += 1
            elif word_start and (said := self._special(tok, i)) is not None:
                words, end = said
                self.put(words, at + i, end - i)
                i = end
            elif (w := _WORD.match(tok, i)) is not None:
                self._keep(tok, i, w.end(), at)
                i = w.end()
            elif char.isdigit():
                j = i + 1
                while j < n and tok[j].isdigit():
                    j += 1
                self._keep(tok, i, j, at)
                i = j
            elif is_emoji(char) and not self.keep_emoji:
                i += 1
            else:
                self._keep(tok, i, i + 1, at)
                i += 1

    def _skipping(self, tok: str, i: int) -> int:
        """Leave out the tag, image or link URL going on at ``i``; return where reading resumes."""
        n = len(tok)
        if self.skip == "<":
            end = tok.find(">", i)
            if end < 0:
                return n
            self.skip = ""
            return end + 1
        if self.skip == "!":
            end = tok.find("]", i)
            if end < 0:
                return n
            if tok.startswith("](", end):
                self.skip, self.depth = "(", 1
                return end + 2
            self.skip = ""
            return end + 1
        while i < n:  # a link's URL, to its closing parenthesis
            if tok[i] == "(":
                self.depth += 1
            elif tok[i] == ")":
                self.depth -= 1
                if not self.depth:
                    self.skip = ""
                    return i + 1
            i += 1
        return n

    def _special(self, tok: str, i: int) -> tuple[str, int] | None:
        """What starts at ``i`` (a word's start) if it is spoken other than as written, with where it ends:
        a pronunciation, a URL or (``expand_numbers``) a number."""
        if (said := self.aliases.word_at(tok, i)) is not None or (said := url_at(tok, i)) is not None:
            return said
        return spell_at(tok, i) if self.expand_numbers else None
