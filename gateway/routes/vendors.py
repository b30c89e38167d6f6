"""What the routes of other vendors' TTS APIs share (``gateway.routes.cartesia``,
``gateway.routes.deepgram``).

- ``voice_book``: the voices a caller may name (built-in, uploaded, aliases from ``VOXGATE_VOICE_ALIASES``)
  and those whose engine times words, read once per socket or request, so that the codec refuses an
  unknown vendor voice id in the vendor's shape before any text (``protocol.codecs.vendor.VoiceBook``);
- ``speak``: a REST request's text as one utterance of a session on the one host (``gateway.session.host``);
- ``run_socket``: one accepted WebSocket as one voxgate session (``gateway.transport.socket``) with a vendor's
  codec, counted and metered as every session.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.websockets import WebSocket, WebSocketState

from ...engine.base import UnsupportedOption
from ...protocol.codecs.base import Codec
from ...protocol.codecs.vendor import VoiceBook
from ...protocol.messages import SessionConfig
from ...protocol.output import OutputFormat
from ..session.failures import REFUSALS, error_for
from ..session.host import SessionHost
from ..session.receipts import read_receipts
from ..transport.socket import Connection
from ..voices.catalog import Catalog
from ..voices.local import VoiceStoreUnavailable

logger = logging.getLogger(__name__)


async def voice_book(state: object) -> VoiceBook:
    """The voices the caller of ``state`` may name; an uploaded voice counts when the store answers."""
    catalog: Catalog = state.catalog  # type: ignore[attr-defined]
    owner: str = getattr(state, "owner", "")
    names = tuple(dict.fromkeys(v.name for v in await catalog.builtin_voices()))
    uploaded: list[str] = []
    if catalog.store is not None:
        try:
            uploaded = [info.name for info in await asyncio.to_thread(catalog.store.list, owner)]
        except VoiceStoreUnavailable:
            logger.warning("the voice store is unavailable: uploaded voices cannot be named now")
    timed: set[str] = set()
    for name in (None, *names, *catalog.aliases):
        try:
            await catalog.prepare(owner, name, None, {"word_timestamps": True})
        except (UnsupportedOption, *REFUSALS):
            continue
        timed.add("" if name is None else name.casefold())
    known = {n.casefold() for n in (*names, *uploaded)} | set(catalog.aliases)
    return VoiceBook(names, frozenset(known), frozenset(timed))


async def run_socket(websocket: WebSocket, codec: Codec, dialect: str) -> None:
    """Run an accepted socket as one voxgate session speaking through ``codec``."""
    state = websocket.state
    connection = Connection(
        websocket,
        state.catalog,
        state.settings,
        owner=getattr(state, "owner", ""),
        extensions=True,
        meter=state.metrics.session(dialect),
        sessions=getattr(state, "sessions", None),
        receipts=read_receipts(websocket.scope),
        codec=codec,
    )
    try:
        with connection.meter.active():
            await asyncio.create_task(connection.run())  # its own task, as the other sockets' sessions
    except Exception:
        logger.exception("%s session %s failed", dialect, connection.id)
        if websocket.application_state is not WebSocketState.DISCONNECTED:
            await connection.fail()


async def speak(
    state: object, config: SessionConfig, fmt: OutputFormat, text: str, dialect: str
) -> SessionHost:
    """The session that speaks ``text`` with ``config``, in ``fmt`` (a REST answer's), metered as ``dialect``.

    Raises:
        ProtocolError: the engines refuse the config (its voice, an option, the rate), or the session's
            limits refuse the text (``text_backlog_full``, ...).
    """
    catalog: Catalog = state.catalog  # type: ignore[attr-defined]
    try:
        resolved = await catalog.prepare(
            getattr(state, "owner", ""), config.voice_name, None, config.engine_options()
        )
    except REFUSALS as exc:
        raise error_for(exc) from None
    fmt = fmt.check()
    meter = state.metrics.session(dialect)  # type: ignore[attr-defined]
    meter.configured(resolved.engine.name)
    host = SessionHost(state.settings, meter)  # type: ignore[attr-defined]
    await host.speak(config, fmt, text, resolved)
    return host
