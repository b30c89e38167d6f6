"""What a client asks of the speech: the options ``session.config`` shares with the REST routes.

``SpeechOptions`` (vllm-omni's field names), the bounds of each field, the pronunciations a request may carry
and the options that reach the engine (``engine_options``). ``protocol.messages`` builds ``session.config``
on them; the REST codecs (``protocol.codecs``) build their request bodies on them.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .normalize import TextNormalization

SampleRate = Annotated[int, msgspec.Meta(ge=8000, le=48000)]
Speed = Annotated[float, msgspec.Meta(ge=0.25, le=4.0)]
FrameMs = Annotated[int, msgspec.Meta(ge=10, le=1000)]
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]  # int64, as vllm-omni
#: A compressed format's bit rate: from Opus' least useful speech rate to mp3's highest.
Bitrate = Annotated[int, msgspec.Meta(ge=6000, le=320_000)]
TaskType = Literal["CustomVoice", "VoiceDesign", "Base"]
# vllm-omni's ways to feed text; each maps onto a granularity and eager setting (``segmentation``).
TextInputMode = Literal["buffered", "commitment"]
StreamingMode = Literal["token_level", "sentence_commit"]
#: Output rate when a config names none, on every surface: vllm-omni's and OpenAI's 24 kHz.
DEFAULT_SAMPLE_RATE = 24000
#: The time budget of an utterance's eager first segment when a config names none (``max_buffer_delay_ms``).
DEFAULT_MAX_BUFFER_DELAY_MS = 300
BufferDelayMs = Annotated[int, msgspec.Meta(ge=0, le=5000)]
#: Carriers whose media-stream framing ``framing`` can produce (``protocol.codecs.telephony.CARRIERS``).
CarrierName = Literal["twilio", "telnyx"]
# Twilio's stream SIDs are 34 characters; room for other carriers' ids, never for a payload.
StreamId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
# vllm-omni caps speaker_embedding at 8192 values.
Embedding = Annotated[list[float], msgspec.Meta(max_length=8192)]
#: vllm-omni's cap on ``max_new_tokens`` (tts_adapters/base.py ``max_new_tokens_max``): more is refused.
MAX_NEW_TOKENS = 4096


#: Pronunciations one request may carry: a voice agent's product names and people, not a dictionary.
MAX_PRONUNCIATIONS = 256
_Word = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]


class Pronunciation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to say one word or several (``pronunciations``): ``alias`` is said instead of ``text``; ``ipa`` is
    said from its phonemes by an engine with phoneme input (``protocol.pronounce``). ``text`` matches whole
    words, in its own case unless ``case_sensitive`` is false."""

    text: _Word
    alias: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    ipa: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None
    case_sensitive: bool = True

    def __post_init__(self) -> None:
        if self.alias is None and self.ipa is None:
            raise ValueError("a pronunciation needs an alias or an ipa")


class SpeechOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What shapes the speech, shared by ``session.config`` and the REST ``POST /v1/audio/speech``.

    Field names are vllm-omni's. ``ref_audio``/``ref_text`` become a voice reference in the gateway;
    the others that are set reach the engine (``engine_options``), which honours each or refuses it
    by name.
    """

    sample_rate: SampleRate | Literal["native"] | None = None
    speed: Speed = 1.0
    seed: Seed | None = None
    language: str | None = None
    instructions: str | None = None
    model: str | None = None
    task_type: TaskType | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    x_vector_only_mode: bool | None = None
    speaker_embedding: Embedding | None = None
    max_new_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_NEW_TOKENS)] | None = None
    initial_codec_chunk_frames: Annotated[int, msgspec.Meta(ge=0)] | None = None
    non_streaming_mode: bool | None = None
    #: Model-specific parameters, passed to the engine whole (vllm-omni's REST field: it applies
    #: ``temperature``, ``top_p`` and ``top_k`` to its sampling and hands the rest to the model as
    #: ``extra_args``); an engine that cannot take them refuses them by name.
    extra_params: dict[str, object] | None = None
    #: How the text is read (``protocol.normalize``): ``auto`` and ``on`` read markdown, URLs and emoji
    #: as a person would, ``off`` reads the text as sent.
    text_normalization: TextNormalization = "auto"
    #: Emoji read by the engine as it would (by name, for Piper) instead of left out (voxgate's own).
    keep_emoji: bool = False
    #: Words said otherwise (voxgate's own; ElevenLabs' pronunciation dictionaries hold the same).
    pronunciations: Annotated[list[Pronunciation], msgspec.Meta(max_length=MAX_PRONUNCIATIONS)] | None = None

    def engine_options(self) -> dict[str, object]:
        """The options an engine must honour or refuse (see ``engine_options``)."""
        return engine_options(self)

    def output_rate(self, native: int) -> int:
        """The output sample rate: as asked, the engine's ``native`` one for ``"native"``, else 24000."""
        if self.sample_rate == "native":
            return native
        return self.sample_rate or DEFAULT_SAMPLE_RATE


#: Fields of ``session.config`` that reach the engine and that it must be able to honour.
ENGINE_OPTION_FIELDS: tuple[str, ...] = (
    "speed",
    "seed",
    "language",
    "instructions",
    "task_type",
    "x_vector_only_mode",
    "speaker_embedding",
    "max_new_tokens",
    "initial_codec_chunk_frames",
    "non_streaming_mode",
    "word_timestamps",
    "extra_params",
)


# Fields whose default is a value, not None: at their default the client cannot have asked for anything.
_DEFAULTS: dict[str, object] = {"speed": 1.0, "word_timestamps": False, "extra_params": {}}


def engine_options(msg: msgspec.Struct) -> dict[str, object]:
    """The ``ENGINE_OPTION_FIELDS`` a request sets (not None, and not at a value default).

    These reach the engine, which honours each one or refuses it by name. An explicit ``false``
    is passed on (it may override an engine's own default); an engine without the feature accepts
    such a neutral value (see ``engine.base.demands``).
    """
    out: dict[str, object] = {}
    for name in ENGINE_OPTION_FIELDS:
        value = getattr(msg, name, None)
        if value is not None and value != _DEFAULTS.get(name):
            out[name] = value
    return out
