"""Piper says the words a client gave phonemes for (``pronunciations`` with ``ipa``) from those phonemes.

The expectation is built from Piper's own path, phonemes to ids to audio (``PiperVoice.phonemize`` with its
``[[...]]`` phoneme input, ``phonemes_to_ids``, ``phoneme_ids_to_audio``), and the engine's one gain and
fades: with a seed (no sampling noise) the engine's samples must be exactly these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pytest
from voxgate.engine import piper
from voxgate.engine.base import AudioChunk, SynthesisRequest
from voxgate.engine.piper import PiperEngine
from voxgate.engine.piper_text import with_phonemes
from voxgate.protocol.joins import fade
from voxgate.protocol.pronounce import Phonemes


@pytest.fixture(scope="module")
def engine() -> Iterator[PiperEngine]:
    # One session (no wide one): the expectation runs on the same ONNX session as the engine.
    loop = asyncio.new_event_loop()
    engine = PiperEngine(threads=1, workers=1, wide_threads=1)
    loop.run_until_complete(engine.start())
    yield engine
    loop.run_until_complete(engine.aclose())
    loop.close()


def _speak(
    engine: PiperEngine, text: str, phonemes: tuple[Phonemes, ...] = (), words: bool = False
) -> list[AudioChunk]:
    async def collect() -> list[AudioChunk]:
        req = SynthesisRequest(
            text=text, voice="joe", seed=7, phonemes=phonemes, options={"word_timestamps": words}
        )
        return [chunk async for chunk in engine.synthesize(req)]

    return asyncio.run(collect())


def _samples(engine: PiperEngine, text: str, phonemes: tuple[Phonemes, ...] = ()) -> npt.NDArray[np.float32]:
    return np.concatenate([c.samples for c in _speak(engine, text, phonemes)])


def _direct(engine: PiperEngine, text: str) -> npt.NDArray[np.float32]:
    """``text`` (with Piper's ``[[phonemes]]``) through Piper's phoneme -> id -> audio path, at the engine's
    gain and fades, without sampling noise (as the engine runs a request with a seed)."""
    from piper import SynthesisConfig

    assert engine._model is not None
    voice = engine._model.voice
    config = SynthesisConfig(length_scale=voice.config.length_scale)
    config.noise_scale = config.noise_w_scale = 0.0
    pieces = []
    for phonemes in voice.phonemize(text):
        audio = np.asarray(voice.phoneme_ids_to_audio(voice.phonemes_to_ids(phonemes), config), np.float32)
        gain = min(engine.gain, piper._CEILING / float(np.max(np.abs(audio))))
        pieces.append(fade(audio * gain, engine.sample_rate))
    return np.concatenate(pieces)


def test_an_ipa_word_gives_the_audio_of_its_phonemes_given_to_piper(engine: PiperEngine) -> None:
    text = "Please call Nguyen, today."
    entry = (Phonemes("Nguyen", "ŋwˈiən"),)
    said = _samples(engine, text, entry)
    assert np.array_equal(said, _direct(engine, "Please call [[ŋwˈiən]], today."))
    plain = _samples(engine, text)
    assert len(plain) != len(said) or not np.array_equal(plain, said)
    assert np.array_equal(plain, _direct(engine, text))  # the same path without the entry: espeak's reading


def test_several_words_in_any_case_are_said_from_one_entry(engine: PiperEngine) -> None:
    entry = (Phonemes("New York", "nˈuː jˈɔːɹk", case_sensitive=False),)
    said = _samples(engine, "We fly to new  york tomorrow.", entry)
    assert np.array_equal(said, _direct(engine, "We fly to [[nˈuː jˈɔːɹk]] tomorrow."))


def test_word_timings_name_the_words_as_written(engine: PiperEngine) -> None:
    chunks = _speak(engine, "Please call Nguyen, today.", (Phonemes("Nguyen", "ŋwˈiən"),), words=True)
    assert [w.word for c in chunks for w in c.words] == ["Please", "call", "Nguyen,", "today."]


def test_the_voice_takes_the_ipa_symbols_it_has_ids_for(engine: PiperEngine) -> None:
    assert {"ŋ", "ə", "ˈ", "ɹ", " "} <= engine.ipa_symbols
    assert not {"[", "]", "^", "$", "_"} & engine.ipa_symbols


def test_with_phonemes_matches_whole_words_only() -> None:
    entries = (Phonemes("SQL", "ˈsiːkwəl"), Phonemes("new york", "nuː jɔːk", case_sensitive=False))
    text, words = with_phonemes("SQL, SQLite mySQL and New York!", entries)
    assert text == "[[ˈsiːkwəl]], SQLite mySQL and [[nuː jɔːk]]!"
    assert words == [
        ("[[ˈsiːkwəl]],", "SQL,"),
        ("SQLite", "SQLite"),
        ("mySQL", "mySQL"),
        ("and", "and"),
        ("[[nuː jɔːk]]!", "New York!"),
    ]
