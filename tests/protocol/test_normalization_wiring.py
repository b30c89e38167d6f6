"""``text_normalization`` and ``pronunciations`` on every surface's schema, and the session's normalizer hook
(issue 33): text goes through the normalizer before the segmenter; each segment names the client's text."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest
from voxgate.protocol.alignment import WordNamer
from voxgate.protocol.codecs.elevenlabs import Params, decode_body, parse_params, session_config
from voxgate.protocol.codecs.openai import decode_batch_request, decode_speech_request, merge
from voxgate.protocol.core import Core
from voxgate.protocol.errors import ErrorCode, ProtocolError
from voxgate.protocol.events import SegmentReady, UtteranceEnded, UtteranceStarted
from voxgate.protocol.messages import (
    AudioStart,
    InputDone,
    InputText,
    Pronunciation,
    SessionConfig,
    WordTimestamps,
)
from voxgate.protocol.normalize import Alias, Normalizer
from voxgate.protocol.output import Message, OutputFormat, Speak
from voxgate.protocol.pronounce import aliases
from voxgate.protocol.session import Session

STEPS = "Here are the steps:\n1. Open the app\n2. Tap settings\n3. Choose voice\nThat is all"


def message(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, **fields}, ensure_ascii=False)


def configured(**config: object) -> Session:
    session = Session()
    [event] = session.receive_text(message("session.config", **config))
    session.accept_config(event.config)  # type: ignore[attr-defined]
    return session


def spoken(session: Session, *pieces: str, context_id: str | None = None) -> list[SegmentReady]:
    """The segments of one utterance fed in ``pieces``, then ``input.done``."""
    cid = {} if context_id is None else {"context_id": context_id}
    events = []
    for piece in pieces:
        events += session.receive_text(message("input.text", text=piece, **cid))
    events += session.receive_text(message("input.done", **cid))
    return [e for e in events if isinstance(e, SegmentReady)]


# --- the schema -----------------------------------------------------------------------------------


def test_a_text_normalization_other_than_the_three_is_refused_naming_the_field() -> None:
    with pytest.raises(ProtocolError) as info:
        Session().receive_text(message("session.config", text_normalization="loud"))
    assert info.value.code == ErrorCode.INVALID_MESSAGE
    assert info.value.field == "$.text_normalization"


def test_a_pronunciation_needs_an_alias_or_an_ipa() -> None:
    with pytest.raises(ProtocolError) as info:
        Session().receive_text(message("session.config", pronunciations=[{"text": "SQL"}]))
    assert info.value.code == ErrorCode.INVALID_MESSAGE
    assert info.value.field == "$.pronunciations[0]"
    config = msgspec.convert(
        {
            "pronunciations": [
                {"text": "Nguyen", "ipa": "ŋwiən"},
                {"text": "sql", "alias": "sequel", "case_sensitive": False},
            ]
        },
        SessionConfig,
    )
    # For an engine without phoneme input: the ipa entry's word is kept as written (protocol.pronounce)
    ipa, alias = aliases(config.pronunciations, phonemes=False)
    assert (ipa.text, ipa.alias) == ("Nguyen", None)
    assert (alias.text, alias.alias, alias.case_sensitive) == ("sql", "sequel", False)
    assert aliases(None, phonemes=False) == []
    assert config.text_normalization == "auto"


def test_openai_rest_and_batch_items_take_the_fields() -> None:
    req = decode_speech_request(b'{"input": "Hi", "text_normalization": "off"}')
    assert req.text_normalization == "off" and req.pronunciations is None
    with pytest.raises(msgspec.ValidationError, match="text_normalization"):
        decode_speech_request(b'{"input": "Hi", "text_normalization": "maybe"}')
    batch = decode_batch_request(
        b'{"text_normalization": "on", "pronunciations": [{"text": "SQL", "alias": "sequel"}],'
        b' "items": [{"input": "a"}, {"input": "b", "text_normalization": "off"}]}'
    )
    first, second = (merge(batch, item) for item in batch.items)
    assert (first.text_normalization, second.text_normalization) == ("on", "off")
    assert second.pronunciations == [Pronunciation(text="SQL", alias="sequel")]
    assert (
        merge(decode_batch_request(b'{"items": [{"input": "a"}]}'), batch.items[0]).text_normalization
        == "auto"
    )


def test_elevenlabs_apply_text_normalization_maps_to_it() -> None:
    assert parse_params({}).text_normalization == "auto"
    params = parse_params({"apply_text_normalization": "off"})
    assert session_config("joe", params).text_normalization == "off"
    assert session_config("joe", params, text_normalization="on").text_normalization == "on"
    with pytest.raises(ProtocolError) as info:
        parse_params({"apply_text_normalization": "sometimes"})
    assert info.value.field == "apply_text_normalization"
    assert decode_body(b'{"text": "x", "apply_text_normalization": "on"}').apply_text_normalization == "on"
    assert Params().text_normalization == "auto"


# --- the session hook -----------------------------------------------------------------------------


def test_each_list_item_is_its_own_segment_and_names_the_clients_text() -> None:
    session = configured()
    pieces = [STEPS[i : i + 4] for i in range(0, len(STEPS), 4)]
    segments = spoken(session, *pieces)
    assert [s.text for s in segments] == [
        "Here are the steps:",
        "1, Open the app",
        "2, Tap settings",
        "3, Choose voice",
        "That is all",
    ]
    assert [s.source or s.text for s in segments] == [
        "Here are the steps:",
        "1. Open the app",
        "2. Tap settings",
        "3. Choose voice",
        "That is all",
    ]


def test_markdown_is_not_read_and_the_source_keeps_it() -> None:
    session = configured(pronunciations=[{"text": "SQL", "alias": "sequel"}])
    [segment] = spoken(session, "Use **", "SQL** at https://exa", "mple.com/x now.")
    assert segment.text == "Use sequel at example dot com now."
    assert segment.source == "Use **SQL** at https://example.com/x now."


def test_on_writes_numbers_out_and_auto_only_when_the_session_asks() -> None:
    assert spoken(configured(text_normalization="on"), "It is $5.")[0].text == "It is five dollars."
    assert spoken(configured(), "It is $5.")[0].text == "It is $5."
    session = Session()
    session.expand_numbers = True  # the host's word: this engine misreads numbers
    session.receive_text(message("session.config"))
    session.accept_config(SessionConfig())
    assert spoken(session, "It is $5.")[0].text == "It is five dollars."


def test_off_reads_the_text_as_sent() -> None:
    [segment] = spoken(configured(text_normalization="off"), "**Sure!**")
    assert segment == SegmentReady(0, 0, "**Sure!**")


def test_a_plain_text_reaches_the_segmenter_without_waiting_for_the_next_space() -> None:
    session = configured()
    events = session.receive_text(message("input.text", text="One two three. Four"))
    assert events == [UtteranceStarted(0), SegmentReady(0, 0, "One two three.")]
    assert session._default.segmenter.pending == "Four"


def test_a_commit_reads_the_token_held() -> None:
    session = configured()
    session.receive_text(message("input.text", text="see *it"))
    events = session.receive_text(message("input.commit"))
    [segment] = [e for e in events if isinstance(e, SegmentReady)]
    assert (segment.text, segment.source, segment.origins) == ("see it", "see *it", (0, 1, 2, 3, 5, 6))


def test_a_named_context_normalizes_as_configured_and_a_cancel_drops_what_is_held() -> None:
    session = configured(text_normalization="on")
    assert spoken(session, "**$5**", context_id="c1")[0].text == "five dollars"
    session.receive_text(message("input.text", text="half a `URL"))
    session.receive_text(message("input.cancel"))
    events = session.receive_text(message("input.text", text="fresh"))
    events += session.receive_text(message("input.done"))
    assert [e for e in events if isinstance(e, SegmentReady)] == [SegmentReady(2, 0, "fresh")]
    assert isinstance(events[-1], UtteranceEnded)


def test_the_backlog_cap_counts_the_token_held() -> None:
    session = Session(max_pending_text_chars=10)
    session.receive_text(message("session.config"))
    session.accept_config(SessionConfig())
    session.receive_text(message("input.text", text="`12345678"))
    with pytest.raises(ProtocolError) as info:
        session.receive_text(message("input.text", text="90"))
    assert info.value.code == ErrorCode.TEXT_BACKLOG_FULL


# --- what the listener heard, in the client's characters ------------------------------------------


def test_word_namer_names_each_word_in_the_clients_text() -> None:
    norm = Normalizer("on", aliases=[Alias("SQL", "sequel")])
    said = norm.feed("Use **SQL**: $12.99 at https://ex.io/a now") + norm.flush()
    source, origins = norm.source(said)
    namer = WordNamer(said, source, origins)
    assert said == "Use sequel: twelve dollars and ninety-nine cents at ex dot io now"
    assert [
        namer.name(w) for w in ["Use", "SEQUEL:", "twelve", "dollars", "and", "ninety-nine", "cents"]
    ] == [
        "Use",
        "SQL**:",
        "$12.99",
        "",
        "",
        "",
        "",
    ]
    assert [namer.name(w) for w in ["at", "ex", "dot", "io", "gone", "now", ""]] == [
        "at",
        "https://ex.io/a",
        "",
        "",
        "gone",
        "now",
        "",
    ]


def test_word_timestamps_and_sentence_text_name_the_clients_characters() -> None:
    core = Core(OutputFormat("pcm", 8000, frame_ms=100, word_timestamps=True))
    core.receive_message(SessionConfig(word_timestamps=True), 0.0)
    core.accept_config(
        SessionConfig(word_timestamps=True), OutputFormat("pcm", 8000, frame_ms=100, word_timestamps=True)
    )
    core.data_to_send()
    core.receive_message(InputText(text="Here is `sushi_roll`, **really**."), 0.0)
    core.receive_message(InputDone(), 0.0)
    core.data_to_send()
    core.segment_started(0, 0)
    core.audio(
        0,
        0,
        np.zeros(800, dtype=np.float32),
        8000,
        [("Here", 0, 200), ("is", 200, 300), ("sushi", 300, 500), ("roll,", 500, 600), ("really.", 600, 800)],
    )
    out = core.data_to_send()
    [start] = [o.msg for o in out if isinstance(o, Message) and isinstance(o.msg, AudioStart)]
    assert start.sentence_text == "Here is `sushi_roll`, **really**."
    [chunk] = [o.msg for o in out if isinstance(o, Message) and isinstance(o.msg, WordTimestamps)]
    assert [w.word for w in chunk.timestamps] == ["Here", "is", "sushi", "roll`,", "really**."]


def test_the_spoken_words_of_one_written_word_are_one_timed_word() -> None:
    fmt = OutputFormat("pcm", 8000, frame_ms=100, word_timestamps=True)
    core = Core(fmt)
    core.session.expand_numbers = True  # an engine that misreads numbers (Piper): "$5." is spoken in words
    core.receive_message(SessionConfig(word_timestamps=True), 0.0)
    core.accept_config(SessionConfig(word_timestamps=True), fmt)
    core.data_to_send()
    core.receive_message(InputText(text="It is $5."), 0.0)
    core.receive_message(InputDone(), 0.0)
    [speak] = [o for o in core.data_to_send() if isinstance(o, Speak)]
    assert speak.text == "It is five dollars."
    core.segment_started(0, 0)
    timed = [("It", 0, 100), ("is", 100, 200), ("five", 200, 400), ("dollars.", 400, 800)]
    core.audio(0, 0, np.zeros(800, dtype=np.float32), 8000, timed)
    [chunk] = [
        o.msg for o in core.data_to_send() if isinstance(o, Message) and isinstance(o.msg, WordTimestamps)
    ]
    assert [(w.word, w.start_ms, w.end_ms) for w in chunk.timestamps] == [
        ("It", 0.0, 12.5),
        ("is", 12.5, 25.0),
        ("$5.", 25.0, 100.0),
    ]
