"""The rule for user-chosen names (voice names): one Unicode form, and no invisible or reordering characters.

A name is NFKC-normalized, so compatibility forms (fullwidth ``ａｌｉｃｅ``, ligatures, superscripts)
become the plain letters they look like and name the same voice. Characters that make a name display
differently from what it is are refused, before and after normalization:

- control characters, C0, DEL and C1 (``Cc``);
- format characters (``Cf``): bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069), the
  marks LRM, RLM and ALM, zero-width space, joiner and non-joiner, word joiner, BOM, soft hyphen;
- line and paragraph separators (``Zl``, ``Zp``), surrogates (``Cs``), private-use (``Co``) and unassigned
  (``Cn``) code points.

Letters of other scripts that merely look alike (Cyrillic ``а`` for Latin ``a``) are not refused: names in
every script are welcome, and NFKC does not fold across scripts.
"""

from __future__ import annotations

import unicodedata

_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_KINDS = {
    "Cc": "a control character",
    "Cf": "an invisible formatting character (bidi or zero-width)",
    "Cs": "a surrogate",
    "Co": "a private-use character",
    "Cn": "an unassigned code point",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}


class UnsafeName(ValueError):
    """A name holds a character that is refused; the message says which, where, and names the field."""


def normalize_name(name: str, field: str = "name") -> str:
    """``name`` in NFKC form.

    Raises:
        UnsafeName: ``name`` holds a refused character (see the module docstring).
    """
    _check(name, field)
    normalized = unicodedata.normalize("NFKC", name)
    if normalized != name:
        _check(normalized, field)
    return normalized


def _check(name: str, field: str) -> None:
    for index, char in enumerate(name):
        category = unicodedata.category(char)
        if category in _REFUSED_CATEGORIES:
            raise UnsafeName(
                f"{field} must not contain {_KINDS[category]}: U+{ord(char):04X} at position {index}"
            )
