"""One WebSocket session: a reader, a synthesizer and a writer around a ``protocol.Session``.

- The reader only decodes messages and queues work, so a cancel is handled while audio streams.
- The synthesizer takes segments in order and pushes their frames into the outbox as fast as the
  engine makes them: while segment k is being sent, segment k+1 is already being synthesized.
- The writer drains the outbox (the bounded backpressure queue) into the socket.

Ending: ``_Stop`` raised by any of the three ends the task group, which cancels the others (and
so closes the engine iterator in flight); a fatal ``ProtocolError`` is then reported and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import MutableMapping
from dataclasses import dataclass, field

from starlette.websockets import WebSocket, WebSocketDisconnect

from voxgate.engine.base import EngineError, RequestRefused, UnknownVoice, UnsupportedOption
from voxgate.gateway.catalog import Catalog, Resolved, VoiceNotServable
from voxgate.gateway.jobs import Close, End, Job, JobQueue, Segment, Utterance
from voxgate.gateway.outbox import Item, Outbox, Payload, SlowConsumer
from voxgate.gateway.settings import Settings
from voxgate.gateway.voices import Rejected
from voxgate.protocol.dialect import sends
from voxgate.protocol.errors import CloseCode, ErrorCode, ProtocolError
from voxgate.protocol.messages import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    EffectiveConfig,
    Error,
    InputCommitted,
    Limits,
    ServerMessage,
    ServerWarning,
    SessionConfig,
    SessionDone,
    SessionReady,
)
from voxgate.protocol.packer import AudioPacker
from voxgate.protocol.session import (
    CloseRequested,
    Committed,
    ConfigAccepted,
    Event,
    SegmentReady,
    Session,
    UtteranceCancelled,
    UtteranceEnded,
    UtteranceStarted,
)

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


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


@dataclass
class Connection:
    """Drives one accepted WebSocket until it ends."""

    ws: WebSocket
    catalog: Catalog
    settings: Settings
    owner: str = ""
    extensions: bool = True  # the client opted in to voxgate's extensions (protocol.dialect)
    session: Session = field(init=False)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])

    def __post_init__(self) -> None:
        s = self.settings
        self.session = Session(
            max_config_bytes=s.max_config_bytes,
            max_message_bytes=s.max_message_bytes,
            extensions=self.extensions,
        )
        self.log = _SessionLog(logger, {"session": self.id})
        self.outbox = Outbox(s.max_buffered_audio_s)
        self.jobs = JobQueue()
        self.utterances: dict[int, Utterance] = {}
        self.current: asyncio.Task[None] | None = None
        self.resolved: Resolved | None = None
        self.sending = False  # the writer is inside a send (it may block on a client that does not read)
        self.last_activity = time.monotonic()

    async def run(self) -> None:
        stop: _Stop | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._read())
                tg.create_task(self._synthesize())
                tg.create_task(self._write())
        except* _Stop as group:
            stop = group.exceptions[0]  # type: ignore[assignment]
        except* SlowConsumer as group:
            stop = _Stop(slow_consumer_error(group.exceptions[0]))  # type: ignore[arg-type]
        finally:
            await self._close_streams(self.jobs.drain())
        if stop is not None and stop.error is not None:
            await self._abort(stop.error)

    # -- reader -------------------------------------------------------------------------------

    async def _read(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                raise _Stop()
            self.last_activity = time.monotonic()
            events: list[Event] = []
            try:
                text, data = message.get("text"), message.get("bytes")
                if isinstance(text, str):
                    events = self.session.receive_text(text)
                else:
                    events = self.session.receive_bytes(data if isinstance(data, bytes) else b"")
                for event in events:
                    await self._handle(event)
            except ProtocolError as err:
                if err.fatal:
                    raise _Stop(err) from None
                self._report(err)
            if any(isinstance(e, CloseRequested) for e in events):
                return

    async def _receive(self) -> dict[str, object]:
        s = self.settings
        while True:
            configured = self.session.configured
            limit = s.idle_timeout_s if configured else s.config_timeout_s
            wait = limit - (time.monotonic() - self.last_activity) if configured else limit
            if wait <= 0:
                wait = limit  # busy past the limit: the writer's own timeout ends a stuck send
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the task group's cancel.
                async with asyncio.timeout(max(wait, 0.01)):
                    return dict(await self.ws.receive())
            except TimeoutError:
                if not configured:
                    raise _Stop(
                        ProtocolError(
                            ErrorCode.CONFIG_TIMEOUT,
                            f"no session.config within {limit:g} s",
                            close_code=CloseCode.TIMEOUT,
                            fatal=True,
                        )
                    ) from None
                if self._busy() or time.monotonic() - self.last_activity < limit:
                    continue
                raise _Stop(
                    ProtocolError(
                        ErrorCode.IDLE_TIMEOUT,
                        f"no message and no audio for {limit:g} s",
                        close_code=CloseCode.TIMEOUT,
                        fatal=True,
                    )
                ) from None

    def _busy(self) -> bool:
        return bool(len(self.outbox) or len(self.jobs) or self.current is not None or self.sending)

    async def _handle(self, event: Event) -> None:
        now = time.perf_counter()
        match event:
            case ConfigAccepted(config=config, ignored_fields=ignored_fields):
                await self._configure(config, ignored_fields)
            case UtteranceStarted(utterance_index=u):
                self.utterances[u] = self._utterance(u, now)
            case SegmentReady(utterance_index=u, sentence_index=s, text=text):
                self.jobs.put(Segment(self.utterances[u], s, text, now))
            case UtteranceEnded(utterance_index=u, total_sentences=n):
                utterance = self.utterances.get(u) or self.utterances.setdefault(u, self._utterance(u, None))
                self.jobs.put(End(utterance, n))
            case UtteranceCancelled(utterance_index=u):
                await self._cancel(u)
            case Committed(commit_id=commit_id, utterance_index=u, sentence_index=s):
                self._send(InputCommitted(commit_id=commit_id, utterance_index=u, sentence_index=s))
            case CloseRequested():
                self.jobs.put(Close())

    async def _configure(self, config: SessionConfig, ignored_fields: tuple[str, ...] = ()) -> None:
        voice_field = "$.speaker" if config.voice is None and config.speaker is not None else "$.voice"
        try:
            resolved = await self.catalog.prepare(
                self.owner,
                config.voice_name,
                config.model,
                config.engine_options(),
                ref_audio=config.ref_audio,
                ref_text=config.ref_text,
            )
        except Rejected as exc:
            raise self.session.reject_config(
                ProtocolError(ErrorCode.INVALID_REF_AUDIO, exc.message, field=f"$.{exc.param}")
            ) from None
        except UnknownVoice as exc:
            raise self.session.reject_config(
                ProtocolError(ErrorCode.UNKNOWN_VOICE, str(exc), field=voice_field)
            ) from None
        except VoiceNotServable as exc:
            field = "$.ref_audio" if config.ref_audio is not None else voice_field
            raise self.session.reject_config(
                ProtocolError(ErrorCode.VOICE_REQUIRES_CLONING, str(exc), field=field)
            ) from None
        except UnsupportedOption as exc:
            raise self.session.reject_config(
                ProtocolError(ErrorCode.UNSUPPORTED_OPTION, str(exc), field=f"$.{exc.field}")
            ) from None
        self.session.accept_config(config)
        self.resolved = resolved
        engine = resolved.engine
        s = self.settings
        granularity, eager = config.segmentation()
        effective = EffectiveConfig(
            voice=resolved.voice,
            engine=engine.name,
            response_format=config.response_format,
            sample_rate=config.output_rate(engine.sample_rate),
            speed=config.speed,
            seed=config.seed,
            stream_audio=config.streamed,
            split_granularity=granularity,
            eager_first_segment=eager,
            frame_ms=config.frame_ms,
            frame_header=config.frame_header,
        )
        limits = Limits(
            max_message_bytes=s.max_message_bytes,
            max_config_bytes=s.max_config_bytes,
            idle_timeout_s=s.idle_timeout_s,
            max_buffered_audio_s=s.max_buffered_audio_s,
            send_timeout_s=s.send_timeout_s,
        )
        ready = SessionReady(
            session_id=self.id, config=effective, limits=limits, ignored_fields=list(ignored_fields)
        )
        self._send(ready)
        for name in resolved.ignored:
            message = f"engine {engine.name!r} cannot follow {name!r}; it is ignored"
            self.log.warning("%s", message)
            self._send(ServerWarning(code="option_ignored", message=message, field=f"$.{name}"))
        if ignored_fields:
            self.log.info("ignored unknown config fields: %s", ", ".join(ignored_fields))
        self.log.info("configured: %s", effective)

    def _utterance(self, index: int, first_text_t: float | None) -> Utterance:
        config, resolved = self.session.config, self.resolved
        assert config is not None and resolved is not None  # utterances start only once configured
        engine = resolved.engine
        packer = AudioPacker(
            index,
            fmt=config.response_format,
            sample_rate=config.output_rate(engine.sample_rate),
            frame_ms=config.frame_ms,
            frame_header=config.frame_header,
            stream_audio=config.streamed,
        )
        return Utterance(
            index, config, engine, resolved.voice, resolved.reference, resolved.options, packer, first_text_t
        )

    async def _cancel(self, open_index: int | None) -> None:
        victims = list(self.utterances.values())
        for utterance in victims:
            utterance.cancelled = True
        dropped = self.jobs.drain()  # the reader stops at session.close, so no Close can be queued here
        if self.current is not None:
            self.current.cancel()
        self.outbox.drop(u.index for u in victims)
        self.utterances.clear()
        indices: list[int | None] = [u.index for u in victims] or [open_index]
        for index in indices:  # None: nothing was in flight, the cancel is still acknowledged
            self._send(AudioCancelled(utterance_index=index), utterance=None)
        self.log.info("cancelled utterances %s", indices)
        await self._close_streams(dropped)

    @staticmethod
    async def _close_streams(jobs: list[Job]) -> None:
        """Close engine streams opened ahead for segments that will not be spoken."""
        for job in jobs:
            if isinstance(job, Segment) and job.stream is not None:
                await job.stream.aclose()

    def _report(self, err: ProtocolError, utterance: int | None = None) -> None:
        self.log.info("error %s: %s", err.code, err.message)
        self._send(
            Error(
                code=err.code,
                message=err.message,
                fatal=err.fatal,
                field=err.field,
                utterance_index=utterance,
            )
        )

    def _send(self, msg: ServerMessage, *, utterance: int | None = None) -> None:
        if sends(msg, extensions=self.extensions):
            self.outbox.put(Item(self.session.send(msg), utterance))

    # -- synthesizer --------------------------------------------------------------------------

    async def _synthesize(self) -> None:
        while True:
            job = await self.jobs.get()
            match job:
                case Close():
                    self.outbox.put(Item(None))
                    return
                case End(utterance=u) if not u.cancelled:
                    self._queue_done(job)
                case Segment(utterance=u) if not u.cancelled:
                    self.current = task = asyncio.create_task(self._speak(job))
                    try:
                        await asyncio.wait([task])
                    finally:
                        task.cancel()  # a no-op once done; stops the segment when the session ends
                        self.current = None
                    if not task.cancelled() and (exc := task.exception()) is not None:
                        raise exc

    async def _speak(self, seg: Segment) -> None:
        u = seg.utterance
        packer, config = u.packer, u.config
        start = seg.counted = packer.start_segment(seg.sentence_index)
        self._put(
            u,
            AudioStart(
                utterance_index=u.index,
                sentence_index=seg.sentence_index,
                sentence_text=seg.text,
                format=config.response_format,
                sample_rate=packer.sample_rate,
                start_sample=start,
            ),
            streamed=config.streamed,
        )
        failure: EngineError | None = None
        try:
            async with contextlib.aclosing(seg.open()) as chunks:
                # Open the next segment's stream now: an engine that starts work on the call
                # (vllm-omni) gets it submitted while this one streams, and can batch the two.
                following = self.jobs.peek()
                if isinstance(following, Segment) and not following.utterance.cancelled:
                    following.open()
                t = time.perf_counter()
                async for chunk in chunks:
                    seg.synthesis_s += time.perf_counter() - t
                    await self._put_frames(seg, packer.push(chunk.samples, chunk.sample_rate))
                    t = time.perf_counter()
        except EngineError as exc:
            failure = exc
            seg.error = True
        await self._put_frames(seg, packer.end_segment())
        u.synthesis_s += seg.synthesis_s
        total_bytes, samples = packer.segment_bytes, packer.segment_samples

        def done() -> str:
            ready = seg.first_sent_t - seg.ready_t if seg.first_sent_t is not None else None
            return self.session.send(
                AudioDone(
                    utterance_index=u.index,
                    sentence_index=seg.sentence_index,
                    total_bytes=total_bytes,
                    duration_ms=round(samples * 1000.0 / packer.sample_rate, 2),
                    error=seg.error,
                    text_to_first_audio_ms=_ms(ready),
                    synthesis_ms=_ms(seg.synthesis_s) or 0.0,
                )
            )

        self._put(u, done)
        if failure is not None:
            self.log.warning("engine failed on segment %d/%d: %s", u.index, seg.sentence_index, failure)
            refused = failure if isinstance(failure, RequestRefused) else None
            code = ErrorCode.REQUEST_REFUSED if refused else ErrorCode.ENGINE_ERROR
            field = refused.field if refused else None
            self._put(u, Error(code=code, message=str(failure), utterance_index=u.index, field=field))

    async def _put_frames(self, seg: Segment, frames: list[bytes]) -> None:
        packer = seg.utterance.packer
        new_samples, seg.counted = packer.samples_sent - seg.counted, packer.samples_sent
        if not frames or seg.utterance.cancelled:
            return
        audio_s = new_samples / packer.sample_rate / len(frames)  # a whole segment when not streamed
        for frame in frames:
            await self.outbox.put_audio(Item(frame, seg.utterance.index, audio_s, seg.sent))
            if seg.utterance.cancelled:
                return  # cancelled while waiting for room

    def _put(self, u: Utterance, msg: ServerMessage | Payload, *, streamed: bool = True) -> None:
        if u.cancelled:
            return
        if isinstance(msg, str | bytes) or callable(msg):
            payload: Payload = msg
        else:
            payload = self.session.send(msg, streamed=streamed)
        self.outbox.put(Item(payload, u.index))

    def _queue_done(self, job: End) -> None:
        u = job.utterance

        def done() -> str:
            first = u.first_audio_t - u.first_text_t if u.first_audio_t and u.first_text_t else None
            return self.session.send(
                SessionDone(
                    utterance_index=u.index,
                    total_sentences=job.total_sentences,
                    first_text_to_first_audio_ms=_ms(first),
                    audio_ms=round(u.packer.samples_sent * 1000.0 / u.packer.sample_rate, 2),
                    synthesis_ms=_ms(u.synthesis_s) or 0.0,
                )
            )

        def finished() -> None:
            self.utterances.pop(u.index, None)

        self.outbox.put(Item(done, u.index, on_sent=finished))

    # -- writer -------------------------------------------------------------------------------

    async def _write(self) -> None:
        while True:
            item = await self.outbox.get()
            payload = item.payload
            try:
                if payload is None:
                    await self.ws.close(CloseCode.NORMAL)
                    raise _Stop()
                if callable(payload):
                    payload = payload()
                if item.on_sent is not None:
                    item.on_sent()  # before the await, so a cancel meanwhile sees the new state
                # A send blocks only while the client does not read; past the idle timeout it is closed.
                self.sending = True
                try:
                    async with asyncio.timeout(self.settings.send_timeout_s):
                        if isinstance(payload, bytes):
                            await self.ws.send_bytes(payload)
                        else:
                            await self.ws.send_text(payload)
                finally:
                    self.sending = False
            except WebSocketDisconnect:
                raise _Stop() from None
            except TimeoutError:
                raise SlowConsumer(
                    f"the client read nothing for {self.settings.send_timeout_s:g} s"
                ) from None
            self.last_activity = time.monotonic()

    async def _abort(self, err: ProtocolError) -> None:
        """Report a fatal error and close. A client that stopped reading gets one more send timeout
        to read the rest, the error and the close; the engine work is already stopped, so only the
        socket waits."""
        self.log.info("closing with %d: %s %s", err.close_code, err.code, err.message)
        message = self.session.send(Error(code=err.code, message=err.message, fatal=True, field=err.field))
        patience_s = max(CLOSE_TIMEOUT_S, self.settings.send_timeout_s)
        with contextlib.suppress(TimeoutError, WebSocketDisconnect, RuntimeError):
            async with asyncio.timeout(patience_s):
                await self.ws.send_text(message)
        with contextlib.suppress(TimeoutError, WebSocketDisconnect, RuntimeError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.ws.close(err.close_code, err.code)


def slow_consumer_error(exc: SlowConsumer) -> ProtocolError:
    """The fatal error that ends a session whose client stopped reading."""
    return ProtocolError(ErrorCode.SLOW_CONSUMER, str(exc), close_code=CloseCode.SLOW_CONSUMER, fatal=True)
