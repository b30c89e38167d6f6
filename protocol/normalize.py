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

This module cuts the stream into tokens and keeps the source map; the rules live beside it:
``protocol.markdown`` (markup, line by line and inline), ``protocol.addresses`` (URLs and e-mail),
``protocol.aliases`` (pronunciations), ``protocol.numbers``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from .addresses import URL_STARTS
from .aliases import Alias, AliasTable
from .markdown import MarkdownReader, is_emoji

__all__ = ["MAX_TOKEN_CHARS", "Alias", "Normalizer", "SourceMap", "TextNormalization", "is_emoji"]

#: What ``text_normalization`` asks for: ``auto`` (the default) and ``on`` normalize, ``off`` reads as sent.
TextNormalization = Literal["auto", "on", "off"]

# Longest token held back: past it the token is read in pieces of this size (a run of text without spaces,
# never a word or a URL, which stay far shorter); the segmenter would cut it at 300 characters anyway.
MAX_TOKEN_CHARS: Final = 1000
# A token that reads the same whatever comes after it: letters, then such punctuation.
_PLAIN_PREFIX: Final = re.compile(r"[^\W\d_]*[.,!?;:]*")


@dataclass(slots=True)
class _Held:
    """A token of a pronunciation of several words, held until it matches or cannot (``Normalizer``)."""

    token: str
    at: int  #: the client index of its first character
    gap: list[tuple[str, int]] = field(default_factory=list)  #: the spaces after it, with their indices


class SourceMap:
    """The client's text beside the spoken text made of it, until ``source`` names a segment cut from it."""

    __slots__ = ("_fed", "_raw", "_raw_at", "_spoken", "origins")

    def __init__(self) -> None:
        self._fed = 0  # characters fed since the start (or the last reset)
        # The spoken text not yet named by ``source``, the client index of each of its characters, and the
        # client's text from ``_raw_at`` on.
        self._spoken: list[str] = []
        self.origins: list[int] = []
        self._raw = ""
        self._raw_at = 0

    def fed(self, text: str) -> int:
        """The client's next piece of text: return the client index of its first character."""
        start = self._fed
        self._raw += text
        self._fed += len(text)
        return start

    def said(self, spoken: str, origins: list[int]) -> None:
        """Spoken text made of the client's, and the client index of each of its characters."""
        self._spoken.append(spoken)
        self.origins.extend(origins)

    def source(self, segment: str) -> tuple[str, list[int]]:
        """See ``Normalizer.source``."""
        text = "".join(self._spoken)
        at = text.find(segment)
        if at < 0 or not segment:
            return segment, list(range(len(segment)))
        cut = at + len(segment)
        first, last = self.origins[at], self.origins[cut - 1]
        named = self._raw[first - self._raw_at : last + 1 - self._raw_at]
        origins = [o - first for o in self.origins[at:cut]]
        self._spoken, self.origins = [text[cut:]], self.origins[cut:]
        self._raw, self._raw_at = self._raw[last + 1 - self._raw_at :], last + 1
        return named, origins


class Normalizer:
    """Normalize one context's text as it streams in (see the module docstring).

    Call ``feed`` with each ``input.text``, ``commit`` on ``input.commit`` and ``flush`` at the end of the
    utterance (it ends it: the next ``feed`` starts a new one); ``reset`` drops what is held (barge-in).
    ``source`` names a segment cut from the spoken text in the client's own characters.

    It cuts the client's text into tokens and holds back the last one while it may still change how it
    reads, and the words a pronunciation of several words may yet take; ``MarkdownReader`` reads each token
    and ``SourceMap`` keeps the client's text beside what is said.

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
        self._aliases = AliasTable(aliases)
        self._reader = MarkdownReader(
            self._aliases,
            expand_numbers=mode == "on" or (self.enabled and expand_numbers),
            keep_emoji=keep_emoji,
        )
        self.reset()

    def reset(self) -> None:
        """Drop everything held and start over (barge-in): client indices count from here again."""
        self._map = SourceMap()
        self._start()

    def _start(self) -> None:
        """Start an utterance: no markup is open."""
        self._token = ""  # the token being written: no whitespace after it yet
        self._held: list[_Held] = []  # the tokens a pronunciation of several words may yet take
        self._token_at = 0  # the client index of its first character
        self._done = 0  # characters of it already read (``_plain``)
        self._reader.start()

    @property
    def pending(self) -> str:
        """The client's text held back: the last token, until the whitespace after it (or the end), and the
        words before it that a pronunciation of several words may yet take."""
        return "".join(h.token + "".join(c for c, _ in h.gap) for h in self._held) + self._token

    @property
    def origins(self) -> list[int]:
        """For each spoken character not yet named by ``source``, the client index it stands for."""
        return self._map.origins

    def feed(self, text: str) -> str:
        """Take the next piece of the client's text.

        Returns:
            The spoken text now certain (possibly empty); ``off`` returns ``text`` itself.
        """
        if not self.enabled:
            return text
        start = self._map.fed(text)
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
                    self._take_token()
                    self._token, self._token_at = rest, self._token_at + MAX_TOKEN_CHARS
                continue
            if self._token:
                self._take_token()
            if char == "\n":
                self._release()  # a pronunciation does not go over a line end
                self._reader.newline(start + i)
            else:
                self._space(char, start + i)
            i += 1
        if self._token and not self._held and self._plain(self._token):
            self._take_token(final=False)
        return self._emit()

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
        return lowered not in URL_STARTS and not self._aliases.may_start(tok, lowered)

    def commit(self) -> str:
        """The client declared its text so far final (``input.commit``): speak the token held, if any."""
        if not self.enabled or not (self._token or self._held):
            return ""
        if self._token:
            self._take_token()
        self._release()
        return self._emit()

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
        ``segment`` itself (nothing was said through the map). A segment not found in the spoken text (never,
        for a segmenter's cut) is returned as it is.
        """
        return self._map.source(segment)

    def _emit(self) -> str:
        reader = self._reader
        if not reader.text:
            return ""
        spoken = "".join(reader.text)
        self._map.said(spoken, reader.at)
        reader.text, reader.at = [], []
        return spoken

    def _take_token(self, *, final: bool = True) -> None:
        """Read the token held from where its reading stopped: whole (``final``), or as far as it goes
        (``_plain``; the rest is read once it is complete)."""
        tok, at, done = self._token, self._token_at, self._done
        if final:
            self._token, self._done = "", 0
        else:
            self._done = len(tok)
        rest = self._reader.block(tok, at, done)
        if rest is None:
            return
        tok, at = rest
        if final and self._aliases.phrases:
            self._read(tok, at, done)
        else:
            self._reader.inline(tok, at, done)

    # -- pronunciations of several words ----------------------------------------------------------------

    def _read(self, tok: str, at: int, i: int) -> None:
        """Read a whole token from ``i`` on, its words perhaps those of a pronunciation of several words:
        it goes on the words held (``_held``), or a word of it may start a pronunciation (held)."""
        if self._held:
            if self._aliases.may_go_on(" ".join([*(h.token for h in self._held), tok])):
                self._held.append(_Held(tok, at))
            else:
                self._settle([*self._held, _Held(tok, at)])
            return
        start = self._aliases.phrase_start(tok, i)
        if start is None:
            self._reader.inline(tok, at, i)
            return
        self._reader.inline(tok[:start], at, i)
        if (
            self._reader.skip or self._reader.strike
        ):  # inside a link's URL, a tag or struck text: read as such
            self._reader.inline(tok, at, start)
            return
        self._held = [_Held(tok[start:], at + start)]

    def _settle(self, items: list[_Held]) -> None:
        """The words ``items`` can go on no pronunciation: say the longest one they start with, if any (else
        read the first as written), and read what follows as if it came now (it may start another)."""
        self._held = []
        words = " ".join(h.token for h in items)
        match = self._aliases.longest(words)
        if match is not None:
            size, alias = match
            k, end = 0, size  # the item the match ends in, and where in it
            while end > len(items[k].token):
                end -= len(items[k].token) + 1
                k += 1
            span = items[k].at + end - items[0].at
            self._reader.put(alias if alias is not None else words[:size], items[0].at, span)
        else:
            k, end = 0, len(items[0].token)
            self._reader.inline(items[0].token, items[0].at, 0)
        for n, h in enumerate(items[k:]):
            i = end if n == 0 else 0
            if i < len(h.token):
                self._read(h.token, h.at, i)
            for char, char_at in h.gap:
                self._space(char, char_at)

    def _release(self) -> None:
        """No word comes after those held (a line end, a commit): settle them."""
        while self._held:
            self._settle(self._held)

    def _space(self, char: str, at: int) -> None:
        """A space or tab after a token: said, or held with the words before it."""
        if self._held:
            self._held[-1].gap.append((char, at))
        else:
            self._reader.text.append(char)
            self._reader.at.append(at)
