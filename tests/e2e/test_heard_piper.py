"""What the listener heard, with Piper's own word timings: a real-time player cancels after 2 s of playback
(``tests/gateway/test_heard.py`` plays the same against engines that are doubles)."""

from __future__ import annotations

import pytest

from tests.conftest import session
from tests.gateway.test_heard import TEXT, check_cut, heard_by, play_then_cancel

pytestmark = pytest.mark.slow


def test_text_spoken_is_what_a_real_time_player_of_piper_played_within_one_word(piper_gateway: str) -> None:
    with session(piper_gateway, word_timestamps=True) as ws:
        received, position, answer = play_then_cancel(ws)
    assert (
        answer["text_spoken_source"] == "words" and answer["text_spoken"] + answer["text_remaining"] == TEXT
    )
    played_s = answer["played_ms"] / 1000.0
    assert played_s >= position - 0.005  # the server's clock starts first and stops last
    server, player = heard_by(received, played_s), heard_by(received, position)
    assert 0 < len(player) <= len(server) <= len(player) + 1
    check_cut(answer, server)
