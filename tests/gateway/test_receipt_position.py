"""What a read receipt says of the listener's position: the audio the client had read (``read_s``), which
the session core takes to refine its listener clock (``Core.read``, tests/protocol/test_receipt_clock.py)."""

from __future__ import annotations

from .test_read_receipts import receipts


def test_a_receipt_says_how_much_audio_the_client_had_read() -> None:
    watched, pings, clock = receipts(timeout_s=4.0)
    assert watched.read_s == 0.0
    for _ in range(3):
        watched.wrote(1.0)  # a ping after each second of audio
    clock.advance(0.5)
    assert watched.pong(pings[1])  # it had read the first two seconds when it answered
    assert watched.read_s == 2.0
    assert watched.pong(pings[0])  # an older ping's pong: no news
    assert watched.read_s == 2.0
    assert watched.pong(pings[2])
    assert watched.read_s == 3.0 and watched.unread_s == 0.0
