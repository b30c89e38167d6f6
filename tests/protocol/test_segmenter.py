"""Tests for protocol.segmenter: examples for each rule plus properties over random chunkings."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from voxgate.protocol.segmenter import MAX_SEGMENT_CHARS, Granularity, Segmenter

GRANULARITIES: list[Granularity] = ["none", "sentence", "clause"]
_WS = re.compile(r"\s+")


def segment(
    text: str | list[str],
    granularity: Granularity = "sentence",
    *,
    eager_first: bool = True,
    max_chars: int = MAX_SEGMENT_CHARS,
) -> list[str]:
    """Push ``text`` (one string or a list of chunks) through a fresh segmenter, then flush (no early cut)."""
    seg = Segmenter(granularity, eager_first=eager_first, max_chars=max_chars)
    out: list[str] = []
    for chunk in [text] if isinstance(text, str) else text:
        out += seg.push(chunk)
    return out + seg.flush()


def calm(
    text: str | list[str], granularity: Granularity = "sentence", *, max_chars: int = MAX_SEGMENT_CHARS
) -> list[str]:
    """Like :func:`segment` but without the eager first segment."""
    return segment(text, granularity, eager_first=False, max_chars=max_chars)


# --- streaming basics ------------------------------------------------------------------------


def test_token_stream_gives_sentences() -> None:
    seg = Segmenter(eager_first=False)
    out: list[str] = []
    for token in ["Hel", "lo", ".", " How", " are", " you", "?"]:
        out += seg.push(token)
    assert out == ["Hello."]
    assert out + seg.flush() == ["Hello.", "How are you?"]


def test_trailing_period_waits_for_next_char() -> None:
    seg = Segmenter(eager_first=False)
    assert seg.push("Hello.") == []
    assert seg.pending == "Hello."
    assert seg.push(" W") == ["Hello."]
    assert seg.pending == "W"
    assert seg.push("orld.") == []
    assert seg.flush() == ["World."]
    assert seg.pending == ""


def test_pending_tracks_unemitted_text() -> None:
    seg = Segmenter(eager_first=False)
    assert seg.pending == ""
    seg.push("  One two")
    assert seg.pending == "One two"
    seg.push(". Three")
    assert seg.pending == "Three"


def test_reset_drops_text_and_restarts_utterance() -> None:
    seg = Segmenter()
    seg.push("one two three four five six seven eight nine ten. More text")
    seg.push(" that is buffered")
    seg.reset()
    assert seg.pending == ""
    assert seg.flush() == []
    # Eager applies again after reset.
    assert seg.push("a b c d e f g h") == []
    assert seg.cut_early() == ["a b c d e"]  # "h" may still grow: "f g" stay behind


def test_flush_returns_rest_and_resets_eager() -> None:
    seg = Segmenter()
    words = " ".join(f"w{n}" for n in range(12))
    assert seg.push(words + " and") == []
    assert seg.cut_early() == ["w0 w1 w2 w3 w4 w5 w6 w7 w8 w9"]
    assert seg.push(" more words here") == []
    assert seg.cut_early() == ["w10 w11"]  # a later segment: two words, before the phrase "and more"
    assert seg.flush() == ["and more words here"]
    assert seg.push(words) == []
    assert seg.eager_pending
    assert seg.cut_early() == ["w0 w1 w2 w3 w4 w5 w6 w7 w8"]  # "w11" may still grow


def test_cut_early_cuts_every_segment_of_the_utterance_not_only_the_first() -> None:
    seg = Segmenter()
    assert seg.push("Sure! I can definitely help you reschedule that appointment, and I will") == ["Sure!"]
    assert seg.eager_pending and not seg.first_pending
    assert seg.cut_early() == ["I can definitely help you reschedule that appointment,"]
    assert seg.push(" check the calendar for") == []
    assert seg.cut_early() == ["and I will check"]
    assert seg.flush() == ["the calendar for"]


def test_cut_early_prefers_a_phrase_boundary_to_a_plain_word_boundary() -> None:
    seg = Segmenter()
    assert seg.push("This page streams text to the gateway and turns it into speech right away") == []
    # "into" opens the latest phrase with two complete words behind it ("away" may still grow).
    assert seg.cut_early() == ["This page streams text to the gateway and turns it"]
    seg = Segmenter()
    assert seg.push("We will ship the parcel with the blue label tomorrow morning") == []
    assert seg.cut_early() == ["We will ship the parcel"]  # before "with", not "label | tomorrow"
    seg = Segmenter()
    assert seg.push("one two three four five six seven") == []
    assert seg.cut_early() == ["one two three four"]  # no phrase: the last word boundary


def test_flush_of_whitespace_only_is_empty() -> None:
    seg = Segmenter()
    assert seg.push("  \n\t ") == []
    assert seg.flush() == []


def test_invalid_arguments_raise() -> None:
    with pytest.raises(ValueError):
        Segmenter("words")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Segmenter(max_chars=0)


# --- sentence rules --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Really?! Yes. Go!", ["Really?!", "Yes.", "Go!"]),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ("(See Fig. 3.) Next one.", ["(See Fig. 3.)", "Next one."]),
        ("Visit example.com. Then rest.", ["Visit example.com.", "Then rest."]),
        ("Read https://example.com/a.b?c=d now. Ok.", ["Read https://example.com/a.b?c=d now.", "Ok."]),
        ("Mail bob.smith@mail.example.org. Bye.", ["Mail bob.smith@mail.example.org.", "Bye."]),
        ("See No. 5 today. The answer is no. We go.", ["See No. 5 today.", "The answer is no.", "We go."]),
        ("Para one\n\nPara two\r\n \r\nthree", ["Para one", "Para two", "three"]),
        ("Line one\nline two", ["Line one\nline two"]),
    ],
)
def test_sentence_cuts(text: str, expected: list[str]) -> None:
    assert calm(text) == expected
    assert calm(list(text)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Pi is 3.14 and it costs $1,000.50 today",
        "Dr. Mr. Mrs. Ms. Prof. St. Jr. Sr. vs. etc. approx. Fig. ok",
        "DR. MR. dr. mr. PROF. ok",
        "Use e.g. this, i.e. that, in the U.S. or U.K. at 9 a.m. or 5 p.m. sharp",
        "J. R. R. Tolkien wrote it",
        "Wait... what .. then",
        "Wait\u2026 what\u2026 then",
        "See https://example.com/a.b?c=d and bob.smith@mail.example.org here",
        "Ask for No. 5 or no. 12 now",
        "Hello.World and what?no",
        "A sentence that never ends.",
    ],
)
def test_no_split(text: str) -> None:
    assert calm(text) == [text]
    assert calm(list(text)) == [text]


def test_undecided_no_waits_for_the_next_char() -> None:
    seg = Segmenter(eager_first=False)
    assert seg.push("Pick no. ") == []
    assert seg.push("7 please.") == []
    assert seg.flush() == ["Pick no. 7 please."]
    assert seg.push("Say no. ") == []
    assert seg.flush() == ["Say no."]


def test_cjk_sentences() -> None:
    text = "你好。今天天气很好！我们走吧？"
    expected = ["你好。", "今天天气很好！", "我们走吧？"]
    assert calm(text) == expected
    assert segment(text) == expected
    assert calm(list(text), "clause") == expected


def test_cjk_sentence_is_cut_without_waiting_for_whitespace() -> None:
    seg = Segmenter(eager_first=False)
    assert seg.push("你好。") == []  # a closing quote could still follow
    assert seg.push("今") == ["你好。"]


def test_cjk_closing_quotes_stay_with_sentence() -> None:
    assert calm("他说：“你好。”我们走吧。") == ["他说：“你好。”", "我们走吧。"]
    assert calm("「行！」『好？』走") == ["「行！」", "『好？』", "走"]


def test_none_granularity_only_caps() -> None:
    text = "One. Two! Three? Four, five.\n\nSix。七。"
    assert calm(text, "none") == [text]
    assert calm(list(text), "none", max_chars=10) == ["One. Two!", "Three?", "Four,", "five.", "Six。七。"]


# --- clause rules ----------------------------------------------------------------------------


def test_clause_cuts() -> None:
    text = "First of all, we need a plan; then we act: quickly \u2014 and quietly. Done."
    expected = ["First of all,", "we need a plan;", "then we act:", "quickly \u2014 and quietly.", "Done."]
    assert calm(text, "clause") == expected
    assert calm(list(text), "clause") == expected


def test_clause_dash_and_closing_quote() -> None:
    expected = ['"Come here,"', "she said \u2013", "softly so"]
    assert calm('"Come here," she said \u2013 softly so', "clause") == expected


def test_clause_needs_two_words() -> None:
    expected = ["Yes, I do.", "Well, maybe,", "not really,", "ok."]
    assert calm("Yes, I do. Well, maybe, not really, ok.", "clause") == expected


def test_clause_marks_without_whitespace_do_not_cut() -> None:
    text = "It costs 1,000 at 12:30 via https://example.com;x and a,b"
    assert calm(text, "clause") == [text]


def test_cjk_clauses() -> None:
    text = "今天天气很好，我们去公园散步吧、好不好？你好，朋友"
    assert calm(text, "clause") == ["今天天气很好，", "我们去公园散步吧、", "好不好？", "你好，朋友"]
    assert calm(text) == ["今天天气很好，我们去公园散步吧、好不好？", "你好，朋友"]


# --- eager first segment ---------------------------------------------------------------------


def test_without_cut_early_a_sentence_is_never_cut_before_its_end() -> None:
    text = "The quick brown fox jumps over the lazy dog and keeps running far away from the hunter."
    assert segment(text) == [text]
    assert segment(list(text)) == [text]
    assert segment(text + " It barks.") == [text, "It barks."]
    assert segment("Hi. How are you, my friend? Fine.") == ["Hi.", "How are you, my friend?", "Fine."]


def test_cut_early_cuts_at_the_last_word_boundary_leaving_two_complete_words() -> None:
    seg = Segmenter()
    assert seg.push("one two three four five six seven eight nine ten eleven tw") == []
    assert seg.cut_early() == ["one two three four five six seven eight nine"]
    assert seg.pending == "ten eleven tw"
    assert seg.eager_pending and not seg.first_pending  # later segments may be cut by time too
    assert seg.push("elve. Next") == ["ten eleven twelve."]
    assert seg.flush() == ["Next"]


def test_cut_early_never_cuts_inside_a_word_or_too_short() -> None:
    seg = Segmenter()
    assert seg.push("Hello wor") == []
    assert seg.cut_early() == []  # one complete word: nothing to cut
    assert seg.push("ld, my dear") == []
    assert seg.cut_early() == []  # "Hello world," would leave only "my"
    assert seg.push(" friend ") == []
    assert seg.cut_early() == ["Hello world,"]
    assert seg.flush() == ["my dear friend"]


def test_cut_early_waits_while_the_sentence_end_is_in_sight() -> None:
    for text in ["The quick brown fox jumps over the lazy dog.", 'He said "stop now!"', "And so on and on…"]:
        seg = Segmenter()
        assert seg.push(text) == []
        assert seg.cut_early() == []
        assert seg.eager_pending
        assert seg.flush() == [text]
    seg = Segmenter()
    assert seg.push("Well I say no. ") == []  # "No." waits for its next character
    assert seg.cut_early() == []
    assert seg.push("5 or six") == []
    assert seg.cut_early() == ["Well I say no."]


def test_cut_early_prefers_the_last_clause_boundary() -> None:
    seg = Segmenter()
    assert seg.push("So, first of all, let me check that for you, it will take") == []
    assert seg.cut_early() == ["So, first of all, let me check that for you,"]
    assert seg.flush() == ["it will take"]
    assert segment("Well, yes, I think so, and then more, and more.", "clause") == [
        "Well, yes,",
        "I think so,",
        "and then more,",
        "and more.",
    ]


def test_cut_early_skips_leading_whitespace() -> None:
    seg = Segmenter("none")
    assert seg.push("  one two") == []
    assert seg.push(" three four five ") == []
    assert seg.cut_early() == []  # four words before the cut and two after it: six are needed
    assert seg.push("six ") == []
    assert seg.cut_early() == ["one two three four"]
    assert seg.cut_early() == []


def test_cut_early_is_off_without_eager_first() -> None:
    seg = Segmenter(eager_first=False)
    assert seg.push("one two three four five six") == []
    assert not seg.eager_pending
    assert seg.cut_early() == []


def test_commit_cuts_the_buffer_in_the_same_utterance() -> None:
    seg = Segmenter("none", eager_first=False)
    assert seg.push("Hello there, this is") == []
    assert seg.commit() == ["Hello there, this is"]
    assert seg.commit() == []
    assert seg.push(" the rest.") == []
    assert seg.flush() == ["the rest."]


def test_cut_early_in_cjk_text() -> None:
    seg = Segmenter()
    assert seg.push("今天天气很好我们去公园") == []
    assert seg.cut_early() == ["今天天气很好我"]
    assert seg.flush() == ["们去公园"]
    seg = Segmenter()
    assert seg.push("今天天气很好，我们去公园散步") == []
    assert seg.cut_early() == ["今天天气很好，"]
    assert seg.push("吧") == []
    assert seg.flush() == ["我们去公园散步吧"]


# --- hard cap --------------------------------------------------------------------------------


def test_text_without_spaces_is_cut_at_cap() -> None:
    assert [len(s) for s in segment("x" * 700)] == [MAX_SEGMENT_CHARS, MAX_SEGMENT_CHARS, 100]
    cjk = "天" * 650
    assert [len(s) for s in calm(list(cjk), "none")] == [MAX_SEGMENT_CHARS, MAX_SEGMENT_CHARS, 50]


def test_cap_cuts_at_last_whitespace() -> None:
    assert calm("aaaa bbbb cccc dddd", max_chars=12) == ["aaaa bbbb", "cccc dddd"]
    assert calm("aaaa bbbb    cccc", max_chars=10) == ["aaaa bbbb", "cccc"]


def test_cap_prefers_late_punctuation_boundary() -> None:
    text = "alpha beta gamma, delta epsilon zeta eta theta"
    assert calm(text, max_chars=30) == ["alpha beta gamma,", "delta epsilon zeta eta theta"]
    expected = ["无标点的长句子，", "再接着写下去没有停"]
    assert calm("无标点的长句子，再接着写下去没有停", "none", max_chars=12) == expected


def test_long_stream_keeps_every_character() -> None:
    """A 13,000-token stream (its speed is measured in bench/segmenter.py, not asserted here)."""
    tokens = ["Hel", "lo", " there", ",", " Dr", ".", " Smith", ".", " 你好", "。", " It", " costs", " 3.5"]
    stream = tokens * 1000
    for granularity in GRANULARITIES:
        seg = Segmenter(granularity)
        out: list[str] = []
        for token in stream:
            out += seg.push(token)
        out += seg.flush()
        assert len(out) > 1 and all(len(s) <= MAX_SEGMENT_CHARS for s in out)
        assert re.sub(r"\s+", "", "".join(out)) == re.sub(r"\s+", "", "".join(stream))


# --- properties ------------------------------------------------------------------------------

# Latin, digits, whitespace, ASCII/CJK punctuation, closing quotes, ellipsis, Han and kana.
_ALPHABET = "abcXYZ019 \n\t\r.,!?;:\u2014\u2013\"')(\u2026@/$" + "”」』）。！？，、；：你好天ひら"
# Fragments that exercise the non-split rules, paragraph breaks and CJK closing quotes.
_PIECES = (
    "Dr.|e.g.|U.S.|No. 5|no.|3.14|$1,000.50|https://example.com/a.b?c=d|bob.smith@mail.example.org|...|"
    "\n\n| |J. R.|12:30|“好。”|word "
).split("|")
_fragment = st.one_of(st.text(_ALPHABET, max_size=8), st.sampled_from(_PIECES))
texts = st.lists(_fragment, max_size=40).map("".join)
spaceless = st.text(st.sampled_from("ab.,!?:;你好。，、」…\"')"), max_size=200)


@st.composite
def chunked(draw: st.DrawFn, source: st.SearchStrategy[str]) -> tuple[str, list[str]]:
    """A text and a random split of it into push chunks."""
    text = draw(source)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=20)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _check(text: str, chunks: list[str], granularity: Granularity, eager: bool, max_chars: int) -> None:
    whole = segment(text, granularity, eager_first=eager, max_chars=max_chars)
    assert segment(chunks, granularity, eager_first=eager, max_chars=max_chars) == whole
    assert segment(list(text), granularity, eager_first=eager, max_chars=max_chars) == whole
    assert _WS.sub("", "".join(whole)) == _WS.sub("", text)
    for piece in whole:
        assert piece and piece == piece.strip()
        assert len(piece) <= max_chars
    # A flushed segmenter behaves like a fresh one.
    seg = Segmenter(granularity, eager_first=eager, max_chars=max_chars)
    seg.push("leftover. text")
    seg.flush()
    assert seg.push(text) + seg.flush() == whole


_PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize("granularity", GRANULARITIES)
@_PROPERTY
@given(case=chunked(texts), max_chars=st.sampled_from([6, 25, MAX_SEGMENT_CHARS]))
def test_properties_mixed_text(
    granularity: Granularity, eager: bool, case: tuple[str, list[str]], max_chars: int
) -> None:
    _check(*case, granularity, eager, max_chars)


@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize("granularity", GRANULARITIES)
@settings(max_examples=60, deadline=None)
@given(case=chunked(spaceless), max_chars=st.sampled_from([1, 9, 40]))
def test_properties_without_spaces(
    granularity: Granularity, eager: bool, case: tuple[str, list[str]], max_chars: int
) -> None:
    _check(*case, granularity, eager, max_chars)


_WORDY = st.lists(
    st.one_of(st.sampled_from(["ab", "cde", "X9", "你好", "天ひら"]), st.sampled_from(list(" ,.!?;。，\n"))),
    max_size=60,
).map("".join)


@pytest.mark.parametrize("granularity", GRANULARITIES)
@_PROPERTY
@given(case=chunked(_WORDY), ticks=st.lists(st.booleans(), max_size=21))
def test_properties_with_early_cuts(
    granularity: Granularity, case: tuple[str, list[str]], ticks: list[bool]
) -> None:
    """Early cuts after any chunks keep every character and never split a word."""
    text, chunks = case
    seg = Segmenter(granularity)
    out: list[str] = []
    for i, chunk in enumerate(chunks):
        out += seg.push(chunk)
        if i < len(ticks) and ticks[i]:
            out += seg.cut_early()
    out += seg.flush()
    assert _WS.sub("", "".join(out)) == _WS.sub("", text)
    pos = 0
    for piece in out:
        assert piece and piece == piece.strip()
        start = text.index(piece, pos)
        pos = start + len(piece)
        if pos < len(text):
            before, after = text[pos - 1], text[pos]
            assert not (before.isascii() and before.isalnum() and after.isascii() and after.isalnum())


@settings(max_examples=60, deadline=None)
@given(case=chunked(st.text(st.characters(codec="utf-8"), max_size=120)))
def test_properties_arbitrary_unicode(case: tuple[str, list[str]]) -> None:
    for granularity in GRANULARITIES:
        _check(*case, granularity, True, 20)
