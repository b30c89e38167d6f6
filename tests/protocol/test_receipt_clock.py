"""Read receipts refine the listener clock (``Core.read``), on a fake clock.

A receipt says the client had read the first ``read_s`` seconds of the audio written when it answered;
it cannot play what it has not read, so the audio after that ends no sooner than the receipt plus its
length. A client that reads late gets its timed cuts later, and ``played_ms`` does not count audio it had
not even read.
"""

from __future__ import annotations

import numpy as np
import pytest
from voxgate.protocol.core import Core
from voxgate.protocol.messages import AudioCancelled
from voxgate.protocol.output import Message, Speak

from .test_listener_clock import RATE, Run


def _spoken(core: Core, text: str, audio_s: float, now: float) -> None:
    """``text`` arrives, its first segment is spoken (``audio_s`` of audio), all of it written at ``now``."""
    core.receive_text(f'{{"type": "input.text", "text": "{text}"}}', now)
    (speak,) = [o for o in core.data_to_send() if isinstance(o, Speak)]
    core.segment_started(speak.utterance, speak.sentence)
    core.audio(speak.utterance, speak.sentence, np.full(round(audio_s * RATE), 0.25, dtype=np.float32), RATE)
    for output in core.data_to_send():
        core.sending(output, now)


def _played_ms(core: Core, now: float) -> float:
    core.cancel(now=now)
    (cancelled,) = [o.msg for o in core.data_to_send() if isinstance(o, Message)]
    assert isinstance(cancelled, AudioCancelled) and isinstance(cancelled.played_ms, float)
    return cancelled.played_ms


def test_a_client_that_reads_late_has_heard_less_and_its_cut_comes_later() -> None:
    core = Run(6).core
    _spoken(core, "Sure, let me look at that for you. I think we could try the", 2.0, now=0.0)
    before = core.next_deadline()
    assert before is not None
    core.read(0.5, now=1.0)  # at 1 s it had read only the first 0.5 s: 1.5 s still to play from then
    after = core.next_deadline()
    assert after == pytest.approx(before + 0.5)  # the listener runs dry 0.5 s later than the writes say
    assert _played_ms(core, now=1.2) == pytest.approx(700.0)  # 0.5 s read by 1 s, 0.2 s since (not 1200)


def test_a_receipt_of_a_client_that_keeps_up_changes_nothing() -> None:
    core = Run(6).core
    _spoken(core, "Sure, let me look at that for you. I think we could try the", 2.0, now=0.0)
    before = core.next_deadline()
    core.read(1.0, now=0.05)  # it reads as the audio comes: it plays from its first frame
    core.read(2.0, now=0.1)
    assert core.next_deadline() == before
    assert _played_ms(core, now=1.2) == pytest.approx(1200.0)


def test_audio_unread_of_more_than_one_utterance_refines_nothing() -> None:
    core = Run(6).core
    _spoken(core, "Sure. ", 1.0, now=0.0)
    core.receive_text('{"type": "input.done"}', 0.0)
    _spoken(core, "And then some more words for you. More", 1.0, now=0.1)
    before = core.next_deadline()
    assert before is not None
    core.read(0.5, now=1.0)  # the unread audio is the end of the first utterance and the second
    assert core.next_deadline() == before
    core.read(1.0, now=1.5)  # all of the unread audio is the second's: 1 s to play from 1.5 s on
    assert core.next_deadline() == pytest.approx(before + 0.5)


def test_a_receipt_before_any_audio_or_after_a_cancel_refines_nothing() -> None:
    deadlines = []
    for receipts in (False, True):
        core = Run(6).core
        if receipts:
            core.read(0.0, now=0.0)
        _spoken(core, "Sure, let me look at that for you. I think we could try the", 2.0, now=0.0)
        core.cancel(now=0.5)
        core.data_to_send()
        if receipts:
            core.read(0.0, now=1.0)  # the cancelled audio is not played: it moves no clock
        _spoken(core, "Right, so here is another thing to say to you. And then", 1.0, now=1.0)
        deadlines.append(core.next_deadline())
    assert deadlines[0] is not None and deadlines[1] == deadlines[0]


def test_a_receipt_while_a_finished_utterance_still_plays_refines_what_it_heard() -> None:
    core = Run(6).core
    _spoken(core, "Sure. ", 2.0, now=0.0)
    core.receive_text('{"type": "input.done"}', 0.0)
    core.segment_done(0, 0, synthesis_s=0.1)
    for output in core.data_to_send():  # its session.done is written: it still plays, to 2 s
        core.sending(output, 0.0)
    core.read(0.5, now=1.0)
    assert _played_ms(core, now=1.2) == pytest.approx(700.0)
