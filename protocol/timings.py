"""The messages that report an utterance's audio and timings: word timings, ``audio.done``, ``session.done``.

Built from the core's records (``protocol.utterances``) when the core hands them out: word timings as an
``audio.chunk`` before the audio they describe, in milliseconds on the utterance's output clock (the clock
of ``audio.start``'s ``start_sample``); each segment's ``audio.done`` and each utterance's ``session.done``
with their metrics once written.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .alignment import WordNamer
from .messages import AudioDone, AudioStart, SessionDone, WordTimestamp, WordTimestamps, wire_context_id
from .utterances import Segment, Utterance


def word_timestamps(
    u: Utterance, sentence: int, length: int, rate: int, words: Sequence[tuple[str, int, int]]
) -> WordTimestamps:
    """The ``audio.chunk`` of the word timings that come with ``length`` samples of engine audio at ``rate``
    in segment ``sentence``; each word's end is kept too, in the segment's text (``listener.spoken_cut``)."""
    seg = u.segments[sentence]
    # Resampling keeps time, so engine seconds into the segment are output seconds into it.
    base = seg.clock.start_ms + seg.clock.engine_s * 1000.0

    def ms(sample: int) -> float:
        return round(base + sample * 1000.0 / rate, 2)

    msg = WordTimestamps(
        utterance_index=u.index,
        sentence_index=sentence,
        chunk_id=seg.words.chunks,
        chunk_start_ms=ms(0),
        chunk_end_ms=ms(length),
        sample_rate=u.packer.sample_rate,
        timestamps=_named(seg.words.namer, [(w, ms(start), ms(end)) for w, start, end in words]),
        context_id=wire_context_id(u.context_id),
    )
    seg.words.chunks += 1
    _keep_ends(seg, base, rate, words)
    return msg


def audio_start(u: Utterance, sentence: int, start: int) -> AudioStart:
    """The ``audio.start`` of segment ``sentence``, its first sample ``start`` on the utterance's clock."""
    return AudioStart(
        utterance_index=u.index,
        sentence_index=sentence,
        sentence_text=u.segments[
            sentence
        ].words.source,  # the client's text (its text is what the engine says)
        format=u.packer.fmt,
        sample_rate=u.packer.sample_rate,
        start_sample=start,
        word_timestamps=True if u.words else msgspec.UNSET,
        context_id=wire_context_id(u.context_id),
    )


def audio_done(u: Utterance, sentence: int) -> AudioDone:
    """The ``audio.done`` of segment ``sentence``, its audio all written."""
    seg = u.segments[sentence]
    ready = seg.times.first_sent_t - seg.times.ready_t if seg.times.first_sent_t is not None else None
    return AudioDone(
        utterance_index=u.index,
        sentence_index=sentence,
        total_bytes=seg.total_bytes,
        duration_ms=round(seg.samples * 1000.0 / u.packer.sample_rate, 2),
        error=seg.error,
        text_to_first_audio_ms=_ms(ready),
        synthesis_ms=_ms(seg.times.synthesis_s) or 0.0,
        context_id=wire_context_id(u.context_id),
    )


def session_done(u: Utterance) -> SessionDone:
    """The ``session.done`` of ``u``, all its audio written."""
    first = None
    if u.times.first_audio_t is not None and u.times.first_text_t is not None:
        first = u.times.first_audio_t - u.times.first_text_t
    return SessionDone(
        utterance_index=u.index,
        total_sentences=u.counts.total or 0,
        first_text_to_first_audio_ms=_ms(first),
        audio_ms=round(u.packer.samples_sent * 1000.0 / u.packer.sample_rate, 2),
        synthesis_ms=_ms(u.times.synthesis_s) or 0.0,
        context_id=wire_context_id(u.context_id),
    )


def _keep_ends(seg: Segment, base: float, rate: int, words: Sequence[tuple[str, int, int]]) -> None:
    folded = seg.text.lower() if len(seg.text.lower()) == len(seg.text) else seg.text
    for w, _, end in words:  # where each word ends in the segment's text, for ``spoken_cut``
        at = folded.find(w.lower(), seg.words.timed_at) if w else -1
        if at >= 0:
            seg.words.timed_at = at + len(w)
            seg.words.timed.append((seg.words.timed_at, base + end * 1000.0 / rate))


def _named(namer: WordNamer | None, words: list[tuple[str, float, float]]) -> list[WordTimestamp]:
    """The engine's timed words named in the client's text: the spoken words of one written word ("three
    dollars and fifty cents" for "$3.50", "five dollars." for "$5.") are one entry, from the first one's
    start to the last one's end."""
    out: list[WordTimestamp] = []
    for word, start, end in words:
        name = word if namer is None else namer.name(word)
        if out and not any(c.isalnum() for c in name):  # nothing of its own: the rest of the word before
            out[-1].word += name
            out[-1].end_ms = end
        else:
            out.append(WordTimestamp(word=name, start_ms=start, end_ms=end))
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)
