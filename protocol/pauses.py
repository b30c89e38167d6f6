"""Sentence pauses: silence written after a sentence while the next one's audio is not there yet.

A speaker pauses 150-400 ms after a sentence ("Sure!" ... "I can definitely help"). When the text comes
slowly (an LLM at 6 words a second), the next segment's audio may not exist when the listener has heard
the sentence: the words it needs have not all arrived (a cut leaves no word alone) and the engine then
needs its first-audio time. Without more audio a player's buffer runs dry, which a listener hears as a
dropout, not as a pause. So the session core (``protocol.core``) writes silence instead, as audio frames,
after a segment that ends a sentence, while the utterance's next audio is not made:

- only when the listener's audio ahead (written, played in real time from its first frame) is down to
  ``LEAD_S``: a pause is written just in time, ``CHUNK_S`` (whole frames) at a time, and never
  while the next audio is made (it goes out instead);
- at most ``MAX_S`` per sentence end: a longer wait is a gap, as before;
- only after a segment that ends a sentence (never inside one: a pause there breaks the phrase), of an
  utterance not ended, streamed, with timed cuts on (the listener clock, docs/protocol.md §5), and only
  once its text goes on (its next segment is cut, or text of it has come): a client that sent a sentence
  and waits hears no pause.

The pause is the end of the segment before it while the next one has not started, else the start of the
next one, before its first audio (its words' times count from after it). So the ``audio.done`` of a segment
that ends a sentence, in an utterance not ended, waits until the next segment starts, or until the
listener has nearly heard it (``LEAD_S`` left) when no pause is written, or until its pause is over.
Text that arrives in time never meets a pause: its audio is made before the listener runs low.

Pure: the core passes the time in.
"""

from __future__ import annotations

import math
from typing import Final

from . import boundaries

#: The longest pause written at one sentence end: a speaker's long pause.
MAX_S: Final = 0.4
#: The audio ahead of the listener below which a pause chunk is written: the time to write a frame.
LEAD_S: Final = 0.05
#: The pause written at a time, rounded up to whole frames: a frame of 20 ms or more (a 40 ms frame at the
#: default ``frame_ms``), so a pause is no longer than needed by more than a frame.
CHUNK_S: Final = 0.02
#: A pause whose time passed by more than this is not written: the listener has run dry (unless its
#: player buffers), and silence now would only delay the next words.
LATE_S: Final = 0.1


def ends_sentence(text: str) -> bool:
    """Whether a segment's ``text`` ends a sentence (``boundaries.SENTENCE_MARKS``, closers after)."""
    return text.rstrip().rstrip(boundaries.CLOSERS)[-1:] in boundaries.SENTENCE_MARKS


def chunk_samples(sample_rate: int, frame_samples: int, paused_s: float) -> int:
    """Samples of silence to write next, ``paused_s`` having been written at this sentence end: ``CHUNK_S``
    in whole frames, no more than what is left of ``MAX_S``."""
    frames = max(1, math.ceil(CHUNK_S * sample_rate / frame_samples))
    left = max(0, round((MAX_S - paused_s) * sample_rate))
    return min(frames * frame_samples, left)
