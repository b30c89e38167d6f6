"""The REST producer: one request's core and engine pump, and the outputs they give in order.

Every REST surface (OpenAI's ``POST /v1/audio/speech``, ElevenLabs' ``POST /v1/text-to-speech/...``) is a
transport over this: ``start`` feeds the request's text to a core (``protocol.core``) as one utterance and
starts the engine pump (``gateway.pump``: look-ahead, the audio cap, deadlines, cancel, backpressure,
metrics), and ``pieces`` hands the response the audio and messages in order, up to the utterance's
``session.done`` or the first failure. The surface's codec renders them (raw audio, SSE deltas, ElevenLabs'
alignment lines). The first piece is awaited before the response starts, so an engine that fails at once
gets a proper error status instead of an empty 200.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from ..protocol.core import Core
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.messages import Error, InputDone, InputText, SessionConfig, SessionDone
from ..protocol.output import Audio, Message, Output, OutputFormat
from .catalog import Resolved
from .failures import error_for
from .jobs import AudioCap, Utterance
from .metrics import SessionMeter
from .outbox import Outbox
from .pump import Pump
from .settings import Settings

logger = logging.getLogger(__name__)

# A segment's error that does not end the response: its audio was cut to the cap, the rest goes on.
_NOT_FATAL = frozenset({ErrorCode.AUDIO_TRUNCATED.value})

#: What a response gets, in order: audio, a server message (the last one the utterance's ``session.done``),
#: or the failure that ends it early.
Piece = Audio | Message | ProtocolError


class Producer:
    """One request's core and pump, and the outputs they give in order (``next``)."""

    def __init__(self, core: Core, pump: Pump, meter: SessionMeter) -> None:
        self.core, self.pump, self.meter = core, pump, meter
        self.task = asyncio.create_task(pump.run())

    async def next(self) -> Output | ProtocolError:
        """The next output, stamped by ``Core.sending``, or the failure of the pump itself."""
        while True:
            if not len(self.pump.outbox) and not self.task.done():
                getter = asyncio.ensure_future(self.pump.outbox.get())
                await asyncio.wait([getter, self.task], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                output = getter.result()
            elif len(self.pump.outbox):
                output = await self.pump.outbox.get()
            else:
                return self._failure()
            sent = self.core.sending(output, time.perf_counter())
            self.meter.sent(sent)
            if sent is not None:
                return sent

    def _failure(self) -> ProtocolError:
        exc = None if self.task.cancelled() else self.task.exception()
        if exc is None:  # pragma: no cover - the pump only ends by failing or being cancelled
            return ProtocolError(ErrorCode.INTERNAL_ERROR, "synthesis ended early")
        error = (
            error_for(exc)
            if isinstance(exc, Exception)
            else ProtocolError(ErrorCode.INTERNAL_ERROR, str(exc))
        )
        if error.code is ErrorCode.INTERNAL_ERROR:
            logger.error("the engine pump failed", exc_info=exc)
        return error

    async def aclose(self) -> None:
        """Stop the engine work (a client that goes away stops it too)."""
        self.task.cancel()
        # asyncio.wait, not ``await task``: the surrounding scope is being cancelled, and anyio's
        # repeated cancels would otherwise interrupt the pump's own cleanup (closing the upstream).
        await asyncio.wait([self.task])
        await self.pump.aclose()


async def start(
    settings: Settings,
    config: SessionConfig,
    fmt: OutputFormat,
    text: str,
    resolved: Resolved,
    meter: SessionMeter,
) -> Producer:
    """The request's core, ``text`` fed in as one utterance under ``config``, and the pump that speaks it.

    All of the text is there at once, so no time passes and the eager first segment is never cut
    early: no ticks.
    """
    core = Core(fmt)
    now = time.perf_counter()
    core.receive_message(config, now)
    core.accept_config(config, fmt)
    core.data_to_send()  # the config's Configure: accepted above
    core.receive_message(InputText(text=text), now)
    core.receive_message(InputDone(), now)
    cap = AudioCap(settings.max_segment_audio_base_s, settings.max_segment_audio_per_char_s)
    engine, voice, reference, options = resolved.engine, resolved.voice, resolved.reference, resolved.options

    def utterance(index: int) -> Utterance:
        return Utterance(index, config, engine, voice, reference, options, cap)

    outbox = Outbox(
        settings.max_buffered_audio_s,
        max_messages=settings.max_buffered_messages,
        max_message_bytes=settings.max_buffered_message_bytes,
    )
    pump = Pump(core, outbox, meter, utterance, logger)
    producer = Producer(core, pump, meter)
    await pump.route(core.data_to_send())
    return producer


async def pieces(producer: Producer) -> AsyncIterator[Piece]:
    """The response's pieces in order, ending at the utterance's ``session.done`` or its first failure."""
    while True:
        match await producer.next():
            case Message(msg=Error(code=code, message=message)) if code in _NOT_FATAL:
                logger.warning("%s", message)
            case Message(msg=Error(code=code, message=message, field=field)):
                failure = producer.pump.failure  # the segment's own error, with its HTTP status
                yield failure if failure is not None else _failure(code, message, field)
                return
            case ProtocolError() as failure:
                yield failure
                return
            case Message(msg=SessionDone()) as done:
                yield done
                return
            case Audio() | Message() as piece:
                yield piece


def _failure(code: str, message: str, field: str | None) -> ProtocolError:
    """A session's error as a failure of the request (a code outside the error table: internal)."""
    try:
        known = ErrorCode(code)
    except ValueError:
        known = ErrorCode.INTERNAL_ERROR
    return ProtocolError(known, message, field=field)
