"""Pronunciation dictionaries in S3 (``voice_store=s3://...``) against a real S3 server (SeaweedFS, one
per module): two gateways on one bucket prefix, as replicas of a fleet, see each other's dictionaries, one
uploaded through either is used by the other, the count cap holds across both, and they live beside the
voices without becoming voices."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator

import httpx
import pytest
from voxgate.engine.fake import FakeEngine
from websockets.sync.client import connect

from tests.conftest import TIMEOUT_S, serve_engine
from tests.gateway.test_pronunciation_dictionaries import KEY, OTHER, PLS, URL, spoken
from tests.redis_server import free_port
from tests.seaweed_server import SeaweedServer, location, seaweed_server

HEADERS = {"xi-api-key": KEY}


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    with seaweed_server(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def prefix(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    return f"d-{uuid.uuid4().hex[:12]}"


def add(address: str, key: str = KEY) -> httpx.Response:
    return httpx.post(
        f"http://{address}{URL}/add-from-file",
        headers={"xi-api-key": key},
        files={"file": ("lexicon.pls", PLS, "application/pls+xml")},
        data={"name": "Brands"},
        timeout=TIMEOUT_S,
    )


def ids(address: str, key: str = KEY) -> list[str]:
    answer = httpx.get(f"http://{address}{URL}", headers={"xi-api-key": key}, timeout=TIMEOUT_S)
    return [d["id"] for d in answer.json()["pronunciation_dictionaries"]]


def test_replicas_on_one_prefix_share_dictionaries(prefix: str) -> None:
    engine_b = FakeEngine()
    settings: dict[str, object] = {"voice_store": location(prefix), "api_keys": (KEY, OTHER)}
    with serve_engine(FakeEngine(), **settings) as a, serve_engine(engine_b, **settings) as b:
        made = add(a).json()
        assert ids(b) == [made["id"]] and ids(b, OTHER) == []
        got = httpx.get(f"http://{b}{URL}/{made['id']}", headers=HEADERS, timeout=TIMEOUT_S)
        assert got.status_code == 200 and got.json()["latest_version_rules_num"] == 2
        # Uploaded through A, spoken through B.
        spoken_b = httpx.post(
            f"http://{b}/v1/text-to-speech/tone?output_format=pcm_16000",
            headers=HEADERS,
            json={
                "text": "We use SQL.",
                "pronunciation_dictionary_locators": [{"pronunciation_dictionary_id": made["id"]}],
            },
            timeout=TIMEOUT_S,
        )
        assert spoken_b.status_code == 200 and spoken(engine_b) == "We use sequel."
        # Archived through B: A no longer lists it; deleted through A: B no longer finds it.
        archived = httpx.patch(
            f"http://{b}{URL}/{made['id']}", headers=HEADERS, json={"archived": True}, timeout=TIMEOUT_S
        )
        assert archived.status_code == 200 and ids(a) == []
        assert (
            httpx.delete(f"http://{a}{URL}/{made['id']}", headers=HEADERS, timeout=TIMEOUT_S).status_code
            == 200
        )
        assert (
            httpx.get(f"http://{b}{URL}/{made['id']}", headers=HEADERS, timeout=TIMEOUT_S).status_code == 404
        )
        # They sit beside the voices, and are not voices.
        voices = httpx.get(
            f"http://{a}/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT_S
        )
        assert voices.json()["uploaded_voices"] == []


def test_the_count_cap_holds_across_replicas(prefix: str) -> None:
    settings: dict[str, object] = {
        "voice_store": location(prefix),
        "max_pronunciation_dictionaries": 2,
        "api_keys": (KEY,),
    }
    with serve_engine(FakeEngine(), **settings) as a, serve_engine(FakeEngine(), **settings) as b:
        answers: list[int] = []

        def put(address: str) -> None:
            answers.append(add(address).status_code)

        threads = [threading.Thread(target=put, args=(a if i % 2 else b,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(answers) == [200] * 2 + [409] * 4
        assert len(ids(a)) == 2


def test_a_store_that_does_not_answer_is_a_503_and_sockets_still_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    engine = FakeEngine()
    with serve_engine(engine, voice_store=location("down")) as address:
        listing = httpx.get(f"http://{address}{URL}", timeout=TIMEOUT_S)
        assert listing.status_code == 503 and listing.headers["retry-after"] == "5"
        assert listing.json()["detail"]["status"] == "voice_store_unavailable"
        locators = [{"pronunciation_dictionary_id": "0" * 20}]
        answer = httpx.post(
            f"http://{address}/v1/text-to-speech/tone?output_format=pcm_16000",
            json={"text": "We use SQL.", "pronunciation_dictionary_locators": locators},
            timeout=TIMEOUT_S,
        )
        assert answer.status_code == 503 and answer.json()["detail"]["status"] == "voice_store_unavailable"
        # A socket that names no dictionary does not need the store.
        with connect(
            f"ws://{address}/v1/text-to-speech/tone/stream-input?output_format=pcm_16000",
            open_timeout=TIMEOUT_S,
        ) as ws:
            for message in ({"text": " "}, {"text": "We use SQL. "}, {"text": ""}):
                ws.send(json.dumps(message))
            got = [json.loads(m) for m in ws]
        assert got[-1].get("isFinal") and spoken(engine) == "We use SQL."
