"""What the codecs of other vendors' TTS APIs share (``protocol.codecs.cartesia``,
``protocol.codecs.deepgram``), sans-I/O.

- ``VoiceBook``: the voices a request may name, known before any text arrives, so that a vendor's voice id
  or model name that is neither a voxgate voice nor an alias (``VOXGATE_VOICE_ALIASES``) is refused in the
  vendor's own error shape, naming the voices there are, and never spoken by another voice;
- A-law: the session makes μ-law, and ``alaw`` turns it into G.711 A-law byte for byte (one table);
- ``wav_head``: a streamed WAV header of 16-bit, 32-bit float, μ-law or A-law audio (sizes "unknown");
- ``RawAudio``: a REST body that is the audio as it comes, with that header or none.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import ErrorCode, ProtocolError
from .bodies import Body

#: The size fields of a WAV whose length is not known when its header goes out (as ``protocol.audio``'s).
_UNKNOWN = 0xFFFFFFFF
#: Each wire encoding's WAV format tag and bytes per sample.
_WAV_FORMATS: dict[str, tuple[int, int]] = {"pcm": (1, 2), "f32": (3, 4), "mulaw": (7, 1), "alaw": (6, 1)}


@dataclass(frozen=True, slots=True)
class VoiceBook:
    """The voices a socket or request may name, with what their engines can do.

    Args:
        names: the voxgate voices, as an error names them.
        known: every name taken (voices, uploaded voices, aliases), case-folded.
        timed: the names whose engine times words, case-folded (``""``: the default voice).
    """

    names: tuple[str, ...]
    known: frozenset[str]
    timed: frozenset[str] = frozenset()

    def check(self, name: str | None, field: str) -> None:
        """Refuse a voice that is neither a voice here nor an alias (None: the default voice).

        Raises:
            ProtocolError: ``voice_not_found``, naming the voices there are and how to alias an id.
        """
        if name is None or name.casefold() in self.known:
            return
        message = (
            f"voice {name!r} is not a voice of this server; use one of {list(self.names)}, or map it to one "
            "in VOXGATE_VOICE_ALIASES"
        )
        raise ProtocolError(ErrorCode.VOICE_NOT_FOUND, message, field=field)

    def times_words(self, name: str | None) -> bool:
        """Whether the engine of voice ``name`` (None: the default voice) times words."""
        return ("" if name is None else name.casefold()) in self.timed


def _mulaw_linear(byte: int) -> int:
    """A μ-law byte as a 16-bit sample (ITU-T G.711)."""
    u = ~byte & 0xFF
    magnitude = (((u & 0x0F) << 3) + 0x84) << ((u >> 4) & 0x07)
    return 0x84 - magnitude if u & 0x80 else magnitude - 0x84


def _linear_alaw(sample: int) -> int:
    """A 16-bit sample as an A-law byte (ITU-T G.711; Sun's ``linear2alaw``)."""
    value = sample >> 3
    mask = 0xD5
    if value < 0:
        mask, value = 0x55, -value - 1
    # A 16-bit sample is at most 0xFFF here: it always has a segment.
    segment = next(
        s for s, end in enumerate((0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF)) if value <= end
    )
    low = (value >> 1) & 0x0F if segment < 2 else (value >> segment) & 0x0F
    return ((segment << 4) | low) ^ mask


#: μ-law byte -> the A-law byte of the same sample.
_ALAW_OF_MULAW = bytes(_linear_alaw(_mulaw_linear(b)) for b in range(256))


def alaw(mulaw: bytes) -> bytes:
    """μ-law audio as A-law, sample for sample."""
    return mulaw.translate(_ALAW_OF_MULAW)


def wav_head(encoding: str, sample_rate: int) -> bytes:
    """The header of a streamed mono WAV of ``encoding`` (``pcm``, ``f32``, ``mulaw``, ``alaw``), its sizes
    "unknown" (0xFFFFFFFF), as voxgate streams every WAV."""
    tag, width = _WAV_FORMATS[encoding]
    fmt = struct.pack("<HHIIHH", tag, 1, sample_rate, sample_rate * width, width, width * 8)
    return (
        b"RIFF"
        + struct.pack("<I", _UNKNOWN)
        + b"WAVEfmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + (b"data" + struct.pack("<I", _UNKNOWN))
    )


class RawAudio(Body):
    """A REST body that is its audio as it comes (A-law made from the session's μ-law), behind ``head``.

    Args:
        media_type: its ``Content-Type``.
        to_alaw: the session makes μ-law for an A-law answer.
        head: what goes first (a WAV header), or nothing.
    """

    def __init__(self, media_type: str, *, to_alaw: bool = False, head: bytes = b"") -> None:
        super().__init__(media_type)
        self.to_alaw, self._head = to_alaw, head

    def head(self) -> bytes:
        return self._head

    def audio(self, data: bytes, audio_s: float) -> bytes:
        return alaw(data) if self.to_alaw else data
