"""Codecs: one surface's WebSocket wire on one side, the session core's input and typed outputs on the other.

The WebSocket shell (``gateway.transport.socket``) is the same for every socket surface; what differs is its
``Codec``. In, ``decode`` turns one wire message into what the core takes, in order: the session's own JSON
text (or binary) for ``Core.receive_text`` / ``receive_bytes``, client messages already decoded for
``Core.receive_message``, or a server message the codec answers with itself (a carrier's playback
position). Out, ``encode`` turns each of the core's ``Audio`` and ``Message`` outputs into the payloads
written, none while it holds one back. The codecs:

- ``protocol.codecs.stream.SessionCodec``: vllm-omni's protocol and voxgate.v1, the session's own messages and
  binary frames, rendered in the client's dialect;
- ``protocol.codecs.telephony.Telephony``: a phone carrier's media-stream messages around the session's own,
  chosen when a ``session.config`` names ``framing`` (``adopt``);
- ``protocol.codecs.elevenlabs_socket.ElevenLabsSocket``: ElevenLabs' ``stream-input`` and
  ``multi-stream-input``;
- ``protocol.codecs.cartesia.CartesiaSocket``: Cartesia's ``/tts/websocket`` (each Cartesia context a
context);
- ``protocol.codecs.deepgram.DeepgramSocket``: Deepgram Aura's ``/v1/speak``.

A codec never awaits and never touches a socket.
"""

from __future__ import annotations

from typing import Protocol, Self

from ..errors import CloseCode, ProtocolError
from ..messages import ClientMessage, PlaybackPosition, SessionConfig
from ..output import Audio, Message

#: What a codec makes of a wire message for the core, item by item (see the module docstring).
Inbound = str | bytes | ClientMessage | PlaybackPosition
#: One payload to write: a text or a binary WebSocket message.
Payload = str | bytes


class Codec(Protocol):
    """One socket surface's wire (see the module docstring)."""

    def opening(self) -> list[ClientMessage]:
        """The client messages the session starts with, before anything is read (ElevenLabs' config)."""
        ...

    def decode(self, data: str | bytes) -> list[Inbound]:
        """One wire message as the core's input, in order; the shell applies each in turn.

        Raises:
            ProtocolError: the message is refused; ``fatal`` says whether the session must close.
        """
        ...

    def encode(self, output: Audio | Message) -> list[Payload]:
        """The payloads of one output of the core, as it is written (none: held back for later)."""
        ...

    def check(self, config: SessionConfig, previous: SessionConfig | None) -> SessionConfig:
        """A ``session.config`` as this wire allows it, before the engines see it.

        Raises:
            ProtocolError: this wire cannot take the config.
        """
        ...

    def adopt(self, config: SessionConfig) -> Codec:
        """The codec from now on, once ``config`` is accepted (itself, or one that wraps it)."""
        ...

    def dropped(self) -> None:
        """A cancel was applied: what is queued for its utterances is gone."""
        ...

    def close(self, error: ProtocolError | None) -> tuple[int, str | None]:
        """The close code and reason of a session that ends normally (None) or with ``error``."""
        ...


class Own:
    """The hooks of a codec whose session's configs are its own (it makes them from its wire): each config
    as it made it, itself kept, nothing to forget on a cancel, and the error's close code (1000 without
    one) with no reason. Cartesia's and Deepgram's codecs take them."""

    def check(self, config: SessionConfig, previous: SessionConfig | None) -> SessionConfig:
        """The config as the codec made it."""
        return config

    def adopt(self, config: SessionConfig) -> Self:
        """This codec."""
        return self

    def dropped(self) -> None:
        """Nothing to do."""

    def close(self, error: ProtocolError | None) -> tuple[int, str | None]:
        """1000, or the fatal error's close code, with no reason."""
        return int(CloseCode.NORMAL if error is None else error.close_code), None
