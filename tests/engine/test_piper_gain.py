"""Piper's loudness: one gain per voice, level across an utterance, the model's own variation kept."""

from __future__ import annotations

import asyncio

import numpy as np
from voxgate.engine import piper
from voxgate.engine.base import SynthesisRequest
from voxgate.engine.piper import PiperEngine
from voxgate.engine.piper_text import cuts, gap_scores, phonemize_whole

# The segments of one reply, loud and quiet: peak-normalized one by one, they stepped by up to 5.5 dB.
SEGMENTS = [
    "Sure!",
    "I can definitely help you reschedule that appointment, and I will check the calendar.",
    "Okay.",
    "The weather today will be mostly sunny with a high of seventy two degrees.",
]


def _rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))


def test_every_segment_gets_the_voices_one_gain_and_no_sample_clips() -> None:
    async def scenario() -> None:
        engine = PiperEngine(threads=1, workers=1, wide_threads=1)
        await engine.start()
        try:
            assert engine._model is not None
            voice = engine._model.voice
            assert 1.0 < engine.gain < 2.5  # joe's raw peaks are 0.34-0.63: turned up, with headroom
            from piper import SynthesisConfig

            config = SynthesisConfig()
            config.noise_scale = config.noise_w_scale = 0.0
            gains = []
            for text in SEGMENTS:
                chunks = [
                    c async for c in engine.synthesize(SynthesisRequest(text=text, voice="joe", seed=1))
                ]
                out = np.concatenate([c.samples for c in chunks])
                raw = np.concatenate(
                    [
                        np.asarray(voice.phoneme_ids_to_audio(voice.phonemes_to_ids(p), config), np.float32)
                        for p in voice.phonemize(text)
                    ]
                )
                assert np.abs(out).max() <= piper._CEILING + 1e-6  # no clipping
                gains.append(20 * np.log10(_rms(out) / _rms(raw)))
            # The gain relative to the model's own output is the same for every segment (the fades at the
            # ends change the RMS a hair); per-segment peak normalization spread it over 4-5 dB.
            assert max(gains) - min(gains) < 0.5
        finally:
            await engine.aclose()

    asyncio.run(scenario())


def test_a_long_sentence_is_cut_into_pieces_where_a_reader_would_pause() -> None:
    async def scenario() -> None:
        engine = PiperEngine(threads=1, workers=1, wide_threads=1)
        await engine.start()
        try:
            assert engine._model is not None
            voice = engine._model.voice
            text = (
                "This page streams text to the gateway while the model is still writing it and the gateway "
                "turns that text into speech right away with no wait for the whole reply to arrive first"
            )
            (sentence,) = phonemize_whole(voice.phonemize, text)
            (plan,) = piper._plan(voice, text, [sentence])
            pieces = cuts(sentence, limit=60, score=gap_scores(plan, sentence))
            assert len(pieces) > 2
            starts = {group.first: group.words[0].lower() for group in plan}
            # Every cut is before a word that opens a phrase ("while", "that", "with", ...), as the
            # segmenter cuts; by the phonemes alone it fell on the last word gap ("the | gateway").
            assert [starts[at] for at, _ in pieces[1:]] == ["while", "that", "with"]
            plain = cuts(sentence, limit=60)
            assert [starts.get(at) for at, _ in plain[1:]] != [starts[at] for at, _ in pieces[1:]]
        finally:
            await engine.aclose()

    asyncio.run(scenario())
