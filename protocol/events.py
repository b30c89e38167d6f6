"""What the session's text side decides: the events ``Session.receive`` returns and ``Core.receive`` applies.

The session (``protocol.session``) turns each client message into a list of these, in the order they take
effect; the core (``protocol.core``) turns them into outputs. They carry only what the text side knows: the
segments cut from the text, the utterances and contexts it opened and closed, and the config it checked.
"""

from __future__ import annotations

import msgspec

from .messages import CloseReason, SessionConfig


class Event(msgspec.Struct, frozen=True):
    """Base of what the session tells the gateway to do."""


class ConfigAccepted(Event, frozen=True):
    """A config passed validation; the gateway checks it against the engine, then answers session.ready."""

    config: SessionConfig
    ignored_fields: tuple[str, ...] = ()


class SegmentReady(Event, frozen=True):
    """A segment of text is complete and can be synthesized."""

    utterance_index: int
    sentence_index: int
    text: str
    #: The client's text the segment stands for (``Normalizer.source``), where it differs from ``text``,
    #: and for each character of ``text`` the index in ``source`` of the one it stands for.
    source: str = ""
    origins: tuple[int, ...] = ()


class UtteranceStarted(Event, frozen=True):
    """The first text of an utterance arrived; ``context_number`` is its context (0: the default)."""

    utterance_index: int
    context_number: int = 0


class UtteranceEnded(Event, frozen=True):
    """All text of the utterance is segmented (after ``input.done`` or ``session.close``)."""

    utterance_index: int
    total_sentences: int
    context_number: int = 0


class UtteranceCancelled(Event, frozen=True):
    """Barge-in on every context: stop everything in flight, and close the named contexts.

    ``utterance_index`` is an open utterance, if any.
    """

    utterance_index: int | None


class Committed(Event, frozen=True):
    """``input.commit`` cut the buffered text; ``sentence_index`` is its segment, None if no text."""

    commit_id: str | None
    utterance_index: int
    sentence_index: int | None
    context_number: int = 0


class ContextStarted(Event, frozen=True):
    """A message opened the named context ``context_id``; ``context_number`` numbers it in the session."""

    context_id: str
    context_number: int


class ContextActive(Event, frozen=True):
    """A message named an open context (or, None, a ``keepalive`` named none): restart its idle timer."""

    context_number: int | None


class ContextCancelled(Event, frozen=True):
    """Barge-in on one context: stop its utterances and close it (``context_number`` None: not open)."""

    context_id: str
    context_number: int | None


class ContextEnded(Event, frozen=True):
    """The text side closed a context: gracefully (``closed``: once its audio is out), or when idle.

    ``context_number`` is None when the id named no open context.
    """

    context_id: str
    context_number: int | None
    reason: CloseReason = "closed"


class CloseRequested(Event, frozen=True):
    """The client asked to close once the last utterance has played out."""
