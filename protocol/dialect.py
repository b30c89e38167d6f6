"""How server messages are written on the wire: voxgate's full messages, or vllm-omni's exact ones.

A client that opts in to voxgate's extensions (the WebSocket subprotocol ``voxgate.v1``) gets every
message with every field. Any other client speaks vllm-omni's protocol and gets exactly vllm-omni's
events and field sets (``serving_speech_stream.py`` in vllm-omni 0.30): no ``session.ready``, no
``audio.cancelled``, ``warning`` or ``context.*``, no timings, no error codes and no ``context_id``.
"""

from __future__ import annotations

import msgspec

from .messages import (
    AudioCancelled,
    ContextClosed,
    ContextOpened,
    ServerMessage,
    ServerWarning,
    SessionReady,
)

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
