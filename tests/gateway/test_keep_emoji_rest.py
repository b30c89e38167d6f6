"""``keep_emoji`` on the OpenAI REST route and a batch item: the engine is sent emoji only when asked."""

from __future__ import annotations

import httpx
from voxgate.engine.fake import FakeEngine

from tests.conftest import TIMEOUT_S, serve_engine


def test_rest_and_batch_items_keep_emoji_when_asked() -> None:
    engine = FakeEngine()
    with serve_engine(engine) as address:
        for keep in (False, True):
            body = {"input": "Done 🎉", "response_format": "pcm", "keep_emoji": keep}
            response = httpx.post(f"http://{address}/v1/audio/speech", json=body, timeout=TIMEOUT_S)
            assert response.status_code == 200
        batch = httpx.post(
            f"http://{address}/v1/audio/speech/batch",
            json={"items": [{"input": "Bye 👋", "keep_emoji": True}], "response_format": "pcm"},
            timeout=TIMEOUT_S,
        )
    assert batch.json()["succeeded"] == 1
    assert [r.text for r in engine.requests] == ["Done", "Done 🎉", "Bye 👋"]
