"""LLM markdown spoken as a person reads it (issue 33): the issue's three examples, streamed 4 characters at
a time over the real WebSocket to Piper, transcribed back by Whisper tiny.en."""

from __future__ import annotations

import re

import pytest
from voxgate.protocol.audio import decode
from voxgate.protocol.normalize import Normalizer

from tests.conftest import recv_until, send, session
from tests.speech_check import load_whisper, word_error_rate

pytestmark = pytest.mark.slow

EXAMPLES = [
    "**Sure!** Here are three options:\n\n1. *Pizza* for $12.99\n2. `sushi_roll` at "
    "https://example.com/menu?id=42\n3. ~~Tacos~~ Burgers.\n\n### Summary\n- Total: 3 items",
    "Here are the steps:\n1. Open the app\n2. Tap settings\n3. Choose voice\nThat is all",
    "Great job! 🎉🎉 See you at 10am 👋",
]
# What today's literal reading made of them (the issue's transcripts): none of it may be heard.
READ_ALOUD = re.compile(r"asterisk|hash|tilde|slash|colon|underscore|http|popper|waving|party|equals")


@pytest.fixture(scope="module")
def whisper() -> object:
    return load_whisper()


def speak(address: str, text: str, **config: object) -> tuple[bytes, list[str]]:
    """Stream ``text`` 4 characters at a time: its audio (f32, 16 kHz) and its segments' ``sentence_text``."""
    with session(address, response_format="f32", sample_rate=16000, seed=7, **config) as ws:
        for start in range(0, len(text), 4):
            send(ws, type="input.text", text=text[start : start + 4])
        send(ws, type="input.done")
        got = recv_until(ws, "session.done")
    return b"".join(got.frames()), [str(m["sentence_text"]) for m in got.messages("audio.start")]


# Words each example must be heard with (Whisper writes some numbers as digits), and words it must not.
HEARD = [
    ("sure three options pizza sushi roll example burgers summary total items", "tacos"),
    ("steps open app tap settings choose voice that is all", ""),
    ("great job see you at", "popper"),
]


@pytest.mark.parametrize(
    ("text", "heard_as"), list(zip(EXAMPLES, HEARD, strict=True)), ids=["markdown", "steps", "emoji"]
)
def test_the_issues_examples_are_spoken_as_a_person_reads_them(
    piper_gateway: str, whisper: object, text: str, heard_as: tuple[str, str]
) -> None:
    # The default, "auto": for Piper (``reads_numbers`` False) it writes numbers out, as "on" does.
    frames, sentences = speak(piper_gateway, text)
    norm = Normalizer("auto", expand_numbers=True)
    error, heard = word_error_rate(whisper, decode(frames, "f32"), 16000, norm.feed(text) + norm.flush())
    assert not READ_ALOUD.search(heard), heard
    expected, struck = heard_as
    assert all(word in heard for word in expected.split()), heard
    assert not struck or struck not in heard, heard
    assert error <= 0.3, (error, heard)
    # Each segment names the client's own characters, markup and all.
    assert all(sentence in text for sentence in sentences), sentences


def test_each_list_item_is_its_own_segment_and_off_reads_as_today(piper_gateway: str) -> None:
    _, sentences = speak(piper_gateway, EXAMPLES[1])
    assert sentences == [
        "Here are the steps:",
        "1. Open the app",
        "2. Tap settings",
        "3. Choose voice",
        "That is all",
    ]
    _, literal = speak(piper_gateway, EXAMPLES[1], text_normalization="off")
    assert literal[:2] == [
        "Here are the steps:\n1.",
        "Open the app\n2.",
    ]  # the number glued to the item before


def test_an_alias_is_heard_and_sounds_as_the_word_replaced_by_hand(
    piper_gateway: str, whisper: object
) -> None:
    aliased, _ = speak(
        piper_gateway,
        "We store it in **SQL** today.",
        pronunciations=[{"text": "SQL", "alias": "structured query language"}],
    )
    by_hand, _ = speak(piper_gateway, "We store it in structured query language today.")
    assert aliased == by_hand  # the same seed: the same audio
    _, heard = word_error_rate(
        whisper, decode(aliased, "f32"), 16000, "We store it in structured query language today."
    )
    assert "structured query language" in heard, heard
