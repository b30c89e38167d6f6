"""What the listener heard: ``audio.cancelled``'s ``played_ms``, ``text_spoken`` and ``text_remaining``.

On a fake clock: audio is written (``Core.sending``) at chosen times and the cancel comes at another; the
listener plays what was written in real time from its first frame.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from voxgate.protocol.audio import Samples
from voxgate.protocol.codecs.deepgram import DeepgramSocket, Params
from voxgate.protocol.codecs.stream import SessionCodec, render, sends
from voxgate.protocol.codecs.telephony import CARRIERS, Framing, Telephony
from voxgate.protocol.core import Core
from voxgate.protocol.messages import (
    AudioCancelled,
    CarrierName,
    InputCancel,
    InputDone,
    InputText,
    SessionConfig,
)
from voxgate.protocol.output import Audio, Message, Output, OutputFormat, Speak
from voxgate.protocol.session import Session

RATE = 8000


def tone(seconds: float) -> Samples:
    return np.full(round(seconds * RATE), 0.25, dtype=np.float32)


def core_for(*, words: bool = False, **config: object) -> Core:
    fmt = OutputFormat("pcm", RATE, frame_ms=100, word_timestamps=words)
    core = Core(fmt)
    cfg = SessionConfig(word_timestamps=words, eager_first_segment=False, **config)  # type: ignore[arg-type]
    core.receive_message(cfg, 0.0)
    core.accept_config(cfg, fmt)
    core.data_to_send()
    return core


def say(core: Core, *pieces: str, context_id: str | None = None) -> list[str]:
    """Send ``pieces`` as one utterance; returns the segments' spoken texts."""
    for piece in pieces:
        core.receive_message(InputText(text=piece, context_id=context_id), 0.0)
    core.receive_message(InputDone(context_id=context_id), 0.0)
    return [o.text for o in core.data_to_send() if isinstance(o, Speak)]


def write(core: Core, now: float) -> None:
    for output in core.data_to_send():
        core.sending(output, now)


def synthesize(
    core: Core, u: int, s: int, seconds: float, words: tuple[tuple[str, int, int], ...] = ()
) -> None:
    core.segment_started(u, s)
    core.audio(u, s, tone(seconds), RATE, words)
    core.segment_done(u, s, synthesis_s=0.0)


def cancelled(outputs: list[Output]) -> list[AudioCancelled]:
    return [o.msg for o in outputs if isinstance(o, Message) and isinstance(o.msg, AudioCancelled)]


def cancel(core: Core, now: float, context_id: str | None = None) -> list[AudioCancelled]:
    core.receive_message(InputCancel(context_id=context_id), now)
    return cancelled(core.data_to_send())


def whole(heard: AudioCancelled) -> str:
    """``text_spoken + text_remaining``."""
    assert isinstance(heard.text_spoken, str) and isinstance(heard.text_remaining, str), heard
    return heard.text_spoken + heard.text_remaining


TEXT = "One two three four. Five six seven eight."


@pytest.mark.parametrize(
    ("now", "spoken"),
    [
        (0.7, "One two"),  # 7 of segment 0's 19 characters: at the space after "two"
        (1.0, "One two"),  # 10 of segment 0's 19 characters: "three" is not over
        (2.5, "One two three four. Five"),  # segment 0 whole, 6 of segment 1's 21 characters
        (3.9, "One two three four. Five six seven"),  # 20 of 21: "eight." is not over
    ],
)
def test_without_word_timings_the_cut_is_estimated_from_each_segments_audio(now: float, spoken: str) -> None:
    core = core_for()
    assert say(core, TEXT) == ["One two three four.", "Five six seven eight."]
    synthesize(core, 0, 0, 1.9)
    write(core, 0.0)  # the listener's clock starts at the first frame: 1.9 s ahead
    synthesize(core, 0, 1, 2.1)
    write(core, 1.0)  # written before segment 0 has played out: it plays after it, to 4.0 s
    [heard] = cancel(core, now)
    assert heard.utterance_index == 0 and heard.played_ms == pytest.approx(min(now, 4.0) * 1000.0)
    assert (heard.text_spoken, heard.text_spoken_source) == (spoken, "estimate")
    assert whole(heard) == TEXT


def test_nothing_heard_before_the_first_frame_is_written() -> None:
    core = core_for()
    say(core, TEXT)
    core.segment_started(0, 0)
    [heard] = cancel(core, 1.0)
    assert (heard.played_ms, heard.text_spoken, heard.text_remaining) == (0.0, "", TEXT)


def test_a_segment_still_being_made_is_estimated_from_the_pace() -> None:
    core = core_for()
    say(core, TEXT)
    core.segment_started(0, 0)
    core.audio(0, 0, tone(0.55), RATE)  # 0.5 s written of a segment the pace puts at 19 x 60 ms = 1.14 s
    write(core, 0.0)
    [heard] = cancel(core, 0.5)
    assert heard.played_ms == pytest.approx(500.0) and heard.text_spoken == "One two"  # 8 of 19 characters
    assert heard.text_remaining == " three four. Five six seven eight."


# The engine's words, without the text's punctuation; "three" ends at 875 ms.
SPOKEN_WORDS = (("One", 0, 2000), ("two", 2400, 4000), ("three", 4400, 7000), ("four", 7400, 15000))


@pytest.mark.parametrize(
    ("now", "spoken"),
    [
        (10.1, ""),  # "One" ends at 250 ms
        (10.8, "One two,"),  # a word heard takes the punctuation stuck to it
    ],
)
def test_word_timings_cut_after_the_last_word_that_ended(now: float, spoken: str) -> None:
    core = core_for(words=True)
    say(core, "One two, three four.")
    synthesize(core, 0, 0, 1.9, SPOKEN_WORDS)
    write(core, 10.0)
    [heard] = cancel(core, now)
    assert heard.played_ms == pytest.approx((now - 10.0) * 1000.0)
    assert (heard.text_spoken, heard.text_spoken_source) == (spoken, "words")
    assert whole(heard) == "One two, three four."


def test_the_text_spoken_is_the_clients_own_characters_however_it_was_split_and_normalized() -> None:
    core = core_for(words=True, text_normalization="on")
    pieces = ("**Su", "re!** It co", "sts $12", ".99 tod", "ay.")
    segments = say(core, *pieces)
    assert segments[0] == "Sure!" and segments[1].startswith("It costs twelve dollars")
    for s, spoken in enumerate(segments):  # each word 100 ms (800 samples), one after the other
        words = [w.strip(".,!") for w in spoken.split()]
        synthesize(
            core, 0, s, 0.1 * len(words), tuple((w, 800 * n, 800 * n + 560) for n, w in enumerate(words))
        )
    write(core, 0.0)
    [heard] = cancel(core, 0.45)  # "twelve" ended at 370 ms; "dollars" is being said
    assert heard.text_spoken == "**Sure!** It costs $12.99"
    assert whole(heard) == "".join(pieces)


def test_an_utterance_written_whole_but_still_playing_is_reported_until_it_has_played_out() -> None:
    core = core_for()
    say(core, TEXT)
    synthesize(core, 0, 0, 1.9)
    synthesize(core, 0, 1, 2.1)
    write(core, 0.0)  # audio.done and session.done written: the listener hears it for 4 s more
    assert core.in_flight == ()
    [heard] = cancel(core, 3.0)
    assert heard.played_ms == 3000.0 and heard.text_spoken == "One two three four. Five six"
    # Played out, it is no longer reported: the cancel confirms nothing in flight.
    say(core, "Hi.")
    synthesize(core, 1, 0, 0.5)
    write(core, 10.0)
    assert cancel(core, 10.5) == [AudioCancelled(utterance_index=None)]


def test_utterances_heard_out_are_forgotten_as_the_next_ones_are_written() -> None:
    core = core_for()
    for u, now in ((0, 0.0), (1, 5.0)):
        say(core, f"Number {u}.")
        synthesize(core, u, 0, 1.0)
        write(core, now)
    [heard] = cancel(core, 5.8)  # utterance 0 played out at 1 s: only utterance 1 is heard
    assert (heard.utterance_index, heard.text_spoken) == (1, "Number")
    assert heard.played_ms == pytest.approx(800.0)


def test_a_context_cancel_reports_its_own_utterances_only() -> None:
    core = core_for()
    say(core, "Default one here.")
    say(core, "Named one here.", context_id="a")
    core.receive_message(InputText(text="And more", context_id="a"), 0.0)  # open: in flight
    core.data_to_send()
    synthesize(core, 1, 0, 1.5)
    write(core, 0.0)
    heard = cancel(core, 1.0, context_id="a")
    assert [(h.utterance_index, h.context_id, h.text_spoken, h.text_remaining) for h in heard] == [
        (1, "a", "Named one", " here."),
        (2, "a", "", "And more"),
    ]


def test_an_idle_timeout_reports_no_audio_it_did_not_stop() -> None:
    fmt = OutputFormat("pcm", RATE, frame_ms=100)
    core = Core(fmt, Session(context_idle_timeout_s=1.0))
    core.receive_message(SessionConfig(), 0.0)
    core.accept_config(SessionConfig(), fmt)
    core.data_to_send()
    say(core, "Named one here.", context_id="a")
    synthesize(core, 0, 0, 9.0)
    write(core, 0.0)
    core.tick(1.0)
    assert cancelled(core.data_to_send()) == []


HEARD = AudioCancelled(
    utterance_index=3,
    played_ms=1200.0,
    text_spoken="**Sure!** It",
    text_remaining=" costs $12.99.",
    text_spoken_source="words",
)


def test_voxgate_v1_writes_the_fields_and_vllm_omni_gets_no_audio_cancelled() -> None:
    assert json.loads(render(HEARD, extensions=True)) == {
        "type": "audio.cancelled",
        "utterance_index": 3,
        "played_ms": 1200.0,
        "text_spoken": "**Sure!** It",
        "text_remaining": " costs $12.99.",
        "text_spoken_source": "words",
    }
    assert not sends(HEARD, extensions=False)
    assert json.loads(render(AudioCancelled(), extensions=True)) == {
        "type": "audio.cancelled",
        "utterance_index": None,
    }


@pytest.mark.parametrize("carrier", ["twilio", "telnyx"])
def test_a_carrier_bridge_gets_the_clear_then_what_was_heard(carrier: CarrierName) -> None:
    codec = Telephony(SessionCodec(extensions=True), Framing(CARRIERS[carrier], "S1"))
    assert len(codec.encode(Message(AudioCancelled()))) == 1  # no audio went out yet: no clear
    codec.encode(Audio(b"\xff" * 160, 3, 0, 0.02))
    clear, sent = codec.encode(Message(HEARD))
    assert json.loads(clear)["event"] == "clear"
    assert isinstance(sent, str) and json.loads(sent) == json.loads(render(HEARD, extensions=True))


def test_deepgram_cleared_carries_the_text_spoken_and_remaining() -> None:
    socket = DeepgramSocket(Params("joe", "linear16", 16000, "none"), 1 << 20)
    socket.decode(json.dumps({"type": "Clear"}))
    [cleared] = socket.encode(Message(HEARD))
    assert json.loads(cleared) == {
        "type": "Cleared",
        "sequence_id": 0,
        "text_spoken": "**Sure!** It",
        "text_remaining": " costs $12.99.",
    }
    socket.decode(json.dumps({"type": "Clear"}))  # with nothing in flight: nothing was heard or left
    [cleared] = socket.encode(Message(AudioCancelled()))
    assert json.loads(cleared) == {"type": "Cleared", "sequence_id": 0}
