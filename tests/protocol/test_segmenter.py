"""Tests for protocol.segmenter: examples for each rule plus properties over random chunkings."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voxgate.protocol.segmenter import EAGER_CJK_CHARS, EAGER_WORDS, MAX_SEGMENT_CHARS, Granularity, Segmenter

GRANULARITIES: list[Granularity] = ["none", "sentence", "clause"]
_WS = re.compile(r"\s+")


def segment(
    text: str | list[str],
    granularity: Granularity = "sentence",
    *,
    eager_first: bool = True,
    max_chars: int = MAX_SEGMENT_CHARS,
    eager_words: int = EAGER_WORDS,
) -> list[str]:
    """Push ``text`` (one string or a list of chunks) through a fresh segmenter, then flush."""
    seg = Segmenter(granularity, eager_first=eager_first, max_chars=max_chars, eager_words=eager_words)
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
    assert seg.push("a b c d e f g h i j k") == []
    assert seg.push(" l") == ["a b c d e f g h"]


def test_flush_returns_rest_and_resets_eager() -> None:
    seg = Segmenter()
    words = " ".join(f"w{n}" for n in range(12))
    assert seg.push(words + " and") == [" ".join(f"w{n}" for n in range(EAGER_WORDS))]
    assert seg.push(" more words here") == []  # not eager any more; no sentence end yet
    assert seg.flush() == ["w8 w9 w10 w11 and more words here"]
    assert seg.push(words) == [" ".join(f"w{n}" for n in range(EAGER_WORDS))]


def test_flush_of_whitespace_only_is_empty() -> None:
    seg = Segmenter()
    assert seg.push("  \n\t ") == []
    assert seg.flush() == []


def test_invalid_arguments_raise() -> None:
    with pytest.raises(ValueError):
        Segmenter("words")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Segmenter(max_chars=0)
    with pytest.raises(ValueError):
        Segmenter(eager_words=0)


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


def test_eager_cuts_after_eight_words_once_a_long_tail_follows() -> None:
    seg = Segmenter()
    assert seg.push("one two three four five six seven eight nine ten eleven") == []
    assert seg.push(" ") == []  # three words follow the candidate: a sentence end may still be near
    assert seg.push("t") == ["one two three four five six seven eight"]
    assert seg.push("welve thirteen fourteen fifteen sixteen seventeen ") == []
    assert seg.flush() == ["nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen"]


def test_eager_keeps_a_sentence_whole_when_its_end_is_in_sight() -> None:
    text = "The quick brown fox jumps over the lazy dog."
    assert segment(text) == [text]
    assert segment(list(text)) == [text]
    assert segment(text + " It barks.") == [text, "It barks."]
    assert segment("Sure thing, I can.") == ["Sure thing, I can."]


def test_eager_never_leaves_a_short_tail() -> None:
    words = "one two three four five six seven eight nine ten eleven twelve thirteen"
    for n in range(9, 14):
        text = " ".join(words.split()[:n]) + "."
        first, *rest = segment(text + " Next one.")
        assert first == text or len(first.split()) == EAGER_WORDS and len(text.split()) - EAGER_WORDS > 3


def test_eager_prefers_a_clause_to_the_word_count() -> None:
    text = "Let me check that for you, it will take a moment or two to find."
    assert segment(text) == ["Let me check that for you,", "it will take a moment or two to find."]


def test_eager_moves_to_a_clause_that_follows_the_word_count() -> None:
    text = "A long sentence that takes a while to speak, and then it goes on and on."
    assert segment(text) == ["A long sentence that takes a while to speak,", "and then it goes on and on."]


def test_commit_cuts_the_buffer_in_the_same_utterance() -> None:
    seg = Segmenter("none", eager_first=False)
    assert seg.push("Hello there, this is") == []
    assert seg.commit() == ["Hello there, this is"]
    assert seg.commit() == []
    assert seg.push(" the rest.") == []
    assert seg.flush() == ["the rest."]


def test_eager_cuts_at_first_clause() -> None:
    text = "Well, yes, I think so, and then more, and more."
    assert segment(text) == ["Well, yes,", "I think so, and then more, and more."]
    assert segment(text, "clause") == ["Well, yes,", "I think so,", "and then more,", "and more."]


def test_eager_sentence_comes_first_when_short() -> None:
    assert segment("Hi. How are you, my friend? Fine.") == ["Hi.", "How are you, my friend?", "Fine."]


def test_eager_words_parameter() -> None:
    assert segment("a b c d e f g", eager_words=3) == ["a b c", "d e f g"]
    assert segment("a b c d e f", eager_words=3) == ["a b c d e f"]


def test_eager_applies_to_granularity_none() -> None:
    text = "one two three four five six seven eight nine ten eleven twelve. Eleven, twelve thirteen."
    expected = ["one two three four five six seven eight", "nine ten eleven twelve. Eleven, twelve thirteen."]
    assert segment(text, "none") == expected
    assert calm(text, "none") == [text]


def test_eager_cjk_without_punctuation() -> None:
    text = "今天天气很好我们去公园散步吧好不好"
    assert segment(text) == [text[:EAGER_CJK_CHARS], text[EAGER_CJK_CHARS:]]
    assert segment("今天天气很好，我们去公园散步吧好不好") == ["今天天气很好，", "我们去公园散步吧好不好"]


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


@settings(max_examples=60, deadline=None)
@given(case=chunked(st.text(st.characters(codec="utf-8"), max_size=120)))
def test_properties_arbitrary_unicode(case: tuple[str, list[str]]) -> None:
    for granularity in GRANULARITIES:
        _check(*case, granularity, True, 20)
