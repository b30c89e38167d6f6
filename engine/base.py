"""The one interface every TTS engine implements, and the values that cross it.

The gateway only ever talks to engines through ``TTSEngine``: it asks for ``voices()``, checks a
request with ``check()``, then consumes ``synthesize()`` with ``contextlib.aclosing`` so that a cancel
or a disconnect closes the iterator and the engine stops working for nobody.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import NamedTuple, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from ..protocol.pronounce import Phonemes


class EngineError(Exception):
    """Synthesis failed inside an engine (model error, upstream down, bad audio)."""


class UnsupportedOption(EngineError):
    """A request asks for something the engine cannot honour.

    Args:
        field: the request field, as named on the wire (``instructions``, ``voice``).
        engine: the engine's registry name.
        detail: what would serve the request instead.
    """

    def __init__(self, field: str, engine: str, detail: str = "") -> None:
        self.field = field
        self.engine = engine
        message = f"engine {engine!r} cannot honour {field!r}"
        super().__init__(f"{message}: {detail}" if detail else message)


#: An unknown-voice error names this many of the voices there are, then how many more.
NAMED_VOICES = 10


class UnknownVoice(EngineError):
    """The requested voice is not one the engine can speak; the message names a few that are."""

    def __init__(self, voice: str, engine: str, available: list[str]) -> None:
        self.voice = voice
        self.engine = engine
        named = ", ".join(available[:NAMED_VOICES])
        more = len(available) - NAMED_VOICES
        listed = f"{named}, ... and {more} more (GET /v1/audio/voices lists them)" if more > 0 else named
        super().__init__(f"voice {voice[:100]!r} is not available on engine {engine!r}; available: {listed}")


class UpstreamBusy(EngineError):
    """Every upstream tried said it is busy now (429, or 503 with ``Retry-After``): the client may retry
    after ``retry_after_s`` seconds."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestRefused(EngineError):
    """The engine (or its upstream) refused the request as invalid: the client's to fix, not a failure.

    An upstream's 4xx becomes this, so the client gets a 4xx with the upstream's own message instead
    of a 502, and the upstream is not held responsible (no failover, no circuit breaker).

    Args:
        message: what was wrong, in the refusing side's words.
        field: the request field it is about, as named on the wire, when known.
        status: the HTTP status to answer with (a 4xx).
    """

    def __init__(self, message: str, *, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


class UnsupportedText(RequestRefused):
    """A segment's text has letters the voice cannot read: a script its language does not use.

    ``synthesize`` raises it before any audio (``engine.scripts``), instead of speaking the letters'
    names ("Chinese letter"); the segment is not spoken, the next ones are. Digits, punctuation and
    symbols never raise it.

    Args:
        message: the voice, its language and the letters refused, for the client.
        language: the voice's language as a BCP 47 tag (``en-US``).
        letters: the distinct letters refused, in the order of the text.
    """

    def __init__(self, message: str, *, language: str, letters: tuple[str, ...]) -> None:
        super().__init__(message)
        self.language = language
        self.letters = letters


# Option values that ask for nothing: an engine without the feature can accept them as they are.
NEUTRAL_VALUES: dict[str, object] = {
    "speed": 1.0,
    "word_timestamps": False,
    "x_vector_only_mode": False,
    "non_streaming_mode": False,
    "instructions": "",
}


def demands(options: dict[str, object]) -> dict[str, object]:
    """The options that ask something of the engine: those not at a neutral value.

    Engines that lack a feature check ``demands(options)``, so an explicit neutral value (say
    ``x_vector_only_mode: false``) is accepted rather than refused.
    """
    return {k: v for k, v in options.items() if k not in NEUTRAL_VALUES or v != NEUTRAL_VALUES[k]}


class Voice(msgspec.Struct, frozen=True, kw_only=True):
    """A voice an engine can speak."""

    name: str
    engine: str
    language: str = ""
    description: str = ""
    sample_rate: int = 0


class VoiceReference(msgspec.Struct, frozen=True, kw_only=True):
    """An uploaded voice, for engines that clone: a reference clip (with its transcript) or an embedding."""

    name: str
    audio: npt.NDArray[np.float32] | None = None
    sample_rate: int = 0
    ref_text: str | None = None
    embedding: npt.NDArray[np.float32] | None = None


class SynthesisRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One segment of text to speak, with the options that shape it.

    ``options`` holds the wire options the client set (see ``protocol.messages.engine_options``);
    the engine has already accepted them through ``check``.
    ``reference`` is set when ``voice`` is an uploaded voice (only for engines that clone).
    ``deadline`` orders queued work in engines that share workers between sessions (earliest first).
    """

    text: str
    voice: str
    speed: float = 1.0
    seed: int | None = None
    options: dict[str, object] = msgspec.field(default_factory=dict)
    reference: VoiceReference | None = None
    #: When the audio is needed, on the ``time.monotonic()`` clock: for a first segment, now (the time
    #: the request is made, the default); for a later one, when the audio already sent for its
    #: utterance will have played out in real time. Engines that queue work run the earliest first.
    deadline: float = msgspec.field(default_factory=time.monotonic)
    #: The most audio the gateway takes of this segment (its audio cap, ``max_segment_audio_*``), in
    #: seconds; None when unknown. An engine that must hold an answer whole (remote, for word timings)
    #: bounds what it reads by it.
    max_audio_s: float | None = None
    #: Words of ``text`` to say from phonemes (a client's ``pronunciations`` with ``ipa``): whole words, where
    #: they occur in the text (``Phonemes``). Only an engine with phoneme input (``ipa_symbols``) gets any.
    phonemes: tuple[Phonemes, ...] = ()


class WordTiming(NamedTuple):
    """One spoken word of an ``AudioChunk``: ``[start, end)`` in samples from the chunk's first sample.

    ``word`` is the input text's word as the client wrote it (punctuation included).
    """

    word: str
    start: int
    end: int


class AudioChunk(msgspec.Struct, frozen=True):
    """Mono float32 samples in [-1, 1] at ``sample_rate``.

    ``words`` are the timings of the words spoken in this chunk, when the request asked for
    ``word_timestamps`` (an engine that cannot time words refuses that option in ``check``): in order,
    non-overlapping, in samples at ``sample_rate`` relative to this chunk's first sample. A word belongs
    to the chunk its first sample is in; it may end past the chunk's end (it goes on in the next chunk).
    """

    samples: npt.NDArray[np.float32]
    sample_rate: int
    words: tuple[WordTiming, ...] = ()


class TTSEngine(Protocol):
    """What the gateway needs from an engine.

    Attributes:
        name: registry name (``piper``), reported to clients.
        sample_rate: native output rate, the session default.
        default_voice: the voice used when a client names none.
        clones: whether it can speak uploaded voices (``SynthesisRequest.reference``).
        reads_numbers: whether its front end reads numbers, dates, money and times as a person would; if
            not (Piper's espeak reads "12/05/2026" as "12-0-5-2,26"), ``text_normalization: auto`` writes
            them out first (``protocol.normalize``).
        ipa_symbols: the phoneme symbols its voices take as input (``SynthesisRequest.phonemes``), each one
            code point; empty for an engine without phoneme input, which says a ``pronunciations`` entry with
            ``ipa`` by its alias or as written (``protocol.pronounce``).
    """

    name: str
    sample_rate: int
    default_voice: str
    clones: bool
    reads_numbers: bool
    ipa_symbols: frozenset[str]

    async def start(self) -> None:
        """Load the model; called once from the app lifespan before serving."""
        ...

    async def voices(self) -> list[Voice]:
        """The voices this engine can speak."""
        ...

    def check(self, voice: str, options: dict[str, object]) -> None:
        """Raise ``UnknownVoice`` or ``UnsupportedOption`` for a request the engine cannot honour.

        Called when a session is configured, so that a client learns at once, not per segment.
        ``voice`` is a built-in voice name; uploaded voices reach only engines that clone, and
        skip the voice check.
        """
        ...

    def synthesize(self, req: SynthesisRequest) -> AsyncGenerator[AudioChunk, None]:
        """Stream the audio of one segment. Closing the iterator must stop the work."""
        ...

    async def ready(self) -> bool:
        """Whether the engine is loaded and answering (``/readyz``)."""
        ...

    async def aclose(self) -> None:
        """Free the model and any worker threads or connections."""
        ...
