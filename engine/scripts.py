"""Which writing systems a voice can read, and the letters of a text that fall outside them.

espeak-ng, which turns Piper's text into phonemes, reads a letter of a script its language has no rules
for by naming it: Chinese text sent to the English voice comes out as "Chinese letter" per character,
Arabic as "Arabic letter ..." per letter. Nobody wants that audio, so an engine refuses such a segment
(``UnsupportedText``) instead of speaking it. The rule is about letters only: digits, punctuation,
symbols and emoji are read in any language and pass, and so do letters that Unicode's compatibility
mapping (NFKC) turns into the voice's script (fullwidth ``Ａ``, mathematical ``𝐀``, the ligature ``ﬁ``).
"""

from __future__ import annotations

import unicodedata

#: The scripts (the first word of a letter's Unicode name) a language's voices read, by the language's
#: primary subtag. A language missing here is not checked.
SCRIPTS: dict[str, frozenset[str]] = {
    "en": frozenset({"LATIN"}),
}
# Letters whose name starts with no script: IPA stress marks, the modifier apostrophe (``ʼ``).
_NEUTRAL = frozenset({"MODIFIER"})
# Scripts whose letters an English reader names when one stands alone, in a formula or a unit: espeak
# reads ``π`` as "pi", ``Δ`` as "delta", ``µ`` as "mu". Two or more in a row are a word, and refused.
_SYMBOLS = frozenset({"GREEK"})
# The letters an error message lists; the rest are counted.
_SHOWN = 5


def script(char: str) -> str | None:
    """The script of ``char`` if it is a letter (``LATIN``, ``CJK``, ``ARABIC``, ...), else None."""
    if not unicodedata.category(char).startswith("L"):
        return None
    folded = next((c for c in unicodedata.normalize("NFKC", char) if c.isalpha()), char)
    name = unicodedata.name(folded, "")
    first = name.split(" ", 1)[0] if name else ""
    return None if not first or first in _NEUTRAL else first


def unreadable(text: str, scripts: frozenset[str]) -> dict[str, str]:
    """The distinct letters of ``text`` outside ``scripts``, in order, each with its script.

    Args:
        text: what would be spoken.
        scripts: the scripts the voice reads (``SCRIPTS[language]``).

    Returns:
        ``{letter: script}``, empty when the voice can read all of ``text``.
    """
    found: dict[str, str] = {}
    kinds = [script(c) for c in text]
    for i, (char, kind) in enumerate(zip(text, kinds, strict=True)):
        if kind is None or kind in scripts:
            continue
        alone = (i == 0 or kinds[i - 1] != kind) and (i + 1 == len(kinds) or kinds[i + 1] != kind)
        if kind in _SYMBOLS and alone:
            continue
        found.setdefault(char, kind)
    return found


def describe(found: dict[str, str]) -> str:
    """``found`` (from ``unreadable``) for an error message: ``'中', '文' (CJK)``."""
    shown = ", ".join(repr(c) for c in list(found)[:_SHOWN])
    more = f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    kinds = ", ".join(k if len(k) <= 3 else k.title() for k in dict.fromkeys(found.values()))
    return f"{shown}{more} ({kinds})"
