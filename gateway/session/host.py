"""The one session host: every surface's session is built here, from the settings, and only here.

A ``SessionHost`` holds one session's parts (the role websockets' base ``Connection`` plays for its client
and server): the text side (``protocol.session.Session``) with its limits, the core (``protocol.core``), the
outbox (``gateway.session.outbox``: the bound on what waits for the client), the engine pump
(``gateway.session.pump``),
the audio cap and the meter. Every per-session limit (pending text, the audio cap, deadlines, queued
utterances, contexts, buffered messages) is applied here once, so it holds on every surface: the WebSocket
transport (``gateway.transport.socket``: vllm-omni, voxgate.v1, ElevenLabs' sockets, phone carriers) and the
HTTP
body transport (``gateway.transport.body``: OpenAI, ElevenLabs and batch REST answers) only read and write.

The host also owns the writer's step (``take``: the core stamps an output as it goes out, the meter counts
it), and, for a REST answer, the whole text fed as one utterance (``speak``) and the answer's pieces in
order (``pieces``), each failure carrying its own HTTP status (``Message.failure``, set by the core).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from ...protocol import pronounce
from ...protocol.core import Core
from ...protocol.encoders import effective_bitrate
from ...protocol.errors import ErrorCode, ProtocolError
from ...protocol.messages import (
    EffectiveConfig,
    Error,
    InputDone,
    InputText,
    Limits,
    SessionConfig,
    SessionDone,
)
from ...protocol.output import Audio, Message, Output, OutputFormat
from ...protocol.session import Session
from ..metrics import SessionMeter
from ..middleware.ratelimit import References
from ..settings import Settings
from ..voices.catalog import Resolved
from .errorlog import ErrorLog
from .failures import error_for
from .jobs import AudioCap, Utterance
from .outbox import Outbox
from .pump import Configurer, Pump

logger = logging.getLogger(__name__)

#: A segment's error that does not end a REST answer: its audio was cut to the cap, the rest goes on.
_NOT_FATAL = frozenset({ErrorCode.AUDIO_TRUNCATED.value})

#: What a REST answer gets, in order: audio, a server message (the last one the utterance's
#: ``session.done``), or the failure that ends it early.
Piece = Audio | Message | ProtocolError
Log = logging.Logger | logging.LoggerAdapter[logging.Logger]
#: How much sooner the core's next deadline must come than the reader's wait to wake it.
SOONER_S = 0.005


class SessionHost:
    """One session's text side, core, outbox, pump, audio cap and meter, built from ``settings``.

    Args:
        settings: the server's settings: every per-session limit comes from them.
        meter: the session's metrics.
        log: the session's logger.
        extensions: the client's dialect takes voxgate's own messages (``protocol.codecs.stream.sends``).
        configure: handles a ``session.config`` that passed the core (a WebSocket's); None on REST, whose
            config is given whole to ``speak``.
        dropped: called after a cancel is applied (a phone carrier's ``clear``).
    """

    def __init__(
        self,
        settings: Settings,
        meter: SessionMeter,
        log: Log = logger,
        *,
        extensions: bool = True,
        configure: Configurer | None = None,
        dropped: Callable[[], None] | None = None,
    ) -> None:
        s = settings
        self.settings, self.meter, self.log = settings, meter, log
        self.session = Session(
            max_config_bytes=s.max_config_bytes,
            max_message_bytes=s.max_message_bytes,
            max_pending_text_chars=s.max_pending_text_chars,
            extensions=extensions,
            max_contexts=s.max_contexts,
            context_idle_timeout_s=s.context_idle_timeout_s,
        )
        self.core = Core(OutputFormat("pcm", 24000), self.session)  # the first session.config sets the format
        self.outbox = Outbox(
            s.max_buffered_audio_s,
            max_messages=s.max_buffered_messages,
            max_message_bytes=s.max_buffered_message_bytes,
        )
        self.cap = AudioCap(s.max_segment_audio_base_s, s.max_segment_audio_per_char_s)
        self.resolved: Resolved | None = None  # the engine and voice of the config in force
        self.pump = Pump(
            self.core,
            self.outbox,
            meter,
            self.utterance,
            log,
            extensions=extensions,
            configure=configure,
            dropped=dropped,
            changed=self.changed,
        )
        self._task: asyncio.Task[None] | None = None  # the pump, when the host runs it (REST)
        self.references = References()  # the inline ref_audio clips it may have decoded
        #: When the reader's wait in progress ends (the core's clock), and what tells it of a sooner deadline.
        self.waiting_until: float | None = None
        self.sooner: Callable[[], None] | None = None
        self.errors = ErrorLog(log)  # non-fatal errors' lines, rate-limited

    def utterance(self, index: int) -> Utterance:
        """The engine, voice and config utterance ``index`` speaks with (those in force as it starts)."""
        config, resolved = self.session.config, self.resolved
        assert config is not None and resolved is not None  # utterances start only once configured
        return Utterance(
            index, config, resolved.engine, resolved.voice, resolved.reference, resolved.options, self.cap
        )

    def limits(self) -> Limits:
        """The limits in force, as ``session.ready`` reports them: the settings' of the same names."""
        return Limits(**{name: getattr(self.settings, name) for name in Limits.__struct_fields__})

    def take(self, output: Output, now: float) -> Output | None:
        """The writer's step: ``output`` as it goes out (``Core.sending``), counted by the meter."""
        sent = self.core.sending(output, now)
        self.meter.sent(sent)
        self.changed()
        return sent

    def changed(self) -> None:
        """The core's state moved (an engine report, a write): wake the reader if its next deadline is now
        sooner than the wait in progress (a first audio later than estimated, a segment shorter), so that a
        timed cut is not late by the difference."""
        if self.sooner is None or self.waiting_until is None:
            return
        deadline = self.core.next_deadline()
        if deadline is not None and deadline < self.waiting_until - SOONER_S:
            self.waiting_until = None  # once per wait
            self.sooner()

    # -- a REST answer: one utterance, its text all there ------------------------------------------------

    async def speak(self, config: SessionConfig, fmt: OutputFormat, text: str, resolved: Resolved) -> None:
        """Feed ``text`` as one utterance under ``config`` and start the pump that speaks it.

        All of the text is there at once, so the session's limits apply to it whole (a text over
        ``max_pending_text_chars`` is refused, as on a socket), and no time passes: no ticks.

        Raises:
            ProtocolError: the text is refused (``text_backlog_full``, ...); nothing was started.
        """
        pronounce.check(config.pronunciations, resolved.engine.ipa_symbols)  # ipa the voice cannot say
        core, now = self.core, time.perf_counter()
        core.receive_message(config, now)
        self.session.expand_numbers = not resolved.engine.reads_numbers  # text_normalization: auto
        self.session.takes_ipa = bool(resolved.engine.ipa_symbols)  # pronunciations' ipa
        core.accept_config(config, fmt)
        core.data_to_send()  # the config's Configure: accepted above
        self.resolved = resolved
        try:
            core.receive_message(InputText(text=text), now)
        except ProtocolError as err:
            if err.code is not ErrorCode.TEXT_BACKLOG_FULL:
                raise
            cap = self.settings.max_pending_text_chars
            message = f"the text is {len(text)} characters, over this server's limit of {cap}: split it"
            raise ProtocolError(err.code, message, field=err.field) from None
        core.receive_message(InputDone(), now)
        self._task = asyncio.create_task(self.pump.run())
        try:
            await self.pump.route(core.data_to_send())
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        """Stop the engine work now, without waiting (``aclose`` waits for it to end)."""
        if self._task is not None:
            self._task.cancel()

    async def next(self) -> Output | ProtocolError:
        """The next output, stamped (``take``), or the failure of the pump itself."""
        task = self._task
        assert task is not None, "speak() starts the pump"
        while True:
            if not len(self.outbox) and not task.done():
                getter = asyncio.ensure_future(self.outbox.get())
                await asyncio.wait([getter, task], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                output = getter.result()
            elif len(self.outbox):
                output = await self.outbox.get()
            else:
                return self._failure(task)
            sent = self.take(output, time.perf_counter())
            if sent is not None:
                return sent

    async def pieces(self) -> AsyncIterator[Piece]:
        """The answer's pieces in order, ending at the utterance's ``session.done`` or its first failure."""
        while True:
            match await self.next():
                case Message(msg=Error(code=code, message=message)) if code in _NOT_FATAL:
                    self.log.warning("%s", message)
                case Message(msg=Error() as error, failure=failure):
                    yield failure if failure is not None else _failure(error)
                    return
                case ProtocolError() as failure:
                    yield failure
                    return
                case Message(msg=SessionDone()) as done:
                    yield done
                    return
                case Audio() | Message() as piece:
                    yield piece

    def _failure(self, task: asyncio.Task[None]) -> ProtocolError:
        exc = None if task.cancelled() else task.exception()
        if exc is None:  # pragma: no cover - the pump only ends by failing or being cancelled
            return ProtocolError(ErrorCode.INTERNAL_ERROR, "synthesis ended early")
        error = (
            error_for(exc)
            if isinstance(exc, Exception)
            else ProtocolError(ErrorCode.INTERNAL_ERROR, str(exc))
        )
        if error.code is ErrorCode.INTERNAL_ERROR:
            self.log.error("the engine pump failed", exc_info=exc)
        return error

    async def aclose(self) -> None:
        """Stop the engine work (a client that goes away stops it too)."""
        if self._task is not None:
            self.cancel()
            # asyncio.wait, not ``await task``: the surrounding scope is being cancelled, and anyio's
            # repeated cancels would otherwise interrupt the pump's own cleanup (closing the upstream).
            await asyncio.wait([self._task])
        await self.pump.aclose()


def _failure(error: Error) -> ProtocolError:
    """A session's error as a failure of the answer (a code outside the error table: internal)."""
    try:
        known = ErrorCode(error.code)
    except ValueError:
        known = ErrorCode.INTERNAL_ERROR
    return ProtocolError(known, error.message, field=error.field)


def ignored_headers(resolved: Resolved) -> dict[str, str]:
    """A REST answer's ``X-Voxgate-Warning`` for the options its engine ignores (a socket gets a ``warning``
    message with code ``option_ignored`` for each): ``option_ignored=$.instructions, option_ignored=...``."""
    if not resolved.ignored:
        return {}
    return {"x-voxgate-warning": ", ".join(f"option_ignored=$.{name}" for name in resolved.ignored)}


def effective_config(config: SessionConfig, resolved: Resolved, rate: int) -> EffectiveConfig:
    """What the server will do with an accepted ``config``, as ``session.ready`` reports it."""
    granularity, eager = config.segmentation()
    return EffectiveConfig(
        voice=resolved.voice,
        engine=resolved.engine.name,
        response_format=config.response_format,
        sample_rate=rate,
        speed=config.speed,
        seed=config.seed,
        stream_audio=config.streamed,
        split_granularity=granularity,
        eager_first_segment=eager,
        max_buffer_delay_ms=config.max_buffer_delay_ms,
        frame_ms=config.frame_ms,
        frame_header=config.frame_header,
        bitrate=effective_bitrate(config.response_format, rate, config.bitrate),
        framing=config.framing,
    )
