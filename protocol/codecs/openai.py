"""Schema of the OpenAI-compatible ``POST /v1/audio/speech`` body, with vllm-omni's extra fields, and of
vllm-omni's ``POST /v1/audio/speech/batch``.

OpenAI's fields come first; vllm-omni's follow. Unknown fields are refused by name (OpenAI answers
"Unrecognized request argument" too), so a typo never silently changes what is spoken.

The batch (vllm-omni's ``BatchSpeechRequest``) holds ``items`` and defaults beside them: an item's field
wins when it is set, the batch's otherwise (``merge``). The batch's own schema is as loose as vllm-omni's
where vllm-omni refuses an item rather than the batch (``max_new_tokens`` up to int64, any
``instructions``, an empty ``input``): each merged item is then checked as a single request is
(``SpeechRequest``, ``check_limits``), and one that fails is a failed item, not a refused batch.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ..errors import ErrorCode, ProtocolError
from ..messages import (
    DEFAULT_SAMPLE_RATE,
    MAX_PRONUNCIATIONS,
    Embedding,
    Pronunciation,
    Seed,
    SpeechOptions,
    Speed,
    TaskType,
)
from ..normalize import TextNormalization

MAX_INPUT_CHARS = 4096  # OpenAI's limit for this route
#: vllm-omni's default cap on ``instructions`` (serving_speech.py ``_TTS_MAX_INSTRUCTIONS_LENGTH``); its
#: ``--tts-max-instructions-length`` changes it, as voxgate's ``max_instructions_chars`` does.
MAX_INSTRUCTIONS_CHARS = 500
#: vllm-omni's cap on a batch's items (``tts_batch_max_items``), voxgate's ``tts_batch_max_items``.
MAX_BATCH_ITEMS = 32
_INT64_MAX = 2**63 - 1  # vllm-omni bounds its integer fields to int64
SpeechFormat = Literal["wav", "pcm", "flac", "mp3", "opus", "aac"]
#: A rate as vllm-omni's batch schema takes it (any positive one; the merged item checks the range).
_AnyRate = Annotated[int, msgspec.Meta(gt=0)] | Literal["native"]
__all__ = [
    "DEFAULT_SAMPLE_RATE",
    "BatchItem",
    "BatchRequest",
    "SpeechRequest",
    "check_limits",
    "check_word_timestamps",
    "decode_batch_request",
    "decode_speech_request",
    "merge",
    "speakable",
]


class VoiceId(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``voice`` given as an object, as newer OpenAI clients may send it."""

    id: str


class SpeechRequest(SpeechOptions, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/audio/speech``: OpenAI's fields plus vllm-omni's (``SpeechOptions``)."""

    input: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_INPUT_CHARS)]
    voice: str | VoiceId | None = None
    #: vllm-omni's alias of ``voice`` (its ``AliasChoices("voice", "speaker")``: ``voice`` wins).
    speaker: str | None = None
    response_format: SpeechFormat = "mp3"
    #: None: raw audio, as ``"audio"``; a named one is a streaming request for vllm-omni's rules.
    stream_format: Literal["audio", "sse"] | None = None
    stream: bool | None = None  # vllm-omni's switch; this route streams unless it must hold the answer
    #: vllm-omni 0.30's ``X-Word-Timestamps`` header: the answer is then held whole, not streamed.
    word_timestamps: bool = False

    @property
    def voice_name(self) -> str | None:
        """The voice as a plain name, whichever form or field it came in."""
        if isinstance(self.voice, VoiceId):
            return self.voice.id
        return self.voice if self.voice is not None else self.speaker

    @property
    def voice_field(self) -> str:
        """The field the voice came from, for errors about it."""
        return "$.speaker" if self.voice is None and self.speaker is not None else "$.voice"

    @property
    def streaming(self) -> bool:
        """Whether vllm-omni counts the request as streamed (``is_streaming``): ``stream`` or a
        ``stream_format``."""
        return bool(self.stream) or self.stream_format is not None


class _BatchFields(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The fields a batch and its items share; None: not set (an item's then comes from the batch)."""

    voice: str | VoiceId | None = None
    speaker: str | None = None
    instructions: str | None = None
    response_format: SpeechFormat | None = None
    sample_rate: _AnyRate | None = None
    speed: Speed | None = None
    seed: Seed | None = None
    task_type: TaskType | None = None
    language: str | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    x_vector_only_mode: bool | None = None
    speaker_embedding: Embedding | None = None
    max_new_tokens: Annotated[int, msgspec.Meta(ge=1, le=_INT64_MAX)] | None = None
    initial_codec_chunk_frames: Annotated[int, msgspec.Meta(ge=0, le=_INT64_MAX)] | None = None
    non_streaming_mode: bool | None = None
    extra_params: dict[str, object] | None = None
    #: voxgate's own (``SpeechOptions``): how the text is read, and words said otherwise.
    text_normalization: TextNormalization | None = None
    keep_emoji: bool | None = None
    pronunciations: Annotated[list[Pronunciation], msgspec.Meta(max_length=MAX_PRONUNCIATIONS)] | None = None

    @property
    def voice_name(self) -> str | None:
        """The voice as a plain name (``voice``, else its alias ``speaker``), or None."""
        if isinstance(self.voice, VoiceId):
            return self.voice.id
        return self.voice if self.voice is not None else self.speaker


class BatchItem(_BatchFields, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One item of a batch: its text, and the fields that override the batch's."""

    input: str


class BatchRequest(_BatchFields, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/audio/speech/batch``: the items, and the defaults every item takes."""

    items: Annotated[list[BatchItem], msgspec.Meta(min_length=1)]
    model: str | None = None


#: The shared fields merged one by one (the voice is merged as one name, whichever field it came in).
_MERGED = tuple(f for f in _BatchFields.__struct_fields__ if f not in ("voice", "speaker"))
_decode = msgspec.json.Decoder(SpeechRequest).decode
_decode_batch = msgspec.json.Decoder(BatchRequest).decode


def decode_speech_request(body: bytes) -> SpeechRequest:
    """Decode and validate a request body.

    Raises:
        msgspec.DecodeError: the body is not JSON.
        msgspec.ValidationError: a field is missing, unknown, of the wrong type or out of range.
    """
    return _decode(body)


def decode_batch_request(body: bytes) -> BatchRequest:
    """Decode and validate a batch body (each item is checked on its own later, by ``merge``).

    Raises:
        msgspec.DecodeError: the body is not JSON.
        msgspec.ValidationError: the batch's schema refuses it (no items, an unknown field, a bad type).
    """
    return _decode_batch(body)


def merge(batch: BatchRequest, item: BatchItem) -> SpeechRequest:
    """One item as the single request it stands for: its fields, else the batch's (vllm-omni's
    ``_merge_batch_item``); ``wav`` unless a format is named, and never streamed.

    Raises:
        msgspec.ValidationError: the merged request is not one ``POST /v1/audio/speech`` takes (an empty
            ``input``, ``max_new_tokens`` over 4096): the item fails, the others go on.
    """
    fields: dict[str, object] = {}
    for name in _MERGED:
        value = getattr(item, name)
        fields[name] = value if value is not None else getattr(batch, name)
    voice = item.voice_name if item.voice_name is not None else batch.voice_name
    fields.update(input=item.input, voice=voice, model=batch.model)
    fields["response_format"] = fields["response_format"] or "wav"
    fields["speed"] = fields["speed"] or 1.0
    set_fields = {k: v for k, v in fields.items() if v is not None}
    return msgspec.convert(msgspec.to_builtins(set_fields), SpeechRequest)


def check_limits(options: SpeechOptions, max_instructions_chars: int = MAX_INSTRUCTIONS_CHARS) -> None:
    """Refuse what vllm-omni's adapters refuse and the schema cannot check: a limit set by the server.

    Call it once the request is decoded, before any engine work.

    Raises:
        ProtocolError: ``invalid_message`` on ``instructions`` over ``max_instructions_chars`` characters.
    """
    if options.instructions is not None and len(options.instructions) > max_instructions_chars:
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE,
            f"instructions too long: {len(options.instructions)} characters, at most "
            f"{max_instructions_chars}",
            field="$.instructions",
        )


def check_word_timestamps(req: SpeechRequest) -> None:
    """Refuse ``word_timestamps`` on a streamed request, as vllm-omni 0.30 does: its timings go out in a
    response header (``X-Word-Timestamps``), so the answer must be whole first.

    Raises:
        ProtocolError: ``invalid_message`` on ``word_timestamps``.
    """
    if req.word_timestamps and req.streaming:
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE,
            "word_timestamps=true is supported on non-streamed answers only (no stream, no stream_format): "
            "for streamed word timings use the WebSocket /v1/audio/speech/stream",
            field="$.word_timestamps",
        )


def speakable(text: str) -> bool:
    """Whether ``text`` has anything to say: a letter or a digit (``"..."`` or ``"?!"`` has not)."""
    return any(ch.isalnum() for ch in text)
