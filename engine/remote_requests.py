"""What engine ``remote`` sends upstream: the body of one segment's ``POST /v1/audio/speech``.

What is sent follows the rules of the model family upstream (``engine.families``: one row per vllm-omni
serving adapter, detected from the model id or set with ``upstream_family``): which options it takes (the
rest are refused by name at session config), whether ``voice`` names a preset, how a clone travels and
which clones it cannot make (refused before any upstream call), Qwen3-TTS's ``task_type`` and language
names. A family that speaks only from a reference (Qwen3-TTS Base, CosyVoice3, GLM-TTS, MOSS-TTS) gets the
default reference voice with a plain request: a clip and its transcript shipped in the package
(``engine/data/reference.wav``), or the ones ``upstream_reference_audio`` / ``_text`` name. A reference clip
is sent at its own rate up to the family's (Fish Speech's codec runs at 44.1 kHz, the others at 24 kHz),
inline as a WAV data URL. A ``speed`` other than 1 or ``word_timestamps`` asks for a whole (non-streamed)
answer, since vllm-omni streams neither.
"""

from __future__ import annotations

import base64
import hashlib

import numpy as np
import soundfile
import soxr

from ..protocol.audio import encode, wav_header
from ..protocol.messages import ENGINE_OPTION_FIELDS
from .base import VoiceReference
from .families import Clip, Family, Presets
from .qwen3_tts import qwen_language

# Options sent upstream as they are (``word_timestamps`` turns the segment into a whole answer too).
FORWARDED = frozenset(ENGINE_OPTION_FIELDS)
# A handful of voices are in use at a time: past this many clips the data URL cache starts over.
DATA_URL_CACHE = 64


class SpeechBodies:
    """The request bodies of one engine: its ``model``, its default reference voice (a WAV file and its
    transcript, read once), and the reference clips as data URLs (cached by content)."""

    def __init__(self, model: str, reference_audio: str, reference_text: str) -> None:
        self.model = model
        self._reference_path, self._reference_text = reference_audio, reference_text
        self._reference: VoiceReference | None = None
        self._ref_cache: dict[tuple[bytes, int, int], str] = {}

    def default_reference(self) -> VoiceReference:
        """The reference a plain request carries to a family that speaks only from one (read once)."""
        if self._reference is None:
            audio, rate = soundfile.read(self._reference_path, dtype="float32", always_2d=True)
            self._reference = VoiceReference(
                name="default",
                audio=np.ascontiguousarray(audio.mean(axis=1), dtype=np.float32),
                sample_rate=int(rate),
                ref_text=self._reference_text,
            )
        return self._reference

    def body(
        self,
        text: str,
        voice: str | None,
        options: dict[str, object],
        *,
        family: Family,
        names: list[str] | None,
        default_voice: str,
        reference: VoiceReference | None = None,
    ) -> dict[str, object]:
        """The request body of one segment, shaped by the upstreams' ``family``; ``names`` are the voices the
        upstreams list (None: not known yet), ``default_voice`` the one a plain request speaks."""
        body: dict[str, object] = {"input": text, "response_format": "wav"}
        # vllm-omni refuses a streamed answer with speed adjustment (serving_speech.py
        # ``_validate_speech_streaming_request``) or with word timestamps (``create_speech``), but makes a
        # whole one: ask for that instead.
        if options.get("speed", 1.0) == 1.0 and not options.get("word_timestamps"):
            body.update(stream=True, stream_format="audio")
        if self.model:
            body["model"] = self.model
        if reference is None and family.reference_only and options.get("speaker_embedding") is None:
            reference = self.default_reference()
        # A checkpoint that lists no voices (Qwen3-TTS Base or VoiceDesign) has no speakers to name; a
        # family with unlisted presets (Ming-flash-omni) is named any voice but the default.
        named = {
            Presets.LISTED: names != [],
            Presets.NAMED: voice != default_voice,
            Presets.NONE: False,
        }[family.presets]
        if voice is not None and reference is None and named:
            body["voice"] = voice
        body.update({k: v for k, v in options.items() if k in FORWARDED})
        # vllm-omni takes a Qwen3-TTS request without ``task_type`` as CustomVoice, which a VoiceDesign or
        # Base checkpoint refuses (tts_adapters/qwen3_tts.py ``validate``): name the task it runs.
        task_type = family.task_type or (family.clone_task_type if reference is not None else None)
        if task_type is not None:
            body.setdefault("task_type", task_type)
        # vllm-omni title-cases ``language`` and accepts Qwen3-TTS's names (tts_adapters/qwen3_tts.py
        # ``validate``): codes and tags (``en``, ``en-US``) become those names; others go as they are.
        if family.qwen_languages and isinstance(body.get("language"), str):
            body["language"] = qwen_language(str(body["language"]))
        if reference is not None:
            if reference.audio is not None:
                body["ref_audio"] = self.data_url(reference, family.reference_rate_hz)
                if reference.ref_text:
                    body["ref_text"] = reference.ref_text
                elif family.clip is Clip.X_VECTOR:
                    # A Qwen3-TTS clone without a transcript is refused unless it asks for the speaker
                    # embedding alone (tts_adapters/qwen3_tts.py ``validate``, Base task).
                    body.setdefault("x_vector_only_mode", True)
            elif reference.embedding is not None:
                body["speaker_embedding"] = [float(x) for x in reference.embedding]
        return body

    def data_url(self, ref: VoiceReference, max_rate: int) -> str:
        """The clip as a WAV data URL, at its own rate or ``max_rate`` when that is lower."""
        assert ref.audio is not None
        # Keyed by content, not name: a voice may be replaced, and each API key has its own namespace.
        audio = np.ascontiguousarray(ref.audio, dtype=np.float32)
        rate = min(ref.sample_rate, max_rate)
        key = (hashlib.blake2b(audio.tobytes(), digest_size=16).digest(), ref.sample_rate, rate)
        if key not in self._ref_cache:
            if rate != ref.sample_rate:
                audio = soxr.resample(audio, ref.sample_rate, rate).astype(np.float32)
            pcm = encode(audio, "pcm")
            wav = wav_header(rate, len(pcm)) + pcm
            if len(self._ref_cache) > DATA_URL_CACHE:
                self._ref_cache.clear()
            self._ref_cache[key] = "data:audio/wav;base64," + base64.b64encode(wav).decode()
        return self._ref_cache[key]
