"""What ``AsyncOmni`` yields for one speech request, as ``AudioChunk``s (vllm-omni 0.30.0's output shapes).

Audio arrives as ``OmniRequestOutput.multimodal_output["audio"]`` (or ``"model_outputs"``), one tensor per
step (DELTA, the streaming default) or a growing list (CUMULATIVE), with ``"sr"`` beside it; ``AudioReader``
reads both, as vllm-omni's speech server reads them. Qwen3-TTS with ``async_chunk: false`` sends cumulative
snapshots instead (each one all the audio so far): ``AudioReader(snapshots=True)`` emits each sample once.
``with_words`` joins a segment's audio with the words vllm-omni's forced aligner timed in it.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import numpy.typing as npt

from .base import AudioChunk, EngineError
from .qwen3_tts import word_timings

logger = logging.getLogger(__name__)


def to_samples(item: Any) -> npt.NDArray[np.float32]:
    """``tensor.float().cpu().numpy().squeeze()`` for a tensor, arrays as they are; mono only."""
    value = item
    for method in ("float", "detach", "cpu", "numpy"):  # float() first: bfloat16 has no numpy dtype
        if hasattr(value, method):
            value = getattr(value, method)()
    samples = np.squeeze(np.asarray(value, dtype=np.float32))
    if samples.ndim > 1:
        raise EngineError(f"expected mono audio, got an array of shape {samples.shape}")
    return samples.reshape(-1)


class AudioReader:
    """Turns one request's ``OmniRequestOutput``s into ``AudioChunk``s.

    It reads what vllm-omni's speech server reads: ``multimodal_output["audio"]`` as one tensor per output
    (DELTA) or a growing list (CUMULATIVE: new items only), ``"sr"`` as a tensor or a list (its last item).
    Outputs without audio (other stages, the end marker) are skipped.

    With ``snapshots`` (``async_chunk`` off), each output's audio is all the audio so far: a tensor, or a
    history list whose last non-empty item is the latest snapshot (what vllm-omni's speech server keeps).
    Only the samples past those already emitted come out, so a snapshot sent again adds nothing.
    """

    def __init__(self, default_rate: int, *, snapshots: bool = False) -> None:
        self._default_rate = default_rate
        self._snapshots = snapshots
        self._rate: int | None = None
        self._seen = 0
        self._emitted = 0

    def read(self, output: Any) -> list[AudioChunk]:
        """The new audio in ``output``; EngineError for an output error or a rate change mid-stream."""
        if error := getattr(output, "error", None):
            raise EngineError(f"vllm-omni: {error}")
        mm = getattr(output, "multimodal_output", None)
        key = next((k for k in ("audio", "model_outputs") if mm and k in mm), None)
        if mm is None or key is None:
            return []
        audio = mm[key]
        if self._snapshots:
            return self._read_snapshot(audio, mm)
        if isinstance(audio, list):
            new, self._seen = audio[self._seen :], len(audio)
        else:
            # Counted as vllm-omni counts it: a cumulative stream's first output is one tensor, not a list.
            new, self._seen = ([], self._seen) if audio is None else ([audio], self._seen + 1)
        samples = [s for s in (to_samples(item) for item in new) if s.size]
        if not samples:
            return []
        rate = self._sample_rate(mm.get("sr"))
        return [AudioChunk(s, rate) for s in samples]

    def _read_snapshot(self, audio: Any, mm: Any) -> list[AudioChunk]:
        history = audio if isinstance(audio, list) else [audio]
        latest = next((s for s in map(to_samples, reversed(history)) if s.size), None)
        if latest is None or latest.size <= self._emitted:
            return []
        new, self._emitted = latest[self._emitted :], latest.size
        return [AudioChunk(new, self._sample_rate(mm.get("sr")))]

    def _sample_rate(self, raw: Any) -> int:
        if isinstance(raw, list):
            raw = raw[-1] if raw else None
        if raw is None:
            rate = self._rate or self._default_rate
        else:
            rate = int(raw.item() if hasattr(raw, "item") else raw)
        if self._rate is not None and rate != self._rate:
            raise EngineError(f"the sample rate changed mid-stream from {self._rate} Hz to {rate} Hz")
        self._rate = rate
        return rate


def with_words(
    text: str, chunks: list[AudioChunk], words: list[tuple[str, int, int]] | None, request_id: str
) -> AudioChunk:
    """A segment's audio as one chunk, with the aligner's words (ms from its start) in samples."""
    samples = np.concatenate([c.samples for c in chunks])
    rate = chunks[0].sample_rate
    if not words:
        # vllm-omni's "timestamps: null": the aligner timed nothing (no word in the text, or a mismatch).
        logger.warning("vllm-omni's aligner timed no word of request %s", request_id)
        return AudioChunk(samples, rate)
    return AudioChunk(samples, rate, word_timings(text, words, rate, len(samples)))
