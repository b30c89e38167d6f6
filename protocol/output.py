"""What the session core (``protocol.core``) hands its shell: typed outputs, in the order they take effect.

The shell takes them with ``Core.data_to_send()`` and acts on each in order:

- ``Configure``: a ``session.config`` passed validation: check it against the engines, then call
  ``Core.accept_config`` or ``Core.reject_config``;
- ``Speak``: synthesize this segment (the shell queues it for its engine);
- ``Message``: a server message, rendered by the surface's codec (``protocol.codecs.base``; REST: its route);
- ``Audio``: encoded audio of a segment, sent as it is;
- ``Report``: a timing report whose numbers are known only when it is written: pass it through
  ``Core.sending`` just before writing, which turns it into a ``Message``;
- ``Drop``: a cancel: stop the engine work of these utterances and discard what is queued for them;
- ``Finish``: everything before it is written: close normally.

``utterance`` on an output says which utterance it belongs to, so that a ``Drop`` can discard it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .audio import AudioFormat
from .encoders import COMPRESSED_FORMATS, check_rate
from .errors import ErrorCode, ProtocolError
from .messages import ServerMessage, SessionConfig


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """How the audio of the utterances that start from now on is encoded and framed.

    Args:
        fmt: the wire format.
        sample_rate: the output rate (the engine's audio is resampled to it).
        frame_ms: audio per ``Audio`` output when streamed.
        frame_header: put the 24-byte frame header in front of each ``Audio`` (``protocol.frames``).
        streamed: False makes one ``Audio`` of each whole segment (a complete WAV for ``wav``, a complete
            file for the compressed formats).
        bitrate: the compressed formats' bit rate in bit/s; None: the encoder's default for the rate.
        word_timestamps: the config asked for word timings (``audio.start`` says so: its dialect may then
            carry the audio inside ``audio.chunk`` messages, ``protocol.codecs.stream``).
    """

    fmt: AudioFormat
    sample_rate: int
    frame_ms: int = 40
    frame_header: bool = False
    streamed: bool = True
    bitrate: int | None = None
    word_timestamps: bool = False

    @classmethod
    def of(cls, config: SessionConfig, sample_rate: int) -> OutputFormat:
        """The format a ``session.config`` asks for, at ``sample_rate`` (``SessionConfig.output_rate``)."""
        return cls(
            config.response_format,
            sample_rate,
            config.frame_ms,
            config.frame_header,
            config.streamed,
            config.bitrate,
            config.word_timestamps,
        )

    def check(self) -> OutputFormat:
        """This format, once its rate is known to be one its encoder takes.

        Raises:
            ProtocolError: ``unsupported_rate``, naming the rates the format takes.
        """
        if self.fmt in COMPRESSED_FORMATS:
            try:
                check_rate(self.fmt, self.sample_rate)
            except ValueError as exc:
                raise ProtocolError(ErrorCode.UNSUPPORTED_RATE, str(exc)) from None
        return self


@dataclass(frozen=True, slots=True)
class Configure:
    """A config to check against the engines; ``ignored_fields`` are its unknown fields."""

    config: SessionConfig
    ignored_fields: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Speak:
    """Synthesize segment ``sentence`` of ``utterance``: ``text``."""

    utterance: int
    sentence: int
    text: str


@dataclass(frozen=True, slots=True)
class Message:
    """A server message; ``streamed`` and ``frame_header`` tell the dialect how ``audio.start``'s audio goes
    out (in frames; each behind the frame header). An ``error`` carries its ``failure``, whose HTTP status a
    REST answer takes (an upstream's own 4xx, a ``Retry-After``): the status travels with the failure."""

    msg: ServerMessage
    utterance: int | None = None
    streamed: bool = True
    frame_header: bool = False
    failure: ProtocolError | None = None


@dataclass(frozen=True, slots=True)
class Audio:
    """Encoded audio of one segment, ``audio_s`` seconds of it (what the shell's bound counts)."""

    data: bytes
    utterance: int
    sentence: int
    audio_s: float


@dataclass(frozen=True, slots=True)
class Report:
    """``audio.done`` of segment ``sentence``, or ``session.done`` of the utterance when it is None."""

    utterance: int
    sentence: int | None = None


@dataclass(frozen=True, slots=True)
class Drop:
    """Cancel: stop the engine work of ``utterances`` and discard their queued outputs."""

    utterances: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Finish:
    """Close normally: the client asked to, and everything before this is written."""


Output = Configure | Speak | Message | Audio | Report | Drop | Finish
