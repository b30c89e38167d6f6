"""Rule 1: each piece of a session's state has one owner; the others ask it (h11's ``_state.py``)."""

from __future__ import annotations

import pytest
from voxgate.protocol.core import Core
from voxgate.protocol.messages import InputText, SessionConfig
from voxgate.protocol.output import Configure, OutputFormat
from voxgate.protocol.session import Session

PCM = OutputFormat("pcm", 8000, frame_ms=100)


def test_the_session_s_caps_read_the_text_and_utterances_the_core_holds() -> None:
    """The backlog (text of segments not started) and the utterances in flight are counted by the core
    alone; the session only reads them, so no second copy can drift."""
    core = Core(PCM, Session(max_pending_text_chars=100))
    core.receive_message(SessionConfig(), 0.0)
    [configure] = core.data_to_send()
    assert isinstance(configure, Configure)
    core.accept_config(configure.config, PCM)
    core.receive_message(InputText(text="One two three. Four"), 1.0)
    assert (core.session.backlog, core.session.in_flight) == (len("One two three."), 1)
    with pytest.raises(AttributeError):
        core.session.backlog = 0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        core.session.in_flight = 0  # type: ignore[misc]
    alone = Session()  # a session without a core holds no engine work
    assert (alone.backlog, alone.in_flight) == (0, 0)


def test_the_client_s_text_is_handed_to_the_core_once_not_cleared_by_it() -> None:
    """The session keeps the client's text until the core takes it (``take_received``): one writer."""
    session = Session()
    session.receive(SessionConfig())
    session.accept_config(SessionConfig())
    session.receive(InputText(text="Hello "))
    session.receive(InputText(text="there."))
    assert session.take_received() == [(0, "Hello "), (0, "there.")]
    assert session.take_received() == []
