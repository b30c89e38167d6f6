"""Schema of the OpenAI-compatible ``POST /v1/audio/speech`` body, with vllm-omni's extra fields.

OpenAI's fields come first; vllm-omni's follow. Unknown fields are refused by name (OpenAI answers
"Unrecognized request argument" too), so a typo never silently changes what is spoken.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .messages import DEFAULT_SAMPLE_RATE, SpeechOptions

MAX_INPUT_CHARS = 4096  # OpenAI's limit for this route
SpeechFormat = Literal["wav", "pcm", "flac", "mp3", "opus", "aac"]
__all__ = ["DEFAULT_SAMPLE_RATE", "SpeechRequest", "decode_speech_request", "speakable"]


class VoiceId(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``voice`` given as an object, as newer OpenAI clients may send it."""

    id: str


class SpeechRequest(SpeechOptions, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/audio/speech``: OpenAI's fields plus vllm-omni's (``SpeechOptions``)."""

    input: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_INPUT_CHARS)]
    voice: str | VoiceId | None = None
    response_format: SpeechFormat = "mp3"
    stream_format: Literal["audio", "sse"] = "audio"
    stream: bool | None = None  # vllm-omni's switch; this route always streams

    @property
    def voice_name(self) -> str | None:
        """The voice as a plain name, whichever form it came in."""
        return self.voice.id if isinstance(self.voice, VoiceId) else self.voice


_decode = msgspec.json.Decoder(SpeechRequest).decode


def decode_speech_request(body: bytes) -> SpeechRequest:
    """Decode and validate a request body.

    Raises:
        msgspec.DecodeError: the body is not JSON.
        msgspec.ValidationError: a field is missing, unknown, of the wrong type or out of range.
    """
    return _decode(body)


def speakable(text: str) -> bool:
    """Whether ``text`` has anything to say: a letter or a digit (``"..."`` or ``"?!"`` has not)."""
    return any(ch.isalnum() for ch in text)
