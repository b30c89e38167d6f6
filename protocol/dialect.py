"""How server messages are written on the wire: voxgate's full messages, or vllm-omni's exact ones; and
``SessionCodec``, the codec (``protocol.codec``) of the session's own WebSocket in either dialect.

A client that opts in to voxgate's extensions (the WebSocket subprotocol ``voxgate.v1``) gets every
message with every field. Any other client speaks vllm-omni's protocol and gets exactly vllm-omni's
events and field sets (``serving_speech_stream.py`` in vllm-omni 0.30): no ``session.ready``, no
``audio.cancelled``, ``warning`` or ``context.*``, no timings, no error codes and no ``context_id``.
"""

from __future__ import annotations

import msgspec

from .codec import Codec, Inbound, Payload
from .errors import CloseCode, ProtocolError
from .messages import (
    AudioCancelled,
    ClientMessage,
    ContextClosed,
    ContextOpened,
    ServerMessage,
    ServerWarning,
    SessionConfig,
    SessionReady,
)
from .output import Audio, Message
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
    if tag == "audio.start" and streamed and full["format"] != "wav":
        fields += ("sample_rate", "channels")
    return _encode({name: full[name] for name in fields}).decode()


class SessionCodec:
    """vllm-omni's protocol, or voxgate.v1 when ``extensions``: the session's own JSON and binary frames.

    Args:
        extensions: the client opted in to voxgate's extensions.
    """

    def __init__(self, *, extensions: bool) -> None:
        self.extensions = extensions

    def opening(self) -> list[ClientMessage]:
        """Nothing: the client sends its own ``session.config``."""
        return []

    def decode(self, data: str | bytes) -> list[Inbound]:
        """The message itself: the session decodes its own messages (``Core.receive_text``)."""
        return [data]

    def encode(self, output: Audio | Message) -> list[Payload]:
        """Audio as it is (binary frames); a message in the client's dialect (``render``)."""
        if isinstance(output, Audio):
            return [output.data]
        return [render(output.msg, extensions=self.extensions, streamed=output.streamed)]

    def check(self, config: SessionConfig, previous: SessionConfig | None) -> SessionConfig:
        """The config with a carrier's audio format forced on it when it names ``framing``
        (``protocol.telephony.framed_config``).

        Raises:
            ProtocolError: the framing is incomplete, or changes after the first config.
        """
        return framed_config(config, previous)

    def adopt(self, config: SessionConfig) -> Codec:
        """A ``Telephony`` codec around this one once a config names ``framing``; else this one."""
        return Telephony.of(config, self) or self

    def dropped(self) -> None:
        """Nothing to do: the outbox has dropped what was queued."""

    def close(self, error: ProtocolError | None) -> tuple[int, str | None]:
        """1000 at a normal end; else the error's close code, with its code as the reason."""
        return (int(CloseCode.NORMAL), None) if error is None else (int(error.close_code), str(error.code))
