"""Wire messages of ``WS /v1/audio/speech/stream``, as msgspec Structs in tagged unions.

Message flow (``docs/protocol.md`` is the full contract)::

    client                                   server
    session.config ─────────────────────────▶
                   ◀───────────────────────── session.ready
    input.text  (any number, any size) ─────▶
                   ◀───────────────────────── audio.start      (per segment)
                   ◀───────────────────────── audio.chunk      (word timings, with word_timestamps)
                   ◀───────────────────────── <binary audio>   (frames of frame_ms)
                   ◀───────────────────────── audio.done       (per segment)
    input.done  (flush; the socket stays) ──▶
                   ◀───────────────────────── session.done     (per utterance)
    input.commit (cut the text so far) ─────▶
                   ◀───────────────────────── input.committed
    input.cancel (barge-in) ────────────────▶
                   ◀───────────────────────── audio.cancelled  (no audio of it after this)
    {"event":"mark"} (carrier echo, framing) ▶
                   ◀───────────────────────── playback.position
    keepalive   (restarts idle timers) ─────▶
    context.close (one context, gracefully) ▶
                   ◀───────────────────────── context.opened / context.closed
    session.config (again, between utterances)
    session.close ──────────────────────────▶ (all queued audio goes out, then close 1000)
                   ◀───────────────────────── error            (any time; fatal ones close)

Client messages are frozen and ignore unknown fields, as vllm-omni does (its clients send fields newer
servers know); ``session.ready`` lists the ignored config fields back to clients that opted in to
voxgate's extensions (``session.ready``, ``input.cancel``, ``warning``, timings). Server messages give
every field a default, so adding one never breaks a client; ``protocol.codecs.stream`` renders them with
exactly vllm-omni's field sets for clients that did not opt in.

Contexts (a voxgate extension): ``input.text``, ``input.done``, ``input.commit``, ``input.cancel`` and
``keepalive`` may name a ``context_id``, one of several independent streams of utterances on one socket
(ElevenLabs' multi-context WebSocket). Without it a message is about the default context, as before. The
server messages about a named context's utterances carry its ``context_id``; a field that is ``UNSET`` is
left out of the JSON, so messages of the default context are written exactly as before.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .audio import AudioFormat

# The options ``session.config`` shares with the REST routes are ``protocol.config``'s; they are named here
# too, where callers that build or read a ``session.config`` have always found them.
from .config import DEFAULT_MAX_BUFFER_DELAY_MS as DEFAULT_MAX_BUFFER_DELAY_MS
from .config import DEFAULT_SAMPLE_RATE as DEFAULT_SAMPLE_RATE
from .config import ENGINE_OPTION_FIELDS as ENGINE_OPTION_FIELDS
from .config import MAX_NEW_TOKENS as MAX_NEW_TOKENS
from .config import MAX_PRONUNCIATIONS as MAX_PRONUNCIATIONS
from .config import Bitrate, BufferDelayMs, FrameMs, StreamId, StreamingMode, TextInputMode
from .config import CarrierName as CarrierName
from .config import Embedding as Embedding
from .config import Pronunciation as Pronunciation
from .config import SampleRate as SampleRate
from .config import Seed as Seed
from .config import SpeechOptions as SpeechOptions
from .config import Speed as Speed
from .config import TaskType as TaskType
from .config import engine_options as engine_options
from .errors import ProtocolError
from .segmenter import Granularity

#: A context's id: what UUIDs, short ids and readable names need, and nothing that must be escaped in logs.
ContextId = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
#: Why a context was closed: ``context.close`` / ``session.close``, ``input.cancel``, or its idle timeout.
CloseReason = Literal["closed", "cancelled", "idle_timeout"]


class _Client(msgspec.Struct, tag_field="type", frozen=True, kw_only=True):
    """Base of every client-to-server message."""


class SessionConfig(_Client, SpeechOptions, tag="session.config", frozen=True):
    """Configures the session; first message, may be sent again between utterances.

    Field names follow vllm-omni's ``StreamingSpeechSessionConfig`` (the shared ones are in
    ``SpeechOptions``); ``f32``/``mulaw`` formats, ``eager_first_segment``, ``max_buffer_delay_ms``,
    ``frame_ms`` and ``frame_header`` are voxgate's own. Each config replaces the previous one whole:
    omitted fields take their defaults.
    """

    voice: str | None = None
    speaker: str | None = None
    response_format: AudioFormat = "pcm"
    stream_audio: bool | None = None
    split_granularity: Granularity | None = None
    eager_first_segment: bool | None = None
    max_buffer_delay_ms: BufferDelayMs = DEFAULT_MAX_BUFFER_DELAY_MS
    text_input_mode: TextInputMode | None = None
    streaming_mode: StreamingMode | None = None
    frame_ms: FrameMs = 40
    frame_header: bool = False
    #: The compressed formats' bit rate in bit/s (voxgate's own); None: the encoder's default.
    bitrate: Bitrate | None = None
    word_timestamps: bool = False
    framing: CarrierName | None = None
    stream_sid: StreamId | None = None

    @property
    def voice_name(self) -> str | None:
        """The requested voice: ``voice``, else its alias ``speaker``, else None (engine default)."""
        return self.voice if self.voice is not None else self.speaker

    @property
    def streamed(self) -> bool:
        """Whether audio goes out in frames: ``stream_audio``, else only the formats without a file header
        (``pcm``, ``f32``, ``mulaw``): ``wav`` and the compressed formats send one file a segment, as
        vllm-omni does (it streams ``pcm`` only)."""
        if self.stream_audio is not None:
            return self.stream_audio
        return self.response_format in ("pcm", "f32", "mulaw")

    def segmentation(self) -> tuple[Granularity, bool]:
        """The granularity and eager-first setting this config asks for, explicit fields first.

        ``split_granularity`` and ``eager_first_segment`` win when set. Otherwise vllm-omni's modes
        decide: ``buffered`` and ``sentence_commit`` cut only at ``input.commit`` / ``input.done``,
        ``commitment`` only at confirmed sentence ends, ``token_level`` starts audio early. With none of
        these fields: sentences, with an eager first segment.
        """
        granularity: Granularity
        eager: bool
        if self.streaming_mode == "sentence_commit" or self.text_input_mode == "buffered":
            granularity, eager = "none", False
        elif self.streaming_mode == "token_level":
            granularity, eager = "sentence", True
        elif self.text_input_mode == "commitment":
            granularity, eager = "sentence", False
        else:
            granularity, eager = "sentence", self.split_granularity is None
        if self.split_granularity is not None:
            granularity = self.split_granularity
        if self.eager_first_segment is not None:
            eager = self.eager_first_segment
        return granularity, eager


class InputText(_Client, tag="input.text", frozen=True):
    """Appends text to the context's open utterance (starts one if none is open)."""

    text: str
    context_id: ContextId | None = None


class InputDone(_Client, tag="input.done", frozen=True):
    """Flush: synthesize everything buffered and end the context's utterance; the socket stays open."""

    context_id: ContextId | None = None


class InputCommit(_Client, tag="input.commit", frozen=True):
    """Cut the context's text buffered so far into a segment now; answered by ``input.committed``."""

    commit_id: str | None = None
    context_id: ContextId | None = None


class InputCancel(_Client, tag="input.cancel", frozen=True):
    """Barge-in: drop buffered text, abort synthesis and discard queued audio (of one context, or all)."""

    context_id: ContextId | None = None


class Keepalive(_Client, tag="keepalive", frozen=True):
    """Restart the idle timer of one context (``context_id``), or of every context; nothing else."""

    context_id: ContextId | None = None


class ContextClose(_Client, tag="context.close", frozen=True):
    """End the context's open utterance as ``input.done`` would; once its audio is out, close it."""

    context_id: ContextId


class SessionClose(_Client, tag="session.close", frozen=True):
    """Finish the current utterance as ``input.done`` would, then close with 1000."""


ClientMessage = (
    SessionConfig
    | InputText
    | InputDone
    | InputCommit
    | InputCancel
    | Keepalive
    | ContextClose
    | SessionClose
)
CLIENT_TYPES: frozenset[str] = frozenset(
    str(t.__struct_config__.tag)
    for t in (
        SessionConfig,
        InputText,
        InputDone,
        InputCommit,
        InputCancel,
        Keepalive,
        ContextClose,
        SessionClose,
    )
)


def wire_context_id(context_id: str | None) -> str | msgspec.UnsetType:
    """A context id as server messages carry it: left out for the default context (None)."""
    return msgspec.UNSET if context_id is None else context_id


class _Server(msgspec.Struct, tag_field="type", kw_only=True):
    """Base of every server-to-client message."""


class Limits(msgspec.Struct, kw_only=True):
    """Limits in force for the session."""

    max_message_bytes: int = 0
    max_config_bytes: int = 0
    idle_timeout_s: float = 0.0
    max_buffered_audio_s: float = 0.0
    send_timeout_s: float = 0.0
    max_pending_text_chars: int = 0
    max_sessions: int = 0
    max_sessions_per_key: int = 0
    #: A segment's audio is at most ``(base + per_char * characters) / speed`` seconds; more is cut.
    max_segment_audio_base_s: float = 0.0
    max_segment_audio_per_char_s: float = 0.0
    max_contexts: int = 0
    context_idle_timeout_s: float = 0.0
    #: REST requests per second per API key (per client address without keys), and the burst above it.
    rate_limit_per_s: float = 0.0
    rate_limit_burst: int = 0
    #: Seconds an HTTP client has to send a request's headers.
    header_timeout_s: float = 0.0


class EffectiveConfig(msgspec.Struct, kw_only=True):
    """What the server will actually do with the accepted config."""

    voice: str = ""
    engine: str = ""
    response_format: AudioFormat = "pcm"
    sample_rate: int = 0
    channels: int = 1
    speed: float = 1.0
    seed: int | None = None
    stream_audio: bool = True
    split_granularity: Granularity = "sentence"
    eager_first_segment: bool = True
    max_buffer_delay_ms: int = DEFAULT_MAX_BUFFER_DELAY_MS
    frame_ms: int = 40
    frame_header: bool = False
    #: The compressed formats' bit rate in bit/s (None for the others).
    bitrate: int | None = None
    framing: CarrierName | None = None


class SessionReady(_Server, tag="session.ready"):
    """Sent after each accepted ``session.config``."""

    session_id: str = ""
    config: EffectiveConfig = msgspec.field(default_factory=EffectiveConfig)
    limits: Limits = msgspec.field(default_factory=Limits)
    ignored_fields: list[str] = msgspec.field(default_factory=list)


class AudioStart(_Server, tag="audio.start"):
    """Announces the audio of one segment; its binary frames follow."""

    utterance_index: int = 0
    sentence_index: int = 0
    sentence_text: str = ""
    format: AudioFormat = "pcm"
    sample_rate: int = 0
    channels: int = 1
    start_sample: int = 0
    word_timestamps: bool | msgspec.UnsetType = msgspec.UNSET  # true: the config asked for word timings
    context_id: str | msgspec.UnsetType = msgspec.UNSET


class WordTimestamp(msgspec.Struct, kw_only=True):
    """One spoken word: ``[start_ms, end_ms)`` on the utterance's audio clock."""

    word: str = ""
    start_ms: float = 0.0
    end_ms: float = 0.0


class WordTimestamps(_Server, tag="audio.chunk"):
    """Word timings of a stretch of a segment's audio, sent before that audio (``word_timestamps``).

    vllm-omni's alignment chunk (an ``audio.chunk`` whose ``audio_b64`` is empty), with voxgate's timing
    rules: it comes before the binary frames it describes, and every time (``chunk_start_ms``,
    ``chunk_end_ms``, each word's) counts milliseconds from the start of the utterance's audio as the
    client receives it (output samples / ``sample_rate``), the clock of ``audio.start``'s ``start_sample``.
    ``chunk_id`` counts these messages within the segment.
    """

    utterance_index: int = 0
    sentence_index: int = 0
    chunk_id: int = 0
    chunk_start_ms: float = 0.0
    chunk_end_ms: float = 0.0
    sample_rate: int = 0
    audio_b64: str = ""
    timestamps: list[WordTimestamp] = msgspec.field(default_factory=list)
    context_id: str | msgspec.UnsetType = msgspec.UNSET


class AudioDone(_Server, tag="audio.done"):
    """Ends the audio of one segment, with its timing."""

    utterance_index: int = 0
    sentence_index: int = 0
    total_bytes: int = 0
    duration_ms: float = 0.0
    error: bool = False
    text_to_first_audio_ms: float | None = None
    synthesis_ms: float = 0.0
    context_id: str | msgspec.UnsetType = msgspec.UNSET


class SessionDone(_Server, tag="session.done"):
    """Ends an utterance (after ``input.done``), with its metrics."""

    utterance_index: int = 0
    total_sentences: int = 0
    first_text_to_first_audio_ms: float | None = None
    audio_ms: float = 0.0
    synthesis_ms: float = 0.0
    context_id: str | msgspec.UnsetType = msgspec.UNSET


class AudioCancelled(_Server, tag="audio.cancelled"):
    """Confirms ``input.cancel``; no binary frame of this utterance follows it.

    One per utterance that was in flight, or whose audio was all written but not yet all heard;
    ``utterance_index`` is None when there was none. What the listener heard of it (docs/protocol.md §8):
    ``played_ms`` of its audio, played in real time from its first frame written; ``text_spoken``, its text
    up to the last word heard, and ``text_remaining``, the rest (together: the text as the client sent it);
    ``text_spoken_source`` says how the cut was found: ``words`` from the engine's word timings, ``estimate``
    spread over each segment's audio by characters. Absent with no utterance.
    """

    utterance_index: int | None = None
    context_id: str | msgspec.UnsetType = msgspec.UNSET
    played_ms: float | msgspec.UnsetType = msgspec.UNSET
    text_spoken: str | msgspec.UnsetType = msgspec.UNSET
    text_remaining: str | msgspec.UnsetType = msgspec.UNSET
    text_spoken_source: Literal["words", "estimate"] | msgspec.UnsetType = msgspec.UNSET


class InputCommitted(_Server, tag="input.committed"):
    """Answers ``input.commit``: the text so far became segment ``sentence_index`` (None: no text)."""

    commit_id: str | None = None
    utterance_index: int = 0
    sentence_index: int | None = None
    context_id: str | msgspec.UnsetType = msgspec.UNSET


class PlaybackPosition(_Server, tag="playback.position"):
    """A carrier echoed a segment's mark (``framing``): the listener has heard that segment to its end.

    ``played_ms`` is all the audio heard on the socket so far: the segments whose marks came back.
    """

    mark: str = ""
    utterance_index: int = 0
    sentence_index: int = 0
    text: str = ""
    duration_ms: float = 0.0
    played_ms: float = 0.0


class ServerWarning(_Server, tag="warning"):
    """Something the server did differently from what was asked, e.g. an option it ignored."""

    code: str = ""
    message: str = ""
    field: str | None = None


class Error(_Server, tag="error"):
    """Reports a failure; ``fatal`` errors are followed by a close."""

    code: str = ""
    message: str = ""
    fatal: bool = False
    utterance_index: int | None = None
    field: str | None = None
    context_id: str | msgspec.UnsetType = msgspec.UNSET

    @classmethod
    def of(cls, err: ProtocolError, utterance: int | None = None, context_id: str | None = None) -> Error:
        """The one way a ``ProtocolError`` becomes an ``error`` message (on the context's wire id)."""
        return cls(
            code=err.code,
            message=err.message,
            fatal=err.fatal,
            utterance_index=utterance,
            field=err.field,
            context_id=wire_context_id(context_id),
        )


class ContextOpened(_Server, tag="context.opened"):
    """A named context opened (at the first message naming it); frames of it carry ``context_number``."""

    context_id: str = ""
    context_number: int = 0


class ContextClosed(_Server, tag="context.closed"):
    """A named context closed: after its last ``session.done``, or at once when cancelled or idle.

    ``context_number`` is None when the context was not open (a ``context.close`` of an unknown id).
    """

    context_id: str = ""
    context_number: int | None = None
    reason: CloseReason = "closed"


ServerMessage = (
    SessionReady
    | AudioStart
    | WordTimestamps
    | AudioDone
    | SessionDone
    | AudioCancelled
    | InputCommitted
    | PlaybackPosition
    | ServerWarning
    | Error
    | ContextOpened
    | ContextClosed
)
