"""The caps a session holds its client to: ``SessionLimits``, kept as ``Session.limits``.

``Session`` takes them as keyword arguments of the same names (its defaults: ``protocol.session``'s
``MAX_*`` constants); the gateway sets them from ``Settings``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """The caps of one session (docs/protocol.md names the error each refusal carries)."""

    #: Largest accepted ``session.config`` message, in bytes.
    max_config_bytes: int
    #: Largest accepted message of any other type, in bytes.
    max_message_bytes: int
    #: Most text not yet handed to the engine (buffered in the session, or in segments not started yet:
    #: ``backlog``, kept by the ``Core``) an ``input.text`` may bring it to; 0 for no cap.
    max_pending_text_chars: int
    #: Named contexts open at once; a message that would open one more is refused (``too_many_contexts``).
    #: 0 refuses every named context.
    max_contexts: int
    #: Seconds a named context may go without a message before the core closes it (``Core.tick``); 0 for
    #: never.
    context_idle_timeout_s: float
    #: Utterances queued at once (started, their ``session.done`` not yet out); a message that would start
    #: one more is refused (``text_backlog_full``). Empty utterances (``input.done`` alone) count too: each
    #: holds a little state until its turn.
    max_in_flight: int
