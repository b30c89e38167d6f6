"""The model families vllm-omni serves, as the rules of the request each family's adapter accepts.

vllm-omni 0.30 picks one serving adapter per deployment (``entrypoints/openai/tts_adapters``): it reads the
``model_stage`` / ``model_arch`` of the stage configs its resolver made from the checkpoint's
``config.json`` ``model_type``, and that adapter's ``validate`` decides which fields a request may carry.
None of that is visible over HTTP; what is, is the model list (``/v1/models``: the served name as ``id``,
the checkpoint path as ``root``), which names the checkpoint (``fishaudio/s2-pro``,
``Qwen/Qwen3-TTS-12Hz-1.7B-Base``). So the remote engine detects the family from those names
(``detect``), and a deployment that serves under another name says it with ``upstream_family``.

Each ``Family`` is data, not code: which engine options it takes (any other is refused by name at
session config, ``check``), whether it names built-in voices, how a clone travels (a clip with its
transcript, a clip alone as Qwen3-TTS's ``x_vector_only_mode``, a clip with an optional transcript, or
not at all), whether it takes a ``speaker_embedding``, whether it speaks only from a reference (a plain
request then carries the default reference voice), which ``task_type`` Qwen3-TTS is told, and the highest
rate a reference clip keeps (Fish Speech's codec runs at 44.1 kHz; the others condition on 24 kHz). A
request a family cannot serve is refused here, before any upstream call, with the field that says why.
"""

from __future__ import annotations

import enum

import msgspec

from .base import RequestRefused, UnsupportedOption, VoiceReference

ENGINE = "remote"

# Options every vllm-omni adapter takes or the serving layer handles for all of them (sampling seed and
# overrides, token budget, the aligner stage, the streaming switches).
_COMMON = frozenset(
    {
        "seed",
        "max_new_tokens",
        "extra_params",
        "word_timestamps",
        "non_streaming_mode",
        "initial_codec_chunk_frames",
    }
)


class Clip(enum.Enum):
    """How a family clones from a reference clip."""

    #: ``ref_audio`` with ``ref_text``; a clip without a transcript is refused (Fish Speech, CosyVoice3...).
    TRANSCRIPT = "transcript"
    #: ``ref_audio`` with ``ref_text``, or alone as ``x_vector_only_mode`` (Qwen3-TTS Base).
    X_VECTOR = "x_vector"
    #: ``ref_audio``, with ``ref_text`` when there is one (Voxtral, OmniVoice, MOSS-TTS, VoxCPM2, Ming).
    OPTIONAL = "optional"
    #: No cloning from a clip.
    NONE = "none"


class Presets(enum.Enum):
    """Whether and how a family names built-in voices."""

    #: The voices ``/v1/audio/voices`` lists, sent as ``voice``.
    LISTED = "listed"
    #: Named presets the voice list does not show (Ming-flash-omni's ``voice_name``): any name but the
    #: default goes up.
    NAMED = "named"
    #: None: ``voice`` is never sent (vllm-omni refuses an unknown name for these families).
    NONE = "none"


class Family(msgspec.Struct, frozen=True, kw_only=True):
    """The request rules of one vllm-omni serving adapter (one row of ``FAMILIES``)."""

    #: ``FAMILIES`` key and the ``upstream_family`` value; vllm-omni's adapter name where it has one.
    name: str
    #: How the docs and error messages name it.
    label: str
    #: Lower-case pieces of a model id or checkpoint path that identify the family.
    ids: tuple[str, ...] = ()
    #: Engine options (``protocol.messages.ENGINE_OPTION_FIELDS``) it takes; others are refused by name.
    options: frozenset[str] = _COMMON
    presets: Presets = Presets.NONE
    clip: Clip = Clip.NONE
    embedding: bool = False
    #: Every request needs a reference: a plain one carries the default reference voice.
    reference_only: bool = False
    #: Qwen3-TTS's ``task_type`` for every request of this checkpoint kind (None: the field is not sent).
    task_type: str | None = None
    #: The ``task_type`` a clone is sent with, when ``task_type`` is None.
    clone_task_type: str | None = None
    #: A request without ``instructions`` is refused (Qwen3-TTS VoiceDesign).
    needs_instructions: bool = False
    #: The highest rate a reference clip is sent at: higher ones are resampled down, lower ones kept.
    reference_rate_hz: int = 24000
    #: Language codes become Qwen3-TTS's names (``en`` -> ``English``).
    qwen_languages: bool = False

    def check(self, options: dict[str, object]) -> None:
        """Refuse, by name, an option this family does not take.

        Raises:
            UnsupportedOption: the first such option.
        """
        for field in options:
            if field not in self.options:
                raise UnsupportedOption(field, ENGINE, f"{self.label} does not take {field!r}")

    def check_request(self, reference: VoiceReference | None, options: dict[str, object]) -> None:
        """Refuse a voice or request this family cannot serve, before anything is sent.

        Raises:
            UnsupportedOption: a clone it cannot make (``ref_audio``, ``ref_text``, ``speaker_embedding``).
            RequestRefused: a request it cannot serve without a field the client did not give.
        """
        self.check_reference(reference)
        if self.needs_instructions and not options.get("instructions"):
            raise RequestRefused(
                f"{self.label} designs the voice from 'instructions': give them", field="instructions"
            )

    def check_reference(self, reference: VoiceReference | None) -> None:
        """Refuse a voice (a clip, an embedding) this family cannot clone: at a session's config already.

        Raises:
            UnsupportedOption: on ``ref_audio``, ``ref_text`` or ``speaker_embedding``.
        """
        if reference is not None and reference.audio is not None:
            if self.clip is Clip.NONE:
                raise UnsupportedOption("ref_audio", ENGINE, f"{self.label} does not clone from a clip")
            if self.clip is Clip.TRANSCRIPT and not (reference.ref_text or "").strip():
                raise UnsupportedOption(
                    "ref_text",
                    ENGINE,
                    f"{self.label} clones only from a clip with its transcript: give the voice a ref_text",
                )
        # (an inline ``speaker_embedding`` option is refused by ``check``, with the options it does not take)
        if reference is not None and reference.embedding is not None and not self.embedding:
            raise UnsupportedOption(
                "speaker_embedding", ENGINE, f"{self.label} does not clone from a speaker embedding"
            )


_SPEED = _COMMON | {"speed"}

#: Every family voxgate knows, by ``name``. ``GENERIC`` is not detected: it is what an upstream that
#: names no known checkpoint gets (another voxgate, an OpenAI-compatible server).
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        # Qwen3-TTS: one checkpoint kind per server, told by the id's suffix; each takes its own task_type.
        Family(
            name="qwen3_tts_customvoice",
            label="Qwen3-TTS CustomVoice",
            ids=("qwen3-tts", "customvoice"),
            options=_SPEED | {"language", "instructions", "task_type"},
            presets=Presets.LISTED,
            task_type="CustomVoice",
            qwen_languages=True,
        ),
        Family(
            name="qwen3_tts_base",
            label="Qwen3-TTS Base",
            ids=("qwen3-tts", "base"),
            options=_SPEED | {"language", "task_type", "x_vector_only_mode", "speaker_embedding"},
            clip=Clip.X_VECTOR,
            embedding=True,
            reference_only=True,
            task_type="Base",
            qwen_languages=True,
        ),
        Family(
            name="qwen3_tts_voicedesign",
            label="Qwen3-TTS VoiceDesign",
            ids=("qwen3-tts", "voicedesign"),
            options=_SPEED | {"language", "instructions", "task_type"},
            needs_instructions=True,
            task_type="VoiceDesign",
            qwen_languages=True,
        ),
        Family(
            name="fish_tts",
            label="Fish Speech",
            ids=("fish",),
            options=_SPEED,
            clip=Clip.TRANSCRIPT,
            reference_rate_hz=44100,
        ),
        Family(
            name="cosyvoice3",
            label="CosyVoice3",
            ids=("cosyvoice",),
            options=_SPEED,
            clip=Clip.TRANSCRIPT,
            reference_only=True,
        ),
        Family(
            name="glm_tts",
            label="GLM-TTS",
            ids=("glm-tts",),
            options=_SPEED,
            clip=Clip.TRANSCRIPT,
            reference_only=True,
        ),
        # Refuses task_type, language, instructions, speed, x_vector_only_mode and speaker_embedding.
        Family(name="higgs_audio_v2", label="Higgs Audio V2", ids=("higgs-audio-v2",), clip=Clip.TRANSCRIPT),
        # Refuses task_type, language, x_vector_only_mode, initial_codec_chunk_frames, ref_audio, ref_text.
        Family(
            name="ming_flash_omni_tts",
            label="Ming-flash-omni TTS",
            ids=("ming-flash-omni",),
            options=(_SPEED - {"initial_codec_chunk_frames"}) | {"instructions", "speaker_embedding"},
            presets=Presets.NAMED,
            embedding=True,
        ),
        Family(
            name="ming_tts",
            label="Ming TTS",
            ids=("ming-uniaudio", "ming-tts"),
            options=_SPEED | {"instructions", "speaker_embedding"},
            clip=Clip.OPTIONAL,
            embedding=True,
        ),
        Family(
            name="moss_tts",
            label="MOSS-TTS",
            ids=("moss-tts",),
            options=_SPEED | {"language"},
            clip=Clip.OPTIONAL,
            reference_only=True,
        ),
        Family(name="omnivoice", label="OmniVoice", ids=("omnivoice",), options=_SPEED, clip=Clip.OPTIONAL),
        Family(
            name="voxtral_tts",
            label="Voxtral TTS",
            ids=("voxtral",),
            options=_SPEED,
            presets=Presets.LISTED,
            clip=Clip.OPTIONAL,
        ),
        Family(
            name="voxcpm2",
            label="VoxCPM2",
            ids=("voxcpm",),
            options=_SPEED,
            clip=Clip.OPTIONAL,
            reference_rate_hz=48000,
        ),
        Family(name="covo_audio", label="Covo Audio", ids=("covo",), options=_SPEED),
    )
}

#: An upstream that names no known checkpoint: every option goes up, a clone as Qwen3-TTS's Base task
#: (what voxgate sent before it knew families, and what another voxgate gateway takes).
GENERIC = Family(
    name="generic",
    label="the upstream",
    options=_SPEED | {"language", "instructions", "task_type", "x_vector_only_mode", "speaker_embedding"},
    presets=Presets.LISTED,
    clip=Clip.X_VECTOR,
    embedding=True,
    clone_task_type="Base",
    qwen_languages=True,
    reference_rate_hz=48000,
)


def detect(names: list[str]) -> Family | None:
    """The family a model id or checkpoint path names (the first of ``names`` that names one)."""
    for name in names:
        key = name.lower().replace("_", "-")
        for family in FAMILIES.values():
            if family.ids and all(piece in key for piece in family.ids):
                return family
    return None
