"""The codec (``protocol.codecs.base``) of an ElevenLabs ``stream-input`` or ``multi-stream-input`` WebSocket.

The WebSocket shell (``gateway.transport.socket``) drives it over the real socket, as it drives the session's
own
codec: ``ElevenLabsSocket`` decodes each client message into voxgate client messages
(``protocol.codecs.elevenlabs.Stream.receive``) and encodes the session's typed outputs into ElevenLabs'
messages
(``Stream.audio``, ``Stream.render``): base64 audio messages as the audio comes, each with the alignment of
the characters known by then, ``isFinal`` at a context's end, errors in ElevenLabs' shape. Close codes are
ElevenLabs' (``close_code``).
"""

from __future__ import annotations

from ..errors import CloseCode, ErrorCode, ProtocolError
from ..messages import ClientMessage, SessionConfig
from ..output import Audio, Message
from .base import Codec, Inbound, Payload
from .elevenlabs import Stream, close_code, decode_inbound


class ElevenLabsSocket:
    """One ElevenLabs socket's wire over ``stream``.

    Args:
        stream: the socket's translation both ways (voice, query parameters, contexts).
        max_message_bytes: the largest client message taken (``message_too_large`` past it).
    """

    def __init__(self, stream: Stream, max_message_bytes: int) -> None:
        self.stream = stream
        self.max_message_bytes = max_message_bytes

    def opening(self) -> list[ClientMessage]:
        """The session's ``session.config``, as the socket opens (``Stream.start``)."""
        return list(self.stream.start())

    def decode(self, data: str | bytes) -> list[Inbound]:
        """The session messages one client message becomes.

        Raises:
            ProtocolError: fatal for a message that is not ElevenLabs' (not JSON, a field of the wrong type);
                not fatal for one too large, or a first message refused (its ``voice_settings``; reported
                on its context, and the next message is a first one again).
        """
        size = len(data) if isinstance(data, bytes) or data.isascii() else len(data.encode())
        if size > self.max_message_bytes:
            message = f"message of {size} bytes exceeds {self.max_message_bytes}"
            raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, message)
        try:
            msg = decode_inbound(data)
        except ProtocolError as err:
            err.fatal = True
            raise
        try:
            return list(self.stream.receive(msg))
        except ProtocolError as err:
            err.context_id = self.stream.context_of(msg)
            raise

    def encode(self, output: Audio | Message) -> list[Payload]:
        """Audio as it comes, each piece with the alignment known by then (``Stream.audio``); a message as
        ElevenLabs' counterpart, if it has one (``Stream.render``)."""
        if isinstance(output, Audio):
            return [self.stream.audio(output.data, output.audio_s).decode()]
        return [message.decode() for message in self.stream.render(output.msg)]

    def check(self, config: SessionConfig, previous: SessionConfig | None) -> SessionConfig:
        """The config as ``Stream`` made it."""
        return config

    def adopt(self, config: SessionConfig) -> Codec:
        """This codec."""
        return self

    def dropped(self) -> None:
        """Nothing to do."""

    def close(self, error: ProtocolError | None) -> tuple[int, str | None]:
        """ElevenLabs' close code (a timeout is 1008), with no reason."""
        return close_code(CloseCode.NORMAL if error is None else error.close_code), None
