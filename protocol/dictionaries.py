"""ElevenLabs' pronunciation dictionaries (sans-I/O): the stored record, the locators that name them,
and the shapes of the ``/v1/pronunciation-dictionaries`` answers (``pronunciation_dictionary_locators``).

A dictionary is a PLS lexicon uploaded once (``protocol.pls`` parses it) and kept per API key beside the
voices (``gateway.voices.dictionaries``). A request names up to ``MAX_LOCATORS`` of them by id (and
optionally version); ``pronunciations`` turns those locators into ``Pronunciation`` entries, the same ones
``session.config``'s ``pronunciations`` carry, so the normalizer applies both one way. A change of rules
makes a new version, and only the latest is kept; a locator may name it or leave it out.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Annotated

import msgspec

from .errors import ErrorCode, ProtocolError, decoded
from .messages import MAX_PRONUNCIATIONS, Pronunciation
from .pls import ARPABET, IPA, arpabet_ipa

#: ElevenLabs takes at most three locators in one request.
MAX_LOCATORS = 3
#: The ``format`` of a stored record.
FORMAT = "voxgate.pronunciation-dictionary/1"
#: A dictionary's name and description: identification only, as in ElevenLabs.
MAX_NAME_CHARS = 256
MAX_DESCRIPTION_CHARS = 4096
#: ``GET /v1/pronunciation-dictionaries``' ``page_size``: ElevenLabs' default and most.
DEFAULT_PAGE_SIZE = 30
MAX_PAGE_SIZE = 100
_ID_HEX = 10  # 20 hex digits, the length of ElevenLabs' ids
_Ref = Annotated[str, msgspec.Meta(max_length=128)]


class Locator(msgspec.Struct, frozen=True, kw_only=True):
    """One ``pronunciation_dictionary_locators`` entry; without ``version_id``, the latest version."""

    pronunciation_dictionary_id: _Ref
    version_id: _Ref | None = None


#: The locators one request may carry.
Locators = Annotated[list[Locator], msgspec.Meta(max_length=MAX_LOCATORS)]


class Dictionary(msgspec.Struct, frozen=True, kw_only=True):
    """A stored dictionary: its metadata and its entries, in the lexicon's order."""

    format: str = FORMAT
    id: str
    owner: str
    version_id: str
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_CHARS)]
    description: Annotated[str, msgspec.Meta(max_length=MAX_DESCRIPTION_CHARS)] | None = None
    created_at: int
    archived_at: int | None = None
    rules: Annotated[list[Pronunciation], msgspec.Meta(min_length=1, max_length=MAX_PRONUNCIATIONS)]


class AliasRule(msgspec.Struct, tag_field="type", tag="alias", frozen=True, kw_only=True):
    """ElevenLabs' alias rule: ``string_to_replace`` said as ``alias``."""

    string_to_replace: str
    alias: str
    case_sensitive: bool | None = None
    word_boundaries: bool | None = None


class PhonemeRule(msgspec.Struct, tag_field="type", tag="phoneme", frozen=True, kw_only=True):
    """ElevenLabs' phoneme rule: ``string_to_replace`` said as ``phoneme`` (``ipa`` or ``cmu-arpabet``)."""

    string_to_replace: str
    phoneme: str
    alphabet: str
    case_sensitive: bool | None = None
    word_boundaries: bool | None = None


class RulesBody(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/pronunciation-dictionaries/add-from-rules``' body (``workspace_access`` is ignored)."""

    name: str
    rules: Annotated[list[AliasRule | PhonemeRule], msgspec.Meta(max_length=MAX_PRONUNCIATIONS)]
    description: str | None = None


class NewRules(msgspec.Struct, frozen=True, kw_only=True):
    """The body of ``POST .../{id}/set-rules`` and ``.../add-rules``."""

    rules: Annotated[list[AliasRule | PhonemeRule], msgspec.Meta(max_length=MAX_PRONUNCIATIONS)]


class RuleStrings(msgspec.Struct, frozen=True, kw_only=True):
    """The body of ``POST .../{id}/remove-rules``: the ``string_to_replace`` of each rule to remove."""

    rule_strings: Annotated[list[str], msgspec.Meta(max_length=MAX_PRONUNCIATIONS)]


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Dictionary).decode
_decode_rules = msgspec.json.Decoder(RulesBody).decode
_decode_new_rules = msgspec.json.Decoder(NewRules).decode
_decode_rule_strings = msgspec.json.Decoder(RuleStrings).decode


def decode_rules(data: bytes) -> RulesBody:
    """Decode an ``add-from-rules`` body.

    Raises:
        ProtocolError: not JSON (``invalid_json``), a field of the wrong type, an unknown rule ``type`` or
            over ``MAX_PRONUNCIATIONS`` rules (``invalid_message``, with its path).
    """
    return decoded(_decode_rules, data, " body")


def decode_new_rules(data: bytes) -> NewRules:
    """Decode a ``set-rules`` or ``add-rules`` body (raises as ``decode_rules``)."""
    return decoded(_decode_new_rules, data, " body")


def decode_rule_strings(data: bytes) -> RuleStrings:
    """Decode a ``remove-rules`` body (raises as ``decode_rules``)."""
    return decoded(_decode_rule_strings, data, " body")


def new_version(dictionary: Dictionary, rules: list[Pronunciation]) -> Dictionary:
    """``dictionary`` with ``rules`` as a new version (a new ``version_id``; only the latest is kept).

    Raises:
        ProtocolError: no rules left, or over ``MAX_PRONUNCIATIONS`` (``invalid_message``).
    """
    if not rules or len(rules) > MAX_PRONUNCIATIONS:
        message = f"a dictionary holds 1 to {MAX_PRONUNCIATIONS} rules; this change leaves {len(rules)}"
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, message, field="$.rules")
    return msgspec.structs.replace(dictionary, rules=rules, version_id=new_id())


def with_added(current: Sequence[Pronunciation], added: Sequence[Pronunciation]) -> list[Pronunciation]:
    """``current`` with ``added``: a rule for a ``text`` already there replaces it in place, others follow."""
    out = {entry.text: entry for entry in current}
    out.update((entry.text, entry) for entry in added)
    return list(out.values())


def without(current: Sequence[Pronunciation], texts: Sequence[str]) -> list[Pronunciation]:
    """``current`` less the rules for ``texts``."""
    gone = set(texts)
    return [entry for entry in current if entry.text not in gone]


def version(dictionary: Dictionary) -> dict[str, object]:
    """ElevenLabs' ``PronunciationDictionaryRulesResponseModel`` (the answer to a change of rules)."""
    return {
        "id": dictionary.id,
        "version_id": dictionary.version_id,
        "version_rules_num": len(dictionary.rules),
    }


def entries(rules: Sequence[AliasRule | PhonemeRule]) -> list[Pronunciation]:
    """ElevenLabs' rules as ``pronunciations`` entries (case-sensitive unless a rule says not; a phoneme in
    ARPAbet written as IPA, as a PLS lexicon's is).

    Raises:
        ProtocolError: ``invalid_message`` naming the rule: ``word_boundaries: false`` (voxgate matches
            whole words only), another alphabet, an unknown ARPAbet symbol, an entry past
            ``Pronunciation``'s limits; or no rules.
    """
    out: list[Pronunciation] = []
    for n, rule in enumerate(rules):
        field = f"$.rules[{n}]"
        if rule.word_boundaries is False:
            message = "word_boundaries false is not supported: voxgate matches whole words"
            raise ProtocolError(ErrorCode.INVALID_MESSAGE, message, field=f"{field}.word_boundaries")
        fields: dict[str, object] = {
            "text": rule.string_to_replace,
            "case_sensitive": rule.case_sensitive is not False,
        }
        try:
            if isinstance(rule, AliasRule):
                fields["alias"] = rule.alias
            elif rule.alphabet in (IPA, ARPABET):
                fields["ipa"] = rule.phoneme if rule.alphabet == IPA else arpabet_ipa(rule.phoneme)
            else:
                raise ValueError(f'alphabet {rule.alphabet!r}: voxgate takes "ipa" or "cmu-arpabet"')
            out.append(msgspec.convert(fields, Pronunciation))
        except ValueError as exc:  # msgspec.ValidationError included
            raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"rule {n}: {exc}", field=field) from None
    if not out:
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE, "a dictionary needs at least one rule", field="$.rules"
        )
    return out


def new_id() -> str:
    """A fresh dictionary or version id: 20 random hex digits."""
    return secrets.token_hex(_ID_HEX)


def is_id(value: str) -> bool:
    """Whether ``value`` can be an id ``new_id`` made (anything else names no dictionary, and never a key)."""
    return len(value) == 2 * _ID_HEX and all(c in "0123456789abcdef" for c in value)


def encode(dictionary: Dictionary) -> bytes:
    """The bytes every store keeps for ``dictionary``."""
    return _encode(dictionary)


def decode(data: bytes, owner: str, dictionary_id: str) -> Dictionary:
    """A stored record, checked to be the dictionary its place says (``owner``, ``dictionary_id``).

    Raises:
        ValueError: not a record of ours, or of another place (copied or tampered with).
    """
    try:
        found = _decode(data)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise ValueError(f"not a dictionary record: {exc}") from None
    if found.format != FORMAT or found.owner != owner or found.id != dictionary_id:
        raise ValueError("the record's format, owner or id does not match its place")
    return found


def pronunciations(
    locators: Sequence[Locator] | None,
    found: Mapping[str, Dictionary] | None,
    field: str = "$.pronunciation_dictionary_locators",
) -> list[Pronunciation] | None:
    """The entries of the dictionaries ``locators`` name, in order (None for none): a word in two of them
    is said as the first one says it.

    Args:
        locators: the request's locators.
        found: the caller's dictionaries by id (those the locators name, or all of them); None when the
            store could not be read.
        field: where the locators are in the request, for the error's field.

    Raises:
        ProtocolError: a locator names no dictionary of the caller's, an archived one, or another version
            (``pronunciation_dictionary_not_found``); the entries together pass ``MAX_PRONUNCIATIONS``
            (``invalid_message``); ``found`` is None (``voice_store_unavailable``).
    """
    if not locators:
        return None
    if found is None:
        message = "the pronunciation dictionaries could not be read; try again shortly"
        raise ProtocolError(ErrorCode.VOICE_STORE_UNAVAILABLE, message, field=field)
    out: dict[tuple[str, bool], Pronunciation] = {}
    for n, locator in enumerate(locators):
        dictionary = found.get(locator.pronunciation_dictionary_id)
        if dictionary is None or dictionary.archived_at is not None:
            said = "no" if dictionary is None else "an archived"
            message = (
                f"{said} pronunciation dictionary {locator.pronunciation_dictionary_id!r} of this API key"
            )
            raise not_found(message, f"{field}[{n}].pronunciation_dictionary_id")
        if locator.version_id not in (None, dictionary.version_id):
            message = (
                f"pronunciation dictionary {dictionary.id!r} has no version {locator.version_id!r} "
                f"(its version is {dictionary.version_id!r})"
            )
            raise not_found(message, f"{field}[{n}].version_id")
        for rule in dictionary.rules:
            out.setdefault((rule.text, rule.case_sensitive), rule)
    if len(out) > MAX_PRONUNCIATIONS:
        message = (
            f"the dictionaries hold {len(out)} words together; a request takes at most {MAX_PRONUNCIATIONS}"
        )
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, message, field=field)
    return list(out.values())


def not_found(message: str, field: str | None = None) -> ProtocolError:
    """The refusal of an id that names no dictionary of the caller's."""
    return ProtocolError(ErrorCode.PRONUNCIATION_DICTIONARY_NOT_FOUND, message, field=field)


def metadata(dictionary: Dictionary) -> dict[str, object]:
    """ElevenLabs' ``GetPronunciationDictionaryMetadataResponse`` (list entries, ``PATCH``'s answer)."""
    return {
        "id": dictionary.id,
        "latest_version_id": dictionary.version_id,
        "latest_version_rules_num": len(dictionary.rules),
        "name": dictionary.name,
        "permission_on_resource": "admin",
        "created_by": dictionary.owner or "anonymous",
        "creation_time_unix": dictionary.created_at,
        "archived_time_unix": dictionary.archived_at,
        "description": dictionary.description,
    }


def with_rules(dictionary: Dictionary) -> dict[str, object]:
    """ElevenLabs' ``GetPronunciationDictionaryWithRulesResponseModel`` (``GET .../{id}``)."""
    return {**metadata(dictionary), "rules": [rule(entry) for entry in dictionary.rules]}


def added(dictionary: Dictionary) -> dict[str, object]:
    """ElevenLabs' ``AddPronunciationDictionaryResponseModel`` (``POST .../add-from-file``)."""
    return {
        "id": dictionary.id,
        "name": dictionary.name,
        "created_by": dictionary.owner or "anonymous",
        "creation_time_unix": dictionary.created_at,
        "version_id": dictionary.version_id,
        "version_rules_num": len(dictionary.rules),
        "description": dictionary.description,
        "permission_on_resource": "admin",
    }


def rule(entry: Pronunciation) -> dict[str, object]:
    """One entry as ElevenLabs' rule: a ``phoneme`` rule when it has IPA (with its alias, if any, beside),
    else an ``alias`` rule; always on word boundaries."""
    shape: dict[str, object] = {
        "string_to_replace": entry.text,
        "case_sensitive": entry.case_sensitive,
        "word_boundaries": True,
    }
    if entry.ipa is not None:
        shape.update(type="phoneme", phoneme=entry.ipa, alphabet="ipa")
        if entry.alias is not None:
            shape["alias"] = entry.alias
    else:
        shape.update(type="alias", alias=entry.alias)
    return shape


class Page(msgspec.Struct, frozen=True, kw_only=True):
    """The query of ``GET /v1/pronunciation-dictionaries``: ElevenLabs' paging and sorting."""

    cursor: str | None = None
    page_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_PAGE_SIZE)] = DEFAULT_PAGE_SIZE
    sort: str = "creation_time_unix"
    sort_direction: str = "DESCENDING"
    include_archived: bool = False


def parse_page(query: Mapping[str, str]) -> Page:
    """Read the list's query parameters.

    Raises:
        ProtocolError: a ``page_size`` out of 1-100, a ``cursor`` this server did not give, an unknown
            ``sort`` or ``sort_direction`` (``invalid_message``, naming it).
    """
    fields: dict[str, object] = {k: query[k] for k in ("cursor", "sort", "sort_direction") if k in query}
    for name in ("page_size", "include_archived"):
        if name in query:
            fields[name] = query[name]
    try:
        page = msgspec.convert(fields, Page, strict=False)
    except msgspec.ValidationError as exc:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, str(exc), field=_query_field(exc)) from None
    if page.sort not in ("creation_time_unix", "name"):
        message = f"sort must be 'creation_time_unix' or 'name', not {page.sort!r}"
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, message, field="sort")
    if page.sort_direction.lower() not in ("ascending", "descending"):
        message = f"sort_direction must be 'ascending' or 'descending', not {page.sort_direction!r}"
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, message, field="sort_direction")
    if page.cursor is not None and not page.cursor.isdigit():
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "cursor is not one this server gave", field="cursor")
    return page


def _query_field(exc: msgspec.ValidationError) -> str | None:
    text = str(exc)
    return next((name for name in ("page_size", "include_archived") if name in text), None)


def listing(dictionaries: Sequence[Dictionary], page: Page) -> dict[str, object]:
    """ElevenLabs' ``GetPronunciationDictionariesMetadataResponseModel``: one page of ``dictionaries``,
    sorted and filtered as ``page`` asks, with the cursor of the next."""
    shown = [d for d in dictionaries if page.include_archived or d.archived_at is None]
    descending = page.sort_direction.lower() == "descending"
    if page.sort == "name":
        shown.sort(key=lambda d: (d.name, d.id), reverse=descending)
    else:
        shown.sort(key=lambda d: (d.created_at, d.id), reverse=descending)
    start = int(page.cursor or 0)
    end = start + page.page_size
    more = end < len(shown)
    return {
        "pronunciation_dictionaries": [metadata(d) for d in shown[start:end]],
        "next_cursor": str(end) if more else None,
        "has_more": more,
    }
