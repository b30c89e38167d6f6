"""How server messages are written on the wire: voxgate's full messages, or vllm-omni's exact ones; and
``SessionCodec``, the codec (``protocol.codecs.base``) of the session's own WebSocket in either dialect.

A client that opts in to voxgate's extensions (the WebSocket subprotocol ``voxgate.v1``) gets every
message with every field. Any other client speaks vllm-omni's protocol and gets exactly vllm-omni's
events and field sets (``serving_speech_stream.py`` in vllm-omni 0.30): no ``session.ready``, no
``audio.cancelled``, ``warning`` or ``context.*``, no timings, no error codes and no ``context_id``.

Two things of vllm-omni 0.30 need the codec to keep a little state, in its dialect only:

- Word timestamps. vllm-omni takes ``word_timestamps`` only with streamed ``pcm``, and then sends the
  audio itself as JSON: each PCM chunk as ``audio.chunk`` with base64 ``audio_b64`` and ``timestamps:
  null``, and, after the sentence's audio, one ``audio.chunk`` with empty audio whose ``timestamps`` are
  the sentence's words, in integer ms from the sentence's start. For such a segment (``audio.start`` says
  ``word_timestamps``; streamed ``pcm`` without frame headers) the codec does the same: each ``Audio``
  becomes an ``audio.chunk``, the words the core sends before their audio (``WordTimestamps``, on the
  utterance's clock) are kept and sent re-timed in that trailing chunk, just before ``audio.done``.
  Other formats keep binary frames with the words before them (vllm-omni refuses them).
- A failed segment. vllm-omni sends its ``error`` before its ``audio.done`` (``error: true``), with
  ``partial_audio: true, action: "discard"`` when some of its audio went out. The core writes
  ``audio.done`` first, then the error (voxgate.v1's order), so the codec holds a failed ``audio.done``
  until the error of its utterance, and writes the two in vllm-omni's order; anything else written
  meanwhile releases it first.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import msgspec

from ..errors import CloseCode, ProtocolError
from ..messages import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    ClientMessage,
    ContextClosed,
    ContextOpened,
    Error,
    ServerMessage,
    ServerWarning,
    SessionConfig,
    SessionReady,
    WordTimestamp,
    WordTimestamps,
)
from ..output import Audio, Message
from .base import Codec, Inbound, Payload
from .telephony import Telephony, framed_config

#: The subprotocol a client offers to opt in to voxgate's extensions.
EXTENSIONS_SUBPROTOCOL = "voxgate.v1"

_encode = msgspec.json.Encoder().encode
# vllm-omni's field set of each message it sends; messages not listed here are voxgate's own.
_VLLM_FIELDS: dict[str, tuple[str, ...]] = {
    "audio.start": ("type", "utterance_index", "sentence_index", "sentence_text", "format"),
    # Sent only to a client that asked for word_timestamps, in either dialect: asking is opting in.
    "audio.chunk": (
        "type",
        "utterance_index",
        "sentence_index",
        "chunk_id",
        "chunk_start_ms",
        "chunk_end_ms",
        "sample_rate",
        "audio_b64",
        "timestamps",
    ),
    "audio.done": ("type", "utterance_index", "sentence_index", "total_bytes", "error"),
    "session.done": ("type", "utterance_index", "total_sentences"),
    "input.committed": ("type", "commit_id", "utterance_index", "sentence_index"),
    "error": ("type", "message"),
}
_EXTENSION_ONLY = (SessionReady, AudioCancelled, ServerWarning, ContextOpened, ContextClosed)


def sends(msg: ServerMessage, *, extensions: bool) -> bool:
    """Whether a client of this dialect gets ``msg`` at all (vllm-omni has no ``session.ready`` etc.)."""
    return extensions or not isinstance(msg, _EXTENSION_ONLY)


def render(msg: ServerMessage, *, extensions: bool, streamed: bool = True) -> str:
    """Encode a server message as the text of a WebSocket message.

    Args:
        msg: the message.
        extensions: the client opted in to voxgate's extensions: every field is written.
        streamed: for ``audio.start`` in vllm-omni's dialect: the audio is streamed, so, as vllm-omni
            does for streamed ``pcm``, the message states the ``sample_rate`` and ``channels``.
    """
    if extensions:
        return _encode(msg).decode()
    full = msgspec.to_builtins(msg)
    tag = str(msg.__struct_config__.tag)
    fields = _VLLM_FIELDS.get(tag, tuple(full))
    if tag == "audio.start":
        # As vllm-omni: the rate of streamed audio, and whether words come (its channels are always 1).
        fields += ("sample_rate",) if streamed and full["format"] != "wav" else ()
        fields += ("word_timestamps",) if "word_timestamps" in full else ()
    return _encode({name: full[name] for name in fields}).decode()


def _ms(samples: int, rate: int) -> int:
    """Integer ms of ``samples`` at ``rate``, rounded as vllm-omni rounds its chunk times."""
    return int(round(samples * 1000.0 / rate))


@dataclass(slots=True)
class _Inline:
    """A segment whose audio goes out in ``audio.chunk`` messages (vllm-omni 0.30 with word timestamps)."""

    start: AudioStart
    chunks: int = 0  # audio.chunk messages written, the trailing one included
    samples: int = 0  # PCM samples written
    words: list[WordTimestamp] | None = None  # none came: vllm-omni's ``timestamps: null``
    offset_ms: float = field(init=False)  # the segment's start on the utterance's clock

    def __post_init__(self) -> None:
        self.offset_ms = self.start.start_sample * 1000.0 / self.start.sample_rate

    def chunk(self, pcm: bytes, timestamps: list[dict[str, object]] | None = None) -> str:
        """One ``audio.chunk`` of vllm-omni: ``pcm`` (empty for the trailing one, which spans the segment)."""
        rate, begin = self.start.sample_rate, self.samples
        self.samples += len(pcm) // 2  # 16-bit mono PCM
        msg = {
            "type": "audio.chunk",
            "utterance_index": self.start.utterance_index,
            "sentence_index": self.start.sentence_index,
            "chunk_id": self.chunks,
            "chunk_start_ms": _ms(begin, rate) if pcm else 0,
            "chunk_end_ms": _ms(self.samples, rate),
            "sample_rate": rate,
            "audio_b64": base64.b64encode(pcm).decode("ascii"),
            "timestamps": timestamps,
        }
        self.chunks += 1
        return _encode(msg).decode()

    def last(self) -> str:
        """The trailing ``audio.chunk``: no audio, the segment's words in integer ms from its start."""
        if self.words is None:
            return self.chunk(b"")
        words: list[dict[str, object]] = [
            {
                "word": w.word,
                "start_ms": max(0, round(w.start_ms - self.offset_ms)),
                "end_ms": max(0, round(w.end_ms - self.offset_ms)),
            }
            for w in self.words
        ]
        return self.chunk(b"", words)


class SessionCodec:
    """vllm-omni's protocol, or voxgate.v1 when ``extensions``: the session's own JSON and binary frames.

    Args:
        extensions: the client opted in to voxgate's extensions.
    """

    def __init__(self, *, extensions: bool) -> None:
        self.extensions = extensions
        self._inline: dict[tuple[int, int], _Inline] = {}
        self._held: AudioDone | None = None  # a failed segment's audio.done, until its error

    def opening(self) -> list[ClientMessage]:
        """Nothing: the client sends its own ``session.config``."""
        return []

    def decode(self, data: str | bytes) -> list[Inbound]:
        """The message itself: the session decodes its own messages (``Core.receive_text``)."""
        return [data]

    def encode(self, output: Audio | Message) -> list[Payload]:
        """Audio as it is (binary frames); a message in the client's dialect (``render``). In vllm-omni's
        dialect, also its base64 audio with word timestamps, and its order and fields of a failed segment's
        ``error`` (see the module docstring)."""
        if self.extensions:
            if isinstance(output, Audio):
                return [output.data]
            return [render(output.msg, extensions=True, streamed=output.streamed)]
        msg = output.msg if isinstance(output, Message) else None
        held, self._held = self._held, None
        if held is not None and isinstance(msg, Error) and msg.utterance_index == held.utterance_index:
            error: dict[str, object] = {"type": "error", "message": msg.message}
            if held.total_bytes:
                error.update(partial_audio=True, action="discard")
            return [_encode(error).decode(), render(held, extensions=False)]
        out: list[Payload] = [] if held is None else [render(held, extensions=False)]
        if not isinstance(output, Message):
            seg = self._inline.get((output.utterance, output.sentence))
            return [*out, output.data if seg is None else seg.chunk(output.data)]
        match output.msg:
            case AudioStart(word_timestamps=True, format="pcm") if (
                output.streamed and not output.frame_header
            ):
                self._inline[output.msg.utterance_index, output.msg.sentence_index] = _Inline(output.msg)
            case WordTimestamps() if (seg := self._inline.get(_key(output.msg))) is not None:
                seg.words = [*(seg.words or ()), *output.msg.timestamps]
                return out
            case AudioDone(error=True):
                self._inline.pop(_key(output.msg), None)  # vllm-omni sends no words for a failed sentence
                self._held = output.msg
                return out
            case AudioDone() if (seg := self._inline.pop(_key(output.msg), None)) is not None:
                out.append(seg.last())
        return [*out, render(output.msg, extensions=False, streamed=output.streamed)]

    def check(self, config: SessionConfig, previous: SessionConfig | None) -> SessionConfig:
        """The config with a carrier's audio format forced on it when it names ``framing``
        (``protocol.codecs.telephony.framed_config``).

        Raises:
            ProtocolError: the framing is incomplete, or changes after the first config.
        """
        return framed_config(config, previous)

    def adopt(self, config: SessionConfig) -> Codec:
        """A ``Telephony`` codec around this one once a config names ``framing``; else this one."""
        return Telephony.of(config, self) or self

    def dropped(self) -> None:
        """The outbox has dropped what was queued: forget the segments and the ``audio.done`` held for it."""
        self._inline.clear()
        self._held = None

    def close(self, error: ProtocolError | None) -> tuple[int, str | None]:
        """1000 at a normal end; else the error's close code, with its code as the reason."""
        return (int(CloseCode.NORMAL), None) if error is None else (int(error.close_code), str(error.code))


def _key(msg: WordTimestamps | AudioDone) -> tuple[int, int]:
    return msg.utterance_index, msg.sentence_index
