"""Phone-carrier framing: a session's audio as the JSON media-stream messages a carrier plays as they are.

A telephony bridge sits between a carrier's media-stream WebSocket (Twilio ``<Connect><Stream>``) and
voxgate. With ``"framing": "twilio"`` and the call's ``stream_sid`` in ``session.config``, voxgate
writes the carrier's own messages, so the bridge forwards them without decoding or re-encoding:

- each audio frame (forced to 20 ms of mu-law at 8 kHz, 160 bytes) goes out as a text message
  ``{"event":"media","streamSid":…,"media":{"payload":<base64>}}`` instead of a binary frame;
- each segment's ``audio.done`` is preceded by ``{"event":"mark","streamSid":…,"mark":{"name":…}}``;
  the carrier echoes a mark once the audio before it has played, so marks tell playback position;
- a cancel's ``audio.cancelled`` is preceded by ``{"event":"clear","streamSid":…}`` when audio went
  out since the last clear: the carrier drops the audio it has buffered, so an ``input.cancel`` stops
  what the caller hears.

voxgate's own messages (``"type"``) still go out as before; a bridge forwards those with ``"event"``
to the carrier and reads the others. Inbound, the bridge relays the carrier's ``mark`` echoes and
``clear`` as they are: a mark becomes a ``playback.position`` event (``Framing.receive``), a clear
cancels as ``input.cancel`` does. One that names another stream than the session's is refused.

``Telephony`` is the codec (``protocol.codecs.base``) of such a socket: it wraps the session's own codec
(``protocol.codecs.stream.SessionCodec``), which adopts it once a ``session.config`` names ``framing``.

Carriers differ only in data: one ``Carrier`` entry each in ``CARRIERS``. Telnyx speaks Twilio's
event shapes with ``stream_id`` for ``streamSid``. Vonage would need more than an entry: it takes
raw binary 16-bit PCM frames (no JSON ``media``), has no marks, and clears with ``{"action":"clear"}``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import msgspec

from ..audio import BYTES_PER_SAMPLE, AudioFormat
from ..errors import MALFORMED_JSON, ErrorCode, ProtocolError
from ..messages import (
    AudioCancelled,
    AudioDone,
    AudioStart,
    CarrierName,
    ClientMessage,
    InputCancel,
    PlaybackPosition,
    ServerMessage,
    SessionConfig,
)
from ..output import Audio, Message
from .base import Codec, Inbound, Payload


@dataclass(frozen=True, slots=True)
class Carrier:
    """How one carrier's media stream frames outbound audio and names the stream.

    Args:
        name: the value of ``framing`` that selects it.
        stream_field: the key that names the stream on each outbound message.
        needs_stream_id: the carrier refuses messages without it (``stream_sid`` is then required).
        fmt: the only audio format the carrier plays from the stream.
        sample_rate: its rate.
        frame_ms: audio per ``media`` message.
        silence: one sample of silence in ``fmt``: pads a segment's short last frame to ``frame_ms``.
    """

    name: CarrierName
    stream_field: str
    needs_stream_id: bool
    fmt: AudioFormat = "mulaw"
    sample_rate: int = 8000
    frame_ms: int = 20  # what Twilio sends inbound, and the usual RTP packet: both carriers accept it
    silence: bytes = b"\xff"  # mu-law's code for 0

    @property
    def frame_bytes(self) -> int:
        """Size of one full frame's payload."""
        return self.sample_rate * self.frame_ms // 1000 * BYTES_PER_SAMPLE[self.fmt]


#: The carriers ``framing`` can name. Twilio: twilio.com/docs/voice/media-streams/websocket-messages;
#: Telnyx: developers.telnyx.com …/stream-call-media-over-websocket (RTP mode, PCMU).
CARRIERS: dict[CarrierName, Carrier] = {
    "twilio": Carrier("twilio", stream_field="streamSid", needs_stream_id=True),
    "telnyx": Carrier("telnyx", stream_field="stream_id", needs_stream_id=False),
}


def framed_config(config: SessionConfig, previous: SessionConfig | None) -> SessionConfig:
    """Check a ``session.config``'s framing and force the carrier's audio format on it.

    Call it before the config is adopted. ``response_format``, ``sample_rate``, ``frame_ms``,
    ``frame_header`` and ``stream_audio`` are replaced by what the carrier plays (``session.ready``
    shows them). Framing is one per socket: a bridge opens one session per call.

    Args:
        config: the config received.
        previous: the config in force, None before the first.

    Returns:
        ``config`` itself without framing, else a copy in the carrier's format.

    Raises:
        ProtocolError: a later config changes ``framing`` or ``stream_sid``, or a carrier that needs
            a stream id has none.
    """
    if previous is not None and (config.framing, config.stream_sid) != (
        previous.framing,
        previous.stream_sid,
    ):
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE,
            "framing and stream_sid are set by the first session.config and cannot change: "
            "open one session per call",
            field="$.framing",
        )
    if config.framing is None:
        return config
    carrier = CARRIERS[config.framing]
    if carrier.needs_stream_id and config.stream_sid is None:
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE,
            f"framing {carrier.name!r} needs the call's stream_sid",
            field="$.stream_sid",
        )
    return msgspec.structs.replace(
        config,
        response_format=carrier.fmt,
        sample_rate=carrier.sample_rate,
        frame_ms=carrier.frame_ms,
        frame_header=False,
        stream_audio=True,
    )


class _MarkName(msgspec.Struct, frozen=True):
    name: str


class _Inbound(msgspec.Struct, frozen=True):
    """The fields of a relayed carrier message that matter; the carrier's others are ignored."""

    event: str | None = None
    type: str | None = None  # a voxgate message: not the carrier's
    mark: _MarkName | None = None
    streamSid: str | None = None  # noqa: N815 - Twilio's name of the stream
    stream_id: str | None = None  # Telnyx's

    def stream(self, carrier: Carrier) -> str | None:
        """The stream the message names, in ``carrier``'s field (None: it names none)."""
        return {"streamSid": self.streamSid, "stream_id": self.stream_id}.get(carrier.stream_field)


_decode_inbound = msgspec.json.Decoder(_Inbound).decode
_encode = msgspec.json.Encoder().encode


def mark_name(utterance: int, sentence: int) -> str:
    """The name of the mark after a segment: unique on the socket, since utterance indices only grow."""
    return f"utt-{utterance}-seg-{sentence}"


class Framing:
    """One session's carrier framing: renders audio and segment ends, and follows marks to playback.

    Args:
        carrier: the carrier's entry in ``CARRIERS``.
        stream_id: the call's stream id, written on every message when given.
    """

    def __init__(self, carrier: Carrier, stream_id: str | None) -> None:
        self.carrier = carrier
        self.stream_id = stream_id
        self._stream: dict[str, str] = {carrier.stream_field: stream_id} if stream_id is not None else {}
        self._texts: dict[tuple[int, int], str] = {}  # segments announced and not yet ended
        self._pending: dict[str, PlaybackPosition] = {}  # marks sent and not yet echoed
        self._unclear = False  # audio went out since the last clear: the carrier may be playing it
        self.played_ms = 0.0  # audio heard so far: the segments whose marks came back

    @classmethod
    def of(cls, config: SessionConfig) -> Framing | None:
        """The framing a config asks for (after ``framed_config``), None when it asks for none."""
        if config.framing is None:
            return None
        return cls(CARRIERS[config.framing], config.stream_sid)

    def media(self, data: bytes) -> str:
        """The carrier message carrying one frame of audio (a short last frame is padded with silence)."""
        frame = data.ljust(self.carrier.frame_bytes, self.carrier.silence)
        self._unclear = True
        payload = base64.b64encode(frame).decode("ascii")
        return self._message("media", {"media": {"payload": payload}})

    def cues(self, msg: ServerMessage) -> list[str]:
        """The carrier messages to write just before a voxgate message, as the writer reaches it.

        A mark before each ``audio.done`` (the segment's audio has all been written); a clear before an
        ``audio.cancelled`` if audio went out since the last clear (one clear for a cancel of several
        utterances, none when nothing was sent); ``audio.start`` is only noted (its text is reported
        with the mark).
        """
        match msg:
            case AudioStart(utterance_index=u, sentence_index=s, sentence_text=text):
                self._texts[u, s] = text
            case AudioDone(utterance_index=u, sentence_index=s, duration_ms=duration_ms):
                name = mark_name(u, s)
                text = self._texts.pop((u, s), "")
                self._pending[name] = PlaybackPosition(
                    mark=name, utterance_index=u, sentence_index=s, text=text, duration_ms=duration_ms
                )
                return [self._message("mark", {"mark": {"name": name}})]
            case AudioCancelled() if self._unclear:
                self._unclear = False
                return [self._message("clear", {})]
        return []

    def cleared(self) -> None:
        """A cancel: the carrier drops its buffered audio, so marks still out will never mean "heard".

        (Twilio echoes the marks it drops on ``clear``; those echoes are then ignored.)
        """
        self._texts.clear()
        self._pending.clear()

    def receive(self, data: str) -> list[InputCancel | PlaybackPosition] | None:
        """Take a text message the bridge relayed from the carrier.

        Returns:
            None when ``data`` is not a carrier message (a voxgate message, for the ``Session``);
            else what it means: ``InputCancel`` for a ``clear``, the ``PlaybackPosition`` of an echoed
            mark, or nothing for the echo of a mark cleared or unknown.

        Raises:
            ProtocolError: a carrier event other than ``mark`` and ``clear``, a mark without a name, or a
                message naming a stream other than the session's (``invalid_message`` on the carrier's
                stream field, not fatal: a bridge that mixes up its calls must not cancel another's
                speech, nor count its playback).
        """
        if '"event"' not in data:  # voxgate's messages never have the key: skip the second decode
            return None
        try:
            msg = _decode_inbound(data)
        except MALFORMED_JSON:
            return None  # malformed, or not shaped as a carrier's (a ValidationError): the Session says so
        if msg.event is None or msg.type is not None:
            return None
        named = msg.stream(self.carrier)
        if self.stream_id is not None and named is not None and named != self.stream_id:
            field = self.carrier.stream_field
            raise ProtocolError(
                ErrorCode.INVALID_MESSAGE,
                f"a carrier message of another stream: its {field} is not this session's stream_sid",
                field=f"$.{field}",
            )
        match msg.event:
            case "mark":
                if msg.mark is None:
                    raise ProtocolError(ErrorCode.INVALID_MESSAGE, "mark without its name", field="$.mark")
                position = self._pending.pop(msg.mark.name, None)
                if position is None:
                    return []
                self.played_ms = round(self.played_ms + position.duration_ms, 2)
                position.played_ms = self.played_ms
                return [position]
            case "clear":
                return [InputCancel()]
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE,
            f"carrier event {msg.event!r} is not taken: relay only mark and clear",
            field="$.event",
        )

    def _message(self, event: str, body: dict[str, object]) -> str:
        return _encode({"event": event, **self._stream, **body}).decode()


class Telephony:
    """The codec of a carrier-framed session: ``framing``'s messages around those of ``inner``.

    In, a relayed ``clear`` is an ``input.cancel`` and an echoed mark a ``playback.position`` answered at
    once (``Framing.receive``); anything else is the session's own message. Out, audio goes out as
    ``media`` messages, and a segment's end and a cancel are preceded by their ``mark`` and ``clear``.

    Args:
        inner: the session's own codec.
        framing: the carrier framing of the socket.
    """

    def __init__(self, inner: Codec, framing: Framing) -> None:
        self.inner, self.framing = inner, framing

    @classmethod
    def of(cls, config: SessionConfig, inner: Codec) -> Telephony | None:
        """The codec a config asks for around ``inner`` (after ``framed_config``); None without framing."""
        framing = Framing.of(config)
        return None if framing is None else cls(inner, framing)

    def opening(self) -> list[ClientMessage]:
        """The inner codec's."""
        return self.inner.opening()

    def decode(self, data: str | bytes) -> list[Inbound]:
        """A carrier's message as what it means; any other as the inner codec decodes it.

        Raises:
            ProtocolError: a carrier event other than ``mark`` and ``clear``, or a mark without a name.
        """
        replies = self.framing.receive(data) if isinstance(data, str) else None
        return self.inner.decode(data) if replies is None else list(replies)

    def encode(self, output: Audio | Message) -> list[Payload]:
        """Audio as ``media`` messages; a message after its carrier cues (``Framing.cues``)."""
        if isinstance(output, Audio):
            return [self.framing.media(output.data)]
        return [*self.framing.cues(output.msg), *self.inner.encode(output)]

    def check(self, config: SessionConfig, previous: SessionConfig | None) -> SessionConfig:
        """As the inner codec checks it (the framing cannot change)."""
        return self.inner.check(config, previous)

    def adopt(self, config: SessionConfig) -> Codec:
        """This codec: the framing is the first config's."""
        return self

    def dropped(self) -> None:
        """A cancel: marks still out will never mean "heard" (``Framing.cleared``)."""
        self.framing.cleared()

    def close(self, error: ProtocolError | None) -> tuple[int, str | None]:
        """As the inner codec closes."""
        return self.inner.close(error)
