"""URLs and e-mail addresses as a person says them (sans-I/O; ``protocol.normalize``, docs/protocol.md §17).

A bare URL is said by its host: "https://example.com/menu?id=42" as "example dot com". An e-mail address
keeps its user as written and says its domain: "ann@example.com" as "ann at example dot com".
"""

from __future__ import annotations

import re
from typing import Final

#: Every start of what a URL starts with ("", "h", ..., "https://", "w", ...): a token that may still become
#: a URL waits.
URL_STARTS: Final = frozenset(s[:n] for s in ("https://", "http://", "www.") for n in range(len(s) + 1))

_URL: Final = re.compile(r"(?:https?://|www\.)[^\s<>()\[\]\"'`*]+", re.IGNORECASE)
_SCHEME: Final = re.compile(r"^(?:https?://)?(?:www\.)?", re.IGNORECASE)
_HOST_END: Final = re.compile(r"[/?#:]")
_DOMAIN: Final = re.compile(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")  # after an e-mail address's "@"
# Characters a URL or address does not end with: the sentence's punctuation after it.
_TRAILING: Final = ".,;:!?"


def url_at(tok: str, i: int) -> tuple[str, int] | None:
    """The URL that starts at ``i`` in ``tok``, if one does: its host as said, and where it ends (after its
    ``>`` too, in an autolink ``<https://...>``)."""
    if (m := _URL.match(tok, i)) is None:
        return None
    url = m[0].rstrip(_TRAILING)
    end = i + len(url) + (1 if tok.startswith(">", i + len(url)) else 0)
    host = _HOST_END.split(_SCHEME.sub("", url), 1)[0]
    return _dotted(host or url), end


def domain_at(tok: str, i: int) -> tuple[str, int] | None:
    """The domain of the e-mail address whose "@" is at ``i`` in ``tok``, if it has one: said with its "@"
    (" at example dot com"), and where it ends."""
    if (m := _DOMAIN.match(tok, i + 1)) is None:
        return None
    host = m[0].rstrip(_TRAILING)
    return f" at {_dotted(host)}", i + len(host) + 1


def _dotted(name: str) -> str:
    """A host or an address's user as said aloud: "example.com" -> "example dot com"."""
    return re.sub(
        r"[._-]+", lambda m: {".": " dot ", "_": " underscore ", "-": " dash "}[m[0][0]], name
    ).strip()
