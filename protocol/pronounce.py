"""A request's ``pronunciations`` as one engine says them: which words the normalizer rewrites, which the
engine says from phonemes (sans-I/O; docs/protocol.md §17).

Each entry names whole words (``text``, one word or several) and how to say them:

* ``alias``: said instead, on every engine (the normalizer rewrites the words, ``protocol.normalize``);
* ``ipa``: an engine with phoneme input (``TTSEngine.ipa_symbols`` not empty: Piper) says the words from
  these phonemes. The normalizer keeps the words as written, out of every other rule, and each segment goes
  to the engine with the entries (``SynthesisRequest.phonemes``); the engine finds the words in it again.
  A symbol the voice has no phoneme for is refused (``invalid_message``, naming the entry's ``ipa``).
  An engine without phoneme input says the entry's ``alias`` when it has one, else the words as written,
  and the client is told so (``option_ignored``, naming the entry's ``ipa``).

Under ``text_normalization: off`` the text is read as sent: no entry applies.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from .errors import ErrorCode, ProtocolError
from .normalize import Alias


class Entry(Protocol):
    """One entry of ``pronunciations`` (``protocol.config.Pronunciation``, or a dictionary's rule)."""

    @property
    def text(self) -> str: ...
    @property
    def alias(self) -> str | None: ...
    @property
    def ipa(self) -> str | None: ...
    @property
    def case_sensitive(self) -> bool: ...


class Phonemes(NamedTuple):
    """Words an engine with phoneme input says from ``ipa``: whole words, any spaces between them."""

    text: str
    #: The phonemes, decomposed (NFD, as espeak's are) and one space between words (``ipa_form``).
    ipa: str
    case_sensitive: bool = True


def ipa_form(ipa: str) -> str:
    """``ipa`` as an engine takes it: decomposed (an accent is a symbol of its own), words one space apart."""
    return " ".join(unicodedata.normalize("NFD", ipa).split())


def check(entries: Sequence[Entry] | None, symbols: frozenset[str]) -> tuple[str, ...]:
    """Check the ``ipa`` of ``entries`` against the phoneme symbols of the engine's voice.

    Args:
        entries: the request's ``pronunciations``.
        symbols: ``TTSEngine.ipa_symbols``: empty for an engine without phoneme input.

    Returns:
        The fields of the ``ipa`` the engine cannot say (``pronunciations[1].ipa``): all of them for an engine
        without phoneme input, which says those words by their alias or as written.

    Raises:
        ProtocolError: ``invalid_message`` naming the first ``ipa`` with a symbol the voice cannot say.
    """
    fields = [(n, e.ipa) for n, e in enumerate(entries or ()) if e.ipa is not None]
    if not symbols:
        return tuple(f"pronunciations[{n}].ipa" for n, _ in fields)
    for n, ipa in fields:
        form = ipa_form(ipa)
        unknown = sorted({s for s in form if s not in symbols and s != " "})
        if not form or unknown:
            listed = " ".join(f"{s!r} (U+{ord(s):04X})" for s in unknown[:10])
            problem = f"symbols this voice has no phoneme for: {listed}" if unknown else "no phoneme"
            raise ProtocolError(
                ErrorCode.INVALID_MESSAGE,
                f"pronunciations[{n}].ipa has {problem}; write the word in the IPA symbols espeak-ng uses "
                "for the voice's language",
                field=f"$.pronunciations[{n}].ipa",
            )
    return ()


def aliases(entries: Sequence[Entry] | None, *, phonemes: bool) -> list[Alias]:
    """What the normalizer applies: each entry's alias, except that an ``ipa`` entry keeps its words as
    written for an engine with phoneme input (``phonemes``), and an ``ipa`` entry without alias always."""
    out: list[Alias] = []
    for e in entries or ():
        said = None if e.ipa is not None and (phonemes or e.alias is None) else e.alias
        out.append(Alias(e.text, said, case_sensitive=e.case_sensitive))
    return out


def phonemes(
    entries: Sequence[Entry] | None, symbols: frozenset[str], normalization: str = "auto"
) -> tuple[Phonemes, ...]:
    """The ``ipa`` entries as the engine gets them with each segment: none for an engine without phoneme
    input (no ``symbols``), nor under ``text_normalization: off`` (the text is read as sent)."""
    if not symbols or normalization == "off":
        return ()
    return tuple(
        Phonemes(" ".join(e.text.split()), ipa_form(e.ipa), e.case_sensitive)
        for e in entries or ()
        if e.ipa is not None
    )
