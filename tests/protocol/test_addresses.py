"""URLs and e-mail addresses as said aloud (``protocol.addresses``), on their own and in a normalizer."""

from __future__ import annotations

from voxgate.protocol.addresses import domain_at, url_at
from voxgate.protocol.normalize import Normalizer


def test_a_url_is_said_by_its_host_and_ends_before_the_sentence_punctuation() -> None:
    assert url_at("see https://www.example.com/menu?id=42.", 4) == ("example dot com", 38)
    assert url_at("<https://a-b.io>", 1) == ("a dash b dot io", 16)  # an autolink: its ">" goes with it
    assert url_at("example.com", 0) is None


def test_an_address_says_its_domain_after_the_at_sign() -> None:
    assert domain_at("ann@mail.example.com,", 3) == (" at mail dot example dot com", 20)
    assert domain_at("ann@home", 3) is None  # no dot: not a domain


def test_an_at_sign_before_no_domain_is_read_as_written() -> None:
    normalizer = Normalizer("on")
    assert normalizer.feed("ping ann@home now") + normalizer.flush() == "ping ann@home now"
