"""Qwen3-TTS as vllm-omni 0.30.0 serves it: what differs by checkpoint, as data, and how a prompt is built.

``PROFILES`` holds the per-variant facts (CustomVoice, VoiceDesign, Base: task type, options, what must be
set, the default voice). The in-process engine builds its requests with vllm-omni's own serving code
(``engine.omni_requests``); ``build_info`` (the ``additional_information`` vllm-omni's talker rebuilds its
embeddings from) and ``with_request_params`` are the same building written out, used with the stand-in
helpers (``Qwen3Tools``) that the engine's unit tests pass, where vllm-omni is not installed. Language
names and word timings are shared with the remote engine. Nothing here imports vllm-omni.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec
import numpy as np

from .base import EngineError, WordTiming

if TYPE_CHECKING:
    from .base import VoiceReference

DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
# A name under vllm_omni/deploy/ or a path; this one streams talker -> code2wav in chunks (async_chunk).
DEFAULT_DEPLOY_CONFIG = "qwen3_tts.yaml"
# vllm-omni's own default; a cold start of the 0.6B model (weights, CUDA graphs) took ~2.5 min (REFERENCE D).
DEFAULT_STAGE_INIT_TIMEOUT_S = 300.0
# vllm-omni's serving adapter sends this budget when a request sets none.
DEFAULT_MAX_NEW_TOKENS = 2048
# vllm-omni bounds Base generation, which can loop without EOS, by text length: 12 codec frames per text
# token and at least 192. Without its tokenizer, ~4 characters a token gives 3 frames a character.
MIN_CODEC_FRAMES = 192
CODEC_FRAMES_PER_TEXT_TOKEN = 12
# The languages vllm-omni assumes when the model config lists none (its DEFAULT_TTS_LANGUAGES).
DEFAULT_LANGUAGES = frozenset(
    {
        "Auto",
        "Chinese",
        "English",
        "Japanese",
        "Korean",
        "German",
        "French",
        "Russian",
        "Portuguese",
        "Spanish",
        "Italian",
    }
)
# Qwen3-TTS names languages in English; clients often send codes ("en", "en-US").
_LANGUAGE_CODES = {
    "auto": "Auto",
    "zh": "Chinese",
    "en": "English",
    "ja": "Japanese",
    "ko": "Korean",
    "de": "German",
    "fr": "French",
    "ru": "Russian",
    "pt": "Portuguese",
    "es": "Spanish",
    "it": "Italian",
}
_OPTIONS = frozenset(
    {
        "seed",
        "language",
        "instructions",
        "task_type",
        "max_new_tokens",
        "initial_codec_chunk_frames",
        "non_streaming_mode",
    }
)
_CLONING = frozenset({"x_vector_only_mode", "speaker_embedding"})
REFUSALS = {
    "speed": "Qwen3-TTS has no speaking-rate control; leave speed at 1.0",
    "word_timestamps": (
        "they need vllm-omni's forced-aligner stage, which this deploy does not load: set "
        "VOXGATE_VLLM_FORCED_ALIGNER=Qwen/Qwen3-ForcedAligner-0.6B (an extra 0.6B model stage on the GPU)"
    ),
    **{field: "only a Qwen3-TTS Base model clones voices" for field in _CLONING},
}

TaskType = Literal["CustomVoice", "Base", "VoiceDesign"]


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    """What differs between Qwen3-TTS checkpoints.

    Each runs one ``task_type`` (vllm-omni refuses the others), honours ``options`` and ``requires`` some,
    may clone uploaded voices, and may need a ``non_streaming_mode`` or a frame budget per character
    (``codec_frames_per_char``) when a request sets none. ``default_voice`` is, for CustomVoice, the voice
    until the config's speakers are read (then the first, as in vllm-omni); for Base and VoiceDesign, the
    name of "the uploaded voice" and of "the voice the instructions describe".
    """

    task_type: TaskType
    default_voice: str
    clones: bool = False
    options: frozenset[str] = _OPTIONS
    requires: tuple[str, ...] = ()
    non_streaming_mode: bool | None = None
    codec_frames_per_char: float | None = None
    sample_rate: int = 24000


#: By the task the checkpoint runs: the ``-CustomVoice`` / ``-Base`` / ``-VoiceDesign`` suffix of its name,
#: confirmed by ``tts_model_type`` in its config once loaded.
PROFILES: dict[str, Profile] = {
    "CustomVoice": Profile(task_type="CustomVoice", default_voice="vivian"),
    "Base": Profile(
        task_type="Base",
        default_voice="reference",
        clones=True,
        options=_OPTIONS | _CLONING,
        codec_frames_per_char=3.0,
    ),
    "VoiceDesign": Profile(
        task_type="VoiceDesign", default_voice="designed", requires=("instructions",), non_streaming_mode=True
    ),
}


def variant_of(name: str) -> str | None:
    """The ``PROFILES`` key for a model id, a path or a ``tts_model_type`` value; None if it names none."""
    last = name.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].rsplit("-", 1)[-1]
    key = re.sub(r"[^a-z]", "", last.lower())
    return next((v for v in PROFILES if v.lower() == key), None)


def qwen_language(value: str) -> str:
    """The Qwen3-TTS name of a language given by name (``english``) or code (``en``, ``en-US``)."""
    text = value.strip()
    return _LANGUAGE_CODES.get(text.lower().replace("_", "-").split("-")[0], text.title())


class Qwen3Tools(Protocol):
    """What the engine takes from vllm-omni besides ``AsyncOmni``: Qwen3-TTS helpers and model facts."""

    variant: str | None  # the PROFILES key the checkpoint's config declares
    speakers: list[str]  # built-in speakers in config order; vllm-omni's default is the first
    languages: frozenset[str] | None
    codec_frame_rate: float | None  # codec frames per second of audio (12.5 for the "12Hz" tokenizer)
    # False when the deploy config turns async_chunk off: the talker hands code2wav one full payload, the
    # request stays FINAL_ONLY and its audio arrives as cumulative snapshots (each one all the audio so far).
    streaming: bool

    def text_tokens(self, text: str) -> int | None:
        """How many tokens the model's tokenizer makes of ``text`` (None without one): sizes a Base budget."""
        ...

    def prompt(self, info: dict[str, list[Any]], task_type: str, cache_salt: str) -> dict[str, Any]:
        """The engine prompt: placeholder ids of the right length plus ``additional_information``."""
        ...

    def stream_params(self, *, words: bool = False) -> list[Any]:
        """Per-stage sampling params: fresh copies of the deploy defaults, with streaming (DELTA) output;
        CUMULATIVE with ``words`` (the aligner stage reads the whole waveform), as vllm-omni's server."""
        ...

    #: Whether the pipeline ends with vllm-omni's forced-aligner stage (``--forced-aligner``).
    word_timestamps: bool

    #: What ``AsyncOmni.generate`` is asked for: ``["audio"]``, and the aligner's output for words.
    def modalities(self, words: bool) -> list[str]: ...

    def is_words(self, output: Any) -> bool:
        """Whether ``output`` is the aligner stage's (its final output type is vllm-omni's timestamps)."""
        ...

    def words(self, output: Any, text: str, language: str | None) -> list[tuple[str, int, int]] | None:
        """The aligner output's ``(word, start_ms, end_ms)``, read by vllm-omni's ``extract_word_timestamps``
        (ms from the start of ``text``'s audio); None when it timed none."""
        ...


def build_info(
    text: str,
    *,
    profile: Profile,
    speaker: str,
    language: str,
    options: Mapping[str, object],
    reference: VoiceReference | None,
    codec_frame_rate: float | None,
) -> dict[str, list[Any]]:
    """vllm-omni's Qwen3-TTS ``additional_information`` for one request (every value a one-item list).

    Raises:
        EngineError: a Base request without a voice to clone, or in-context cloning without a transcript.
    """
    instruct, budget = options.get("instructions"), options.get("max_new_tokens")
    info: dict[str, list[Any]] = {
        "text": [text],
        "task_type": [profile.task_type],
        "language": [language],
        "instruct": [instruct if isinstance(instruct, str) else ""],
        "max_new_tokens": [budget if isinstance(budget, int) else DEFAULT_MAX_NEW_TOKENS],
    }
    if profile.task_type == "CustomVoice":
        info["speaker"] = [speaker]
    if "initial_codec_chunk_frames" in options:
        info["initial_codec_chunk_frames"] = [options["initial_codec_chunk_frames"]]
    non_streaming = options.get("non_streaming_mode", profile.non_streaming_mode)
    if non_streaming is not None:
        info["non_streaming_mode"] = [bool(non_streaming)]
    if profile.task_type == "Base":
        info.update(_clone_info(options, reference, codec_frame_rate))
    return info


def _clone_info(
    options: Mapping[str, object], reference: VoiceReference | None, codec_frame_rate: float | None
) -> dict[str, list[Any]]:
    embedding = options.get("speaker_embedding")
    if embedding is None and reference is not None:
        embedding = reference.embedding
    if isinstance(embedding, list | tuple | np.ndarray):
        # Plain floats: the talker rebuilds the tensor on its side of vllm-omni's IPC boundary.
        return {
            "voice_clone_prompt": [{"ref_spk_embedding": [float(x) for x in embedding]}],
            "x_vector_only_mode": [True],
        }
    if reference is None or reference.audio is None:
        raise EngineError("a Qwen3-TTS Base model speaks only uploaded voices; name one in voice")
    ref_text = reference.ref_text
    x_vector_only = bool(options.get("x_vector_only_mode", not ref_text))
    audio = [reference.audio.astype(np.float32).tolist(), reference.sample_rate]
    info: dict[str, list[Any]] = {"ref_audio": [audio], "x_vector_only_mode": [x_vector_only]}
    if isinstance(ref_text, str) and ref_text.strip():
        info["ref_text"] = [ref_text]
    elif not x_vector_only:
        raise EngineError(f"voice {reference.name!r} has no transcript (ref_text) for in-context cloning")
    # vllm-omni's serving adapter sends it for every reference clip; only in-context cloning reads it.
    if codec_frame_rate and reference.sample_rate > 0 and len(reference.audio):
        info["ref_code_length"] = [math.ceil(len(reference.audio) / reference.sample_rate * codec_frame_rate)]
    return info


def cache_salt(info: Mapping[str, list[Any]], reference: VoiceReference | None) -> str:
    """A digest of the conditioning: the placeholder ids look alike, and vLLM's prefix cache must not."""
    digest = hashlib.sha256()
    for key in sorted(info):
        if key != "ref_audio":
            digest.update(f"{key}={info[key]!r}\0".encode())
    if reference is not None and reference.audio is not None:
        digest.update(f"{reference.name}:{reference.sample_rate}\0".encode() + reference.audio.tobytes())
    return digest.hexdigest()[:32]


def _kept(token: str) -> str:
    """A written word as vllm-omni's aligner segments it: its letters, digits and apostrophes."""
    return "".join(c for c in token if c.isalnum() or c == "'")


def written_words(text: str, words: list[str]) -> list[str]:
    """The input's words (``"Dr."``, ``"$3.50"``) for the aligner's (``"Dr"``, ``"350"``).

    vllm-omni's aligner times the text split at whitespace, punctuation dropped, each CJK character a word
    of its own (``qwen3_force_align_processor.segment_words``). A written word that is one aligner word
    gets its written form; one split into several (CJK) keeps the aligner's. If they stop matching, the
    rest keep the aligner's names.
    """
    tokens = [(t, _kept(t)) for t in text.split()]
    tokens = [(t, k) for t, k in tokens if k]
    out: list[str] = []
    at, rest = 0, ""
    for word in words:
        if not rest:
            if at >= len(tokens):
                return out + words[len(out) :]
            written, rest = tokens[at]
            at += 1
            if rest == word:
                out.append(written)
                rest = ""
                continue
        if not rest.startswith(word):
            return out + words[len(out) :]
        out.append(word)
        rest = rest[len(word) :]
    return out


def word_timings(
    text: str, words: Sequence[tuple[str, int, int]], sample_rate: int, length: int
) -> tuple[WordTiming, ...]:
    """vllm-omni's aligner times (``(word, start_ms, end_ms)`` from the start of ``text``'s audio, which is
    ``length`` samples at ``sample_rate``) as ``AudioChunk.words``: in samples, named as written."""
    names = written_words(text, [w for w, _, _ in words])

    def sample(ms: int) -> int:
        return min(length, max(0, round(ms * sample_rate / 1000)))

    return tuple(WordTiming(n, sample(s), sample(e)) for n, (_, s, e) in zip(names, words, strict=True))


def with_request_params(params: Sequence[Any], *, seed: int | None, max_tokens: int | None) -> list[Any]:
    """Stage-0 params with the request's seed and budget, set the way vllm-omni's speech server sets them.

    The other stages keep the deploy defaults; the shared default objects are never changed. A seed in the
    deploy config seeds the code predictor too when the request sets none, as vllm-omni's adapter does.
    """
    out = list(params)
    default_seed = getattr(out[0], "seed", None) if out else None
    if not out or (seed is None and max_tokens is None and default_seed is None):
        return out
    first = copy.deepcopy(out[0])
    if seed is not None:
        first.seed = seed
        # The code predictor samples too; vllm-omni seeds it from this key.
        first.extra_args = {**(first.extra_args or {}), "tts_local_seed": seed}
    elif default_seed is not None:
        first.extra_args = {"tts_local_seed": int(default_seed), **(first.extra_args or {})}
    if max_tokens is not None:
        first.max_tokens = max_tokens
        first.min_tokens = min(int(first.min_tokens or 0), max_tokens)
    out[0] = first
    return out


def word_triples(listed: Any) -> list[tuple[str, int, int]]:
    """vllm-omni's word timestamps (``[{word, start_ms, end_ms}]``) as (word, start ms, end ms)."""
    return [(str(w["word"]), int(w["start_ms"]), int(w["end_ms"])) for w in listed]
