"""The listener clock: when a context's listener runs out of audio, and what the listener heard.

The core (``protocol.core``) writes each context's audio at the pace the shell sends it; the listener plays
it in real time from its first frame (a gap restarts the clock). Two rules read that clock:

- Timed cuts (``eager_first_segment``; docs/protocol.md §5). A segment waits for its sentence end, which
  sounds best, unless waiting would let the listener run dry: a later segment is cut at the best boundary
  its text has once ``now`` reaches the time the audio ahead of the listener runs out (``runs_dry``), less
  the engine's estimated time to the first audio of the text waiting (``protocol.pace``), less
  ``MARGIN_S``. The audio ahead is the context's audio written, then the audio its open utterance's
  segments still owe: what the engine made and is not written yet, and, for segments not finished, at
  least ``Pace.audio_s`` of their text, from their estimated first audio on.
- What the listener heard (docs/protocol.md §8). Each ``audio.cancelled`` (``cancelled``) says how much of
  its utterance's audio the listener has heard on this clock (its audio written, played in real time after
  the context's audio written before it) and cuts the utterance's text, as the client sent it, after the
  last word heard (``spoken_cut``): by the engine's word timings when the config asked for them, else by
  each segment's audio spread over its characters; the normalizer's map (``WordNamer``'s ``origins``)
  turns a spoken position into the client's.
"""

from __future__ import annotations

from . import pauses
from .contexts import Context, Contexts
from .messages import AudioCancelled, wire_context_id
from .pace import AUDIO_SHARE, Pace
from .session import Session
from .utterances import InFlight, Utterance

#: Slack the listener keeps when a segment is cut to be in time: frames in flight, the client's jitter
#: buffer, the error of the engine estimate (``protocol.pace``): a cut this early costs nothing audible.
MARGIN_S = 0.15
#: Rounding of the sums of frame durations: audio this close to a segment's end counts as heard to it.
_SLACK_MS = 0.5


def runs_dry(play_end: float | None, u: Utterance, pace: Pace) -> float:
    """When the listener of ``u`` hears its last audio, from the audio written (its context's, to
    ``play_end``) and still owed."""
    end = play_end if u.times.first_audio_t is not None else None
    for seg in u.segments.values():
        if seg.finished and seg.clock.sent_s >= seg.clock.made_s:
            continue  # all of it written: in play_end
        owed = (
            seg.clock.made_s
            if seg.finished
            else max(seg.clock.made_s, seg.pause.paused_s + pace.audio_s(len(seg.text)))
        )
        if seg.times.first_sent_t is None:  # it begins once the engine gives its first audio
            begin = seg.times.ready_t if seg.times.started_t is None else seg.times.started_t
            begin += pace.first_audio_s(len(seg.text))
            end = begin if end is None else max(end, begin)
        end = (seg.times.ready_t if end is None else end) + max(0.0, owed - seg.clock.sent_s)
    return max(seg.times.ready_t for seg in u.segments.values()) if end is None else end


def cut_at(ctx: Context, session: Session, flight: InFlight, pace: Pace) -> float | None:
    """When the context's buffered text must be cut, if timed cuts apply to it: a first segment's deadline,
    or a later one's listener about to run dry."""
    if ctx.parked or not session.eager_pending_in(ctx.number):
        return None
    if session.first_pending_in(ctx.number):
        return ctx.deadline
    index, text = session.pending_in(ctx.number)
    u = flight.utterances.get(-1 if index is None else index)
    if u is None:  # pragma: no cover - a later segment's utterance has segments, so it is in flight
        return None
    return runs_dry(ctx.play_end, u, pace) - pace.first_audio_s(len(text)) - MARGIN_S


def pause_due(ctx: Context, flight: InFlight) -> tuple[float | None, Utterance | None]:
    """When a pause is next written in the context, and into which utterance (``protocol.pauses``): just in
    time, ``pauses.LEAD_S`` before its listener runs dry, while no audio is ready to go out."""
    if ctx.play_end is not None:
        for u in flight.by_context.get(ctx.number, {}).values():
            if u.pause.at is not None:
                if any(seg.clock.sent_s < seg.clock.made_s - 1e-9 for seg in u.segments.values()):
                    break  # audio is ready to go out: no pause before it
                return ctx.play_end - pauses.LEAD_S, u
    return None, None


def pause(ctx: Context, u: Utterance, now: float) -> tuple[int, bool]:
    """The samples of the next chunk of ``u``'s sentence pause (``protocol.pauses``), counted in its records,
    and whether the pause is over: it goes on only while the text does (the next segment is cut, or text of
    it came), so a client that sent a sentence and waits hears no pause and gets its audio.done once the
    sentence has nearly played; none once the listener ran dry."""
    assert u.pause.at is not None and ctx.play_end is not None
    sentence, packer = u.pause.at, u.packer
    seg, rate = u.segments[sentence], packer.sample_rate
    goes_on = sentence != u.pause.held or sentence + 1 in u.segments or u.counts.unsegmented > 0
    n = pauses.chunk_samples(rate, packer.frame_samples, u.pause.paused_s) if goes_on else 0
    late = now >= ctx.play_end + pauses.LATE_S
    if n and not late:
        seg.pause.paused_s += n / rate
        u.pause.paused_s += n / rate
        if sentence != u.pause.held:  # before its speech: its words start after it
            seg.clock.start_ms += n * 1000.0 / rate
            seg.pause.lead_s += n / rate
    return (0 if late else n), (not n or u.pause.paused_s >= pauses.MAX_S - 1e-9 or late)


def cancelled(u: Utterance, now: float | None, pace: Pace) -> AudioCancelled:
    """The ``audio.cancelled`` of ``u``: what its listener heard of it by ``now`` (None: nothing)."""
    ahead = 0.0 if now is None or u.play_end is None else min(u.sent_s, max(0.0, u.play_end - now))
    played_ms = (u.sent_s - ahead) * 1000.0 if now is not None else 0.0
    text = "".join(u.text)
    cut = spoken_cut(u, text, played_ms, pace)
    return AudioCancelled(
        utterance_index=u.index,
        context_id=wire_context_id(u.context_id),
        played_ms=round(played_ms, 2),
        text_spoken=text[:cut],
        text_remaining=text[cut:],
        text_spoken_source="words" if u.words else "estimate",
    )


def spoken_cut(u: Utterance, text: str, played_ms: float, pace: Pace) -> int:
    """Where in the client's ``text`` of ``u`` the words heard in ``played_ms`` end.

    Segments heard whole count to their last character; in the one being heard, the last word that
    ended (from the engine's word timings, else the share of its audio played, spread over its
    characters, back to the end of a whole word). A word heard takes the characters stuck to it in
    the client's text (punctuation, markup: up to the next whitespace).
    """
    cut = cursor = 0
    for seg in (u.segments[s] for s in sorted(u.segments)):
        at = text.find(seg.words.source, cursor)
        heard_ms = played_ms - seg.clock.start_ms
        if at < 0 or not seg.started or heard_ms <= 0:
            break
        cursor = at + len(seg.words.source)
        speech_s = seg.clock.made_s - seg.pause.paused_s
        if seg.finished and heard_ms >= speech_s * 1000.0 - _SLACK_MS:
            cut = cursor
            continue
        n = len(seg.text)
        if u.words:
            k = max((end for end, end_ms in seg.words.timed if end_ms <= played_ms), default=0)
        else:
            length_s = speech_s if seg.finished else max(speech_s, pace.audio_s(n) / AUDIO_SHARE)
            k = min(n, int(n * (heard_ms + _SLACK_MS) / (length_s * 1000.0)))
            if k < n and not seg.text[k].isspace():  # that word is not over: back to the one before
                k = max(0, seg.text.rfind(" ", 0, k))
            k = len(seg.text[:k].rstrip())
        if k:
            cut = at + (k if seg.words.namer is None else seg.words.namer.origins[k - 1] + 1)
        break
    while 0 < cut < len(text) and not text[cut].isspace():
        cut += 1
    return cut


class Clock:
    """The listener clock of a session's audio written: each segment's, utterance's and context's
    (``written``), and what read receipts say of it (``read``)."""

    def __init__(self, pace: Pace, flight: InFlight, contexts: Contexts) -> None:
        self._pace, self._flight, self._contexts = pace, flight, contexts
        # Audio written, all told, and where the last run of one utterance's audio began in it (``read``).
        self._written_s = 0.0
        self._run: tuple[float, Utterance | None] = (0.0, None)

    def written(self, index: int, sentence: int, audio_s: float, now: float) -> None:
        """``audio_s`` seconds of segment ``sentence`` of utterance ``index`` are written at ``now``."""
        u = self._flight.utterances.get(index)
        if u is None or self._run[1] is not u:
            self._run = (self._written_s, u)
        self._written_s += audio_s
        if u is None:
            return  # cancelled
        seg = u.segments[sentence]
        if seg.pause.lead_s > 1e-9:  # a pause before its speech
            seg.pause.lead_s -= audio_s
        elif seg.times.first_sent_t is None:
            seg.times.first_sent_t = now
            if seg.times.started_t is not None:
                self._pace.first_audio(len(seg.text), now - seg.times.started_t)
        seg.clock.sent_s += audio_s
        u.sent_s += audio_s
        u.times.first_audio_t = now if u.times.first_audio_t is None else u.times.first_audio_t
        if (ctx := self._contexts.get(u.context)) is not None:
            ctx.play_end = max(now, ctx.play_end or now) + audio_s
        u.play_end = max(now, u.play_end or now) + audio_s if ctx is None else ctx.play_end

    def read(self, read_s: float, now: float) -> None:
        """A read receipt came at ``now``: the client had read the first ``read_s`` seconds of the audio
        written (all told, in the order written: ``gateway.session.receipts``) when it answered.

        Its listener cannot play audio before reading it, so the audio written after ``read_s`` ends no
        sooner than ``now`` plus its length. Where all of it is one utterance's, that utterance's
        listener clock (and its context's) ends no sooner than that: a client that reads late (a slow
        network, a proxy's buffer) gets its timed cuts and pauses later, and ``played_ms`` does not count
        audio it had not even read.
        """
        start, u = self._run
        if u is None or read_s < start - 1e-9:
            return  # the audio unread is not one utterance's
        flight = self._flight
        if flight.utterances.get(u.index) is not u and u not in flight.playing.get(u.context, ()):
            return  # cancelled: its listener stopped
        end = now + max(0.0, self._written_s - read_s)
        if u.play_end is not None and end > u.play_end:
            u.play_end = end
            ctx = self._contexts.get(u.context)
            if ctx is not None:  # pragma: no branch - a context outlives its utterances (``_close``)
                ctx.play_end = max(ctx.play_end or end, end)
