"""A word of an uploaded ElevenLabs pronunciation dictionary (a PLS lexicon) is heard as its alias, over the
ElevenLabs REST route (the ``elevenlabs`` SDK at its defaults: mp3_44100_128) and the ElevenLabs WebSockets
(``stream-input`` as ElevenLabs documents it, and pipecat's ``ElevenLabsTTSService`` on
``multi-stream-input``), against a real gateway with the Piper engine and an API key. Whisper tiny.en
transcribes it back; with the same ``seed``, the text with the dictionary is the same audio as the text with
the word replaced by hand (one pronunciation mechanism: the alias is what the engine is sent)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from elevenlabs.client import ElevenLabs
from elevenlabs.types import PronunciationDictionaryVersionLocator
from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame
from pipecat.services.elevenlabs.tts import ElevenLabsTTSService, PronunciationDictionaryLocator
from pipecat.tests.utils import run_test
from voxgate.protocol.audio import decode
from websockets.sync.client import connect

from tests.conftest import TIMEOUT_S, serve_engine
from tests.decoding import decoded
from tests.speech_check import load_whisper, word_error_rate

pytestmark = pytest.mark.slow

KEY = "dictionary-speech-key"
VOICE = "joe"
ALIAS = "structured query language"
TEXT = "We store it in SQL today."
BY_HAND = f"We store it in {ALIAS} today."
PLS = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa" '
    'xml:lang="en-US">\n'
    f"  <lexeme><grapheme>SQL</grapheme><alias>{ALIAS}</alias></lexeme>\n"
    "</lexicon>\n"
).encode()


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    with serve_engine(None, engine="piper", piper_workers=1, api_keys=KEY) as address:
        yield address


@pytest.fixture(scope="module")
def whisper() -> object:
    return load_whisper()


@pytest.fixture(scope="module")
def client(gateway: str) -> Iterator[ElevenLabs]:
    with httpx.Client(timeout=TIMEOUT_S) as http:
        yield ElevenLabs(base_url=f"http://{gateway}", api_key=KEY, httpx_client=http)


@pytest.fixture(scope="module")
def dictionary(client: ElevenLabs) -> PronunciationDictionaryVersionLocator:
    made = client.pronunciation_dictionaries.create_from_file(
        name="Databases", file=("databases.pls", PLS, "application/pls+xml")
    )
    return PronunciationDictionaryVersionLocator(
        pronunciation_dictionary_id=made.id, version_id=made.version_id
    )


def test_sdk_rest_says_the_dictionary_word_as_the_text_replaced_by_hand(
    client: ElevenLabs, dictionary: PronunciationDictionaryVersionLocator, whisper: object
) -> None:
    said = b"".join(
        client.text_to_speech.convert(
            VOICE, text=TEXT, seed=7, pronunciation_dictionary_locators=[dictionary]
        )
    )
    by_hand = b"".join(client.text_to_speech.convert(VOICE, text=BY_HAND, seed=7))
    assert said == by_hand  # the same seed: the same mp3
    audio, rate = decoded(said)
    assert rate == 44100
    error, heard = word_error_rate(whisper, audio, rate, BY_HAND)
    assert ALIAS in heard and error <= 0.3, heard


def _stream_input(gateway: str, text: str, locators: list[dict[str, str]] | None) -> bytes:
    """``stream-input`` as ElevenLabs documents it: the init message (its locators), the text, then ``""``."""
    url = f"ws://{gateway}/v1/text-to-speech/{VOICE}/stream-input?output_format=pcm_16000&seed=7"
    audio = bytearray()
    with connect(url, additional_headers={"xi-api-key": KEY}, open_timeout=TIMEOUT_S, max_size=None) as ws:
        first: dict[str, object] = {"text": " "}
        if locators is not None:
            first["pronunciation_dictionary_locators"] = locators
        for message in (first, {"text": text + " "}, {"text": ""}):
            ws.send(json.dumps(message))
        for data in ws:
            message = json.loads(data)
            assert "error" not in message, message
            audio += base64.b64decode(message.get("audio") or "")
            if message.get("isFinal"):
                break
    return bytes(audio)


def test_stream_input_says_the_dictionary_word_as_the_text_replaced_by_hand(
    gateway: str, dictionary: PronunciationDictionaryVersionLocator, whisper: object
) -> None:
    locators = [dictionary.dict(exclude_none=True)]
    said = _stream_input(gateway, TEXT, locators)
    assert said == _stream_input(gateway, BY_HAND, None)
    error, heard = word_error_rate(whisper, decode(said, "pcm").astype(np.float32), 16000, BY_HAND)
    assert ALIAS in heard and error <= 0.3, heard
    assert (
        ALIAS
        not in word_error_rate(whisper, decode(_stream_input(gateway, TEXT, None), "pcm"), 16000, TEXT)[1]
    )


def test_pipecat_multi_stream_input_says_the_dictionary_word(
    gateway: str, dictionary: PronunciationDictionaryVersionLocator, whisper: object
) -> None:
    # pipecat deprecates its locators (they would break its word tracking where the alignment names the
    # rewritten text; voxgate's names the client's own characters), but still sends them with each context.
    with pytest.deprecated_call():
        locator = PronunciationDictionaryLocator(
            pronunciation_dictionary_id=dictionary.pronunciation_dictionary_id,
            version_id=str(dictionary.version_id),
        )
        tts = ElevenLabsTTSService(
            api_key=KEY,
            url=f"ws://{gateway}",
            sample_rate=24000,
            settings=ElevenLabsTTSService.Settings(voice=VOICE),
            pronunciation_dictionary_locators=[locator],
        )
    down, _ = asyncio.run(run_test(tts, frames_to_send=[TTSSpeakFrame(TEXT)]))
    audio = b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame))
    error, heard = word_error_rate(whisper, decode(audio, "pcm").astype(np.float32), 24000, BY_HAND)
    # pipecat sends no seed, so Piper's speech varies a little from run to run: most of the alias will do.
    assert sum(word in heard.split() for word in ALIAS.split()) >= 2 and error <= 0.4, heard


ARPABET = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b'<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"'
    b' alphabet="cmu-arpabet">\n'
    b"  <lexeme><grapheme>Nguyen</grapheme><phoneme>N W IY1 AH0 N</phoneme></lexeme>\n"
    b"</lexicon>\n"
)


def test_a_phoneme_entry_is_said_as_the_same_ipa_in_session_pronunciations(
    gateway: str, client: ElevenLabs
) -> None:
    """A PLS phoneme (ElevenLabs' cmu-arpabet, written as IPA) is Piper's phoneme input, exactly as the same
    ``ipa`` in voxgate's own ``pronunciations``: one mechanism."""
    made = client.pronunciation_dictionaries.create_from_file(name="Names", file=("names.pls", ARPABET))
    [rule] = client.pronunciation_dictionaries.get(made.id).rules
    assert (rule.type, rule.phoneme) == ("phoneme", "nwˈiːən")
    text = "Please call Nguyen, today."
    said = b"".join(
        client.text_to_speech.convert(
            VOICE,
            text=text,
            seed=7,
            output_format="pcm_16000",
            pronunciation_dictionary_locators=[
                PronunciationDictionaryVersionLocator(pronunciation_dictionary_id=made.id)
            ],
        )
    )
    own = httpx.post(
        f"http://{gateway}/v1/audio/speech",
        headers={"Authorization": f"Bearer {KEY}"},
        json={
            "input": text,
            "voice": VOICE,
            "response_format": "pcm",
            "sample_rate": 16000,
            "seed": 7,
            "pronunciations": [{"text": "Nguyen", "ipa": "nwˈiːən"}],
        },
        timeout=TIMEOUT_S,
    )
    assert own.status_code == 200 and said == own.content
    plain = b"".join(client.text_to_speech.convert(VOICE, text=text, seed=7, output_format="pcm_16000"))
    assert plain != said
