"""Cartesia's REST shapes: ``POST /tts/sse``'s events (a body codec, ``protocol.codecs.bodies``) and the
``Content-Type`` of ``POST /tts/bytes`` by container; the socket's wire is ``protocol.codecs.cartesia``'s."""

from __future__ import annotations

import base64
from collections.abc import Mapping

from ..errors import ProtocolError
from ..messages import ServerMessage, SessionDone, WordTimestamps
from .bodies import Body
from .cartesia import OK, PARTIAL, _shape, error_payload, timestamps
from .vendor import alaw


class CartesiaSse(Body):
    """``POST /tts/sse``: ``chunk`` events as the audio comes, ``timestamps`` when asked for (and the engine
    times words), then ``done``; ``error`` if the engine fails once the answer started.

    Args:
        context: the request's ``context_id``, echoed in each event.
        to_alaw: the session makes μ-law for an A-law answer.
        words: send ``timestamps`` events.
    """

    def __init__(self, context: str | None, *, to_alaw: bool = False, words: bool = False) -> None:
        super().__init__("text/event-stream")
        self.context, self.to_alaw, self.words = context, to_alaw, words

    def audio(self, data: bytes, audio_s: float) -> bytes:
        data = alaw(data) if self.to_alaw else data
        chunk = _shape(
            "chunk",
            self.context,
            data=base64.b64encode(data).decode(),
            done=False,
            status_code=PARTIAL,
            step_time=0.0,
        )
        return _event("chunk", chunk)

    def message(self, msg: ServerMessage) -> bytes:
        if isinstance(msg, WordTimestamps) and self.words and msg.timestamps:
            return _event("timestamps", timestamps(self.context, msg.timestamps, 0.0))
        return b""

    def end(self, done: SessionDone) -> bytes:
        return _event("done", _shape("done", self.context, done=True, status_code=OK))

    def error(self, err: ProtocolError) -> bytes:
        return _event("error", error_payload(err.code, err.message, self.context))


def _event(kind: str, data: bytes) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


#: ``/tts/bytes``' ``Content-Type`` by container (raw by encoding).
MEDIA_TYPES: Mapping[str, str] = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "pcm_s16le": "audio/pcm",
    "pcm_f32le": "audio/pcm",
    "pcm_mulaw": "audio/basic",
    "pcm_alaw": "audio/x-alaw-basic",
}
