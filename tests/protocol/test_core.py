"""The session core: events and engine audio in, typed outputs out; time is an argument."""

from __future__ import annotations

import io

import av
import msgspec
import numpy as np
import pytest
from voxgate.protocol.audio import Samples
from voxgate.protocol.core import Core
from voxgate.protocol.errors import ErrorCode, ProtocolError
from voxgate.protocol.events import (
    CloseRequested,
    Committed,
    ConfigAccepted,
    SegmentReady,
    UtteranceCancelled,
    UtteranceEnded,
    UtteranceStarted,
)
from voxgate.protocol.messages import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    Error,
    InputCommitted,
    InputDone,
    InputText,
    SessionConfig,
    SessionDone,
    WordTimestamp,
    WordTimestamps,
)
from voxgate.protocol.output import (
    Audio,
    Configure,
    Drop,
    Finish,
    Message,
    Output,
    OutputFormat,
    Report,
    Speak,
)
from voxgate.protocol.session import Session, State


def unheard(
    index: int, text: str = "", context_id: str | msgspec.UnsetType = msgspec.UNSET
) -> AudioCancelled:
    """The ``audio.cancelled`` of an utterance the listener heard nothing of (its ``text``: all remaining)."""
    return AudioCancelled(
        utterance_index=index,
        context_id=context_id,
        played_ms=0.0,
        text_spoken="",
        text_remaining=text,
        text_spoken_source="estimate",
    )


RATE = 8000
PCM = OutputFormat("pcm", RATE, frame_ms=100)


def tone(seconds: float) -> Samples:
    return np.full(int(seconds * RATE), 0.25, dtype=np.float32)


def kinds(outputs: list[Output]) -> list[str]:
    return [type(o.msg).__name__ if isinstance(o, Message) else type(o).__name__ for o in outputs]


def speak_one(core: Core, u: int = 0, text: str = "Hi.", now: float = 0.0) -> list[Output]:
    core.receive(UtteranceStarted(u), now)
    core.receive(SegmentReady(u, 0, text), now)
    core.receive(UtteranceEnded(u, 1), now)
    return core.data_to_send()


def test_a_segment_is_spoken_announced_framed_and_reported() -> None:
    core = Core(PCM)
    assert speak_one(core) == [Speak(0, 0, "Hi.")]
    core.segment_started(0, 0)
    core.audio(0, 0, tone(0.25), RATE)
    core.segment_done(0, 0, synthesis_s=0.5)
    out = core.data_to_send()
    assert kinds(out) == ["AudioStart", "Audio", "Audio", "Audio", "Report", "Report"]
    start = out[0]
    assert isinstance(start, Message) and isinstance(start.msg, AudioStart)
    assert start.msg.sentence_text == "Hi." and start.utterance == 0 and start.streamed
    frames = [o for o in out if isinstance(o, Audio)]
    assert [len(f.data) for f in frames] == [1600, 1600, 800]  # 100 ms of pcm16, the last one short
    assert sum(f.audio_s for f in frames) == 0.25
    assert out[4:] == [Report(0, 0), Report(0)]


def test_timings_are_stamped_when_written() -> None:
    core = Core(PCM)
    core.receive(UtteranceStarted(0), 10.0)
    core.receive(SegmentReady(0, 0, "Hi."), 10.5)
    core.receive(UtteranceEnded(0, 1), 10.5)
    core.segment_started(0, 0)
    core.audio(0, 0, tone(0.2), RATE)
    core.segment_done(0, 0, synthesis_s=0.125)
    sent = [core.sending(o, 11.0 + n) for n, o in enumerate(core.data_to_send()[1:])]
    done, session_done = sent[-2], sent[-1]
    assert isinstance(done, Message) and isinstance(done.msg, AudioDone)
    assert done.msg.text_to_first_audio_ms == 1500.0 and done.msg.duration_ms == 200.0
    assert done.msg.synthesis_ms == 125.0 and done.msg.total_bytes == 3200 and not done.msg.error
    assert isinstance(session_done, Message) and isinstance(session_done.msg, SessionDone)
    assert session_done.msg.first_text_to_first_audio_ms == 2000.0 and session_done.msg.total_sentences == 1
    assert core.in_flight == ()  # forgotten once session.done is written


def test_an_utterance_without_text_is_done_at_once_without_timings() -> None:
    core = Core(PCM)
    core.receive(UtteranceEnded(0, 0), 0.0)
    (report,) = core.data_to_send()
    done = core.sending(report, 1.0)
    assert isinstance(done, Message) and done.msg == SessionDone(utterance_index=0)


def test_session_done_waits_for_earlier_utterances_and_finish_comes_last() -> None:
    core = Core(PCM)
    speak_one(core, 0)
    core.receive(UtteranceEnded(1, 0), 0.0)
    core.receive(CloseRequested(), 0.0)
    assert core.data_to_send() == []  # utterance 0 still speaks
    core.segment_started(0, 0)
    core.segment_done(0, 0, synthesis_s=0.0)
    assert kinds(core.data_to_send()) == ["AudioStart", "Report", "Report", "Report", "Finish"]


def test_close_with_nothing_in_flight_finishes_at_once() -> None:
    core = Core(PCM)
    core.receive(CloseRequested(), 0.0)
    assert core.data_to_send() == [Finish()]


def test_a_failed_segment_reports_its_error_after_audio_done() -> None:
    core = Core(PCM)
    speak_one(core)
    core.segment_started(0, 0)
    error = ProtocolError(ErrorCode.REQUEST_REFUSED, "bad language", field="language", status=422)
    core.segment_done(0, 0, synthesis_s=0.0, error=error)
    out = core.data_to_send()
    assert kinds(out) == ["AudioStart", "Report", "Error", "Report"]
    failed = out[2]
    assert isinstance(failed, Message) and failed.utterance == 0
    assert failed.msg == Error(
        code="request_refused", message="bad language", utterance_index=0, field="language"
    )
    done = core.sending(out[1], 1.0)
    assert isinstance(done, Message) and isinstance(done.msg, AudioDone) and done.msg.error


def test_cancel_drops_everything_in_flight_and_later_engine_work_produces_nothing() -> None:
    core = Core(PCM)
    speak_one(core, 0)
    core.receive(UtteranceStarted(1), 0.0)
    core.receive(SegmentReady(1, 0, "More."), 0.0)
    core.data_to_send()
    core.segment_started(0, 0)
    core.audio(0, 0, tone(0.2), RATE)  # a frame, and 4 ms held back for the fade-out
    queued = core.data_to_send()
    core.receive(UtteranceCancelled(1), 0.0)
    assert core.data_to_send() == [
        Drop((0, 1)),
        Message(unheard(0)),
        Message(unheard(1)),
    ]
    core.segment_started(0, 0)
    core.audio(0, 0, tone(0.1), RATE)
    core.segment_done(0, 0, synthesis_s=0.0)
    assert core.data_to_send() == []
    assert [core.sending(o, 1.0) for o in (Report(0, 0), Report(0))] == [None, None]
    assert core.sending(queued[1], 1.0) == queued[1]  # audio of a forgotten utterance stamps nothing


def test_cancel_with_nothing_in_flight_is_still_confirmed() -> None:
    core = Core(PCM)
    core.cancel()
    assert core.data_to_send() == [Drop(()), Message(AudioCancelled(utterance_index=None))]


def test_commit_is_answered_and_a_valid_config_is_left_to_the_shell_to_check() -> None:
    core = Core(PCM)
    core.receive(Committed("c1", 0, 2), 0.0)
    core.receive(ConfigAccepted(SessionConfig(), ("lang",)), 0.0)
    assert core.data_to_send() == [
        Message(InputCommitted(commit_id="c1", utterance_index=0, sentence_index=2)),
        Configure(SessionConfig(), ("lang",)),
    ]


def test_wire_messages_go_through_the_text_side() -> None:
    core = Core(PCM)
    core.receive_text('{"type": "session.config", "voice": "tone", "lang": "en"}', 0.0)
    (configure,) = core.data_to_send()
    assert isinstance(configure, Configure) and configure.ignored_fields == ("lang",)
    core.accept_config(configure.config, PCM)
    core.receive_text('{"type": "input.text", "text": "One. Two"}', 1.0)
    core.receive_message(InputDone(), 2.0)
    assert [o for o in core.data_to_send() if isinstance(o, Speak)] == [
        Speak(0, 0, "One."),
        Speak(0, 1, "Two"),
    ]
    with pytest.raises(ProtocolError) as binary:
        core.receive_bytes(b"\x00", 3.0)
    assert binary.value.code is ErrorCode.BINARY_NOT_ACCEPTED and not binary.value.fatal


def test_a_refused_first_config_is_fatal() -> None:
    core = Core(PCM)
    core.receive_message(SessionConfig(voice="nobody"), 0.0)
    error = core.reject_config(ProtocolError(ErrorCode.VOICE_NOT_FOUND, "no voice 'nobody'"))
    assert error.fatal and error.close_code == 1008


def test_a_new_format_applies_from_the_next_utterance_and_wav_segments_are_whole() -> None:
    core = Core(PCM)
    core.receive(UtteranceStarted(0), 0.0)
    core.accept_config(SessionConfig(response_format="wav"), OutputFormat("wav", RATE, streamed=False))
    speak_one(core, 1)
    core.segment_started(1, 0)
    core.audio(1, 0, tone(0.2), RATE)
    assert core.data_to_send() == [core_start(1)]
    core.segment_done(1, 0, synthesis_s=0.0)
    (audio, *_) = core.data_to_send()
    assert isinstance(audio, Audio) and audio.data[:4] == b"RIFF" and audio.audio_s == 0.2


def core_start(u: int) -> Message:
    msg = AudioStart(utterance_index=u, sentence_index=0, sentence_text="Hi.", format="wav", sample_rate=RATE)
    return Message(msg, u, streamed=False)


def test_an_utterance_reported_but_not_yet_written_is_reported_once() -> None:
    core = Core(PCM)
    core.receive(UtteranceEnded(0, 0), 0.0)
    core.receive(UtteranceEnded(1, 0), 0.0)
    assert core.data_to_send() == [Report(0), Report(1)]
    assert core.in_flight == (0, 1)


def speaks(core: Core) -> list[str]:
    return [o.text for o in core.data_to_send() if isinstance(o, Speak)]


def text(core: Core, fragment: str, now: float) -> None:
    core.receive_text(f'{{"type": "input.text", "text": "{fragment}"}}', now)


def configured(config: str = "") -> Core:
    core = Core(PCM)
    core.receive_text(f'{{"type": "session.config"{config}}}', 0.0)
    (configure,) = core.data_to_send()
    assert isinstance(configure, Configure)
    core.accept_config(configure.config, PCM)
    return core


def test_the_first_segment_is_cut_once_its_text_waited_the_budget() -> None:
    core = configured(', "max_buffer_delay_ms": 200')
    assert core.next_deadline() is None
    text(core, "Let me check that", 10.0)
    assert speaks(core) == [] and core.next_deadline() == pytest.approx(10.2)
    core.tick(10.1)  # early: nothing
    text(core, " for you, it will ", 10.15)
    assert speaks(core) == [] and core.next_deadline() == pytest.approx(10.2)  # from the first text
    core.tick(10.2)
    assert speaks(core) == ["Let me check that for you,"]
    assert (core.next_deadline() or 0.0) > 11.0  # "it will": the listener's deadline, near the first's end
    text(core, "take a moment. Then", 10.3)
    assert speaks(core) == ["it will take a moment."]
    core.tick(99.0)  # "Then" is one word: nothing to cut, and nothing due until more text
    assert speaks(core) == [] and core.next_deadline() is None
    core.receive_message(InputDone(), 99.0)
    assert speaks(core) == ["Then"]
    text(core, "A new utterance", 100.0)  # the next utterance is eager again
    assert core.next_deadline() == pytest.approx(100.2)


def test_a_sentence_in_sight_is_not_cut_and_a_blocked_cut_waits_for_text() -> None:
    core = configured()  # the default budget: 300 ms
    text(core, "The quick brown fox jumps over the lazy dog.", 0.0)
    assert core.next_deadline() == pytest.approx(0.3)
    core.tick(0.5)
    assert speaks(core) == [] and core.next_deadline() is None  # the end is in sight: no busy ticking
    text(core, " It", 0.6)
    assert speaks(core) == ["The quick brown fox jumps over the lazy dog."]
    # "It" waits for the listener: 0.6 + 0.276 s to the first audio of the sentence, 44 characters of audio
    # at 0.054 s, less 0.108 s to the first audio of "It", less the 0.15 s margin.
    assert core.next_deadline() == pytest.approx(2.994)
    core.receive_message(InputDone(), 0.7)
    assert speaks(core) == ["It"]
    text(core, "Hello wor", 1.0)
    core.tick(1.3)
    assert speaks(core) == [] and core.next_deadline() is None  # one complete word: nothing to cut
    text(core, "ld and many more words here", 2.0)  # past the deadline: the cut is made at once
    assert speaks(core) == ["Hello world and many"]


def test_a_whole_sentence_at_once_is_one_segment_whatever_the_time() -> None:
    core = configured()
    sentence = "This sentence is long enough that a word count would have cut it in two, but it is whole."
    text(core, sentence, 0.0)
    core.receive_message(InputDone(), 0.0)
    assert speaks(core) == [sentence] and core.next_deadline() is None


def test_text_past_the_backlog_cap_is_refused_without_changing_anything() -> None:
    core = Core(PCM, Session(max_pending_text_chars=20))
    core.receive_message(SessionConfig(), 0.0)
    (configure,) = core.data_to_send()
    assert isinstance(configure, Configure)
    core.accept_config(configure.config, PCM)
    core.receive_message(InputText(text="One two three. Four"), 1.0)  # the space between is dropped
    assert core.session.backlog + len(core.session._segmenter.pending) == 18  # "One two three." + "Four"
    speaks = [o for o in core.data_to_send() if isinstance(o, Speak)]
    with pytest.raises(ProtocolError) as full:
        core.receive_message(InputText(text=" five"), 2.0)
    assert full.value.code is ErrorCode.TEXT_BACKLOG_FULL and not full.value.fatal
    assert core.data_to_send() == [] and core.session.state is State.SPEAKING
    # Once a segment's synthesis starts its text no longer waits: there is room again.
    core.segment_started(0, speaks[0].sentence)
    core.receive_message(InputText(text=" five"), 3.0)
    # A cancel drops what waited: the whole cap is free again.
    core.receive_message(InputDone(), 4.0)
    core.cancel()
    assert core.session.backlog == 0
    core.receive_message(InputText(text="x" * 20), 5.0)
    with pytest.raises(ProtocolError):
        core.receive_message(InputText(text="y"), 6.0)


def test_utterances_past_max_in_flight_are_refused_until_one_is_done() -> None:
    """Empty utterances (``input.done`` alone) behind one still speaking each hold state until their turn:
    past ``max_in_flight`` a message that would start one more is refused, text or not."""
    core = Core(PCM, Session(max_in_flight=3))
    core.receive_message(SessionConfig(), 0.0)
    (configure,) = core.data_to_send()
    assert isinstance(configure, Configure)
    core.accept_config(configure.config, PCM)
    core.receive_message(InputText(text="Still speaking."), 1.0)
    core.receive_message(InputDone(), 1.0)
    core.receive_message(InputDone(), 1.0)
    core.receive_message(InputDone(), 1.0)
    assert core.in_flight == (0, 1, 2) and core.session.in_flight == 3
    for refused in (InputDone(), InputText(text="More.")):
        with pytest.raises(ProtocolError) as full:
            core.receive_message(refused, 2.0)
        assert full.value.code is ErrorCode.TEXT_BACKLOG_FULL and not full.value.fatal
    core.cancel()  # a cancel frees every place
    assert core.session.in_flight == 0
    core.receive_message(InputText(text="Again."), 3.0)
    assert core.session.in_flight == 1


def test_word_timings_go_out_before_their_audio_in_ms_on_the_utterance_clock() -> None:
    core = Core(OutputFormat("pcm", 16000, frame_ms=100))  # the engine speaks at 8 kHz: resampled
    core.receive(UtteranceStarted(0), 0.0)
    core.receive(SegmentReady(0, 0, "One two."), 0.0)
    core.receive(SegmentReady(0, 1, "Three."), 0.0)
    core.receive(UtteranceEnded(0, 2), 0.0)
    core.data_to_send()
    core.segment_started(0, 0)
    core.audio(0, 0, tone(0.25), RATE, [("One", 400, 1000), ("two.", 1000, 2000)])
    core.audio(0, 0, tone(0.25), RATE, [("more", 0, 2000)])
    core.audio(0, 0, tone(0.125), RATE)  # no words in this one: no message
    core.segment_done(0, 0, synthesis_s=0.1)
    core.segment_started(0, 1)
    core.audio(0, 1, tone(0.5), RATE, [("Three.", 800, 4000)])
    out = core.data_to_send()
    words = [o.msg for o in out if isinstance(o, Message) and isinstance(o.msg, WordTimestamps)]
    assert [(w.sentence_index, w.chunk_id, w.chunk_start_ms, w.chunk_end_ms) for w in words] == [
        (0, 0, 0.0, 250.0),
        (0, 1, 250.0, 500.0),
        (1, 0, 625.0, 1125.0),  # the second segment starts after the first's 625 ms
    ]
    assert words[0].timestamps == [
        WordTimestamp(word="One", start_ms=50.0, end_ms=125.0),
        WordTimestamp(word="two.", start_ms=125.0, end_ms=250.0),
    ]
    assert words[1].timestamps == [WordTimestamp(word="more", start_ms=250.0, end_ms=500.0)]
    assert words[2].timestamps == [WordTimestamp(word="Three.", start_ms=725.0, end_ms=1125.0)]
    assert all(w.sample_rate == 16000 and w.utterance_index == 0 for w in words)
    # Each comes before the first frame of its audio.
    first = kinds(out).index("WordTimestamps")
    assert "Audio" not in kinds(out)[:first]
    starts = [i for i, o in enumerate(out) if isinstance(o, Message) and isinstance(o.msg, AudioStart)]
    assert kinds(out)[starts[1] + 1] == "WordTimestamps"


def test_word_timings_of_a_cancelled_utterance_are_dropped() -> None:
    core = Core(PCM)
    speak_one(core)
    core.segment_started(0, 0)
    core.cancel()
    core.data_to_send()
    core.audio(0, 0, tone(0.1), RATE, [("Hi.", 0, 800)])
    assert core.data_to_send() == []


def opus_stream(data: bytes) -> tuple[int, float]:
    """The sample rate and duration a real decoder (FFmpeg, through PyAV) reads from an Ogg Opus stream."""
    with av.open(io.BytesIO(data), mode="r") as container:
        frames = list(container.decode(audio=0))
    return frames[0].sample_rate, sum(f.samples for f in frames) / frames[0].sample_rate


def test_a_compressed_utterance_is_one_encoder_stream_ended_before_its_session_done() -> None:
    core = Core(OutputFormat("opus", RATE))
    speak_one(core)
    core.segment_started(0, 0)
    core.audio(0, 0, tone(0.005), RATE)  # less than one 20 ms Opus frame: only the stream's headers
    first = core.data_to_send()
    assert kinds(first) == ["AudioStart", "Audio"] and first[1].data[:4] == b"OggS"  # type: ignore[union-attr]
    core.audio(0, 0, tone(0.001), RATE)  # still in the codec: nothing to send, counted later
    assert core.data_to_send() == []
    core.audio(0, 0, tone(0.244), RATE)
    core.segment_done(0, 0, synthesis_s=0.1)
    out = first + core.data_to_send()
    # The codec's last bytes (its delay) come after the segment's audio.done, before session.done.
    assert kinds(out)[-3:] == ["Report", "Audio", "Report"]
    audio = [o for o in out if isinstance(o, Audio)]
    # It carries the audio the codec held (the segment's faded last 4 ms): every sample is counted once.
    assert audio[-1].audio_s == pytest.approx(0.004) and sum(a.audio_s for a in audio) == pytest.approx(0.25)
    rate, seconds = opus_stream(b"".join(a.data for a in audio))
    assert rate == 48000 and seconds == pytest.approx(0.25, abs=0.001)


def test_a_compressed_segment_not_streamed_is_a_whole_file_and_leaves_no_tail() -> None:
    core = Core(OutputFormat("opus", RATE, streamed=False))
    speak_one(core)
    core.segment_started(0, 0)
    core.audio(0, 0, tone(0.1), RATE)
    core.segment_done(0, 0, synthesis_s=0.1)
    out = core.data_to_send()
    assert kinds(out) == ["AudioStart", "Audio", "Report", "Report"]
    assert opus_stream(out[1].data)[1] == pytest.approx(0.1, abs=0.001)  # type: ignore[union-attr]


def test_an_output_format_is_checked_against_its_encoders_rates() -> None:
    assert OutputFormat("mp3", 44100).check() == OutputFormat("mp3", 44100)
    assert OutputFormat("pcm", 44100).check() == OutputFormat("pcm", 44100)
    with pytest.raises(ProtocolError) as refused:
        OutputFormat("opus", 44100).check()
    assert refused.value.code is ErrorCode.UNSUPPORTED_RATE and "48000" in refused.value.message


def test_a_reported_error_names_its_utterance_and_none_once_it_is_gone() -> None:
    core = Core(PCM)
    speak_one(core)
    core.report(0, ProtocolError(ErrorCode.AUDIO_TRUNCATED, "cut"))
    (out,) = core.data_to_send()
    assert isinstance(out, Message) and isinstance(out.msg, Error)
    assert (out.msg.code, out.msg.utterance_index, out.msg.fatal) == ("audio_truncated", 0, False)
    core.cancel()
    core.data_to_send()
    core.report(0, ProtocolError(ErrorCode.AUDIO_TRUNCATED, "cut"))
    assert core.data_to_send() == []
