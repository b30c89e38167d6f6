"""``pronunciations`` on an engine without phoneme input (the fake one, as remote and vllm-omni): an entry's
``ipa`` cannot be said, so its alias is, else its words as written, and the client is told which ``ipa`` went
unused (``option_ignored``, naming it), over the WebSocket and REST. Entries of several words match whole,
also when their words come in separate ``input.text`` messages."""

from __future__ import annotations

import httpx
from voxgate.engine.fake import FakeEngine

from tests.conftest import TIMEOUT_S, recv_until, send, serve_engine, session

SAID = [
    {"text": "Nguyen", "ipa": "ŋwˈiən"},
    {"text": "SQL", "alias": "sequel", "ipa": "ˈsiːkwəl"},
    {"text": "New York", "alias": "the big apple", "case_sensitive": False},
]


def test_the_websocket_says_aliases_and_words_as_written_and_names_each_unused_ipa() -> None:
    engine = FakeEngine()
    with serve_engine(engine) as address, session(address, pronunciations=SAID) as ws:
        for piece in ("I met Nguyen in new", " York to talk", " SQL 2024."):
            send(ws, type="input.text", text=piece)
        send(ws, type="input.done")
        received = recv_until(ws, "session.done")
    warnings = received.messages("warning")
    assert [(w["code"], w["field"]) for w in warnings] == [
        ("option_ignored", "$.pronunciations[0].ipa"),
        ("option_ignored", "$.pronunciations[1].ipa"),
    ]
    assert " ".join(r.text for r in engine.requests) == "I met Nguyen in the big apple to talk sequel 2024."
    assert all(r.phonemes == () for r in engine.requests)


def test_rest_says_the_alias_and_names_the_unused_ipa_in_its_warning_header() -> None:
    engine = FakeEngine()
    with serve_engine(engine) as address:
        response = httpx.post(
            f"http://{address}/v1/audio/speech",
            json={"input": "Ask Nguyen about SQL.", "response_format": "pcm", "pronunciations": SAID},
            timeout=TIMEOUT_S,
        )
    assert response.status_code == 200 and response.content
    assert response.headers["x-voxgate-warning"] == (
        "option_ignored=$.pronunciations[0].ipa, option_ignored=$.pronunciations[1].ipa"
    )
    assert [r.text for r in engine.requests] == ["Ask Nguyen about sequel."]
