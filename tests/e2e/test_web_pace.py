"""The demo page's own text, at its own pace, on Piper in Chromium: the listener never runs dry (issue 32).

The page streams its default text token by token at its default 25 tokens a second (about 15 words a
second, far faster than speech), so every sentence after the first arrives while the one before plays.
Before the listener clock, "Hello!" (half a second of audio) was cut alone and the next sentence waited
for its end: the page counted an underrun on its first Speak. Real time here, as a visitor hears it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tests.e2e.test_web import WAIT_MS, browser, open_page, page, voxgate  # skips without Chromium

if TYPE_CHECKING:
    from playwright.sync_api import Page

__all__ = ["browser", "page"]  # the fixtures, shared with test_web


def test_the_default_text_at_the_default_pace_plays_without_an_underrun(
    page: Page, piper_gateway: str
) -> None:
    open_page(page, piper_gateway)
    assert page.is_checked("input[name=mode][value=llm]")  # the defaults, untouched
    assert page.eval_on_selector("#token-rate", "el => el.value") == "25"
    default_text = page.input_value("#text")
    page.click("#speak-btn")
    page.wait_for_function("() => window.voxgate.sessionsDone >= 1", timeout=WAIT_MS)
    page.wait_for_function("() => window.voxgate.state === 'idle'", timeout=WAIT_MS)
    state = voxgate(page)
    assert " ".join(s["text"] for s in state["segments"]) == default_text
    assert state["underruns"] == 0, json.dumps(state["segments"])
    assert page.inner_text("#stat-underruns") == "0"
