"""Which engine speaks which voice: built-in voices, aliases, uploaded voices and engine choice.

One resolution path serves the WebSocket and the REST routes: ``model`` may name a configured engine;
an alias (OpenAI's voice names) maps to a configured voice; an uploaded voice needs an engine that
clones and travels to it as a ``VoiceReference``; a built-in voice goes to the engine that has it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field

from ...engine.base import TTSEngine, UnknownVoice, UnsupportedOption, Voice, VoiceReference
from ...protocol.errors import ErrorCode
from ..middleware.http import Rejected
from .backend import VoiceBackend
from .clips import MAX_STORED_RATE, decoding, inline_reference

logger = logging.getLogger(__name__)


class VoiceNotServable(Exception):
    """An uploaded voice was asked of an engine that cannot clone."""

    def __init__(self, voice: str, engine: str, detail: str) -> None:
        self.voice = voice
        self.engine = engine
        super().__init__(detail)


@dataclass(frozen=True, slots=True)
class Resolved:
    """The engine and voice a request will use."""

    engine: TTSEngine
    voice: str
    reference: VoiceReference | None = None
    #: The options the engine gets: the request's, less those it ignores (see ``ignored``).
    options: dict[str, object] = field(default_factory=dict)
    #: Options the engine cannot follow that were dropped instead of refused (``IGNORABLE``): each surface
    #: tells its client (``option_ignored``).
    ignored: tuple[str, ...] = ()


#: The one rule for an option an engine cannot use. These only tune how speech is generated (a style
#: prompt, model sampling, token and chunk budgets, the text-input mode): an engine without them ignores
#: them, and the client is warned (``option_ignored``), as production speech APIs and voice-agent frameworks
#: expect (they send ``instructions`` to every engine). An option that changes what is said or whose voice
#: it is (``language``, ``task_type``, ``x_vector_only_mode``, ``speaker_embedding``, a reference clip), or
#: what the answer holds (``word_timestamps``), is refused by name instead (``unsupported_option``).
IGNORABLE = frozenset(
    {"instructions", "extra_params", "max_new_tokens", "initial_codec_chunk_frames", "non_streaming_mode"}
)


class Catalog:
    """The configured engines, the first being the default, plus aliases and the voice store."""

    def __init__(
        self,
        engines: list[TTSEngine],
        *,
        aliases: dict[str, str] | None = None,
        store: VoiceBackend | None = None,
        clip_rate_hz: int = MAX_STORED_RATE,
    ) -> None:
        if not engines:
            raise ValueError("at least one engine is needed")
        self.engines = {e.name: e for e in engines}
        self.default = engines[0]
        # Aliases match without regard to case, like voice names.
        self.aliases = {k.casefold(): v for k, v in (aliases or {}).items()}
        self.store = store
        #: The highest rate an inline ``ref_audio`` is kept at (``max_clip_rate_hz``).
        self.clip_rate_hz = clip_rate_hz

    async def start(self) -> None:
        """Start every engine."""
        await asyncio.gather(*(e.start() for e in self.engines.values()))

    async def _engine_voices(self) -> dict[str, list[Voice]]:
        # Asked each time, not cached: a remote engine learns its voices when an upstream comes up.
        return {name: await engine.voices() for name, engine in self.engines.items()}

    async def aclose(self) -> None:
        for engine in self.engines.values():
            await engine.aclose()

    async def builtin_voices(self) -> list[Voice]:
        """Built-in voices of every configured engine."""
        return [v for voices in (await self._engine_voices()).values() for v in voices]

    def cloning_engines(self) -> list[str]:
        """Names of the engines that can speak uploaded voices."""
        return [name for name, engine in self.engines.items() if engine.clones]

    async def prepare(
        self,
        owner: str,
        voice: str | None,
        model: str | None,
        options: dict[str, object],
        *,
        ref_audio: str | None = None,
        ref_text: str | None = None,
    ) -> Resolved:
        """Resolve a request's engine and voice, then have the engine check its options.

        ``ref_audio`` (a data: URL or base64 clip) with its ``ref_text`` is decoded here, once, into
        the same ``VoiceReference`` an uploaded voice becomes, so engines see one mechanism. It is decoded
        only once an engine that clones is found for it: a decode costs about 0.5 s of CPU, which a client
        must not get spent by asking an engine that would refuse the clip anyway.

        Raises:
            Rejected: ``ref_audio`` is not a usable clip, or ``ref_text`` came without it.
            UnknownVoice, VoiceNotServable: see ``resolve``.
            UnsupportedOption: the engine cannot honour one of ``options``.
        """
        inline = None
        if ref_audio is not None:
            self._inline_cloner(model)  # refuses before the decode, not after it
            inline = await decoding(inline_reference, ref_audio, ref_text, self.clip_rate_hz)
        elif ref_text is not None:
            message = "ref_text goes with ref_audio; an uploaded voice keeps its own transcript"
            raise Rejected(ErrorCode.INVALID_REF_AUDIO, message, "ref_text")
        return self.checked(await self.resolve(owner, voice, model, inline), options)

    def checked(self, resolved: Resolved, options: dict[str, object]) -> Resolved:
        """``resolved`` with the options its engine takes (``prepare``'s second half: options a voice cannot
        use are refused, harmless ones dropped and named in ``ignored``, a clone it cannot make refused)."""
        engine = resolved.engine
        options = dict(options)
        ignored: list[str] = []
        while True:
            try:
                engine.check(resolved.voice if resolved.reference is None else engine.default_voice, options)
                break
            except UnsupportedOption as exc:
                if exc.field not in options or not _harmless(
                    exc.field, options[exc.field], resolved.reference is None
                ):
                    raise
                del options[exc.field]
                if exc.field in IGNORABLE:
                    ignored.append(exc.field)
        # A clone the engine cannot make (a remote family that needs a transcript) is refused now, not
        # at the first segment.
        check_reference = getattr(engine, "check_reference", None)
        if resolved.reference is not None and check_reference is not None:
            check_reference(resolved.reference)
        return dataclasses.replace(resolved, options=options, ignored=tuple(ignored))

    def primed(self, owner: str, voice: str | None, model: str | None, resolved: Resolved) -> Catalog:
        """This catalog, but the first ``prepare`` of ``voice`` and ``model`` for ``owner`` (without a clip)
        takes ``resolved``'s engine and voice instead of resolving them again: a route that resolved a
        socket's voice to check it before the session (ElevenLabs' sockets) hands it on, so the voice is
        looked up once (an uploaded voice is a read of the store)."""
        return _Primed(self, (owner, voice, model), resolved)

    async def resolve(
        self, owner: str, voice: str | None, model: str | None = None, inline: VoiceReference | None = None
    ) -> Resolved:
        """Pick engine and voice for a request.

        Order: a reference clip sent with the request (``inline``); a built-in voice of the chosen engine
        (or of any engine), matched without regard to case; the caller's uploaded voice of that name;
        an alias; and with no voice, the engine's default.

        Raises:
            UnknownVoice: no engine has the voice, no uploaded voice and no alias has that name.
            VoiceNotServable: the voice is a reference clip and no usable engine can clone.
        """
        chosen = self.engines.get(model) if model else None
        if inline is not None:
            return Resolved(self._inline_cloner(model), voice or "", inline)
        engine = chosen or self.default
        if voice is None:
            return Resolved(engine, engine.default_voice)
        known = await self._engine_voices()
        for candidate in [chosen] if chosen else list(self.engines.values()):
            for v in known.get(candidate.name, []):
                if v.name.casefold() == voice.casefold():
                    return Resolved(candidate, v.name)
        data = await asyncio.to_thread(self.store.get, owner, voice) if self.store else None
        if data is not None:
            voice = data.info.name  # as uploaded: names match in any case
            reference = VoiceReference(
                name=voice,
                audio=data.audio,
                sample_rate=data.info.sample_rate,
                ref_text=data.info.ref_text,
                embedding=data.embedding,
            )
            return Resolved(self._cloner(chosen, f"the uploaded voice {voice!r}", voice), voice, reference)
        if voice.casefold() in self.aliases:
            return Resolved(engine, self.aliases[voice.casefold()] or engine.default_voice)
        raise UnknownVoice(voice, engine.name, [v.name for v in known.get(engine.name, [])])

    def _inline_cloner(self, model: str | None) -> TTSEngine:
        """The engine that will speak a reference clip sent with a request for ``model``."""
        chosen = self.engines.get(model) if model else None
        return self._cloner(chosen, "a reference clip sent with the request")

    def _cloner(self, chosen: TTSEngine | None, what: str, voice: str = "ref_audio") -> TTSEngine:
        """The engine that will speak a reference clip: the chosen one, or the first that clones."""
        cloner = chosen if chosen is not None else next((e for e in self.engines.values() if e.clones), None)
        if cloner is not None and cloner.clones:
            return cloner
        blocked = chosen.name if chosen else self.default.name
        raise VoiceNotServable(
            voice,
            blocked,
            f"{what} needs an engine that clones voices, and engine {blocked!r} cannot; serve it with a "
            "cloning engine, e.g. --engine remote in front of vllm-omni serving a Qwen3-TTS Base model",
        )


def _harmless(name: str, value: object, builtin_voice: bool) -> bool:
    """Whether an option an engine refused can be dropped: it changes neither what is said nor whose
    voice it is (``IGNORABLE``, dropped with a warning). vllm-omni's clients also send ``task_type:
    CustomVoice`` and ``language: Auto`` with a built-in voice: they ask for what the engine does anyway,
    and are dropped silently."""
    if name in IGNORABLE:
        return True
    if name == "task_type":
        return value == "CustomVoice" and builtin_voice
    return name == "language" and isinstance(value, str) and value.casefold() == "auto"


class _Primed(Catalog):
    """A catalog whose first ``prepare`` of one request reuses a resolution (``Catalog.primed``)."""

    def __init__(
        self, catalog: Catalog, request: tuple[str, str | None, str | None], resolved: Resolved
    ) -> None:
        self.__dict__.update(catalog.__dict__)  # the same engines, aliases and store
        self._hint: tuple[tuple[str, str | None, str | None], Resolved] | None = (request, resolved)

    async def prepare(
        self,
        owner: str,
        voice: str | None,
        model: str | None,
        options: dict[str, object],
        *,
        ref_audio: str | None = None,
        ref_text: str | None = None,
    ) -> Resolved:
        hint, self._hint = self._hint, None
        if hint is not None and hint[0] == (owner, voice, model) and ref_audio is None and ref_text is None:
            base = hint[1]
            return self.checked(Resolved(base.engine, base.voice, base.reference), options)
        return await super().prepare(owner, voice, model, options, ref_audio=ref_audio, ref_text=ref_text)
