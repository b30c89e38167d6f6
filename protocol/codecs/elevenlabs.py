"""ElevenLabs' text-to-speech wire shapes, mapped onto voxgate's session protocol (sans-I/O).

ElevenLabs clients (pipecat's ``ElevenLabsTTSService``, livekit-plugins-elevenlabs, the ``elevenlabs``
SDK) speak through voxgate unchanged: this module turns their messages into voxgate client messages
(``protocol.messages``) of one session per socket, each ElevenLabs context a context of that session
(``context_id``, docs/protocol.md §11 and §11.1), and the session's server messages back into theirs.
``protocol.codecs.elevenlabs_socket`` makes ``Stream`` the codec of a socket
(``gateway/routes/elevenlabs_ws.py`` runs it), and the REST routes use it for each segment's alignment;
docs/agents.md has the wire rules. What a request asks for (its query, a REST body, ``voice_settings``, the
``session.config`` they make, the REST error body) is ``protocol.codecs.elevenlabs_request``'s.

Client -> server, one JSON text message each (every field optional)::

    {"text": " ", "voice_settings": {...}, "generation_config": {...}, "context_id": "c1"}  first one
    {"text": "Hello there. ", "try_trigger_generation": true, "flush": false}                text
    {"text": ""}                       stream-input: end of input; multi-stream-input: keep-alive
    {"context_id": "c1", "flush": true}                  speak what is buffered now
    {"context_id": "c1", "close_context": true}          end of the context's input
    {"close_socket": true}                               end of every context, then close

Server -> client::

    {"audio": "<base64>", "isFinal": null, "alignment": {...} | null, "normalizedAlignment": {...} | null,
     "contextId": "c1"}                                  audio as it comes; contextId on multi only
    {"audio": "", "isFinal": null, "alignment": {...}, ...}  a segment's characters not sent by its end
    {"isFinal": true, "contextId": "c1"}                 after a context's last audio
    {"message": "...", "error": "<code>", "code": 1008}  an error (contextId when it is a context's); the
                                                         close code only on a fatal one, as it closes

Each character of a segment goes out once, in order, with the first audio message by which it is known
(``known_alignment``: a word's characters once the next word is timed; all of them at the segment's
``audio.done`` when the engine times no words) and has started (``Stream.audio``). Alignment times are
milliseconds from where the segment's previous alignment ended, so that the spans add up to the audio
(pipecat's clock), which is the message's own audio start when its alignment covers it (``Alignment`` in
the SDK). The REST routes send a segment whole with its alignment (``hold`` / ``take_segment``); their
``with-timestamps`` shapes use seconds from the start of the response.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping

import msgspec

from ..alignment import Alignment, known_alignment, spread_alignment, word_alignment
from ..audio import BYTES_PER_SAMPLE, AudioFormat
from ..dictionaries import Dictionary, Locator, Locators, pronunciations
from ..errors import FAILURES, CloseCode, ErrorCode, ProtocolError, decoded
from ..messages import (
    AudioDone,
    AudioStart,
    ClientMessage,
    ContextClose,
    ContextClosed,
    Error,
    InputDone,
    InputText,
    Keepalive,
    Pronunciation,
    ServerMessage,
    SessionClose,
    SessionConfig,
    WordTimestamp,
    WordTimestamps,
)
from .elevenlabs_request import (
    DEFAULT_INACTIVITY_TIMEOUT_S,
    ERROR_CODES,
    Params,
    VoiceSettings,
    decode_body,
    http_error,
    parse_params,
    session_config,
)

#: This module's own names, and those of ``elevenlabs_request`` its callers have always taken from here.
__all__ = [
    "DEFAULT_INACTIVITY_TIMEOUT_S",
    "FIXED_CONTEXT",
    "Inbound",
    "Params",
    "Stream",
    "VoiceSettings",
    "close_code",
    "decode_body",
    "decode_inbound",
    "http_error",
    "parse_params",
    "session_config",
    "ws_error",
]

#: The close code of each error code (``protocol.errors.FAILURES``), by the code's string.
_CLOSE_CODES: dict[str, CloseCode] = {str(code): failure.close_code for code, failure in FAILURES.items()}


def close_code(code: int) -> int:
    """The close code an ElevenLabs client gets: ours, but 1008 for a timeout (ElevenLabs' own choice)."""
    return int(CloseCode.POLICY_VIOLATION) if code == CloseCode.TIMEOUT else code


class Inbound(msgspec.Struct, frozen=True, kw_only=True):
    """One client message of ``stream-input`` / ``multi-stream-input``; unknown fields are ignored."""

    text: str | None = None
    context_id: str | None = None
    flush: bool = False
    try_trigger_generation: bool | None = None
    close_context: bool = False
    close_socket: bool = False
    voice_settings: VoiceSettings | None = None
    #: The dictionaries whose words the socket says their way (its first message; ``Stream.receive``).
    pronunciation_dictionary_locators: Locators | None = None


_decode_inbound = msgspec.json.Decoder(Inbound).decode
_encode = msgspec.json.Encoder().encode


def decode_inbound(data: str | bytes) -> Inbound:
    """Decode one client message of a socket.

    Raises:
        ProtocolError: not JSON, nested past the interpreter's stack (``invalid_json``), or a field of the
            wrong type (``invalid_message``, with its path).
    """
    return decoded(_decode_inbound, data)


#: The session's context for ``stream-input``'s messages, and for ``multi-stream-input``'s that name none
#: (a named context of the core, so that its end is reported: ``context.closed`` is ``isFinal``).
FIXED_CONTEXT = "elevenlabs:default"


@dataclasses.dataclass(slots=True)
class _Segment:
    """The segment whose audio comes next (from its ``audio.start``), and how much of it was sent."""

    format: AudioFormat
    rate: int
    context: str = FIXED_CONTEXT
    text: str = ""
    start_ms: float = 0.0  #: where it starts on its utterance's clock
    timed: list[WordTimestamp] = dataclasses.field(default_factory=list)  #: its words
    speaking: bool = False  #: between its audio.start and its audio.done
    sent: int = 0  #: its characters already sent
    sent_ms: float = 0.0  #: its audio already sent
    origin_ms: float = 0.0  #: where the next alignment's times count from, from its start


class Stream:
    """One ``stream-input`` or ``multi-stream-input`` socket over one voxgate session and its contexts.

    ``start`` opens the session; ``receive`` maps the client's messages to the session's (docs/protocol.md
    §11.1); ``render`` maps the session's typed server messages back and ``audio`` its audio as it comes,
    routing each by its context: a message by its ``context_id``, audio by the ``audio.start`` before it.

    Args:
        voice_id: the voice of the path.
        params: the query parameters.
        multi: ``multi-stream-input``: messages name contexts, an empty text is a keep-alive, and every
            message sent back carries ``contextId``.
        words: the engine times words: ask for them, and align characters with them.
        dictionaries: the caller's pronunciation dictionaries by id, for the locators of its messages
            (None: the store could not be read).
    """

    def __init__(
        self,
        voice_id: str,
        params: Params,
        *,
        multi: bool,
        words: bool = False,
        dictionaries: Mapping[str, Dictionary] | None = None,
    ) -> None:
        self.voice_id, self.params, self.multi, self.words = voice_id, params, multi, words
        self.dictionaries = dictionaries
        self._locators: list[Locator] | None = None  # the socket's pronunciation dictionaries
        self._said: list[Pronunciation] | None = None  # their entries
        self._settings: VoiceSettings | None = None  # the first message's voice settings
        self._spoken = False  # text went to the session
        self.configured = False  # a session.config went out
        self.settled = False  # a first message was taken: later ``voice_settings`` are ignored
        self.ended = False  # the client's input ended: what follows is ignored
        self._open: set[str] = set()  # the contexts this codec opened and has not closed
        self._segment = _Segment(*params.audio)
        self._held: bytes | None = None  # REST: a segment's audio, until its audio.done says how long it is
        self._ready: tuple[bytes, Alignment, float] | None = None  # REST: a segment with its alignment

    def start(self) -> list[ClientMessage]:
        """The session's ``session.config``, sent as the socket opens (the first message may add a speed)."""
        self.configured = True
        return [session_config(self.voice_id, self.params, words=self.words, whole_segments=False)]

    def context_of(self, msg: Inbound) -> str:
        """The session's context for a client message."""
        return (msg.context_id if self.multi else None) or FIXED_CONTEXT

    def receive(self, msg: Inbound) -> list[ClientMessage]:
        """The session messages one client message becomes (none once the input ended).

        Raises:
            ProtocolError: the first message's ``voice_settings`` are out of range; the message is not
                taken, and the next one is a first message again.
        """
        if self.ended:
            return []
        out: list[ClientMessage] = []
        located = self._locate(msg)
        if not self.settled:
            settings = self._settings = msg.voice_settings
            if not self.configured or (settings is not None and settings.speed is not None) or located:
                out.append(self._config())
            self.configured = self.settled = True
        elif located:
            out.append(self._config())
        if msg.close_socket or (msg.text == "" and not self.multi):
            self.ended = True
            return [*out, SessionClose()]
        context = self.context_of(msg)
        if msg.text == "":  # multi-stream-input's keep-alive: of one context, or of all
            out.append(Keepalive(context_id=msg.context_id))
            if msg.context_id:
                self._open.add(context)
        elif msg.text is not None and (msg.text.strip() or context in self._open):
            out.append(InputText(text=msg.text, context_id=context))
            self._open.add(context)
            self._spoken = True
        elif msg.text is not None:  # the init message's " ": opens the context
            out.append(Keepalive(context_id=context))
            self._open.add(context)
        if msg.flush:
            out.append(InputDone(context_id=context))
            self._open.add(context)
        if msg.close_context:
            out.append(ContextClose(context_id=context))
            self._open.discard(context)
        return out

    def _config(self) -> SessionConfig:
        return session_config(
            self.voice_id,
            self.params,
            self._settings,
            words=self.words,
            whole_segments=False,
            pronunciations=self._said,
        )

    def _locate(self, msg: Inbound) -> bool:
        """Take a message's ``pronunciation_dictionary_locators``: True if they set the socket's (a new
        ``session.config`` follows). They apply to every context of the socket, so they may be set until
        its first text; later the same ones are welcome (pipecat sends them with each context), others not.

        Raises:
            ProtocolError: fatal for a locator that names no dictionary of the caller's
                (``pronunciation_dictionary_not_found``); not fatal for other locators after text
                (``unsupported_option``).
        """
        locators = msg.pronunciation_dictionary_locators
        if locators is None or locators == self._locators:
            return False
        field = "$.pronunciation_dictionary_locators"
        if self._spoken:
            message = (
                "this socket's pronunciation dictionaries are those of its messages before its first text; "
                "they apply to every context: open another socket for others"
            )
            raise ProtocolError(ErrorCode.UNSUPPORTED_OPTION, message, field=field)
        try:
            self._said = pronunciations(locators, self.dictionaries)
        except ProtocolError as err:
            err.fatal = True
            raise
        self._locators = locators
        return True

    def render(self, msg: ServerMessage) -> list[bytes]:
        """The client messages for one server message of the session: ``isFinal`` for a context's end, an
        error, and at a segment's ``audio.done`` the alignment of its characters not sent yet."""
        rest = self._rest(msg.duration_ms) if isinstance(msg, AudioDone) and self._segment.speaking else []
        match self._take(msg):
            case ContextClosed(context_id=context):
                self._open.discard(context)
                return [self._shape({"isFinal": True}, context)]
            case Error(code=code, message=message, fatal=fatal, context_id=context):
                named = None if isinstance(context, msgspec.UnsetType) else context
                close = _CLOSE_CODES.get(code, CloseCode.INTERNAL_ERROR) if fatal else None
                return [*rest, self._shape(ws_error(code, message, close), named)]
        return rest

    def audio(self, data: bytes, audio_s: float) -> bytes:
        """One audio message as the audio comes: ``data`` (a piece of the segment whose ``audio.start`` came
        last, ``audio_s`` long: a frame, or what the compressed stream's encoder gave), with the alignment
        of the characters known by now that start before the end of the audio sent (null: none yet).

        An alignment's times count from where the segment's previous alignment ended (its first from the
        segment's start), and its last character lasts until the end of the audio it covers, so that a
        client adding up each alignment's span (pipecat) stays on the audio's clock; a message whose
        alignment is its own audio's starts at that audio's start.
        """
        seg = self._segment
        width = BYTES_PER_SAMPLE.get(seg.format)
        seg.sent_ms += len(data) / width * 1000.0 / seg.rate if width else audio_s * 1000.0
        alignment = None
        if seg.speaking and seg.timed:
            known, open_ms = known_alignment(seg.text + " ", seg.timed, seg.start_ms)
            alignment = self._next(known, min(seg.sent_ms, open_ms), last=False)
        return self._audio_payload(data, alignment)

    def _rest(self, duration_ms: float) -> list[bytes]:
        """At a segment's ``audio.done``: its characters not sent yet, in an audio message with no audio
        (the segment's whole alignment when its engine times no words: only its length places them)."""
        self._segment.speaking = False
        alignment = self._next(self._alignment(duration_ms), duration_ms, last=True)
        return [] if alignment is None else [self._audio_payload(b"", alignment)]

    def _next(self, known: Alignment, until_ms: float, *, last: bool) -> Alignment | None:
        """The characters of ``known`` not sent yet that start before ``until_ms`` (every one: ``last``),
        timed from the previous alignment's end to ``until_ms``; None if there are none."""
        seg = self._segment
        stop = seg.sent
        while stop < len(known.chars) and (last or known.charStartTimesMs[stop] < until_ms):
            stop += 1
        if stop == seg.sent:
            return None
        origin, until = round(seg.origin_ms), round(until_ms)
        starts = [max(t - origin, 0) for t in known.charStartTimesMs[seg.sent : stop]]
        durations = known.charDurationsMs[seg.sent : stop]
        durations[-1] = max(until - origin - starts[-1], 0)
        chars = known.chars[seg.sent : stop]
        seg.sent, seg.origin_ms = stop, until_ms
        return Alignment(chars, starts, durations)

    def hold(self, data: bytes) -> None:
        """A whole segment's audio (one binary message of the session); its ``audio.done`` follows."""
        self._held = data

    def take_segment(self) -> tuple[bytes, Alignment, float] | None:
        """The segment completed by the last message taken: its audio, alignment and length in ms."""
        segment, self._ready = self._ready, None
        return segment

    def observe(self, msg: ServerMessage) -> Error | None:
        """Take one message of the session without rendering it (REST: noting each segment's text, words
        and end); hands back its errors."""
        self._take(msg)
        return msg if isinstance(msg, Error) else None

    def _take(self, msg: ServerMessage) -> ServerMessage:
        match msg:
            case AudioStart(sentence_text=sentence, format=fmt, sample_rate=rate, start_sample=start):
                context = FIXED_CONTEXT if isinstance(msg.context_id, msgspec.UnsetType) else msg.context_id
                self._segment = _Segment(fmt, rate, context, sentence, start * 1000.0 / rate, speaking=True)
            case WordTimestamps(timestamps=timed):
                self._segment.timed += timed
            case AudioDone(duration_ms=duration_ms) if self._held is not None:
                data, self._held = self._held, None
                self._ready = (data, self._alignment(duration_ms), duration_ms)
        return msg

    def _alignment(self, duration_ms: float) -> Alignment:
        """The alignment of the segment of the ``audio.start`` seen last, ``duration_ms`` long."""
        seg = self._segment
        if seg.timed:
            return word_alignment(seg.text + " ", seg.timed, seg.start_ms, duration_ms)
        return spread_alignment(seg.text + " ", duration_ms)

    def _audio_payload(self, data: bytes, alignment: Alignment | None) -> bytes:
        """One audio message: base64 audio with its alignment (also as ``normalizedAlignment``; null when it
        has none), for the context of the ``audio.start`` seen last."""
        shape = None if alignment is None else msgspec.to_builtins(alignment)
        payload: dict[str, object] = {
            "audio": base64.b64encode(data).decode(),
            "isFinal": None,
            "normalizedAlignment": shape,
            "alignment": shape,
        }
        return self._shape(payload, self._segment.context)

    def error(self, err: ProtocolError, context: str | None = None) -> bytes:
        """An error in ElevenLabs' shape, of ``context`` (the session's name for it), else of the socket;
        with its close code when it is fatal."""
        return self._shape(ws_error(err.code, err.message, err.close_code if err.fatal else None), context)

    def _shape(self, payload: dict[str, object], context: str | None) -> bytes:
        """``payload`` with the ``contextId`` of ``context`` on ``multi-stream-input`` (None: the socket's,
        which has none; the fixed context's is null)."""
        if self.multi and context is not None:
            payload["contextId"] = None if context == FIXED_CONTEXT else context
        return _encode(payload)


def ws_error(code: str, message: str, close: int | None) -> dict[str, object]:
    """A WebSocket error in ElevenLabs' shape: ``message``, ``error`` (its code), and ``code``, the close code
    that follows, only when one follows.

    ElevenLabs sends an error only as it closes, with the close code in it; voxgate's non-fatal errors
    (``message_too_large``, ``max_active_conversations``, ``engine_error`` of one segment, ...) leave the
    socket open, and a close code in them (1009, 1011) would tell the client it is closing.

    Args:
        code: a voxgate error code (ElevenLabs' own word where it has one: ``voice_not_found``, ...).
        message: what to tell the client.
        close: voxgate's close code of a fatal error (ElevenLabs' is sent: ``close_code``); None when the
            error is not fatal.
    """
    payload: dict[str, object] = {"message": message, "error": ERROR_CODES.get(code, code)}
    if close is not None:
        payload["code"] = close_code(close)
    return payload
