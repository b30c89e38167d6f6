"""Which engine speaks which voice: built-in voices, aliases, uploaded voices and engine choice.

One resolution path serves the WebSocket and the REST routes: ``model`` may name a configured engine;
an alias (OpenAI's voice names) maps to a configured voice; an uploaded voice needs an engine that
clones and travels to it as a ``VoiceReference``; a built-in voice goes to the engine that has it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from engine.base import TTSEngine, UnknownVoice, Voice, VoiceReference
from gateway.store import VoiceStore

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


class Catalog:
    """The configured engines, the first being the default, plus aliases and the voice store."""

    def __init__(
        self,
        engines: list[TTSEngine],
        *,
        aliases: dict[str, str] | None = None,
        store: VoiceStore | None = None,
    ) -> None:
        if not engines:
            raise ValueError("at least one engine is needed")
        self.engines = {e.name: e for e in engines}
        self.default = engines[0]
        self.aliases = aliases or {}
        self.store = store

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

    async def resolve(self, owner: str, voice: str | None, model: str | None = None) -> Resolved:
        """Pick engine and voice for a request.

        Raises:
            UnknownVoice: no configured engine has the voice and no uploaded voice has that name.
            VoiceNotServable: the voice is an uploaded one and the chosen engine cannot clone.
        """
        chosen = self.engines.get(model) if model else None
        known = await self._engine_voices()
        if voice is None or voice in self.aliases:
            target = self.aliases.get(voice, "") if voice is not None else ""
            engine = chosen or self.default
            return Resolved(engine, target or engine.default_voice)
        for engine in [chosen] if chosen else list(self.engines.values()):
            if any(v.name == voice for v in known.get(engine.name, [])):
                return Resolved(engine, voice)
        data = await asyncio.to_thread(self.store.get, owner, voice) if self.store else None
        if data is None:
            engine = chosen or self.default
            names = [v.name for v in known.get(engine.name, [])]
            raise UnknownVoice(voice, engine.name, names)
        cloners = [chosen] if chosen else list(self.engines.values())
        cloner = next((e for e in cloners if e.clones), None)
        if cloner is None:
            blocked = chosen.name if chosen else self.default.name
            raise VoiceNotServable(
                voice,
                blocked,
                (
                    f"voice {voice!r} is an uploaded voice and engine {blocked!r} cannot clone voices; "
                    "serve it with a cloning engine, e.g. --engine remote in front of vllm-omni serving a "
                    "Qwen3-TTS Base model"
                ),
            )
        info = data.info
        reference = VoiceReference(
            name=voice,
            audio=data.audio,
            sample_rate=info.sample_rate,
            ref_text=info.ref_text,
            embedding=data.embedding,
        )
        return Resolved(cloner, voice, reference)
