"""Pronunciation lexicons (W3C PLS 1.0, the files of ElevenLabs' pronunciation dictionaries), parsed into
``pronunciations`` entries (sans-I/O).

A lexicon is XML::

    <lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa"
             xml:lang="en-US">
      <lexeme><grapheme>SQL</grapheme><alias>sequel</alias></lexeme>
      <lexeme><grapheme>Nguyen</grapheme><phoneme>ŋwiən</phoneme></lexeme>
    </lexicon>

Each ``<grapheme>`` of a lexeme becomes one ``Pronunciation`` (``protocol.messages``), the shape
``session.config``'s ``pronunciations`` take: ``{"text", "alias"}`` from the lexeme's first ``<alias>``,
``{"text", "ipa"}`` from its first ``<phoneme>`` (in the phoneme's ``alphabet``, else the lexicon's: ``ipa``,
or ElevenLabs' other one, ``cmu-arpabet``, written as IPA the way espeak-ng writes it), or both when it has
both. So a dictionary and a request's own pronunciations are one mechanism.

The file comes from a client, so it is parsed defensively with expat directly: a document type declaration
(where entity definitions and external references live) is refused outright, so no entity expands and
nothing outside the file is read; only XML's five predefined entities and character references remain.
The file's size, its depth, its number of elements and its number of entries are capped, and each entry
is held to ``Pronunciation``'s limits. Every refusal is one ``ProtocolError`` (``invalid_lexicon``) that
says what to fix and, where it has one, on which line.
"""

from __future__ import annotations

import xml.parsers.expat
from collections.abc import Sequence
from xml.sax.saxutils import escape

import msgspec

from .errors import ErrorCode, ProtocolError
from .messages import MAX_PRONUNCIATIONS, Pronunciation

#: The namespace of PLS 1.0; a lexicon without a namespace is taken as well.
NAMESPACE = "http://www.w3.org/2005/01/pronunciation-lexicon"
#: A lexicon of ``MAX_PRONUNCIATIONS`` entries with comments fits many times over.
MAX_LEXICON_BYTES = 1 << 20
#: Elements of any kind (a lexeme is at least three), and how deep they nest (a lexicon needs three).
MAX_ELEMENTS = 16 * MAX_PRONUNCIATIONS
MAX_DEPTH = 8
#: The phonetic alphabet whose strings ``ipa`` takes (PLS names it so).
IPA = "ipa"
#: The other alphabet ElevenLabs takes: CMU's ARPAbet for American English (``AE1 P AH0 L``), written as IPA.
ARPABET = "cmu-arpabet"
#: Each ARPAbet symbol in IPA as espeak-ng writes American English (so Piper's voices have every symbol);
#: ``ER`` is ``ɜː`` stressed, ``ɚ`` not, and ``AH`` is ``ʌ`` stressed, ``ə`` not.
_ARPABET: dict[str, str] = {
    "AA": "ɑː", "AE": "æ", "AH": "ʌ", "AO": "ɔː", "AW": "aʊ", "AY": "aɪ", "EH": "ɛ", "ER": "ɜː", "EY": "eɪ",
    "IH": "ɪ", "IY": "iː", "OW": "oʊ", "OY": "ɔɪ", "UH": "ʊ", "UW": "uː",
    "B": "b", "CH": "tʃ", "D": "d", "DH": "ð", "F": "f", "G": "ɡ", "HH": "h", "JH": "dʒ", "K": "k", "L": "l",
    "M": "m", "N": "n", "NG": "ŋ", "P": "p", "R": "ɹ", "S": "s", "SH": "ʃ", "T": "t", "TH": "θ", "V": "v",
    "W": "w", "Y": "j", "Z": "z", "ZH": "ʒ",
}  # fmt: skip
_UNSTRESSED = {"AH": "ə", "ER": "ɚ"}
_STRESS = {"0": "", "1": "ˈ", "2": "ˌ"}


class _Lexeme:
    """What one ``<lexeme>`` held, as it is read."""

    __slots__ = ("alias", "graphemes", "line", "phoneme")

    def __init__(self, line: int) -> None:
        self.line = line
        self.graphemes: list[str] = []
        self.alias: str | None = None
        self.phoneme: str | None = None


class _Reader:
    """The expat handlers of one parse: the element stack, the lexeme being read, the text of a leaf."""

    def __init__(self, parser: xml.parsers.expat.XMLParserType) -> None:
        self.parser = parser
        self.stack: list[str] = []
        self.elements = 0
        self.alphabet: str | None = None
        self.lexemes: list[_Lexeme] = []
        self.text: list[str] | None = None  # the text of the grapheme, alias or phoneme being read
        self.text_alphabet: str | None = None  # a phoneme's own alphabet

    def refuse(self, message: str) -> ProtocolError:
        return invalid(f"line {self.parser.CurrentLineNumber}: {message}")

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        name = _local(tag)
        self.elements += 1
        if self.elements > MAX_ELEMENTS or len(self.stack) >= MAX_DEPTH:
            raise self.refuse(f"a lexicon has at most {MAX_ELEMENTS} elements, {MAX_DEPTH} deep")
        parent = self.stack[-1] if self.stack else None
        if parent is None:
            if name != "lexicon" or _namespace(tag) not in ("", NAMESPACE):
                raise self.refuse(f"the root element is <{name}>, not a PLS <lexicon>")
            self.alphabet = attrs.get("alphabet")
        elif parent == "lexicon" and name == "lexeme":
            self.lexemes.append(_Lexeme(self.parser.CurrentLineNumber))
        elif parent == "lexeme" and name in ("grapheme", "alias", "phoneme"):
            self.text, self.text_alphabet = [], attrs.get("alphabet")
        elif self.text is not None:
            raise self.refuse(f"<{parent}> holds text, not a <{name}> element")
        self.stack.append(name)

    def end(self, tag: str) -> None:
        name = self.stack.pop()
        if self.text is None:  # not a grapheme, alias or phoneme (those hold text only)
            return
        text, self.text = " ".join("".join(self.text).split()), None
        lexeme = self.lexemes[-1]
        if name == "grapheme":
            if not text:
                raise self.refuse("an empty <grapheme>")
            lexeme.graphemes.append(text)
        elif name == "alias" and lexeme.alias is None:
            if not text:
                raise self.refuse("an empty <alias> would silence the word")
            lexeme.alias = text
        elif name == "phoneme" and lexeme.phoneme is None:
            alphabet = self.text_alphabet or self.alphabet
            if alphabet not in (IPA, ARPABET):
                said = f"alphabet {alphabet!r}" if alphabet else "no alphabet"
                raise self.refuse(
                    f'a <phoneme> in {said}: voxgate takes "ipa" or "cmu-arpabet" (or an <alias>)'
                )
            if not text:
                raise self.refuse("an empty <phoneme>")
            try:
                lexeme.phoneme = text if alphabet == IPA else arpabet_ipa(text)
            except ValueError as exc:
                raise self.refuse(str(exc)) from None

    def chars(self, data: str) -> None:
        if self.text is not None:
            self.text.append(data)

    def doctype(self, *_: object) -> None:
        raise self.refuse("a lexicon may not have a <!DOCTYPE> (entities and external references)")


def arpabet_ipa(text: str) -> str:
    """ARPAbet symbols (a vowel's stress as its digit) as IPA, each stress mark before its vowel as espeak-ng
    writes it (``AE1 P AH0 L``: ``ˈæpəl``).

    Raises:
        ValueError: a symbol that is not ARPAbet's.
    """
    out = []
    for symbol in text.upper().split():
        base, stress = (symbol[:-1], symbol[-1]) if symbol[-1:] in _STRESS else (symbol, "0")
        if base not in _ARPABET:
            raise ValueError(f"{symbol!r} is not an ARPAbet symbol")
        ipa = _UNSTRESSED.get(base, _ARPABET[base]) if stress == "0" else _ARPABET[base]
        out.append(_STRESS[stress] + ipa)
    return "".join(out)


def write(entries: Sequence[Pronunciation]) -> bytes:
    """A PLS lexicon of ``entries`` (``parse`` reads it back; ``case_sensitive: false`` has no PLS form)."""
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<lexicon version="1.0" xmlns="{NAMESPACE}" alphabet="{IPA}">',
    ]
    for entry in entries:
        said = [f"<grapheme>{escape(entry.text)}</grapheme>"]
        if entry.alias is not None:
            said.append(f"<alias>{escape(entry.alias)}</alias>")
        if entry.ipa is not None:
            said.append(f"<phoneme>{escape(entry.ipa)}</phoneme>")
        lines.append(f"  <lexeme>{''.join(said)}</lexeme>")
    lines.append("</lexicon>\n")
    return "\n".join(lines).encode()


def invalid(message: str) -> ProtocolError:
    """The refusal of a lexicon file (``invalid_lexicon``, about the upload's ``file``)."""
    return ProtocolError(ErrorCode.INVALID_LEXICON, f"not a usable PLS lexicon: {message}", field="file")


def parse(data: bytes) -> list[Pronunciation]:
    """The pronunciations of a PLS lexicon file, in the file's order (the first of a word wins).

    Raises:
        ProtocolError: ``invalid_lexicon``: over ``MAX_LEXICON_BYTES``, not well-formed XML (in an
            encoding its declaration names), a ``<!DOCTYPE>``, not a ``<lexicon>``, a lexeme without a
            grapheme or with neither an alias nor an IPA phoneme, an entry over ``Pronunciation``'s limits,
            or over ``MAX_PRONUNCIATIONS`` entries (or none).
    """
    if len(data) > MAX_LEXICON_BYTES:
        raise invalid(f"{len(data)} bytes; a lexicon is at most {MAX_LEXICON_BYTES}")
    parser = xml.parsers.expat.ParserCreate(namespace_separator=" ")
    parser.SetParamEntityParsing(xml.parsers.expat.XML_PARAM_ENTITY_PARSING_NEVER)
    reader = _Reader(parser)
    parser.StartDoctypeDeclHandler = reader.doctype
    parser.StartElementHandler = reader.start
    parser.EndElementHandler = reader.end
    parser.CharacterDataHandler = reader.chars
    try:
        parser.Parse(data, True)
    except xml.parsers.expat.ExpatError as exc:
        raise invalid(f"line {exc.lineno}: {xml.parsers.expat.errors.messages[exc.code]}") from None
    except (LookupError, ValueError) as exc:  # an encoding Python lacks, or one expat cannot take
        raise invalid(f"its declared encoding: {exc}") from None
    return _entries(reader.lexemes)


def _entries(lexemes: list[_Lexeme]) -> list[Pronunciation]:
    out: list[Pronunciation] = []
    for lexeme in lexemes:
        where = f"the <lexeme> of line {lexeme.line}"
        if not lexeme.graphemes:
            raise invalid(f"{where} has no <grapheme>")
        if lexeme.alias is None and lexeme.phoneme is None:
            raise invalid(f"{where} has neither an <alias> nor a <phoneme>")
        for grapheme in lexeme.graphemes:
            fields = {"text": grapheme, "alias": lexeme.alias, "ipa": lexeme.phoneme}
            try:
                out.append(msgspec.convert(fields, Pronunciation))
            except msgspec.ValidationError as exc:
                raise invalid(f"{where}: {exc}") from None
    if not out:
        raise invalid("it has no <lexeme>")
    if len(out) > MAX_PRONUNCIATIONS:
        raise invalid(f"{len(out)} entries; a dictionary holds at most {MAX_PRONUNCIATIONS}")
    return out


def _local(tag: str) -> str:
    return tag.rpartition(" ")[2]


def _namespace(tag: str) -> str:
    return tag.rpartition(" ")[0]
