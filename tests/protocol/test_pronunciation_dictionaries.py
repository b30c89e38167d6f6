"""ElevenLabs' pronunciation dictionaries, sans-I/O: PLS lexicons parsed defensively into ``pronunciations``
entries (``protocol.pls``), locators resolved to them and the answers' shapes (``protocol.dictionaries``), and
the ElevenLabs socket codec taking locators from its first message (``protocol.codecs.elevenlabs.Stream``)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from voxgate.protocol import pls
from voxgate.protocol.codecs.elevenlabs import Params, Stream, decode_body, decode_inbound, session_config
from voxgate.protocol.dictionaries import (
    MAX_LOCATORS,
    Dictionary,
    Locator,
    added,
    decode,
    decode_new_rules,
    decode_rule_strings,
    decode_rules,
    encode,
    entries,
    is_id,
    listing,
    new_id,
    new_version,
    parse_page,
    pronunciations,
    version,
    with_added,
    with_rules,
    without,
)
from voxgate.protocol.errors import ErrorCode, ProtocolError
from voxgate.protocol.messages import MAX_PRONUNCIATIONS, InputText, Keepalive, Pronunciation, SessionConfig

NS = 'xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"'
SQL = Pronunciation(text="SQL", alias="sequel")
NGUYEN = Pronunciation(text="Nguyen", ipa="ŋwiən")


def lexicon(*lexemes: str, alphabet: str = ' alphabet="ipa"', ns: str = NS) -> bytes:
    body = "".join(f"<lexeme>{lexeme}</lexeme>" for lexeme in lexemes)
    head = '<?xml version="1.0" encoding="UTF-8"?>\n'
    return f'{head}<lexicon version="1.0" {ns}{alphabet}>{body}</lexicon>'.encode()


def refused(data: bytes) -> str:
    with pytest.raises(ProtocolError) as caught:
        pls.parse(data)
    assert caught.value.code == ErrorCode.INVALID_LEXICON and caught.value.status == 400
    assert caught.value.param == "file"
    return caught.value.message


def test_a_lexicon_becomes_pronunciations_in_the_files_order() -> None:
    data = lexicon(
        "<grapheme>SQL</grapheme><alias>sequel</alias>",
        "<grapheme>Nguyen</grapheme><grapheme>AT&amp;T</grapheme><phoneme>ŋwiən</phoneme>",
        "<grapheme> New\n York </grapheme><alias>the big  apple</alias><phoneme>nuː jɔːk</phoneme>"
        "<alias>not this one: the first wins</alias><phoneme>nor this</phoneme><example>ignored</example>",
    )
    assert pls.parse(data) == [
        SQL,
        NGUYEN,
        Pronunciation(text="AT&T", ipa="ŋwiən"),
        Pronunciation(text="New York", alias="the big apple", ipa="nuː jɔːk"),
    ]


def test_namespaces_alphabets_and_encodings() -> None:
    # No namespace is taken too; a phoneme's own alphabet serves when the lexicon names none.
    plain = lexicon('<grapheme>a</grapheme><phoneme alphabet="ipa">eɪ</phoneme>', alphabet="", ns="")
    assert pls.parse(plain) == [Pronunciation(text="a", ipa="eɪ")]
    # An alias needs no alphabet; the declaration's encoding is read.
    utf16 = lexicon("<grapheme>Zoë</grapheme><alias>zoey</alias>", alphabet="").decode()
    assert pls.parse(utf16.replace("UTF-8", "UTF-16").encode("utf-16")) == [
        Pronunciation(text="Zoë", alias="zoey")
    ]


def test_cmu_arpabet_is_written_as_ipa_the_way_espeak_writes_it() -> None:
    data = lexicon(
        "<grapheme>apple</grapheme><phoneme>AE1 P AH0 L</phoneme>",
        "<grapheme>butter</grapheme><phoneme>b ah1 t er0</phoneme>",
        '<grapheme>bird</grapheme><phoneme alphabet="ipa">bˈɜːd</phoneme>',
        "<grapheme>thousand</grapheme><phoneme>TH AW1 Z AH0 N D</phoneme>",
        "<grapheme>cheese</grapheme><phoneme>CH IY2 Z</phoneme>",
        alphabet=' alphabet="cmu-arpabet"',
    )
    assert [entry.ipa for entry in pls.parse(data)] == ["ˈæpəl", "bˈʌtɚ", "bˈɜːd", "θˈaʊzənd", "tʃˌiːz"]
    assert "'QX1' is not an ARPAbet symbol" in refused(
        lexicon("<grapheme>x</grapheme><phoneme>QX1</phoneme>", alphabet=' alphabet="cmu-arpabet"')
    )


BOMB = (
    b'<?xml version="1.0"?><!DOCTYPE lexicon [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">'
    b'<!ENTITY c "&b;&b;&b;&b;&b;&b;">]><lexicon><lexeme><grapheme>&c;</grapheme><alias>x</alias></lexeme>'
    b"</lexicon>"
)
EXTERNAL = (
    b'<?xml version="1.0"?><!DOCTYPE lexicon [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
    b"<lexicon><lexeme><grapheme>&x;</grapheme><alias>x</alias></lexeme></lexicon>"
)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (BOMB, "<!DOCTYPE>"),
        (EXTERNAL, "<!DOCTYPE>"),
        (b"<!DOCTYPE lexicon SYSTEM 'http://example.com/x.dtd'><lexicon/>", "<!DOCTYPE>"),
        (lexicon("<grapheme>&undefined;</grapheme><alias>x</alias>"), "undefined entity"),
        (b"not xml at all", "syntax error"),
        (lexicon("<grapheme>a</grapheme><alias>b</alias>").replace(b"UTF-8", b"yTF-8"), "unknown encoding"),
        (lexicon("<grapheme>a</grapheme><alias>b</alias>").replace(b"UTF-8", b"hex"), "not a text encoding"),
        (lexicon("<grapheme>a</grapheme><alias>b</alias>").replace(b"UTF-8", b"cp932"), "multi-byte"),
        (b"<lexicon><lexeme>", "no element found"),
        (b"<voices/>", "root element is <voices>"),
        (b'<lexicon xmlns="urn:other"/>', "root element is <lexicon>"),
        (lexicon(), "no <lexeme>"),
        (lexicon("<alias>x</alias>"), "has no <grapheme>"),
        (lexicon("<grapheme>x</grapheme>"), "neither an <alias> nor a <phoneme>"),
        (lexicon("<grapheme> </grapheme><alias>x</alias>"), "an empty <grapheme>"),
        (lexicon("<grapheme>x</grapheme><alias></alias>"), "an empty <alias>"),
        (lexicon("<grapheme>x</grapheme><phoneme/>"), "an empty <phoneme>"),
        (lexicon("<grapheme>x</grapheme><phoneme>ɛks</phoneme>", alphabet=""), "no alphabet"),
        (
            lexicon("<grapheme>x</grapheme><phoneme>EH1 K S</phoneme>", alphabet=' alphabet="x-sampa"'),
            "'x-sampa'",
        ),
        (lexicon("<grapheme>x<b>y</b></grapheme><alias>x</alias>"), "<grapheme> holds text"),
        (lexicon(f"<grapheme>{'x' * 101}</grapheme><alias>x</alias>"), "the <lexeme> of line 2"),
        (
            lexicon("<grapheme>x</grapheme><alias>x</alias><a><b><c><d><e><f><g/></f></e></d></c></b></a>"),
            "deep",
        ),
        (lexicon(*["<grapheme>x</grapheme><alias>y</alias>"] * (pls.MAX_ELEMENTS // 3 + 1)), "elements"),
        (
            lexicon(*[f"<grapheme>w{n}</grapheme><alias>y</alias>" for n in range(MAX_PRONUNCIATIONS + 1)]),
            "entries",
        ),
        (b" " * (pls.MAX_LEXICON_BYTES + 1), "bytes"),
    ],
)
def test_a_bad_or_hostile_lexicon_is_refused_saying_why(data: bytes, says: str) -> None:
    assert says in refused(data)


def _dictionary(rules: list[Pronunciation], **fields: Any) -> Dictionary:
    values: dict[str, Any] = {
        "id": new_id(),
        "owner": "ab12",
        "version_id": new_id(),
        "name": "Brands",
        "created_at": 1_700_000_000,
        "rules": rules,
    }
    return Dictionary(**{**values, **fields})


def test_ids_and_the_stored_record() -> None:
    made = new_id()
    assert is_id(made) and made != new_id()
    assert not is_id("../../etc") and not is_id(made.upper()) and not is_id(made + "0")
    dictionary = _dictionary([SQL, NGUYEN], description="ours")
    assert decode(encode(dictionary), "ab12", dictionary.id) == dictionary
    with pytest.raises(ValueError, match="does not match"):
        decode(encode(dictionary), "cd34", dictionary.id)  # another owner's folder
    with pytest.raises(ValueError, match="does not match"):
        decode(encode(dictionary), "ab12", new_id())
    with pytest.raises(ValueError, match="not a dictionary record"):
        decode(b'{"format": 1}', "ab12", dictionary.id)


def test_locators_name_dictionaries_and_the_first_says_a_word() -> None:
    first = _dictionary([SQL, NGUYEN])
    second = _dictionary(
        [Pronunciation(text="SQL", alias="ess queue ell"), Pronunciation(text="GIF", alias="jif")]
    )
    found = {first.id: first, second.id: second}
    locators = [
        Locator(pronunciation_dictionary_id=first.id, version_id=first.version_id),
        Locator(pronunciation_dictionary_id=second.id),
    ]
    assert pronunciations(locators, found) == [SQL, NGUYEN, Pronunciation(text="GIF", alias="jif")]
    assert pronunciations(None, found) is None and pronunciations([], None) is None


def _refusal(locators: list[Locator], found: dict[str, Dictionary] | None) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        pronunciations(locators, found)
    return caught.value


def test_a_locator_of_nothing_is_a_structured_4xx() -> None:
    known = _dictionary([SQL])
    found = {known.id: known}
    unknown = _refusal(
        [Locator(pronunciation_dictionary_id=known.id), Locator(pronunciation_dictionary_id="x")], found
    )
    assert unknown.code == ErrorCode.PRONUNCIATION_DICTIONARY_NOT_FOUND and unknown.status == 400
    assert unknown.field == "$.pronunciation_dictionary_locators[1].pronunciation_dictionary_id"
    version = _refusal([Locator(pronunciation_dictionary_id=known.id, version_id="old")], found)
    assert (
        version.code == ErrorCode.PRONUNCIATION_DICTIONARY_NOT_FOUND and "no version 'old'" in version.message
    )
    assert version.field == "$.pronunciation_dictionary_locators[0].version_id"
    archived = _dictionary([SQL], archived_at=1_700_000_001)
    gone = _refusal([Locator(pronunciation_dictionary_id=archived.id)], {archived.id: archived})
    assert "an archived pronunciation dictionary" in gone.message
    down = _refusal([Locator(pronunciation_dictionary_id=known.id)], None)
    assert down.code == ErrorCode.VOICE_STORE_UNAVAILABLE and down.status == 503
    full = [
        _dictionary([Pronunciation(text=f"w{n}-{d}", alias="x") for n in range(MAX_PRONUNCIATIONS)])
        for d in "ab"
    ]
    many = _refusal([Locator(pronunciation_dictionary_id=d.id) for d in full], {d.id: d for d in full})
    assert many.code == ErrorCode.INVALID_MESSAGE and f"{2 * MAX_PRONUNCIATIONS} words" in many.message


def test_the_answers_are_elevenlabs_shapes() -> None:
    both = Pronunciation(text="NY", alias="new york", ipa="nuː jɔːk", case_sensitive=False)
    dictionary = _dictionary([SQL, NGUYEN, both], owner="")
    assert added(dictionary) == {
        "id": dictionary.id,
        "name": "Brands",
        "created_by": "anonymous",
        "creation_time_unix": 1_700_000_000,
        "version_id": dictionary.version_id,
        "version_rules_num": 3,
        "description": None,
        "permission_on_resource": "admin",
    }
    shown = with_rules(dictionary)
    assert shown["latest_version_id"] == dictionary.version_id and shown["archived_time_unix"] is None
    assert shown["rules"] == [
        {
            "type": "alias",
            "string_to_replace": "SQL",
            "alias": "sequel",
            "case_sensitive": True,
            "word_boundaries": True,
        },
        {
            "type": "phoneme",
            "string_to_replace": "Nguyen",
            "phoneme": "ŋwiən",
            "alphabet": "ipa",
            "case_sensitive": True,
            "word_boundaries": True,
        },
        {
            "type": "phoneme",
            "string_to_replace": "NY",
            "phoneme": "nuː jɔːk",
            "alphabet": "ipa",
            "alias": "new york",
            "case_sensitive": False,
            "word_boundaries": True,
        },
    ]


def test_the_list_pages_sorts_and_hides_the_archived() -> None:
    a = _dictionary([SQL], name="b", created_at=1)
    b = _dictionary([SQL], name="a", created_at=2)
    c = _dictionary([SQL], name="c", created_at=3, archived_at=4)

    def ids(query: dict[str, str]) -> tuple[list[object], object, object]:
        page = listing([a, b, c], parse_page(query))
        shown = page["pronunciation_dictionaries"]
        assert isinstance(shown, list)
        return [d["id"] for d in shown], page["next_cursor"], page["has_more"]

    assert ids({}) == ([b.id, a.id], None, False)  # newest first, archived hidden
    assert ids({"include_archived": "true", "sort": "name", "sort_direction": "ascending"}) == (
        [b.id, a.id, c.id],
        None,
        False,
    )
    assert ids({"page_size": "1"}) == ([b.id], "1", True)
    assert ids({"page_size": "1", "cursor": "1"}) == ([a.id], None, False)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"page_size": "0"}, "page_size"),
        ({"page_size": "many"}, "page_size"),
        ({"include_archived": "perhaps"}, "include_archived"),
        ({"sort": "size"}, "sort"),
        ({"sort_direction": "sideways"}, "sort_direction"),
        ({"cursor": "abc"}, "cursor"),
    ],
)
def test_a_bad_list_query_is_refused_by_name(query: dict[str, str], field: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_page(query)
    assert caught.value.code == ErrorCode.INVALID_MESSAGE and caught.value.param == field


def test_rest_bodies_and_socket_messages_carry_at_most_three_locators() -> None:
    locator = {"pronunciation_dictionary_id": "abc", "version_id": "v1"}
    body = decode_body(msgspec.json.encode({"text": "Hi", "pronunciation_dictionary_locators": [locator]}))
    assert body.pronunciation_dictionary_locators == [
        Locator(pronunciation_dictionary_id="abc", version_id="v1")
    ]
    too_many = msgspec.json.encode(
        {"text": " ", "pronunciation_dictionary_locators": [locator] * (MAX_LOCATORS + 1)}
    )
    with pytest.raises(ProtocolError) as caught:
        decode_inbound(too_many)
    assert caught.value.code == ErrorCode.INVALID_MESSAGE
    assert caught.value.field == "$.pronunciation_dictionary_locators"
    config = session_config("tone", Params(), pronunciations=[SQL])
    assert config.pronunciations == [SQL]


def _first(stream: Stream, **message: object) -> list[object]:
    return list(stream.receive(decode_inbound(msgspec.json.encode(message))))


def test_a_socket_takes_its_dictionaries_from_its_first_messages() -> None:
    known = _dictionary([SQL, NGUYEN])
    locators = [{"pronunciation_dictionary_id": known.id}]
    stream = Stream("tone", Params(), multi=True, dictionaries={known.id: known})
    [opening] = stream.start()  # sent as the socket opens
    assert isinstance(opening, SessionConfig) and opening.pronunciations is None
    # A keep-alive first (no locators), then a context's first message with them: a new config carries them.
    assert [type(m) for m in _first(stream, text="")] == [Keepalive]
    opened = _first(stream, text=" ", context_id="a", pronunciation_dictionary_locators=locators)
    config = opened[0]
    assert isinstance(config, SessionConfig) and config.pronunciations == [SQL, NGUYEN]
    assert [type(m) for m in _first(stream, text="Hello SQL. ", context_id="a")] == [InputText]
    # pipecat sends the same ones with every context: welcome; others after text are refused on the context.
    assert [
        type(m) for m in _first(stream, text=" ", context_id="b", pronunciation_dictionary_locators=locators)
    ] == [Keepalive]
    with pytest.raises(ProtocolError) as caught:
        _first(stream, text=" ", context_id="c", pronunciation_dictionary_locators=[])
    assert caught.value.code == ErrorCode.UNSUPPORTED_OPTION and not caught.value.fatal


def test_a_socket_naming_an_unknown_dictionary_is_closed() -> None:
    stream = Stream("tone", Params(), multi=False, dictionaries={})
    stream.start()
    with pytest.raises(ProtocolError) as caught:
        _first(stream, text=" ", pronunciation_dictionary_locators=[{"pronunciation_dictionary_id": "nope"}])
    assert caught.value.code == ErrorCode.PRONUNCIATION_DICTIONARY_NOT_FOUND and caught.value.fatal
    # The first message, with its speed, and its dictionaries, is one config.
    known = _dictionary([SQL])
    stream = Stream("tone", Params(), multi=False, dictionaries={known.id: known})
    stream.start()
    locators = [{"pronunciation_dictionary_id": known.id}]
    config = _first(
        stream, text=" ", voice_settings={"speed": 1.5}, pronunciation_dictionary_locators=locators
    )[0]
    assert isinstance(config, SessionConfig) and config.speed == 1.5 and config.pronunciations == [SQL]


def test_elevenlabs_rules_become_the_same_entries() -> None:
    body = decode_rules(
        msgspec.json.encode(
            {
                "name": "Rules",
                "workspace_access": "admin",
                "rules": [
                    {"type": "alias", "string_to_replace": "SQL", "alias": "sequel", "word_boundaries": True},
                    {
                        "type": "alias",
                        "string_to_replace": "Thailand",
                        "alias": "tie-land",
                        "case_sensitive": False,
                    },
                    {"type": "phoneme", "string_to_replace": "Nguyen", "phoneme": "ŋwiən", "alphabet": "ipa"},
                    {
                        "type": "phoneme",
                        "string_to_replace": "apple",
                        "phoneme": "AE1 P AH0 L",
                        "alphabet": "cmu-arpabet",
                    },
                ],
            }
        )
    )
    assert entries(body.rules) == [
        SQL,
        Pronunciation(text="Thailand", alias="tie-land", case_sensitive=False),
        NGUYEN,
        Pronunciation(text="apple", ipa="ˈæpəl"),
    ]


@pytest.mark.parametrize(
    ("rule", "field", "says"),
    [
        (
            {"type": "alias", "string_to_replace": "x", "alias": "y", "word_boundaries": False},
            "$.rules[0].word_boundaries",
            "whole words",
        ),
        (
            {"type": "phoneme", "string_to_replace": "x", "phoneme": "ɛks", "alphabet": "x-sampa"},
            "$.rules[0]",
            "x-sampa",
        ),
        (
            {"type": "phoneme", "string_to_replace": "x", "phoneme": "QX", "alphabet": "cmu-arpabet"},
            "$.rules[0]",
            "ARPAbet",
        ),
        ({"type": "alias", "string_to_replace": "", "alias": "y"}, "$.rules[0]", "rule 0"),
    ],
)
def test_a_bad_rule_is_refused_by_name(rule: dict[str, object], field: str, says: str) -> None:
    body = decode_rules(msgspec.json.encode({"name": "Rules", "rules": [rule]}))
    with pytest.raises(ProtocolError) as caught:
        entries(body.rules)
    assert caught.value.code == ErrorCode.INVALID_MESSAGE and caught.value.field == field
    assert says in caught.value.message


def test_no_rules_or_an_unknown_rule_type_is_refused() -> None:
    with pytest.raises(ProtocolError) as caught:
        entries(decode_rules(b'{"name": "Rules", "rules": []}').rules)
    assert caught.value.field == "$.rules"
    with pytest.raises(ProtocolError) as caught:
        decode_rules(b'{"name": "Rules", "rules": [{"type": "regex", "string_to_replace": "x"}]}')
    assert caught.value.code == ErrorCode.INVALID_MESSAGE


def test_a_written_lexicon_reads_back_as_its_entries() -> None:
    said = [SQL, NGUYEN, Pronunciation(text="AT&T <x>", alias="a t and t", ipa="eɪ tˈiː")]
    written = pls.write(said)
    assert written.startswith(b'<?xml version="1.0" encoding="UTF-8"?>') and b"AT&amp;T &lt;x&gt;" in written
    assert pls.parse(written) == said


def test_changes_of_rules_make_a_new_version() -> None:
    made = _dictionary([SQL, NGUYEN])
    added_rules = entries(
        decode_new_rules(
            b'{"rules": [{"type": "alias", "string_to_replace": "SQL", "alias": "ess queue ell"},'
            b' {"type": "alias", "string_to_replace": "GIF", "alias": "jif"}]}'
        ).rules
    )
    changed = new_version(made, with_added(made.rules, added_rules))
    assert changed.id == made.id and changed.version_id != made.version_id
    assert changed.rules == [
        Pronunciation(text="SQL", alias="ess queue ell"),  # replaced in place
        NGUYEN,
        Pronunciation(text="GIF", alias="jif"),
    ]
    assert version(changed) == {"id": made.id, "version_id": changed.version_id, "version_rules_num": 3}
    strings = decode_rule_strings(b'{"rule_strings": ["Nguyen", "absent"]}').rule_strings
    assert without(changed.rules, strings) == [changed.rules[0], changed.rules[2]]
    with pytest.raises(ProtocolError) as caught:
        new_version(made, without(made.rules, ["SQL", "Nguyen"]))
    assert caught.value.code == ErrorCode.INVALID_MESSAGE and "leaves 0" in caught.value.message


def test_no_mutation_of_a_lexicon_escapes_as_anything_but_invalid_lexicon() -> None:
    """Bytes flipped, cut, repeated or inserted anywhere: a parse gives entries or ``invalid_lexicon``."""
    import random

    base = lexicon(
        "<grapheme>SQL</grapheme><alias>sequel</alias>",
        "<grapheme>Nguyen</grapheme><phoneme>ŋwiən</phoneme>",
        '<grapheme>apple</grapheme><phoneme alphabet="cmu-arpabet">AE1 P AH0 L</phoneme>',
    )
    pieces = [
        b"<",
        b">",
        b"&",
        b";",
        b"<!DOCTYPE x>",
        b"<lexeme>",
        b"</lexeme>",
        b"&amp;",
        b"\x00",
        b"\xff",
        b"]]>",
    ]
    rng = random.Random(33)
    outcomes = set()
    for _ in range(3000):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data) + 1)
            match rng.randrange(4):
                case 0:
                    data[at : at + 1] = bytes([rng.randrange(256)])
                case 1:
                    del data[at : at + rng.randint(1, 40)]
                case 2:
                    data[at:at] = rng.choice(pieces)
                case _:
                    data[at:at] = data[at : at + rng.randint(1, 60)] * rng.randint(1, 50)
        try:
            pls.parse(bytes(data))
            outcomes.add("parsed")
        except ProtocolError as err:
            assert err.code == ErrorCode.INVALID_LEXICON
            outcomes.add("refused")
    assert outcomes == {"parsed", "refused"}
