"""ElevenLabs' pronunciation dictionaries on a real gateway: the ``elevenlabs`` SDK at its defaults adds one
from a PLS file, lists, gets and archives it; DELETE removes it; each API key sees only its own; the caps
hold; and ``pronunciation_dictionary_locators`` on the REST routes and the sockets feed the same
``pronunciations`` as ``session.config``'s (the fake engine records the text each segment is sent).
Dictionaries in S3 are shared by replicas on one prefix, as the voices are."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from elevenlabs import pronunciation_dictionaries as sdk_dictionaries
from elevenlabs.client import ElevenLabs
from elevenlabs.core.api_error import ApiError
from elevenlabs.pronunciation_dictionaries.rules import PronunciationDictionaryRule_Alias as RuleAlias
from voxgate.engine.fake import FakeEngine
from voxgate.gateway.voices.catalog import Catalog
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.conftest import TIMEOUT_S, serve_engine

KEY, OTHER = "dict-key-one", "dict-key-two"
URL = "/v1/pronunciation-dictionaries"
PLS = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa" '
    'xml:lang="en-US">\n'
    "  <lexeme><grapheme>SQL</grapheme><alias>sequel</alias></lexeme>\n"
    "  <lexeme><grapheme>Nguyen</grapheme><phoneme>ŋwiən</phoneme></lexeme>\n"
    "</lexicon>\n"
).encode()


def spoken(engine: FakeEngine) -> str:
    return " ".join(r.text for r in engine.requests)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def address(engine: FakeEngine) -> Iterator[str]:
    with serve_engine(engine, api_keys=f"{KEY},{OTHER}") as addr:
        yield addr


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=TIMEOUT_S) as client:
        yield client


AliasRule = (
    sdk_dictionaries.BodyAddAPronunciationDictionaryV1PronunciationDictionariesAddFromRulesPostRulesItem_Alias
)
PhonemeRule = sdk_dictionaries.BodyAddAPronunciationDictionaryV1PronunciationDictionariesAddFromRulesPostRulesItem_Phoneme  # noqa: E501


def sdk(address: str, http: httpx.Client, key: str = KEY) -> ElevenLabs:
    return ElevenLabs(base_url=f"http://{address}", api_key=key, httpx_client=http)


def add(address: str, http: httpx.Client, data: bytes = PLS, key: str = KEY, **form: str) -> httpx.Response:
    return http.post(
        f"http://{address}{URL}/add-from-file",
        headers={"xi-api-key": key},
        files={"file": ("lexicon.pls", data, "application/pls+xml")},
        data={"name": "Brands", **form},
    )


def speak(address: str, http: httpx.Client, route: str = "", key: str = KEY, **body: Any) -> httpx.Response:
    return http.post(
        f"http://{address}/v1/text-to-speech/tone{route}?output_format=pcm_16000",
        headers={"xi-api-key": key},
        json={"text": "We use SQL daily.", **body},
    )


def test_the_sdk_adds_lists_gets_and_archives_and_delete_removes(address: str, http: httpx.Client) -> None:
    client = sdk(address, http)
    made = client.pronunciation_dictionaries.create_from_file(
        name="Brands", file=("lexicon.pls", PLS, "application/pls+xml"), description="our words"
    )
    assert (made.name, made.version_rules_num, made.description) == ("Brands", 2, "our words")
    listed = client.pronunciation_dictionaries.list()
    assert [d.id for d in listed.pronunciation_dictionaries] == [made.id] and not listed.has_more
    got = client.pronunciation_dictionaries.get(made.id)
    assert got.latest_version_id == made.version_id
    assert [(r.type, r.string_to_replace) for r in got.rules] == [("alias", "SQL"), ("phoneme", "Nguyen")]
    archived = client.pronunciation_dictionaries.update(made.id, archived=True, name="Old brands")
    assert archived.archived_time_unix is not None and archived.name == "Old brands"
    assert client.pronunciation_dictionaries.list().pronunciation_dictionaries == []
    assert len(client.pronunciation_dictionaries.list(include_archived=True).pronunciation_dictionaries) == 1
    gone = http.delete(f"http://{address}{URL}/{made.id}", headers={"xi-api-key": KEY})
    assert gone.status_code == 200 and gone.json() == {"status": "ok", "id": made.id}
    with pytest.raises(ApiError) as caught:
        client.pronunciation_dictionaries.get(made.id)
    assert caught.value.status_code == 404
    assert caught.value.body["detail"]["status"] == "pronunciation_dictionary_not_found"


def test_another_key_neither_sees_nor_uses_nor_deletes_it(
    address: str, http: httpx.Client, engine: FakeEngine
) -> None:
    made = add(address, http).json()
    other = sdk(address, http, OTHER)
    assert other.pronunciation_dictionaries.list().pronunciation_dictionaries == []
    for answer in (
        http.get(f"http://{address}{URL}/{made['id']}", headers={"xi-api-key": OTHER}),
        http.delete(f"http://{address}{URL}/{made['id']}", headers={"xi-api-key": OTHER}),
        http.patch(
            f"http://{address}{URL}/{made['id']}", headers={"xi-api-key": OTHER}, json={"archived": True}
        ),
    ):
        assert answer.status_code == 404, answer.text
        assert answer.json()["detail"]["status"] == "pronunciation_dictionary_not_found"
    locators = [{"pronunciation_dictionary_id": made["id"]}]
    refused = speak(address, http, key=OTHER, pronunciation_dictionary_locators=locators)
    assert (
        refused.status_code == 400
        and refused.json()["detail"]["status"] == "pronunciation_dictionary_not_found"
    )
    assert engine.requests == []
    assert len(sdk(address, http).pronunciation_dictionaries.list().pronunciation_dictionaries) == 1


BOMB = (
    b'<?xml version="1.0"?><!DOCTYPE lexicon [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
    b"<lexicon><lexeme><grapheme>&b;</grapheme><alias>x</alias></lexeme></lexicon>"
)


@pytest.mark.parametrize(
    ("data", "form", "status", "code"),
    [
        (BOMB, {}, 400, "invalid_lexicon"),
        (b"\x89PNG not a lexicon", {}, 400, "invalid_lexicon"),
        (b"<lexicon/>", {}, 400, "invalid_lexicon"),
        (PLS, {"name": "  "}, 400, "invalid_message"),
        (b"<lexicon>" + b" " * (1 << 20) + b"</lexicon>", {}, 413, "field_too_large"),
    ],
    ids=["entity-bomb", "not-xml", "no-lexeme", "blank-name", "too-large"],
)
def test_a_bad_file_is_a_structured_4xx(
    address: str, http: httpx.Client, data: bytes, form: dict[str, str], status: int, code: str
) -> None:
    answer = add(address, http, data, **form)
    assert answer.status_code == status, answer.text
    assert answer.json()["detail"]["status"] == code and answer.json()["detail"]["message"]
    no_file = http.post(
        f"http://{address}{URL}/add-from-file", headers={"xi-api-key": KEY}, files={"name": (None, "x")}
    )
    assert no_file.status_code == 400 and no_file.json()["detail"]["status"] == "invalid_lexicon"


def test_the_caps_hold_per_key_and_a_delete_frees_a_place(http: httpx.Client) -> None:
    with serve_engine(FakeEngine(), api_keys=f"{KEY},{OTHER}", max_pronunciation_dictionaries=1) as address:
        first = add(address, http)
        assert first.status_code == 200
        second = add(address, http)
        assert second.status_code == 409
        assert second.json()["detail"]["status"] == "pronunciation_dictionary_limit_reached"
        assert add(address, http, key=OTHER).status_code == 200  # each key has its own
        http.delete(f"http://{address}{URL}/{first.json()['id']}", headers={"xi-api-key": KEY})
        assert add(address, http).status_code == 200
    with serve_engine(FakeEngine(), max_pronunciation_dictionary_bytes=300) as address:
        full = add(address, http)
        assert full.status_code == 409
        assert full.json()["detail"]["status"] == "pronunciation_dictionary_quota_exceeded"


@pytest.mark.parametrize("route", ["", "/stream", "/with-timestamps", "/stream/with-timestamps"])
def test_rest_locators_say_the_words_their_way(
    address: str, http: httpx.Client, engine: FakeEngine, route: str
) -> None:
    made = add(address, http).json()
    locators = [{"pronunciation_dictionary_id": made["id"], "version_id": made["version_id"]}]
    answer = speak(address, http, route, pronunciation_dictionary_locators=locators)
    assert answer.status_code == 200, answer.text
    assert spoken(engine) == "We use sequel daily."
    if route.endswith("with-timestamps"):  # the alignment names the caller's own characters
        line = json.loads(answer.text.splitlines()[0])
        assert "".join(line["alignment"]["characters"]).strip() == "We use SQL daily."


def test_an_unknown_locator_on_rest_is_a_400_naming_it(address: str, http: httpx.Client) -> None:
    made = add(address, http).json()
    for locator, field in (
        ({"pronunciation_dictionary_id": "0" * 20}, f"no pronunciation dictionary '{'0' * 20}'"),
        ({"pronunciation_dictionary_id": made["id"], "version_id": "other"}, "has no version 'other'"),
    ):
        answer = speak(address, http, pronunciation_dictionary_locators=[locator])
        assert (
            answer.status_code == 400
            and answer.json()["detail"]["status"] == "pronunciation_dictionary_not_found"
        )
        assert field in answer.json()["detail"]["message"]
    many = speak(
        address, http, pronunciation_dictionary_locators=[{"pronunciation_dictionary_id": made["id"]}] * 4
    )
    assert many.status_code == 400 and many.json()["detail"]["status"] == "invalid_message"


def test_rest_resolves_the_voice_once(
    address: str, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31: the route resolved each voice twice (a check, then the request); once is enough."""
    calls: list[str | None] = []
    resolve = Catalog.resolve

    async def counted(self: Catalog, owner: str, voice: str | None, *args: Any, **kwargs: Any) -> Any:
        calls.append(voice)
        return await resolve(self, owner, voice, *args, **kwargs)

    monkeypatch.setattr(Catalog, "resolve", counted)
    for route in ("", "/with-timestamps"):
        assert speak(address, http, route).status_code == 200
    assert calls == ["tone", "tone"]


def _socket(address: str, path: str, key: str = KEY) -> ClientConnection:
    conn: ClientConnection = connect(
        f"ws://{address}/v1/text-to-speech/tone/{path}?output_format=pcm_16000",
        additional_headers={"xi-api-key": key},
        open_timeout=TIMEOUT_S,
        max_size=None,
    )
    return conn


def _until(ws: ClientConnection, done: Any) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    try:
        while not got or not done(got[-1]):
            got.append(json.loads(ws.recv(timeout=TIMEOUT_S)))
    except ConnectionClosed:
        pass
    return got


@pytest.mark.parametrize("path", ["stream-input", "multi-stream-input"])
def test_a_socket_resolves_its_voice_once(
    address: str, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Issue 31: a socket resolved its voice to check it before the session, then again for the session's
    configuration; the route hands its resolution on (``Catalog.primed``)."""
    calls: list[str | None] = []
    resolve = Catalog.resolve

    async def counted(self: Catalog, owner: str, voice: str | None, *args: Any, **kwargs: Any) -> Any:
        calls.append(voice)
        return await resolve(self, owner, voice, *args, **kwargs)

    monkeypatch.setattr(Catalog, "resolve", counted)
    with _socket(address, path) as ws:
        ws.send(json.dumps({"text": " ", "context_id": "a"}))
        ws.send(json.dumps({"text": "We use SQL daily. ", "context_id": "a", "flush": True}))
        got = _until(ws, lambda m: m.get("isFinal") or m.get("audio") == "" or "error" in m)
        assert not [m for m in got if "error" in m], got
        ws.send(json.dumps({"text": "", "context_id": "a", "close_socket": True}))
    assert spoken(engine) == "We use SQL daily."
    assert calls == ["tone"]


@pytest.mark.parametrize("path", ["stream-input", "multi-stream-input"])
def test_socket_locators_in_the_first_message_say_the_words_their_way(
    address: str, http: httpx.Client, engine: FakeEngine, path: str
) -> None:
    made = add(address, http).json()
    locators = [{"pronunciation_dictionary_id": made["id"]}]
    with _socket(address, path) as ws:
        ws.send(json.dumps({"text": " ", "context_id": "a", "pronunciation_dictionary_locators": locators}))
        ws.send(json.dumps({"text": "We use SQL daily. ", "context_id": "a", "flush": True}))
        got = _until(ws, lambda m: m.get("isFinal") or m.get("audio") == "" or "error" in m)
        assert not [m for m in got if "error" in m], got
        ws.send(json.dumps({"text": "", "context_id": "a", "close_socket": True}))
    assert spoken(engine) == "We use sequel daily."


@pytest.mark.parametrize("path", ["stream-input", "multi-stream-input"])
def test_a_socket_naming_an_unknown_dictionary_gets_an_error_and_a_close(
    address: str, http: httpx.Client, path: str
) -> None:
    made = add(address, http, key=OTHER).json()  # another key's
    with _socket(address, path) as ws:
        locators = [{"pronunciation_dictionary_id": made["id"]}]
        ws.send(json.dumps({"text": " ", "pronunciation_dictionary_locators": locators}))
        got = _until(ws, lambda m: "error" in m)
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=TIMEOUT_S)
        assert ws.close_code == 1008
    assert got[-1]["error"] == "pronunciation_dictionary_not_found" and got[-1]["code"] == 1008


def test_the_sdk_adds_from_rules_and_downloads_a_lexicon(
    address: str, http: httpx.Client, engine: FakeEngine
) -> None:
    client = sdk(address, http)
    made = client.pronunciation_dictionaries.create_from_rules(
        name="Rules",
        rules=[
            AliasRule(string_to_replace="SQL", alias="sequel", case_sensitive=False),
            PhonemeRule(string_to_replace="Nguyen", phoneme="N W IY1 AH0 N", alphabet="cmu-arpabet"),
        ],
    )
    assert made.version_rules_num == 2
    lexicon = b"".join(client.pronunciation_dictionaries.download(made.id, made.version_id))
    assert b"<grapheme>Nguyen</grapheme><phoneme>nw\xcb\x88i\xcb\x90\xc9\x99n</phoneme>" in lexicon
    again = add(address, http, lexicon).json()  # the download is a lexicon add-from-file takes
    assert again["version_rules_num"] == 2
    answer = speak(
        address,
        http,
        text="We use sql daily.",
        pronunciation_dictionary_locators=[{"pronunciation_dictionary_id": made.id}],
    )
    assert answer.status_code == 200 and spoken(engine) == "We use sequel daily."  # case_sensitive: false
    stale = http.get(f"http://{address}{URL}/{made.id}/{'0' * 20}/download", headers={"xi-api-key": KEY})
    assert stale.status_code == 404
    refused = http.post(
        f"http://{address}{URL}/add-from-rules",
        headers={"xi-api-key": KEY},
        json={
            "name": "Rules",
            "rules": [{"type": "alias", "string_to_replace": "x", "alias": "y", "word_boundaries": False}],
        },
    )
    assert refused.status_code == 400 and refused.json()["detail"]["status"] == "invalid_message"


def test_the_sdk_changes_rules_as_new_versions(address: str, http: httpx.Client, engine: FakeEngine) -> None:
    client = sdk(address, http)
    made = client.pronunciation_dictionaries.create_from_file(name="Brands", file=("lexicon.pls", PLS))
    changed = client.pronunciation_dictionaries.rules.add(
        made.id, rules=[RuleAlias(string_to_replace="SQL", alias="ess queue ell")]
    )
    assert changed.version_id != made.version_id and changed.version_rules_num == 2
    stale = speak(
        address,
        http,
        pronunciation_dictionary_locators=[
            {"pronunciation_dictionary_id": made.id, "version_id": made.version_id}
        ],
    )
    assert stale.status_code == 400 and "has no version" in stale.json()["detail"]["message"]
    latest = speak(
        address, http, pronunciation_dictionary_locators=[{"pronunciation_dictionary_id": made.id}]
    )
    assert latest.status_code == 200 and spoken(engine) == "We use ess queue ell daily."
    removed = client.pronunciation_dictionaries.rules.remove(made.id, rule_strings=["SQL"])
    assert removed.version_rules_num == 1
    replaced = client.pronunciation_dictionaries.rules.set(
        made.id, rules=[RuleAlias(string_to_replace="daily", alias="today")]
    )
    assert [r.string_to_replace for r in client.pronunciation_dictionaries.get(made.id).rules] == ["daily"]
    assert replaced.version_id == client.pronunciation_dictionaries.get(made.id).latest_version_id
    emptied = http.post(
        f"http://{address}{URL}/{made.id}/remove-rules",
        headers={"xi-api-key": KEY},
        json={"rule_strings": ["daily"]},
    )
    assert emptied.status_code == 400 and emptied.json()["detail"]["status"] == "invalid_message"
    elsewhere = http.post(
        f"http://{address}{URL}/{made.id}/add-rules",
        headers={"xi-api-key": OTHER},
        json={"rules": [{"type": "alias", "string_to_replace": "x", "alias": "y"}]},
    )
    assert elsewhere.status_code == 404
