"""One WebSocket session: a reader, a synthesizer and a writer around a ``Core`` and the socket's codec.

The text side (``protocol.session``) and the speech core (``protocol.core``) decide everything; this
shell feeds them messages, engine audio and the time, and moves their outputs to the socket. The codec
(``protocol.codecs.base``) is the surface: vllm-omni's protocol or voxgate.v1
(``protocol.codecs.stream.SessionCodec``,
the default), a phone carrier's framing around it (``protocol.codecs.telephony.Telephony``, adopted when a
``session.config`` names ``framing``), or ElevenLabs' (``protocol.codecs.elevenlabs_socket``); the shell is
the
same for all.

- The reader only decodes messages (``Codec.decode``) and queues work, so a cancel is handled while
  audio streams. It
  waits on the socket no longer than the core's next deadline (``Core.next_deadline``), and calls
  ``Core.tick`` when it passes: segments are cut by the listener's clock (docs/protocol.md §5), with no
  polling. Engine reports and writes can bring that deadline sooner while the reader waits (a first audio
  later than the engine's estimate, a segment shorter than expected): the host then wakes the reader
  (``SessionHost.changed``), which waits again for the new deadline, its read of the socket kept.
- The synthesizer is the engine pump (``gateway.session.pump``, the same on every surface): it takes segments
  in order and feeds their engine audio to the core as fast as the engine makes it, with look-ahead,
  the audio cap, deadlines, cancel and backpressure. Segments of several contexts (``context_id``) take
  their turns in the order they were cut, so their frames interleave on the socket; a cancel of one
  context stops only its segments.
- The writer drains the outbox (the bounded backpressure queue) into the socket, each output as the
  codec encodes it (``Codec.encode``).

Ending: ``_Stop`` raised by any of the three ends the task group, which cancels the others (and
so closes the engine iterator in flight); a fatal ``ProtocolError`` is then reported and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.websockets import WebSocketDisconnect

from ...protocol import pronounce
from ...protocol.codecs.base import Codec, Inbound, Payload
from ...protocol.codecs.openai import check_limits
from ...protocol.codecs.stream import SessionCodec, sends
from ...protocol.core import Core
from ...protocol.errors import INTERNAL_ERROR_MESSAGE, ErrorCode, ProtocolError
from ...protocol.messages import Error, PlaybackPosition, ServerMessage, ServerWarning, SessionReady
from ...protocol.output import Audio, Configure, Finish, Message, OutputFormat
from ...protocol.session import Session, State
from ..metrics import Metrics, SessionMeter
from ..server.sessions import Sessions, shutdown_error
from ..session.deadline import Deadline as Deadline
from ..session.failures import REFUSALS, error_for
from ..session.host import Log, SessionHost, effective_config
from ..session.outbox import Outbox, SlowConsumer
from ..session.pump import Pump
from ..session.receipts import ReadReceipts
from ..settings import Settings
from ..voices.catalog import Catalog

logger = logging.getLogger(__name__)


# The least time a fatal error and the close get to go out before the connection is dropped.
CLOSE_TIMEOUT_S = 1.0


class _Stop(Exception):
    """Ends the session: ``error`` is the fatal error to report, None for a normal end."""

    def __init__(self, error: ProtocolError | None = None) -> None:
        super().__init__(error.message if error else "stop")
        self.error = error


class _SessionLog(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every record with the session id, so one session's lines can be told apart."""

    def process(
        self, msg: object, kwargs: MutableMapping[str, object]
    ) -> tuple[object, MutableMapping[str, object]]:
        return f"[{self.extra['session'] if self.extra else '?'}] {msg}", kwargs


class Socket(Protocol):
    """What a ``Connection`` uses of its socket (a Starlette ``WebSocket``)."""

    async def receive(self) -> Mapping[str, Any]: ...
    async def send_text(self, data: str) -> None: ...
    async def send_bytes(self, data: bytes) -> None: ...
    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


@dataclass(slots=True)
class _Writer:
    """The writer's state."""

    deadline: Deadline = field(default_factory=Deadline)  # its send timeout (a client that stopped reading)
    sending: bool = False  # inside a send (it may block on a client that does not read)
    held_s: float = 0.0  # audio the codec took and holds back (counted when it goes out)


@dataclass(slots=True)
class _Reader:
    """The reader's state."""

    deadline: Deadline = field(default_factory=Deadline)  # its config, idle and tick timeouts
    receiving: asyncio.Future[Mapping[str, Any]] | None = None  # the socket's read in progress
    #: Set when the core's next deadline came sooner than the reader waits.
    sooner: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Connection:
    """Drives one accepted WebSocket until it ends, speaking its wire through ``codec``."""

    ws: Socket
    catalog: Catalog
    settings: Settings
    owner: str = ""
    extensions: bool = True  # the client opted in to voxgate's extensions (protocol.codecs.stream)
    meter: SessionMeter = field(default_factory=lambda: Metrics().session("voxgate.v1"))
    sessions: Sessions | None = None  # the process's sessions: their drain ends this one
    receipts: ReadReceipts | None = (
        None  # the socket's read receipts (gateway.session.receipts), if it has them
    )
    codec: Codec | None = None  # the socket's wire (protocol.codecs.base); None: the session's own dialect
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])

    def __post_init__(self) -> None:
        s = self.settings
        log = _SessionLog(logger, {"session": self.id})
        self.host = SessionHost(
            s, self.meter, log, extensions=self.extensions, configure=self._configure, dropped=self._cleared
        )
        self.writer = _Writer()
        self.reader = _Reader()
        self.host.sooner = self.reader.sooner.set
        self.last_activity = time.monotonic()
        self.wire: Codec = self.codec or SessionCodec(extensions=self.extensions)  # adopt() may wrap it
        if self.receipts is not None:
            self.receipts.watch(s.send_timeout_s)

    # The host's parts, by their names.
    @property
    def session(self) -> Session:
        return self.host.session

    @property
    def core(self) -> Core:
        return self.host.core

    @property
    def outbox(self) -> Outbox:
        return self.host.outbox

    @property
    def pump(self) -> Pump:
        return self.host.pump

    @property
    def log(self) -> Log:
        return self.host.log

    async def run(self) -> None:
        stop: _Stop | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._read())
                tg.create_task(self.pump.run())
                tg.create_task(self._write())
                if self.sessions is not None:
                    tg.create_task(self._drain(self.sessions))
                if self.receipts is not None:
                    tg.create_task(self._watch_reader(self.receipts))
        except* _Stop as group:
            stop = group.exceptions[0]  # type: ignore[assignment]
        except* SlowConsumer as group:
            stop = _Stop(slow_consumer_error(group.exceptions[0]))  # type: ignore[arg-type]
        finally:
            self.reader.deadline.close()
            self.writer.deadline.close()
            if self.receipts is not None:
                self.receipts.close()
            await self.pump.aclose()
        if stop is not None and stop.error is not None:
            await self._abort(stop.error)

    async def _drain(self, sessions: Sessions) -> None:
        """On a drain, refuse new utterances; end the session once nothing is in flight, or when the
        drain's time is up. (A session that kept taking utterances would be cut in the middle of one.)"""
        await sessions.until_draining()
        message = "the server is shutting down: no new utterance (those open finish); reconnect"
        self.session.refuse_new(ProtocolError(ErrorCode.SERVER_SHUTDOWN, message))
        await sessions.until_idle(lambda: bool(self.core.in_flight) or self._busy())
        raise _Stop(shutdown_error())

    async def _watch_reader(self, receipts: ReadReceipts) -> None:
        """End the session once the client has answered no ping for the send timeout: it stopped reading,
        though its buffers (compressed, or behind a proxy) may still take what is written. Each receipt
        shows it still reads what was sent, however far behind: a send blocked meanwhile gets the send
        timeout again, and the idle clock starts over."""
        timeout_s = self.settings.send_timeout_s

        def receipted() -> None:
            self.last_activity = time.monotonic()
            self.writer.deadline.extend(timeout_s)
            self.core.read(receipts.read_s, time.perf_counter())  # the listener's clock, refined

        receipts.on_receipt = receipted
        try:
            await receipts.stalled.wait()
        finally:
            receipts.on_receipt = None
        raise SlowConsumer(f"the client read nothing for {timeout_s:g} s (no pong)")

    # -- reader -------------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            await self._read_messages()
        finally:
            if self.reader.receiving is not None:
                self.reader.receiving.cancel()
            self.host.errors.flush()  # the count of errors left out of the log, as the reader ends

    async def _read_messages(self) -> None:
        await self._apply(self.wire.opening())
        while True:
            # A client whose answers pile up unread is not read either: TCP pushes back
            # (gateway.session.outbox).
            await self.outbox.room_to_read()
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                raise _Stop()
            self.last_activity = time.monotonic()
            text, data = message.get("text"), message.get("bytes")
            payload = text if isinstance(text, str) else data if isinstance(data, bytes) else b""
            try:
                items = self.wire.decode(payload)
            except ProtocolError as err:
                self._refused(err)
                items = []
            await self._apply(items)
            if self.session.state is State.CLOSED:
                return

    async def _apply(self, items: Iterable[Inbound]) -> None:
        """Feed a codec's items to the core one at a time, each one's outputs routed before the next."""
        for item in items:
            try:
                now = time.perf_counter()
                match item:
                    case str():
                        self.core.receive_text(item, now)
                    case bytes():
                        self.core.receive_bytes(item, now)
                    case PlaybackPosition():
                        self._send(item)  # the codec's own answer (a carrier's mark echoed)
                    case _:
                        self.core.receive_message(item, now)
                await self._flush()
            except ProtocolError as err:
                self._refused(err)

    def _refused(self, err: ProtocolError) -> None:
        if err.fatal:
            raise _Stop(err) from None
        self._report(err)

    async def _receive(self) -> dict[str, object]:
        s = self.settings
        while True:
            configured = self.session.configured
            limit = s.idle_timeout_s if configured else s.config_timeout_s
            wait = limit - (time.monotonic() - self.last_activity) if configured else limit
            if wait <= 0:
                wait = limit  # busy past the limit: the writer's own timeout ends a stuck send
            wait = max(wait, 0.01)
            # The core's next deadline (a timed cut, a context's idle timeout) bounds the wait; engine
            # reports and writes may bring it sooner meanwhile (the host says so: ``_Reader.sooner``).
            now = time.perf_counter()
            deadline = self.core.next_deadline()
            tick = deadline is not None and deadline - now < wait
            if deadline is not None and tick:
                wait = max(deadline - now, 0.0)
            self.host.waiting_until = now + wait
            try:
                # In this task, not wait_for's: on 3.11 wait_for can swallow the task group's cancel.
                message = await self.reader.deadline.within(self._message_or_sooner(), wait)
                if message is None:
                    continue  # the core's deadline came sooner: wait again, for the new one
                return dict(message)
            except TimeoutError:
                if tick:
                    self.core.tick(time.perf_counter())
                    await self._flush()
                    continue
                if not configured:
                    raise _Stop(
                        ProtocolError(
                            ErrorCode.CONFIG_TIMEOUT,
                            f"no session.config within {limit:g} s",
                            fatal=True,
                        )
                    ) from None
                if self._busy() or time.monotonic() - self.last_activity < limit:
                    continue
                raise _Stop(
                    ProtocolError(
                        ErrorCode.IDLE_TIMEOUT,
                        f"no message and no audio for {limit:g} s",
                        fatal=True,
                    )
                ) from None

    async def _message_or_sooner(self) -> Mapping[str, Any] | None:
        """The next message of the socket, or None when the core's next deadline came sooner than the wait
        in progress. The socket's read is kept across waits (a wait that ends early loses no message)."""
        reader = self.reader
        if reader.receiving is None:
            reader.receiving = asyncio.ensure_future(self.ws.receive())
        receiving: asyncio.Future[Any] = reader.receiving
        sooner: asyncio.Future[Any] = asyncio.ensure_future(reader.sooner.wait())
        try:
            await asyncio.wait([receiving, sooner], return_when=asyncio.FIRST_COMPLETED)
        finally:
            sooner.cancel()
        if reader.receiving.done():
            got, reader.receiving = reader.receiving, None
            return got.result()
        reader.sooner.clear()
        return None

    def _busy(self) -> bool:
        return bool(
            len(self.outbox)
            or self.pump.busy
            or self.writer.sending
            or (self.receipts is not None and self.receipts.awaiting)
        )

    async def _flush(self) -> None:
        await self.pump.flush()

    def _cleared(self) -> None:
        self.wire.dropped()

    async def _configure(self, output: Configure) -> None:
        config, ignored_fields = output.config, output.ignored_fields
        voice_field = "$.speaker" if config.voice is None and config.speaker is not None else "$.voice"
        try:
            config = self.wire.check(config, self.session.config)
            check_limits(config, self.settings.max_instructions_chars)
            if config.ref_audio is not None:
                self._admit_reference()
        except ProtocolError as err:
            raise self.core.reject_config(err) from None
        try:
            resolved = await self.catalog.prepare(
                self.owner,
                config.voice_name,
                config.model,
                config.engine_options(),
                ref_audio=config.ref_audio,
                ref_text=config.ref_text,
            )
        except REFUSALS as exc:
            error = error_for(exc, voice_field=voice_field, ref_audio=config.ref_audio is not None)
            raise self.core.reject_config(error) from None
        self.host.resolved = resolved
        self.wire = self.wire.adopt(config)
        engine = resolved.engine
        self.meter.configured(engine.name)
        rate = config.output_rate(engine.sample_rate)
        try:
            self.session.expand_numbers = not engine.reads_numbers  # text_normalization: auto
            # pronunciations' ipa: refused if the voice cannot say it; no phoneme input: its alias is used
            unheard = pronounce.check(config.pronunciations, engine.ipa_symbols)
            self.session.takes_ipa = bool(engine.ipa_symbols)
            self.core.accept_config(config, OutputFormat.of(config, rate).check())
        except ProtocolError as err:
            raise self.core.reject_config(err) from None
        effective = effective_config(config, resolved, rate)
        ready = SessionReady(
            session_id=self.id,
            config=effective,
            limits=self.host.limits(),
            ignored_fields=list(ignored_fields),
        )
        self._send(ready)
        for name in (*resolved.ignored, *unheard):
            message = f"engine {engine.name!r} cannot follow {name!r}; it is ignored"
            self.log.warning("%s", message)
            self._send(ServerWarning(code="option_ignored", message=message, field=f"$.{name}"))
        if ignored_fields:
            self.log.info("ignored unknown config fields: %s", ", ".join(ignored_fields))
        self.log.info("configured: %s", effective)

    def _admit_reference(self) -> None:
        """Take one of the session's inline-reference tokens (``gateway.middleware.ratelimit.References``)."""
        self.host.references.admit()

    def _report(self, err: ProtocolError, utterance: int | None = None) -> None:
        if err.fatal:
            self.log.info("error %s: %s", err.code, err.message)
        else:
            self.host.errors.refused(err.code, err.message)
        self._send(Error.of(err, utterance, err.context_id))

    def _send(self, msg: ServerMessage) -> None:
        if sends(msg, extensions=self.extensions):
            self.outbox.put(Message(msg))

    # -- writer -------------------------------------------------------------------------------

    async def _write(self) -> None:
        while True:
            output = self.host.take(await self.outbox.get(), time.perf_counter())
            match output:
                case Finish():
                    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                        await self.ws.close(*self.wire.close(None))
                    raise _Stop()
                case Audio() | Message():
                    audio_s = self.writer.held_s + (output.audio_s if isinstance(output, Audio) else 0.0)
                    payloads = self.wire.encode(output)
                    self.writer.held_s = 0.0 if payloads else audio_s
                    for payload in payloads:
                        await self._send_now(payload, audio_s)
                        audio_s = 0.0
            self.last_activity = time.monotonic()

    async def _send_now(self, payload: Payload, audio_s: float = 0.0) -> None:
        # A send blocks while the client reads slower than it is written to, or not at all: it is closed
        # once neither the send nor its read receipts made progress for the send timeout (each receipt
        # moves the deadline on: ``_watch_reader``). Every send is followed by read receipts, and the
        # writer waits while more than ``max_buffered_audio_s`` of what it wrote is unread, so the engine
        # runs ahead of the client by at most that twice (the outbox's bound, then this one), whatever the
        # socket's buffers hold.
        self.writer.sending = True
        self.meter.wrote(payload)
        try:
            if isinstance(payload, bytes):
                await self.writer.deadline.within(self.ws.send_bytes(payload), self.settings.send_timeout_s)
            else:
                await self.writer.deadline.within(self.ws.send_text(payload), self.settings.send_timeout_s)
            if self.receipts is not None:
                self.receipts.wrote(audio_s)
                lead_s = self.settings.max_buffered_audio_s
                if self.receipts.unread_s > lead_s:  # receipts come in only while the reader reads
                    await self.outbox.unless_reader_stops(self.receipts.read_up_to(lead_s))
        except WebSocketDisconnect:
            raise _Stop() from None
        except RuntimeError as exc:
            # The server closed the socket under the writer (uvicorn's own 1007/1009 close, or ours
            # already sent): the session ends as on a disconnect, with an info line, no traceback.
            self.log.info("socket closed while sending: %s", exc)
            raise _Stop() from None
        except TimeoutError:
            raise SlowConsumer(f"the client read nothing for {self.settings.send_timeout_s:g} s") from None
        finally:
            self.writer.sending = False

    async def _abort(self, err: ProtocolError) -> None:
        """Report a fatal error and close. A client that stopped reading gets one more send timeout
        to read the rest, the error and the close; the engine work is already stopped, so only the
        socket waits."""
        self.log.info("closing with %d: %s %s", err.close_code, err.code, err.message)
        self.meter.error(err.code)
        await self._last_words(err, max(CLOSE_TIMEOUT_S, self.settings.send_timeout_s))

    async def fail(self) -> None:
        """After an unexpected failure of ``run`` (the caller logs it): report an internal error, close."""
        err = ProtocolError(ErrorCode.INTERNAL_ERROR, INTERNAL_ERROR_MESSAGE, fatal=True)
        await self._last_words(err, CLOSE_TIMEOUT_S)

    async def _last_words(self, err: ProtocolError, patience_s: float) -> None:
        """Write the fatal ``err`` in the codec's shape within ``patience_s``, then close as it says."""
        error = Error.of(err)
        with contextlib.suppress(TimeoutError, WebSocketDisconnect, RuntimeError):
            async with asyncio.timeout(patience_s):
                for payload in self.wire.encode(Message(error)):
                    if isinstance(payload, bytes):
                        await self.ws.send_bytes(payload)
                    else:
                        await self.ws.send_text(payload)
        with contextlib.suppress(TimeoutError, WebSocketDisconnect, RuntimeError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.ws.close(*self.wire.close(err))


def slow_consumer_error(exc: SlowConsumer) -> ProtocolError:
    """The fatal error that ends a session whose client stopped reading."""
    return ProtocolError(ErrorCode.SLOW_CONSUMER, str(exc), fatal=True)
