"""One rule for text with nothing to say (``speech.speakable``), on the WebSocket session as on REST."""

from __future__ import annotations

import json

from voxgate.protocol.codecs.openai import speakable
from voxgate.protocol.events import SegmentReady, UtteranceEnded, UtteranceStarted
from voxgate.protocol.session import Session


def _feed(session: Session, *messages: dict[str, object]) -> list[object]:
    return [event for m in messages for event in session.receive_text(json.dumps(m))]


def _configured() -> Session:
    session = Session()
    [event] = session.receive_text('{"type": "session.config"}')
    session.accept_config(event.config)  # type: ignore[attr-defined]
    return session


def test_the_rule_wants_a_letter_or_a_digit() -> None:
    assert (
        not speakable("\U0001f642\U0001f389 \u2764\ufe0f") and not speakable("... ?!") and not speakable("")
    )
    assert speakable("Hi \U0001f642") and speakable("42") and speakable("\u4f60\u597d")


def test_an_emoji_only_utterance_sends_no_segment_to_the_engine() -> None:
    session = _configured()
    events = _feed(session, {"type": "input.text", "text": "\U0001f642\U0001f389"}, {"type": "input.done"})
    assert events == [UtteranceStarted(0), UtteranceEnded(0, 0)]


def test_a_segment_with_nothing_to_say_is_dropped_and_the_others_keep_their_order() -> None:
    session = _configured()
    text = "Hello there. \U0001f642\U0001f642. How are you?"
    events = _feed(session, {"type": "input.text", "text": text}, {"type": "input.done"})
    segments = [e for e in events if isinstance(e, SegmentReady)]
    assert [(s.sentence_index, s.text) for s in segments] == [(0, "Hello there."), (1, "How are you?")]
    assert events[-1] == UtteranceEnded(0, 2)
