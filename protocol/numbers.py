"""English number words for the text normalizer (``protocol.normalize``): what a listener should hear for
the numbers, dates, times, amounts, percentages and phone numbers an LLM writes.

Pure functions from written forms to words. Each ``say_*`` takes a match of its pattern (``PATTERNS``) and
returns the words; ``spell`` tries every pattern on one token and answers None for text that is no number.
Some front ends misread these forms (espeak, under Piper, read "12/05/2026" as "12-0-5-2,26" and
"$1,234.56" as "$1,234.5. 6"); engines that read them well get the written form (``text_normalization``
``auto``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

_ONES: Final = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
_TENS: Final = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
# Powers of a thousand, as far as English readers say them; past these a number is read digit by digit.
_SCALES: Final = ("", "thousand", "million", "billion", "trillion")
_ORDINAL_WORDS: Final = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
_MONTHS: Final = (
    "January February March April May June July August September October November December".split()
)
_CURRENCIES: Final = {
    "$": ("dollar", "cent"),
    "€": ("euro", "cent"),
    "£": ("pound", "penny"),
    "¥": ("yen", ""),
}
_SUFFIXES: Final = {
    "k": "thousand",
    "K": "thousand",
    "M": "million",
    "m": "million",
    "B": "billion",
    "bn": "billion",
}


def cardinal(n: int) -> str:
    """``n`` in words: ``cardinal(1234)`` is "one thousand two hundred thirty-four".

    Numbers of a quadrillion and more are read digit by digit (nobody says them otherwise).
    """
    if n < 0:
        return "minus " + cardinal(-n)
    if n >= 1000 ** len(_SCALES):
        return digits(str(n))
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {cardinal(rest)}" if rest else "")
    words: list[str] = []
    for scale in reversed(range(1, len(_SCALES))):
        part, n = divmod(n, 1000**scale)
        if part:
            words.append(f"{cardinal(part)} {_SCALES[scale]}")
    if n:
        words.append(cardinal(n))
    return " ".join(words)


def ordinal(n: int) -> str:
    """``n`` as an ordinal: "first", "twenty-second", "one hundredth"."""
    words = cardinal(n)
    head, sep, last = words.rpartition("-") if "-" in words.rsplit(" ", 1)[-1] else words.rpartition(" ")
    if last in _ORDINAL_WORDS:
        last = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return head + sep + last


def digits(text: str) -> str:
    """Each digit of ``text`` in words ("one two three"); other characters are left out."""
    return " ".join(_ONES[int(ch)] for ch in text if ch.isdigit())


def year(n: int) -> str:
    """``n`` read as a year: "nineteen ninety-nine", "two thousand five", "twenty twenty-six"."""
    high, low = divmod(n, 100)
    if high % 10 == 0 and low < 10:  # 2000, 2005: "two thousand five"
        return cardinal(n)
    return f"{cardinal(high)} " + (
        "hundred" if low == 0 else f"oh {_ONES[low]}" if low < 10 else cardinal(low)
    )


def decimal(text: str) -> str:
    """A number with optional thousands commas and decimals: "1,234.5" -> "one thousand ... point five"."""
    whole, _, fraction = text.replace(",", "").partition(".")
    words = cardinal(int(whole or "0"))
    return f"{words} point {digits(fraction)}" if fraction else words


def say_money(m: re.Match[str]) -> str:
    """``$12.99`` -> "twelve dollars and ninety-nine cents"; ``$5M`` -> "five million dollars"."""
    unit, cent = _CURRENCIES[m["cur"]]
    amount, suffix = m["amount"], m["suffix"]
    units = unit if unit == "yen" else unit + "s"
    if suffix:
        return f"{decimal(amount)} {_SUFFIXES[suffix]} {units}"
    whole, _, fraction = amount.replace(",", "").partition(".")
    n = int(whole)
    if len(fraction) == 2 and cent and int(fraction):  # yen has no cents
        c = int(fraction)
        cents = f"{cardinal(c)} " + (cent if c == 1 else "pence" if cent == "penny" else cent + "s")
        return cents if n == 0 else f"{cardinal(n)} {unit if n == 1 else units} and {cents}"
    if fraction.strip("0"):
        return f"{decimal(amount)} {units}"
    return f"{cardinal(n)} {unit if n == 1 else units}"


def say_percent(m: re.Match[str]) -> str:
    """``12.5%`` -> "twelve point five percent"."""
    return f"{'minus ' if m['sign'] else ''}{decimal(m['amount'])} percent"


def say_number(m: re.Match[str]) -> str:
    """A plain number (``-3``, ``1,234``, ``3.14``); a four-digit one from 1100 to 2099 is read as a year."""
    sign, amount = m["sign"], m["amount"]
    return f"minus {decimal(amount)}" if sign else _amount(amount)


def _amount(amount: str) -> str:
    """A number without sign: a four-digit one from 1100 to 2099 as a year, others as ``decimal``."""
    if len(amount) == 4 and amount.isdigit() and 1100 <= int(amount) <= 2099:
        return year(int(amount))
    return decimal(amount)


def say_ordinal(m: re.Match[str]) -> str:
    """``21st`` -> "twenty-first"."""
    return ordinal(int(m["n"]))


def say_date(m: re.Match[str]) -> str:
    """``12/05/2026`` (month first, as in the US) or ``2026-12-05`` -> "December fifth, twenty twenty-six"."""
    month, day = int(m["month"]), int(m["day"])
    y = int(m["year"])
    return f"{_MONTHS[month - 1]} {ordinal(day)}, {year(y + 2000 if y < 100 else y)}"


def say_time(m: re.Match[str]) -> str:
    """``10:30`` -> "ten thirty", ``9:05pm`` -> "nine oh five P M", ``10am`` -> "ten A M"."""
    hour, minute = int(m["hour"]), int(m["minute"] or "0")
    words = cardinal(hour)
    if minute:
        words += f" oh {_ONES[minute]}" if minute < 10 else f" {cardinal(minute)}"
    elif not m["ampm"]:
        words += " o'clock" if hour <= 12 else " hundred"
    if m["ampm"]:
        words += " " + " ".join(m["ampm"].replace(".", "").upper())
    return words


def say_phone(m: re.Match[str]) -> str:
    """``+1 555-123-4567``: its digits one by one, a pause between groups."""
    groups = [g for g in re.split(r"[^0-9]+", m[0]) if g]
    head = "plus " if m[0].startswith("+") else ""
    return head + ", ".join(digits(g) for g in groups)


def say_range(m: re.Match[str]) -> str:
    """``10-20`` -> "ten to twenty"."""
    return f"{_amount(m['a'])} to {_amount(m['b'])}"


_AMOUNT: Final = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
#: Each written form, tried in order on the text of one token (without the punctuation around it).
PATTERNS: Final[tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...]] = (
    (re.compile(r"\+?\d{1,3}[-.]\d{3}[-.]\d{3}[-.]\d{4}|\(?\d{3}\)?[-.]\d{3}[-.]\d{4}"), say_phone),
    (re.compile(r"(?P<month>1[0-2]|0?[1-9])/(?P<day>3[01]|[12]\d|0?[1-9])/(?P<year>\d{4}|\d{2})"), say_date),
    (re.compile(r"(?P<year>\d{4})-(?P<month>1[0-2]|0[1-9])-(?P<day>3[01]|[12]\d|0[1-9])"), say_date),
    (
        re.compile(r"(?P<hour>[01]?\d|2[0-3])(?::(?P<minute>[0-5]\d))?(?P<ampm>[ap]\.?m\.?|[AP]\.?M\.?)"),
        say_time,
    ),
    (re.compile(r"(?P<hour>[01]?\d|2[0-3]):(?P<minute>[0-5]\d)(?P<ampm>)"), say_time),
    (re.compile(rf"(?P<cur>[$€£¥])(?P<amount>{_AMOUNT})(?P<suffix>bn|[kKMmB])?"), say_money),
    (re.compile(rf"(?P<sign>-?)(?P<amount>{_AMOUNT})%"), say_percent),
    (re.compile(r"(?P<n>\d+)(?:st|nd|rd|th)"), say_ordinal),
    (re.compile(r"(?P<a>\d+(?:\.\d+)?)[-–](?P<b>\d+(?:\.\d+)?)"), say_range),
    (re.compile(rf"(?P<sign>-?)(?P<amount>{_AMOUNT})"), say_number),
)


def spell(text: str) -> str | None:
    """The words for ``text`` when the whole of it is one written number form, else None.

    Args:
        text: one token without the punctuation around it ("$12.99", "12/05/2026", "10am", "3.5%").
    """
    for pattern, say in PATTERNS:
        m = pattern.fullmatch(text)
        if m is not None:
            return say(m)
    return None


# A number-like run at the start of a word; ``spell`` decides what, if anything, it is.
_NUMBERISH: Final = re.compile(r"[-+(]?[$€£¥]?\d[\w$€£¥%+\-–.,:/()]*")
# The plain number that starts a number-like run that is no number as a whole ("1,2,3").
_LEADING: Final = re.compile(r"[$€£¥]?\d+(?:\.\d+)?")


def spell_at(text: str, i: int) -> tuple[str, int] | None:
    """The words for the number that starts at ``text[i]`` (a word's start), and where it ends; None if none.

    The number-like run there is tried whole, without the punctuation after it ("12.99." is "12.99"), then
    its leading plain number ("1,2,3" starts with "1"); a number glued to letters ("3D") is none.
    """
    m = _NUMBERISH.match(text, i)
    if m is None:
        return None
    lead = _LEADING.match(m[0])
    for written in (m[0], m[0].rstrip(".,;:!?)"), lead[0] if lead else ""):
        end = i + len(written)
        if written and (end == len(text) or not text[end].isalnum()) and (said := spell(written)):
            return said, end
    return None
