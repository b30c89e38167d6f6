"""``text_normalization`` and ``pronunciations`` on the REST routes, and ``auto`` by what the engine reads.

The OpenAI body and a batch item take both fields, ElevenLabs' body takes ``apply_text_normalization``;
``auto`` writes numbers out only for an engine whose front end misreads them (``TTSEngine.reads_numbers``,
False for Piper), on every surface. The fake engine records the text each segment is sent.
"""

from __future__ import annotations

import httpx
import pytest
from voxgate.engine.fake import FakeEngine

from tests.conftest import TIMEOUT_S, recv_until, send, serve_engine, session

TEXT = "**Hi** there, it costs $5."


class MisreadsNumbers(FakeEngine):
    """The fake tone, for an engine that reads numbers as Piper's espeak does."""

    reads_numbers = False


def spoken(engine: FakeEngine) -> str:
    return " ".join(r.text for r in engine.requests)


def openai(address: str, **body: object) -> httpx.Response:
    url = f"http://{address}/v1/audio/speech"
    return httpx.post(url, json={"response_format": "pcm", **body}, timeout=TIMEOUT_S)


@pytest.mark.parametrize(
    ("engine", "mode", "expected"),
    [
        (
            FakeEngine(),
            None,
            "Hi there, it costs $5.",
        ),  # auto: no markup; numbers left to an engine that reads them
        (MisreadsNumbers(), None, "Hi there, it costs five dollars."),  # auto: written out for this one
        (FakeEngine(), "on", "Hi there, it costs five dollars."),
        (FakeEngine(), "off", TEXT),
    ],
    ids=["auto", "auto-misreads-numbers", "on", "off"],
)
def test_the_openai_route_normalizes_as_asked(engine: FakeEngine, mode: str | None, expected: str) -> None:
    fields = {} if mode is None else {"text_normalization": mode}
    with serve_engine(engine) as address:
        response = openai(address, input=TEXT, **fields)
    assert response.status_code == 200 and response.content
    assert spoken(engine) == expected


def test_a_pronunciation_is_spoken_on_rest_and_in_a_batch_item() -> None:
    engine = FakeEngine()
    said = [{"text": "SQL", "alias": "sequel"}]
    with serve_engine(engine) as address:
        single = openai(address, input="I like SQL.", pronunciations=said)
        batch = httpx.post(
            f"http://{address}/v1/audio/speech/batch",
            json={"items": [{"input": "Learn SQL.", "pronunciations": said}], "response_format": "pcm"},
            timeout=TIMEOUT_S,
        )
    assert single.status_code == 200 and batch.json()["succeeded"] == 1
    assert [r.text for r in engine.requests] == ["I like sequel.", "Learn sequel."]


def test_elevenlabs_rest_takes_apply_text_normalization_from_its_body() -> None:
    engine = FakeEngine()
    with serve_engine(engine) as address:
        url = f"http://{address}/v1/text-to-speech/tone"
        plain = httpx.post(url, json={"text": TEXT}, timeout=TIMEOUT_S)
        literal = httpx.post(url, json={"text": TEXT, "apply_text_normalization": "off"}, timeout=TIMEOUT_S)
    assert plain.status_code == literal.status_code == 200
    assert [r.text for r in engine.requests] == ["Hi there, it costs $5.", TEXT]


def test_the_websocket_writes_numbers_out_for_an_engine_that_misreads_them() -> None:
    engine = MisreadsNumbers()
    with serve_engine(engine) as address, session(address) as ws:
        send(ws, type="input.text", text="It costs $5.")
        send(ws, type="input.done")
        recv_until(ws, "session.done")
    assert spoken(engine) == "It costs five dollars."
