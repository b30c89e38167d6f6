"""The engine's pace, as one session has seen it: how soon a text's first audio comes, and how long it speaks.

The session core (``protocol.core``) cuts a segment before its sentence ends when waiting would let the
listener run dry. For that it needs two estimates, kept here as moving figures of what this session's
engine did, starting from conservative defaults (so a fresh session cuts too early rather than too late):

- ``first_audio_s(chars)``: from the moment a segment of ``chars`` characters is handed to the engine to
  its first audio. Fitted as ``base + per_char * min(chars, STREAM_CHARS)`` by least squares with
  forgetting over the segments seen (Piper's first audio grows with the text of its first piece, a
  remote engine's first chunk costs about the same for any text), plus the recent worst lateness
  against that fit, decaying (a machine under load makes the engine late in bursts).
- ``audio_s(chars)``: the audio a text of ``chars`` characters gives, at the low end (a slower estimate
  would count audio the listener may not get).

Pure and deterministic: observations come in as numbers; no clock is read.
"""

from __future__ import annotations

from typing import Final

#: Characters after which more text no longer delays first audio: engines stream (Piper's pieces are
#: at most 120 phonemes, about 100 characters; a remote engine streams chunks).
STREAM_CHARS: Final = 100
#: The prior: 0.1 s before any first audio plus 4 ms a character (Piper on one core of a 2-core machine
#: takes about 4.3 ms a phoneme, about one a character; a remote engine's first chunk 0.1-0.2 s): 0.5 s
#: for a 100-character segment, on the slow side of both.
DEFAULT_BASE_S: Final = 0.1
DEFAULT_PER_CHAR_S: Final = 0.004
#: Audio per character until measured: Piper's joe speaks 0.066-0.07 s a character, the fake engine 0.06;
#: the lower, so unsent audio is not overcounted.
DEFAULT_AUDIO_PER_CHAR_S: Final = 0.06
#: The share of the measured audio per character counted for audio not made yet (speech rate varies by
#: about a tenth between sentences). Each percent less is a cut earlier than needed.
AUDIO_SHARE: Final = 0.9
#: Weight of the past at each new observation: about the last ten segments count.
_DECAY: Final = 0.9
#: The same for the audio per character, which varies less and matters from the first segment on.
_AUDIO_DECAY: Final = 0.6
#: Weight of the prior's two points: outweighed by a couple of real segments.
_PRIOR_WEIGHT: Final = 0.5


class Pace:
    """Moving estimates of one engine's time to first audio and its audio per character."""

    def __init__(self) -> None:
        # Exponentially weighted sums for the fit of latency on characters: w, x, y, xx, xy.
        self._sums = [0.0] * 5
        for chars in (10, STREAM_CHARS):
            self._add(chars, DEFAULT_BASE_S + DEFAULT_PER_CHAR_S * chars, _PRIOR_WEIGHT)
        self._audio_per_char_s = DEFAULT_AUDIO_PER_CHAR_S
        self._late_s = 0.0  # the recent worst lateness of first audio against the fit, decaying

    def first_audio_s(self, chars: int) -> float:
        """The estimated time from handing a text of ``chars`` characters to the engine to its first audio."""
        w, x, y, xx, xy = self._sums
        spread = w * xx - x * x
        per_char = max(0.0, (w * xy - x * y) / spread) if spread > 1e-9 else 0.0
        base = max(0.0, (y - per_char * x) / w)
        return base + per_char * min(chars, STREAM_CHARS) + self._late_s

    def audio_s(self, chars: int) -> float:
        """The audio a text of ``chars`` characters is sure to give, about (the low end of the estimate)."""
        return chars * self._audio_per_char_s * AUDIO_SHARE

    def first_audio(self, chars: int, latency_s: float) -> None:
        """A segment of ``chars`` characters gave its first audio ``latency_s`` after it was started."""
        late = latency_s - (self.first_audio_s(chars) - self._late_s)
        self._late_s = max(late, self._late_s * _DECAY, 0.0)
        self._sums = [s * _DECAY for s in self._sums]
        self._add(min(chars, STREAM_CHARS), max(0.0, latency_s), 1.0)

    def spoken(self, chars: int, audio_s: float) -> None:
        """A segment of ``chars`` characters gave ``audio_s`` seconds of audio in all."""
        if chars > 0 and audio_s > 0:
            self._audio_per_char_s += (audio_s / chars - self._audio_per_char_s) * (1 - _AUDIO_DECAY)

    def _add(self, chars: int, latency_s: float, weight: float) -> None:
        x = float(chars)
        for i, value in enumerate((1.0, x, latency_s, x * x, x * latency_s)):
            self._sums[i] += weight * value
