"""Tests for protocol.normalize and protocol.numbers: each rule by example, properties over random splits."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from voxgate.protocol.alignment import WordNamer
from voxgate.protocol.normalize import Alias, Normalizer, TextNormalization, is_emoji
from voxgate.protocol.numbers import cardinal, digits, ordinal, spell, year
from voxgate.protocol.segmenter import Segmenter

# The three examples (issue 33), as an LLM writes them.
MARKDOWN_REPLY = (
    "**Sure!** Here are three options:\n\n1. *Pizza* for $12.99\n2. `sushi_roll` at "
    "https://example.com/menu?id=42\n3. ~~Tacos~~ Burgers.\n\n### Summary\n- Total: 3 items"
)
STEPS = "Here are the steps:\n1. Open the app\n2. Tap settings\n3. Choose voice\nThat is all"
EMOJI = "Great job! 🎉🎉 See you at 10am 👋"


def spoken(text: str | list[str], mode: TextNormalization = "on", **kwargs: object) -> str:
    """Feed ``text`` (whole, or in the pieces given) through a fresh normalizer, then flush."""
    norm = Normalizer(mode, **kwargs)  # type: ignore[arg-type]
    pieces = [text] if isinstance(text, str) else text
    return "".join(norm.feed(piece) for piece in pieces) + norm.flush()


def segments(text: str, mode: TextNormalization = "on", step: int = 4) -> list[str]:
    """The segments a segmenter cuts from ``text`` normalized, streamed ``step`` characters at a time."""
    norm, seg = Normalizer(mode), Segmenter(eager_first=False)
    out: list[str] = []
    for i in range(0, len(text), step):
        out += seg.push(norm.feed(text[i : i + step]))
    return out + seg.push(norm.flush()) + seg.flush()


def words(text: str) -> str:
    return " ".join(text.split())


# --- the examples -----------------------------------------------------------------------


def test_markdown_reply_is_spoken_without_markup_one_segment_per_item() -> None:
    assert segments(MARKDOWN_REPLY) == [
        "Sure!",
        "Here are three options:",
        "one, Pizza for twelve dollars and ninety-nine cents",
        "two, sushi roll at example dot com",
        "three,  Burgers.",
        "Summary",
        "Total: three items",
    ]


def test_each_list_item_is_its_own_segment() -> None:
    assert segments(STEPS) == [
        "Here are the steps:",
        "one, Open the app",
        "two, Tap settings",
        "three, Choose voice",
        "That is all",
    ]


def test_emoji_are_not_read_and_times_are_written_out() -> None:
    assert words(spoken(EMOJI)) == "Great job! See you at ten A M"
    assert words(spoken(EMOJI, keep_emoji=True)) == "Great job! 🎉🎉 See you at ten A M 👋"


def test_off_is_todays_reading() -> None:
    norm = Normalizer("off")
    assert norm.feed(MARKDOWN_REPLY) == MARKDOWN_REPLY
    assert norm.commit() == ""
    assert norm.flush() == ""
    assert norm.source("**Sure!**") == ("**Sure!**", list(range(9)))
    assert norm.origins == []


def test_auto_writes_numbers_out_only_when_asked() -> None:
    assert words(spoken("Pay $12.99 now", "auto")) == "Pay twelve dollars and ninety-nine cents now"
    assert words(spoken("Pay $12.99 now", "auto", expand_numbers=False)) == "Pay $12.99 now"
    assert words(spoken("1. **Pay** $12.99", "auto", expand_numbers=False)) == "1, Pay $12.99"
    assert words(spoken("Pay $12.99", "off", expand_numbers=True)) == "Pay $12.99"


# --- markdown -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("**bold** and __strong__ and *it* and _em_", "bold and strong and it and em"),
        ("a snake_case name", "a snake case name"),
        ("trailing_ _lead", "trailing lead"),
        ("run `pip install`", "run pip install"),
        ("see [the docs](https://x.io/a_(b)) now", "see the docs now"),
        ("[a](b) c", "a c"),
        ("see ![a logo](logo.png) here", "see here"),
        ("![x]y z", "y z"),
        ("![alt](a b) c", "c"),
        ("<b>bold</b> <a href='x'\ntitle='y'>link</a><br/>", "bold link"),
        ("a < b and <3", "a < b and <three"),
        ("if x <y then <B>z</b> <!-- note -->", "if x <y then z"),
        ("go to <https://example.com/x>.", "go to example dot com."),
        ("~~old text~~ new", "new"),
        ("x ~~gone", "x"),
        ("x ~~gone\n\nback <b\n\nagain [a](b\n\nhere", "x back again a here"),
        ("https://www.example.com/menu?id=42.", "example dot com."),
        ("www.foo-bar.org", "foo dash bar dot org"),
        ("http://", "http://"),
        (
            "mail ann.lee_x@mail.example.com, now",
            "mail ann.lee x at mail dot example dot com, now",
        ),
        ("an @ sign", "an @ sign"),
        ("x86 and GPT4 and 3D", "x86 and GPT4 and 3D"),
        ("a|b", "a,b"),
        ("=> é", "=> é"),
    ],
)
def test_inline_markup(text: str, said: str) -> None:
    assert words(spoken(text)).replace(" ,", ",") == said


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("# Title\nbody", "Title | body"),
        ("## Sub", "Sub"),
        ("#hashtag text", "hashtag text"),
        ("order #4821, C# and a#b #", "order number four thousand eight hundred twenty-one, C# and a#b"),
        ("- one\n* two\n+ three", "one | two | three"),
        ("  - indented", "indented"),
        ("> quoted\n> - item", "quoted | item"),
        (">quoted", "quoted"),
        ("a\n---\nb", "a | b"),
        ("| A | B |\n|---|:-:|\n| 1 | 2 |", "A, B, | one, two,"),
        ("| A | B |\n| --- | --- |", "A, B,"),
        ("```python\nx = 1\ny\n```\nafter", "x = 1 | y | after"),
        ("~~~\ncode\n~~~", "code"),
        ("``` python extra\ncode\n```", "code"),
        ("1) first\n10. tenth", "one, first | ten, tenth"),
        ("soft\nwrap", "soft wrap"),
    ],
)
def test_line_markup(text: str, said: str) -> None:
    """Lines of blocks end their segment (shown here as " | ")."""
    out = spoken(text).replace("\n\n", " | ")
    assert " | ".join(p for p in (words(p) for p in out.split("|")) if p).replace(" ,", ",") == said


def test_pronunciations_replace_whole_words() -> None:
    aliases = [
        Alias("SQL", "sequel"),
        Alias("nguyen", "win", case_sensitive=False),
        Alias("SQLite", "S Q lite"),
    ]
    out = spoken("SQL, sql, SQLs, SQLite and NGUYEN. **SQL**", aliases=aliases)
    assert words(out) == "sequel, sql, SQLs, S Q lite and win. sequel"


def test_pronunciations_of_several_words_match_whole_across_pieces() -> None:
    aliases = [
        Alias("New York", "the big apple"),
        Alias("New York City", "N Y C"),
        Alias("big data", "large data", case_sensitive=False),
    ]
    text = "New York, New  York City! **New York** New Jersey. Big Data; New\nYork; New Yorker, New York"
    said = "the big apple, N Y C! the big apple New Jersey. large data; New York; New Yorker, the big apple"
    assert words(spoken(text, aliases=aliases)) == said
    assert words(spoken(list(text), aliases=aliases)) == said  # one character a message
    assert words(spoken(["New", " Yo", "rk City", " is"], aliases=aliases)) == "N Y C is"
    assert words(spoken("~~New York~~ Boston", aliases=aliases)) == "Boston"  # struck: left out


def test_the_longest_pronunciation_wins_and_what_follows_a_shorter_one_is_read() -> None:
    aliases = [Alias("a b", "one"), Alias("a b c d", "two"), Alias("c", "three")]
    assert words(spoken("a b c e", aliases=aliases)) == "one three e"
    assert words(spoken("a b c d e", aliases=aliases)) == "two e"
    assert words(spoken("a a b", aliases=aliases)) == "a one"


def test_a_first_word_waits_only_while_a_pronunciation_may_match() -> None:
    norm = Normalizer("on", aliases=[Alias("New York", "the big apple")])
    assert norm.feed("I love New ") == "I love "
    assert norm.pending == "New "
    assert norm.feed("Jersey ") == "New Jersey "
    assert norm.feed("New") == ""
    assert norm.commit() == "New"  # nothing comes after it: read as written
    assert norm.feed(" New ") == " "
    assert norm.commit() == "New "


def test_a_pronunciation_kept_as_written_is_out_of_every_other_rule() -> None:
    """An ``ipa`` entry's words (alias None) reach the engine as written: no number, URL or other rule."""
    keep = [Alias("2024", None), Alias("web site", None, case_sensitive=False)]
    assert words(spoken("In 2024 and 2025, the Web Site", aliases=keep)) == (
        "In 2024 and twenty twenty-five, the Web Site"
    )


def test_a_pronunciation_of_several_words_names_the_client_characters() -> None:
    text = "go to **New  York** now"
    norm = Normalizer("on", aliases=[Alias("New York", "the big apple")])
    out = norm.feed(text) + norm.flush()
    assert out == "go to the big apple now"
    named, origins = norm.source(out)
    namer = WordNamer(out, named, origins)
    assert [namer.name(w) for w in out.split()] == ["go", "to", "New  York", "", "", "now"]


# --- numbers --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("$12.99", "twelve dollars and ninety-nine cents"),
        ("$1,234.56", "one thousand two hundred thirty-four dollars and fifty-six cents"),
        ("$1", "one dollar"),
        ("$1.00", "one dollar"),
        ("$0.01", "one cent"),
        ("$2.5", "two point five dollars"),
        ("$5M", "five million dollars"),
        ("£3.01", "three pounds and one penny"),
        ("£3.50", "three pounds and fifty pence"),
        ("€2.01", "two euros and one cent"),
        ("¥500", "five hundred yen"),
        ("¥5.25", "five point two five yen"),
        ("12/05/2026", "December fifth, twenty twenty-six"),
        ("1/2/26", "January second, twenty twenty-six"),
        ("2026-05-12", "May twelfth, twenty twenty-six"),
        ("10am", "ten A M"),
        ("9:05p.m.", "nine oh five P M"),
        ("10:30", "ten thirty"),
        ("10:00", "ten o'clock"),
        ("14:00", "fourteen hundred"),
        ("50%", "fifty percent"),
        ("-3.5%", "minus three point five percent"),
        ("+1-555-123-4567", "plus one, five five five, one two three, four five six seven"),
        ("(555)-123-4567", "five five five, one two three, four five six seven"),
        ("21st", "twenty-first"),
        ("3rd", "third"),
        ("100th", "one hundredth"),
        ("90th", "ninetieth"),
        ("10-20", "ten to twenty"),
        ("1990–1995", "nineteen ninety to nineteen ninety-five"),
        ("2026", "twenty twenty-six"),
        ("2000", "two thousand"),
        ("2005", "two thousand five"),
        ("1905", "nineteen oh five"),
        ("1900", "nineteen hundred"),
        ("1,000,000", "one million"),
        ("3.14", "three point one four"),
        ("-7", "minus seven"),
        ("0", "zero"),
        (
            "1000000000000000",
            "one zero zero zero zero zero zero zero zero zero zero zero zero zero zero zero",
        ),
        ("hello", None),
        ("1e5", None),
    ],
)
def test_spell(text: str, said: str | None) -> None:
    assert spell(text) == said


def test_number_words() -> None:
    assert cardinal(1_002_003) == "one million two thousand three"
    assert cardinal(-45) == "minus forty-five"
    assert ordinal(22) == "twenty-second"
    assert year(1066) == "ten sixty-six"
    assert digits("a1b2") == "one two"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("It costs $12.99.", "It costs twelve dollars and ninety-nine cents."),
        ("I have 2.", "I have two."),
        ("**$5**!", "five dollars!"),
        ("Call (555) now", "Call (five hundred fifty-five) now"),
        ("1,2,3", "one,two,three"),
        ("3.5x faster", "3.5x faster"),
        ("COVID-19 and v2", "COVID-nineteen and v2"),
        ("12/05/2026,", "December fifth, twenty twenty-six,"),
        ("at 3:", "at three:"),
    ],
)
def test_numbers_in_text(text: str, said: str) -> None:
    assert words(spoken(text)) == said


def test_emoji_ranges() -> None:
    assert all(is_emoji(c) for c in "🎉👋☀⌚⬛\u200d\ufe0f\U000e0067")
    assert not any(is_emoji(c) for c in "a1é中—")


# --- the map back to the client's characters ------------------------------------------------------


def test_origins_name_the_clients_characters() -> None:
    norm = Normalizer("on")
    out = norm.feed("**Hi** $5 ") + norm.flush()
    assert out == "Hi five dollars "
    assert norm.origins[:2] == [2, 3]
    assert norm.origins[3:15] == [7] + [8] * 11  # "five dollars" stands for "$5": its first, then its last


def test_source_names_each_segment_in_the_clients_text() -> None:
    norm, seg = Normalizer("on"), Segmenter(eager_first=False)
    texts = seg.push(norm.feed(MARKDOWN_REPLY)) + seg.push(norm.flush()) + seg.flush()
    assert [norm.source(t)[0] for t in texts] == [
        "Sure!",
        "Here are three options:",
        "1. *Pizza* for $12.99",
        "2. `sushi_roll` at https://example.com/menu?id=42",
        "3. ~~Tacos~~ Burgers.",
        "Summary",
        "Total: 3 items",
    ]
    assert norm.source("never said") == ("never said", list(range(10)))
    assert norm.source("") == ("", [])


def test_source_maps_each_spoken_character_into_the_segments_own_text() -> None:
    norm = Normalizer("on")
    said = norm.feed("Pay **$5** now.") + norm.flush()
    assert said == "Pay five dollars now."
    source, origins = norm.source(said)
    assert source == "Pay **$5** now."
    assert origins[:4] == [0, 1, 2, 3] and origins[4:16] == [6] + [7] * 11 and origins[-1] == 14


def test_source_after_reset_counts_from_there() -> None:
    norm = Normalizer("on")
    norm.feed("dropped text ")
    norm.reset()
    said = norm.feed("**kept** ")
    assert said.strip() == "kept"
    assert norm.source("kept") == ("kept", [0, 1, 2, 3])
    assert norm.commit() == ""
    assert norm.pending == ""
    assert norm.feed("tail") == "tail"  # a plain word is read at once
    assert norm.pending == "tail"  # but held: it may go on
    assert norm.feed("s") == "s"
    assert norm.feed("_x") == ""
    assert norm.commit() == " x"


# --- properties -----------------------------------------------------------------------------------

# Text built from the pieces that matter: markup, numbers, URLs, emoji, words, and every kind of space.
_PIECES = st.sampled_from(
    [
        *("**", "*", "_", "__", "~~", "`", "```", "#", "##", "-", "+", ">", "|", "1.", "2)", "[", "](", ")"),
        *("![", "<b>", "</b>", "<", "https://example.com/a?b=1", "www.x.io", "a.b@c.de", "$12.99"),
        *("12/05/2026", "10am", "50%", "555-123-4567", "3rd", "2026", "SQL", "Hello", "world", "x", "🎉"),
        *("é", ".", ",", "!", " ", " ", "\n", "\n\n", "\t"),
    ]
)
_TEXT = st.lists(_PIECES, max_size=40).map("".join)
_MODES = st.sampled_from(["on", "auto", "off"])


def _run(text: str, cuts: list[int], mode: str) -> tuple[str, list[int]]:
    aliases = [Alias("SQL", "sequel"), Alias("Hello world", "hi"), Alias("x world x", None)]
    norm = Normalizer(mode, aliases=aliases)  # type: ignore[arg-type]
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    out = "".join(norm.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)) + norm.flush()
    return out, list(norm.origins)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXT, st.lists(st.integers(min_value=0, max_value=10_000), max_size=12), _MODES)
def test_any_split_speaks_as_the_whole(text: str, cuts: list[int], mode: str) -> None:
    assert _run(text, cuts, mode) == _run(text, [], mode)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXT, st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_origins_are_monotonic_and_in_range(text: str, cuts: list[int]) -> None:
    out, origins = _run(text, cuts, "on")
    assert len(origins) == len(out)
    assert origins == sorted(origins)
    assert all(0 <= at < len(text) for at in origins)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.lists(st.integers(min_value=0, max_value=10_000), max_size=8))
def test_any_text_any_split(text: str, cuts: list[int]) -> None:
    out, origins = _run(text, cuts, "on")
    assert (out, origins) == _run(text, [], "on")
    assert origins == sorted(origins)


def test_a_long_run_without_spaces_is_read_in_pieces_the_same_for_any_split() -> None:
    text = "ab" * 1200 + " end"
    whole = spoken(text)
    assert whole == spoken([text[:7], text[7:1500], text[1500:]]) == text
    norm = Normalizer("on")
    assert norm.feed("x1" * 600) == "x1" * 500  # a full token's worth is read, the rest held
    assert norm.pending == "x1" * 100
