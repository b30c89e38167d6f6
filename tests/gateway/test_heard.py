"""What the listener heard, over a real server: a client plays the audio in real time and cancels after 2 s.

The client plays from the first frame it receives; the server counts from the first frame it writes, a
moment earlier, and reads the cancel a moment after it is sent: its ``played_ms`` is never less than the
client's, and ``text_spoken`` is what the player had played, within one word.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
import pytest
from voxgate.engine.base import AudioChunk, SynthesisRequest, WordTiming
from voxgate.engine.fake import SECONDS_PER_CHAR, FakeEngine
from websockets.sync.client import ClientConnection

from tests.conftest import Received, recv, recv_until, send, serve_engine, session

#: Audio per word of the engine that times its words.
WORD_S = 0.25
#: When the client cancels: seconds of playback after its first frame.
CANCEL_AFTER_S = 2.0
TEXT = "**Sure!** Here are the steps to follow: open the app, tap *settings*, and choose a voice you like."


class _TimedWords(FakeEngine):
    """Times its words: each one ``WORD_S`` of tone, in a chunk of its own (as fast as asked)."""

    def __init__(self) -> None:
        super().__init__(supported=frozenset({"speed", "seed", "language", "word_timestamps"}))

    async def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        per_word = int(WORD_S * self.sample_rate)
        for word in req.text.split():
            tone = np.full(per_word, 0.1, dtype=np.float32)
            yield AudioChunk(tone, self.sample_rate, (WordTiming(word, 0, per_word - 400),))


def play_then_cancel(ws: ClientConnection) -> tuple[Received, float, dict[str, Any]]:
    """Send ``TEXT``, read everything while a real-time player plays it, cancel ``CANCEL_AFTER_S`` after
    the first frame came; returns what came, the player's position at the cancel (s), and the answer."""
    send(ws, type="input.text", text=TEXT)
    send(ws, type="input.done")
    received = Received()
    first: float | None = None
    rate = 0  # the output's sample rate (audio.start says it)
    ends = 0.0  # when the player will have played all it was given (it waits for audio when it runs dry)
    while first is None or time.monotonic() < first + CANCEL_AFTER_S:
        wait = 5.0 if first is None else max(0.001, first + CANCEL_AFTER_S - time.monotonic())
        try:
            item = recv(ws, wait)
        except TimeoutError:
            continue
        received.items.append(item)
        if isinstance(item, dict) and item["type"] == "audio.start":
            rate = int(str(item["sample_rate"]))
        if isinstance(item, bytes):
            now = time.monotonic()
            first = now if first is None else first
            ends = max(now, ends) + len(item) / 2 / rate  # pcm16
    audio_s = sum(len(f) for f in received.frames()) / 2 / rate
    position = audio_s - max(0.0, ends - time.monotonic())
    send(ws, type="input.cancel")
    answer = recv_until(ws, "audio.cancelled").messages("audio.cancelled")[-1]
    return received, position, answer


def heard_by(received: Received, played_s: float) -> list[str]:
    """The words (as ``audio.chunk`` names them) whose end a player at ``played_s`` has played."""
    return [
        str(w["word"])
        for chunk in received.messages("audio.chunk")
        for w in chunk["timestamps"]  # type: ignore[attr-defined]
        if w["word"] and float(w["end_ms"]) <= played_s * 1000.0
    ]


def test_text_spoken_is_what_a_real_time_player_played_within_one_word() -> None:
    with serve_engine(_TimedWords()) as address, session(address, word_timestamps=True) as ws:
        received, position, answer = play_then_cancel(ws)
    assert answer["utterance_index"] == 0 and answer["text_spoken_source"] == "words"
    assert answer["text_spoken"] + answer["text_remaining"] == TEXT  # the client's own characters
    played_s = answer["played_ms"] / 1000.0
    assert played_s >= position - 0.005  # the server's clock starts first and stops last
    server = heard_by(received, played_s)
    player = heard_by(received, position)
    assert 0 < len(player) <= len(server) <= len(player) + 1
    check_cut(answer, server)


def check_cut(answer: dict[str, Any], server: list[str]) -> None:
    """``text_spoken`` ends with the last word heard at ``played_ms`` (``server``: as ``audio.chunk`` names
    them), in the client's characters with what is stuck to it ("*settings*,": markup, punctuation)."""
    spoken = answer["text_spoken"]
    assert TEXT.startswith(spoken) and server[-1].strip(",.!:*") in spoken.split()[-1]
    assert len(spoken.split()) == len(server)


@pytest.mark.parametrize("delay_s", [0.0, 0.2])
def test_without_word_timings_text_spoken_is_estimated_from_the_audio(delay_s: float) -> None:
    """Written whole at once (0.0), or still being made at the cancel (0.2 s before each 250 ms chunk)."""
    with serve_engine(FakeEngine(delay_s=delay_s)) as address, session(address) as ws:
        received, position, answer = play_then_cancel(ws)
    assert answer["utterance_index"] == 0 and answer["text_spoken_source"] == "estimate"
    assert answer["text_spoken"] + answer["text_remaining"] == TEXT
    played_s = answer["played_ms"] / 1000.0
    assert played_s >= position - 0.005
    # Cut at a word's end, somewhere inside the text: audio was still to play.
    spoken = answer["text_spoken"]
    assert TEXT.startswith(spoken) and 0 < len(spoken) < len(TEXT) and TEXT[len(spoken)] == " "
    # The fake engine speaks SECONDS_PER_CHAR a character of what it is sent: the estimate is near exact.
    assert abs(len(spoken.replace("*", "")) * SECONDS_PER_CHAR - played_s) < 1.0
