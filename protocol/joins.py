"""Joins without clicks: a few milliseconds of fade where a segment or a piece starts or ends mid-sound.

Audio that starts or stops on a sample far from zero clicks: the step from silence (or from the last
sample of the segment before) is a broadband transient. An engine's segment ends where its text ends,
not on a zero crossing (a piece of a sentence cut to be in time ends mid-phrase; a remote engine's last
chunk may end anywhere). So every segment's first and last ``FADE_S`` are ramped, on every engine: the
session core applies a :class:`Fader` to each segment's audio as it comes (``Core.audio``), and Piper
applies :func:`fade` to each piece it joins inside a segment. A fade over audio that starts or ends in
silence changes nothing audible.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from .audio import Samples

#: Length of each ramp: shorter than any phoneme's onset, long enough that a step becomes a ramp with no
#: click (a 4 ms raised cosine puts the transient's energy below 250 Hz).
FADE_S: Final = 0.004


def _ramp(length: int) -> Samples:
    """A raised-cosine ramp from near 0 up to near 1 over ``length`` samples."""
    return (0.5 - 0.5 * np.cos(np.pi * (np.arange(length) + 0.5) / length)).astype(np.float32)


def fade(samples: Samples, sample_rate: int) -> Samples:
    """``samples`` with its first and last ``FADE_S`` ramped in and out (a copy; shorter: both overlap).

    Args:
        samples: one piece of audio, whole.
        sample_rate: its rate.

    Returns:
        The faded audio (float32), the same length.
    """
    out = np.array(samples, dtype=np.float32)
    ramp = _ramp(max(1, round(FADE_S * sample_rate)))[: len(out)]
    k = len(ramp)
    out[:k] *= ramp
    out[len(out) - k :] *= ramp[::-1]
    return out


class Fader:
    """One segment's audio as it streams, its first and last ``FADE_S`` ramped.

    The last ``FADE_S`` of what was pushed is held back until more comes (then it is not the end) or
    :meth:`end` (then it is faded out), so a segment of any number of chunks is faded once at each end.

    Args:
        sample_rate: the rate of the audio pushed (the engine's).
    """

    def __init__(self, sample_rate: int) -> None:
        self._n = max(1, round(FADE_S * sample_rate))
        self._ramp = _ramp(self._n)
        self._pos = 0  # samples pushed so far
        self._held: Samples = np.zeros(0, dtype=np.float32)

    def push(self, samples: Samples) -> Samples:
        """Take the next chunk; return the audio now safe to send (all but the last ``FADE_S``)."""
        new = np.array(samples, dtype=np.float32)
        if self._pos < self._n:
            k = min(self._n - self._pos, len(new))
            new[:k] *= self._ramp[self._pos : self._pos + k]
        self._pos += len(new)
        audio = np.concatenate([self._held, new]) if self._held.size else new
        keep = min(self._n, len(audio))
        self._held = audio[len(audio) - keep :]
        return audio[: len(audio) - keep]

    def end(self) -> Samples:
        """The segment ended: the audio held back, faded out."""
        held, self._held = self._held, np.zeros(0, dtype=np.float32)
        return held * self._ramp[: len(held)][::-1]
