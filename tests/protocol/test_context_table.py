"""One table of contexts (``protocol.contexts``), shared by the text side and the core: no two views."""

from __future__ import annotations

import json

from voxgate.protocol.contexts import Contexts
from voxgate.protocol.core import Core
from voxgate.protocol.messages import ContextClosed, ContextOpened
from voxgate.protocol.normalize import Normalizer
from voxgate.protocol.output import Configure, Message, OutputFormat
from voxgate.protocol.segmenter import Segmenter

PCM = OutputFormat("pcm", 8000, frame_ms=100)


def send(core: Core, kind: str, now: float = 0.0, **fields: object) -> list[object]:
    core.receive_text(json.dumps({"type": kind, **fields}), now)
    return [o.msg if isinstance(o, Message) else o for o in core.data_to_send()]


def configured() -> Core:
    core = Core(PCM)
    [configure] = send(core, "session.config")
    assert isinstance(configure, Configure)
    core.accept_config(configure.config, PCM)
    return core


def test_a_cancel_from_the_shell_closes_the_contexts_for_the_text_side_too() -> None:
    """``Core.cancel`` (a barge-in the shell decides) closes the named contexts: the next message naming one
    opens a new context, as ``context.closed`` told the client, rather than feeding the closed one."""
    core = configured()
    assert send(core, "input.text", text="", context_id="a") == [
        ContextOpened(context_id="a", context_number=1)
    ]
    core.cancel()
    closed = [o for o in core.data_to_send() if isinstance(o, Message) and isinstance(o.msg, ContextClosed)]
    assert [o.msg for o in closed] == [ContextClosed(context_id="a", context_number=1, reason="cancelled")]
    assert send(core, "input.text", 1.0, text="", context_id="a") == [
        ContextOpened(context_id="a", context_number=2)
    ]


def test_an_ended_context_frees_its_id_and_keeps_its_number_until_removed() -> None:
    table = Contexts()
    first = table.open("a", Segmenter(), Normalizer())
    assert table.named("a") is first and table.text_of(1) is first and table.open_count == 1
    assert table.end("a") is first  # context.close: its audio may still go out
    assert table.named("a") is None and table.text_of(1) is None and 1 in table and table[1] is first
    second = table.open("a", Segmenter(), Normalizer())  # the id names a new context
    assert second.number == 2 and [c.number for c in table] == [0, 1, 2]
    table.remove(1)  # its last session.done written
    assert table.get(1) is None and [c.number for c in table.texts()] == [0, 2]
    table.remove(2)  # closed while still open (a cancel): ended too
    assert table.named("a") is None and table.open_count == 0 and [c.number for c in table] == [0]
