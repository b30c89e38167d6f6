"""Streaming text normalization: an LLM's markdown reply as a person would read it aloud (sans-I/O).

``Normalizer`` sits between a context's ``input.text`` and its segmenter (``protocol.session``). It is fed
the client's text in pieces of any size and returns the spoken text it is sure of. It holds back at most
the token still being written (the characters after the last whitespace), and only while it may still
turn into markup, a URL, a number or a pronunciation: no rule looks further than one token, so a ``**``
split over two messages, or a URL over five, is read the same as if it came whole, and a plain word
reaches the segmenter as it arrives. With ``text_normalization`` ``on`` or ``auto`` (docs/protocol.md
§17):

* markdown is not read aloud: emphasis (``*`` ``_`` ``**`` ``__``), headings, list markers, block quotes,
  code fences and inline code (their text is kept), links (``[text](url)`` speaks its text), images (left
  out whole), table pipes (a pause between cells), strikethrough (the struck text is left out), HTML tags;
* a list item, a heading, a table row and a code line are each their own segment: a blank line (which the
  segmenter always cuts at) goes before a list item, heading, table or fence and after such a line;
* bare URLs and e-mail addresses are spoken compactly: "https://example.com/menu?id=42" as "example dot
  com", and the domain of an e-mail address: "ann@example.com" as "ann at example dot com";
* emoji are left out (``keep_emoji`` keeps them: the engine reads them as it would, by name for Piper);
* with ``expand_numbers`` (``on``, and ``auto`` for an engine whose front end misreads them), numbers,
  dates, times, amounts, percentages and phone numbers are written out in English (``protocol.numbers``);
* ``pronunciations`` replace whole words by their ``alias``; an entry of several words ("New York") matches
  them with any spaces between (not a line end), also when they come in separate pieces: its first word
  waits until the words after it match or cannot. An entry without an alias (an ``ipa`` one, which the
  engine says from its phonemes) keeps its words as written, out of every other rule.

``off`` passes text through unchanged. Every spoken character keeps the index of the client's character
it stands for (``origins``, counted from the first character fed, or from the last ``reset``), so that what
the engine says can be named in the client's own text (``source``, ``alignment.WordNamer``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from .numbers import spell, spell_at

#: What ``text_normalization`` asks for: ``auto`` (the default) and ``on`` normalize, ``off`` reads as sent.
TextNormalization = Literal["auto", "on", "off"]

# Kinds of line, by how its end is spoken.
_PLAIN: Final = 0  # a soft wrap: the newline is a space
_BLOCK: Final = 1  # a list item, heading, table row or code line: its newline ends the segment
_FENCE_INFO: Final = 2  # the rest of a code fence's opening line (its language): left out

# Longest token held back: past it the token is read in pieces of this size (a run of text without spaces,
# never a word or a URL, which stay far shorter); the segmenter would cut it at 300 characters anyway.
MAX_TOKEN_CHARS: Final = 1000
# A blank line: the segmenter always cuts at one (a sentence end for every granularity but "none").
_BREAK: Final = "\n\n"
_FENCE: Final = re.compile(r"```|~~~")
_HEADING: Final = re.compile(r"#{1,6}")
_BULLET: Final = frozenset("-*+")
_NUMBERED: Final = re.compile(r"(\d{1,3})[.)]")
_RULE: Final = re.compile(r"([-*_])\1{2,}")  # a thematic break: "---", "***", "___"
_TABLE_RULE: Final = re.compile(r"\|?:?-+:?(?:\|:?-+:?)*\|?")  # "|---|:--:|", "---" in a table row
_URL: Final = re.compile(r"(?:https?://|www\.)[^\s<>()\[\]\"'`*]+", re.IGNORECASE)
_SCHEME: Final = re.compile(r"^(?:https?://)?(?:www\.)?", re.IGNORECASE)
_HOST_END: Final = re.compile(r"[/?#:]")
_DOMAIN: Final = re.compile(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")  # after an e-mail address's "@"
# Punctuation that reads the same whatever follows it ("!" but at a token's start, where "![" is an image).
_SENTENCE: Final = ".,!?;:"
# A token that reads the same whatever comes after it: letters, then such punctuation.
_PLAIN_PREFIX: Final = re.compile(r"[^\W\d_]*[.,!?;:]*")
# What a token that is a URL starts with: a token that may still become one waits.
_URL_STARTS: Final = ("https://", "http://", "www.")
# Characters a URL or address does not end with: the sentence's punctuation after it.
_TRAILING: Final = ".,;:!?"
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


def _alias_pattern(aliases: Sequence[Alias]) -> re.Pattern[str] | None:
    """One pattern for every alias, longest first, each whole-word (and case-insensitive when asked)."""
    if not aliases:
        return None
    parts = [
        re.escape(a.text) if a.case_sensitive else f"(?i:{re.escape(a.text)})"
        for a in sorted(aliases, key=lambda a: -len(a.text))
    ]
    return re.compile(rf"(?:{'|'.join(parts)})(?!\w)")


@dataclass(slots=True)
class _Held:
    """A token of a pronunciation of several words, held until it matches or cannot (``Normalizer``)."""

    token: str
    at: int  #: the client index of its first character
    gap: list[tuple[str, int]] = field(default_factory=list)  #: the spaces after it, with their indices


class Normalizer:
    """Normalize one context's text as it streams in (see the module docstring).

    Call ``feed`` with each ``input.text``, ``commit`` on ``input.commit`` and ``flush`` at the end of the
    utterance (it ends it: the next ``feed`` starts a new one); ``reset`` drops what is held (barge-in).
    ``source`` names a segment cut from the spoken text in the client's own characters.

    Args:
        mode: ``text_normalization``: ``auto``, ``on`` or ``off``.
        expand_numbers: write numbers out under ``auto`` (for engines whose front end misreads them);
            ``on`` always does, ``off`` never.
        aliases: the pronunciations to apply.
        keep_emoji: speak emoji as the engine would (by name); they are left out otherwise.
    """

    def __init__(
        self,
        mode: TextNormalization = "auto",
        *,
        expand_numbers: bool = True,
        aliases: Sequence[Alias] = (),
        keep_emoji: bool = False,
    ) -> None:
        self.enabled = mode != "off"
        self.expand_numbers = mode == "on" or (self.enabled and expand_numbers)
        self.keep_emoji = keep_emoji
        single = [a for a in aliases if len(a.text.split()) == 1]
        self._alias_re = _alias_pattern(single)
        self._aliases = {a.key: a.alias for a in single}
        # Entries of several words, longest first: (their words one space apart, as looked up), ...
        self._phrases = sorted(
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
        self.reset()

    def reset(self) -> None:
        """Drop everything held and start over (barge-in): client indices count from here again."""
        self._fed = 0  # characters fed since the start (or the last reset)
        # The spoken text not yet named by ``source``, the client index of each of its characters, and the
        # client's text from ``_raw_at`` on.
        self._spoken: list[str] = []
        self._origins: list[int] = []
        self._raw = ""
        self._raw_at = 0
        self._start()

    def _start(self) -> None:
        """Start an utterance: no markup is open."""
        self._token = ""  # the token being written: no whitespace after it yet
        self._held: list[_Held] = []  # the tokens a pronunciation of several words may yet take
        self._token_at = 0  # the client index of its first character
        self._done = 0  # characters of it already read (``_plain``)
        self._line_start = True  # no token yet on this line
        self._line = _PLAIN
        self._line_said = False  # something of this line was spoken (a table's first pipe is not)
        self._fence = False  # inside a code block
        self._strike = False  # inside ~~struck text~~
        self._skip = ""  # inside what is left out across tokens: "<" a tag, "!" an image, "(" a link's URL
        self._depth = 0  # parentheses open in a link's URL
        self._table = False  # this line is a table row

    @property
    def pending(self) -> str:
        """The client's text held back: the last token, until the whitespace after it (or the end), and the
        words before it that a pronunciation of several words may yet take."""
        return "".join(h.token + "".join(c for c, _ in h.gap) for h in self._held) + self._token

    @property
    def origins(self) -> list[int]:
        """For each spoken character not yet named by ``source``, the client index it stands for."""
        return self._origins

    def feed(self, text: str) -> str:
        """Take the next piece of the client's text.

        Returns:
            The spoken text now certain (possibly empty); ``off`` returns ``text`` itself.
        """
        if not self.enabled:
            return text
        self._raw += text
        out_text: list[str] = []
        out_at: list[int] = []
        start = self._fed
        self._fed += len(text)
        i = 0
        n = len(text)
        while i < n:
            char = text[i]
            if not char.isspace():
                if not self._token:
                    self._token_at = start + i
                j = i + 1
                while j < n and not text[j].isspace():
                    j += 1
                self._token += text[i:j]
                i = j
                while len(self._token) >= MAX_TOKEN_CHARS:
                    rest = self._token[MAX_TOKEN_CHARS:]
                    self._token = self._token[:MAX_TOKEN_CHARS]
                    self._take_token(out_text, out_at)
                    self._token, self._token_at = rest, self._token_at + MAX_TOKEN_CHARS
                continue
            if self._token:
                self._take_token(out_text, out_at)
            if char == "\n":
                self._release(out_text, out_at)  # a pronunciation does not go over a line end
                self._newline(start + i, out_text, out_at)
            else:
                self._space(char, start + i, out_text, out_at)
            i += 1
        if self._token and not self._held and self._plain(self._token):
            self._take_token(out_text, out_at, final=False)
        return self._emit(out_text, out_at)

    def _plain(self, tok: str) -> bool:
        """Whether the token held can be read now, as far as it goes: a word and the punctuation after it,
        which no character to come reads otherwise (no pronunciation, URL or markup can start so), so that
        the segmenter sees the word, and a sentence end after it, without waiting for the next space."""
        if _PLAIN_PREFIX.fullmatch(tok, self._done) is None or tok[0] == "!":  # "![": an image
            return False
        k = self._done  # where the word that ends the token starts: a pronunciation or URL may start there
        while k and tok[k - 1].isalnum():
            k -= 1
        tok = tok[k:]
        lowered = tok.lower()
        if any(start.startswith(lowered) for start in _URL_STARTS):
            return False
        return tok not in self._starts[0] and lowered not in self._starts[1]

    def commit(self) -> str:
        """The client declared its text so far final (``input.commit``): speak the token held, if any."""
        if not self.enabled or not (self._token or self._held):
            return ""
        out_text: list[str] = []
        out_at: list[int] = []
        if self._token:
            self._take_token(out_text, out_at)
        self._release(out_text, out_at)
        return self._emit(out_text, out_at)

    def flush(self) -> str:
        """End the utterance: speak the token held; the next ``feed`` starts a new one (no markup open)."""
        out = self.commit()
        self._start()
        return out

    def source(self, segment: str) -> tuple[str, list[int]]:
        """The client's text a segment stands for: from the character its first spoken character stands for
        to the one its last does (markup around it, held by neither segment, is left out); and for each
        character of ``segment``, the index in that text of the one it stands for.

        Call it with each segment the segmenter cut from this normalizer's text, in order; ``off`` returns
        ``segment`` itself. A segment not found in the spoken text (never, for a segmenter's cut) is returned
        as it is.
        """
        text = "".join(self._spoken)
        at = text.find(segment)
        if not self.enabled or at < 0 or not segment:
            return segment, list(range(len(segment)))
        cut = at + len(segment)
        first, last = self._origins[at], self._origins[cut - 1]
        named = self._raw[first - self._raw_at : last + 1 - self._raw_at]
        origins = [o - first for o in self._origins[at:cut]]
        self._spoken, self._origins = [text[cut:]], self._origins[cut:]
        self._raw, self._raw_at = self._raw[last + 1 - self._raw_at :], last + 1
        return named, origins

    def _emit(self, out_text: list[str], out_at: list[int]) -> str:
        spoken = "".join(out_text)
        self._spoken.append(spoken)
        self._origins.extend(out_at)
        return spoken

    def _newline(self, at: int, out_text: list[str], out_at: list[int]) -> None:
        if self._line == _BLOCK:
            out_text.append(_BREAK)
            out_at.extend((at, at))
        else:
            out_text.append("\n")
            out_at.append(at)
        if self._line_start and not self._fence:  # a blank line: what a tag, link or ~~ left open ends here
            self._skip, self._strike = "", False
        self._line_start = True
        self._line_said = False
        self._table = False
        self._line = _PLAIN

    def _break(self, at: int, out_text: list[str], out_at: list[int]) -> None:
        """End the segment before a block (a list item, heading, table or fence) that starts at ``at``."""
        out_text.append(_BREAK)
        out_at.extend((at, at))
        self._line = _BLOCK

    def _take_token(self, out_text: list[str], out_at: list[int], *, final: bool = True) -> None:
        """Read the token held from where its reading stopped: whole (``final``), or as far as it goes
        (``_plain``; the rest is read once it is complete)."""
        tok, at, done = self._token, self._token_at, self._done
        if final:
            self._token, self._done = "", 0
        else:
            self._done = len(tok)
        if self._line == _FENCE_INFO:
            return
        if self._fence:
            if not done and self._line_start and _FENCE.match(tok):
                self._fence = False
                self._line_start = False
                return
            self._line_start = False
            self._line = _BLOCK
            out_text.append(tok[done:])
            out_at.extend(range(at + done, at + len(tok)))
            return
        if not done and self._line_start and not self._skip and not self._strike:
            tok, at = self._line_marker(tok, at, out_text, out_at)
        if not done and self._table and _TABLE_RULE.fullmatch(tok):
            return
        if final and self._phrases:
            self._read(tok, at, done, out_text, out_at)
        else:
            self._inline(tok, at, done, out_text, out_at)

    # -- pronunciations of several words ----------------------------------------------------------------

    def _read(self, tok: str, at: int, i: int, out_text: list[str], out_at: list[int]) -> None:
        """Read a whole token from ``i`` on, its words perhaps those of a pronunciation of several words:
        it goes on the words held (``_held``), or a word of it may start a pronunciation (held)."""
        if self._held:
            if self._may_go_on(" ".join([*(h.token for h in self._held), tok])):
                self._held.append(_Held(tok, at))
            else:
                self._settle([*self._held, _Held(tok, at)], out_text, out_at)
            return
        start = self._phrase_start(tok, i)
        if start is None:
            self._inline(tok, at, i, out_text, out_at)
            return
        self._inline(tok[:start], at, i, out_text, out_at)
        if self._skip or self._strike:  # inside a link's URL, a tag or struck text: read as such
            self._inline(tok, at, start, out_text, out_at)
            return
        self._held = [_Held(tok[start:], at + start)]

    def _phrase_start(self, tok: str, i: int) -> int | None:
        """The first word start from ``i`` on where the rest of ``tok`` begins a pronunciation of several
        words (its first words, then a space), if any."""
        for j in range(i, len(tok)):
            if (j == 0 or not tok[j - 1].isalnum()) and self._may_go_on(tok[j:]):
                return j
        return None

    def _may_go_on(self, words: str) -> bool:
        """Whether ``words`` and a space begin a pronunciation of several words."""
        return words in self._firsts[0] or words.lower() in self._firsts[1]

    def _settle(self, items: list[_Held], out_text: list[str], out_at: list[int]) -> None:
        """The words ``items`` can go on no pronunciation: say the longest one they start with, if any (else
        read the first as written), and read what follows as if it came now (it may start another)."""
        self._held = []
        words = " ".join(h.token for h in items)
        lowered = words.lower()
        for key, alias, sensitive in self._phrases:
            said = words if sensitive else lowered
            if said.startswith(key) and (len(said) == len(key) or not _is_word(said[len(key)])):
                k, end = 0, len(key)  # the item the match ends in, and where in it
                while end > len(items[k].token):
                    end -= len(items[k].token) + 1
                    k += 1
                span = items[k].at + end - items[0].at
                self._put(
                    alias if alias is not None else words[: len(key)], items[0].at, span, out_text, out_at
                )
                break
        else:
            k, end = 0, len(items[0].token)
            self._inline(items[0].token, items[0].at, 0, out_text, out_at)
        for n, h in enumerate(items[k:]):
            i = end if n == 0 else 0
            if i < len(h.token):
                self._read(h.token, h.at, i, out_text, out_at)
            for char, char_at in h.gap:
                self._space(char, char_at, out_text, out_at)

    def _release(self, out_text: list[str], out_at: list[int]) -> None:
        """No word comes after those held (a line end, a commit): settle them."""
        while self._held:
            self._settle(self._held, out_text, out_at)

    def _space(self, char: str, at: int, out_text: list[str], out_at: list[int]) -> None:
        """A space or tab after a token: said, or held with the words before it."""
        if self._held:
            self._held[-1].gap.append((char, at))
        else:
            out_text.append(char)
            out_at.append(at)

    def _line_marker(self, tok: str, at: int, out_text: list[str], out_at: list[int]) -> tuple[str, int]:
        """Read the markdown that opens a line; return what is left of the token to read inline."""
        if _FENCE.match(tok):
            self._break(at, out_text, out_at)
            self._fence = True
            self._line = _FENCE_INFO
            return "", at
        quote = len(tok) - len(tok.lstrip(">"))
        if quote:
            tok, at = tok[quote:], at + quote
            if not tok:
                return "", at  # the line still starts: "> - item" is a list item
        if _HEADING.fullmatch(tok) or (tok in _BULLET):
            self._break(at, out_text, out_at)
            self._line_start = False
            return "", at
        if _RULE.fullmatch(tok) or (_TABLE_RULE.fullmatch(tok) and "|" in tok):
            self._line_start = False
            self._line = _BLOCK
            return "", at
        self._line_start = False
        numbered = _NUMBERED.fullmatch(tok)
        if numbered is not None:
            self._break(at, out_text, out_at)
            number = numbered[1]
            said = spell(number) if self.expand_numbers else number
            self._put(f"{said},", at, len(tok), out_text, out_at)
            return "", at
        if tok.startswith("|"):
            self._break(at, out_text, out_at)
            self._table = True
        return tok, at

    def _put(self, words: str, at: int, span: int, out_text: list[str], out_at: list[int]) -> None:
        """Say ``words`` for the ``span`` client characters from ``at``: the first character names the first
        of them, every other one the last (so that the first word said names the whole written form)."""
        out_text.append(words)
        out_at.append(at)
        out_at.extend([at + span - 1] * (len(words) - 1))
        self._line_said = True

    def _keep(self, tok: str, i: int, j: int, at: int, out_text: list[str], out_at: list[int]) -> None:
        out_text.append(tok[i:j])
        out_at.extend(range(at + i, at + j))
        self._line_said = True

    def _inline(self, tok: str, at: int, i: int, out_text: list[str], out_at: list[int]) -> None:
        """Read one token (no whitespace in it) from ``i`` on, after its line's markdown: inline markup, URLs,
        numbers. What it says for a character depends on the one before it and those after it only."""
        n = len(tok)
        while i < n:
            if self._skip:
                i = self._skipping(tok, i)
                continue
            if self._strike:
                end = tok.find("~~", i)
                if end < 0:
                    return
                self._strike = False
                i = end + 2
                continue
            char = tok[i]
            word_start = i == 0 or not tok[i - 1].isalnum()
            if tok.startswith("~~", i):
                self._strike = True
                i += 2
            elif tok.startswith("![", i) and (
                i == 0 or not (tok[i - 1].isalnum() or tok[i - 1] in _SENTENCE)
            ):
                self._skip = "!"
                i += 2
            elif tok.startswith("](", i):
                self._skip, self._depth = "(", 1
                i += 2
            elif char in "[]`*":
                i += 1
            elif char == "_":
                if 0 < i < n - 1 and tok[i - 1].isalnum() and tok[i + 1].isalnum():
                    self._put(" ", at + i, 1, out_text, out_at)
                i += 1
            elif char == "@" and i and tok[i - 1].isalnum() and (m := _DOMAIN.match(tok, i + 1)) is not None:
                host = m[0].rstrip(_TRAILING)  # an e-mail address: its user is read as written
                self._put(f" at {_dotted(host)}", at + i, len(host) + 1, out_text, out_at)
                i += len(host) + 1
            elif char == "#" and i + 1 < n and tok[i + 1].isdigit():
                self._put("number ", at + i, 1, out_text, out_at)  # "#4821"
                i += 1
            elif char == "#" and word_start:
                i += 1  # a hashtag's mark, or a heading's without its space
            elif char == "|":
                if self._line_said:
                    self._put(",", at + i, 1, out_text, out_at)
                i += 1
            elif char == "<" and _URL.match(tok, i + 1):
                i += 1  # an autolink, <https://...>: its ">" goes with the URL
            elif char == "<" and _TAG.match(tok, i):
                self._skip = "<"
                i += 1
            elif word_start and (said := self._special(tok, i)) is not None:
                words, end = said
                self._put(words, at + i, end - i, out_text, out_at)
                i = end
            elif (w := _WORD.match(tok, i)) is not None:
                self._keep(tok, i, w.end(), at, out_text, out_at)
                i = w.end()
            elif char.isdigit():
                j = i + 1
                while j < n and tok[j].isdigit():
                    j += 1
                self._keep(tok, i, j, at, out_text, out_at)
                i = j
            elif is_emoji(char) and not self.keep_emoji:
                i += 1
            else:
                self._keep(tok, i, i + 1, at, out_text, out_at)
                i += 1

    def _skipping(self, tok: str, i: int) -> int:
        """Leave out the tag, image or link URL going on at ``i``; return where reading resumes."""
        n = len(tok)
        if self._skip == "<":
            end = tok.find(">", i)
            if end < 0:
                return n
            self._skip = ""
            return end + 1
        if self._skip == "!":
            end = tok.find("]", i)
            if end < 0:
                return n
            if tok.startswith("](", end):
                self._skip, self._depth = "(", 1
                return end + 2
            self._skip = ""
            return end + 1
        while i < n:  # a link's URL, to its closing parenthesis
            if tok[i] == "(":
                self._depth += 1
            elif tok[i] == ")":
                self._depth -= 1
                if not self._depth:
                    self._skip = ""
                    return i + 1
            i += 1
        return n

    def _special(self, tok: str, i: int) -> tuple[str, int] | None:
        """What starts at ``i`` (a word's start) if it is spoken other than as written, with where it ends:
        a pronunciation, a URL or (``expand_numbers``) a number."""
        if self._alias_re is not None and (m := self._alias_re.match(tok, i)) is not None:
            key = m[0] if m[0] in self._aliases else m[0].lower()
            said = self._aliases[key]
            return (said if said is not None else m[0]), m.end()
        if (m := _URL.match(tok, i)) is not None:
            url = m[0].rstrip(_TRAILING)
            end = i + len(url) + (1 if tok.startswith(">", i + len(url)) else 0)
            host = _HOST_END.split(_SCHEME.sub("", url), 1)[0]
            return _dotted(host or url), end
        return spell_at(tok, i) if self.expand_numbers else None


def _dotted(name: str) -> str:
    """A host or an address's user as said aloud: "example.com" -> "example dot com"."""
    return re.sub(
        r"[._-]+", lambda m: {".": " dot ", "_": " underscore ", "-": " dash "}[m[0][0]], name
    ).strip()


def _is_word(char: str) -> bool:
    """Whether ``char`` goes on a word (a match must not end inside one): a letter, digit or underscore."""
    return char.isalnum() or char == "_"
