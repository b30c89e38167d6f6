"""What the remote engine learns of its upstreams without synthesizing: health, voices, checkpoint, aligner.

A ``Survey`` round asks every upstream at once, each in turn for its ``/health``, then (until some
upstream has listed them) its voices and the checkpoint it serves, then (once per upstream) whether it
times words. Every request is a probe (``Survey.fetch``): bounded in time by one deadline for the whole
request, connection included, and in size, so an upstream that trickles or never answers costs a round
one deadline, not the gateway its start-up (the engine's ``start`` runs the first round). An upstream
that does not answer a probe in time is marked down (``UpstreamPool.down``) until a health check passes
again. Voices are taken from the first upstream, in the configured order, that lists them.

The family of the checkpoint served (``engine.families``) is learned with the voices: from the
configured ``model`` if there is one, else from the model list (``/v1/models``: the served name as ``id`` and
the checkpoint path as ``root``, the only things of vllm-omni's own detection that an HTTP client can see).

The rate needs no probe: every answer is a WAV whose header says it (a probe that names no voice is
refused by Base and VoiceDesign checkpoints, which would retry it forever). Which upstreams have the
aligner is learned from a probe that costs no synthesis (an empty input with ``word_timestamps: true``:
without the aligner vllm-omni 0.30 refuses the option first, with it the empty input), and again from
any refusal that names ``--forced-aligner`` (``learn_aligner``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import httpx

from .deadlines import bounded_read, httpx_reader
from .families import Family, detect
from .upstream_voices import is_uploaded
from .upstreams import Upstream, UpstreamPool

logger = logging.getLogger(__name__)

# vllm-omni 0.30 times words only with its forced-aligner stage; this is in its refusal without one
# (serving_speech.py ``create_speech``: "word_timestamps=true requires the server to be launched with
# --forced-aligner.").
ALIGNER_FLAG = "--forced-aligner"
# vllm-omni lists this name beside the speakers; it means "no voice" and is not one.
_PLACEHOLDER_VOICE = "default"
# A voice list or model list: vllm-omni's is a few hundred bytes; a megabyte is thousands of voices.
_LIST_BYTES = 1024 * 1024
#: Voices kept of an upstream's list (in its order): a checkpoint has a few dozen speakers at most. Every
#: request resolves its voice against the list, and every listing carries it: 100k names cost 36 ms of CPU a
#: request and a 13 MB listing.
MAX_LISTED_VOICES = 1000
#: A longer name is not a speaker's (vllm-omni's are a word); it is left out.
MAX_VOICE_NAME_CHARS = 128
# The probe's refusal is a line of JSON.
_REFUSAL_BYTES = 64 * 1024


class ProbeFailed(Exception):
    """A probe got no answer in time, or none at all."""


def voice_names(payload: object) -> list[str]:
    """Names from ``{"voices": [...]}``: plain names (vllm-omni) or objects with a ``name``; the first
    ``MAX_LISTED_VOICES`` of them, each at most ``MAX_VOICE_NAME_CHARS`` long (the rest are logged)."""
    listed = payload.get("voices") if isinstance(payload, dict) else None
    if not isinstance(listed, list):
        raise ValueError(f"no voice list in {str(payload)[:100]!r}")
    names = [
        v if isinstance(v, str) else str(v.get("name", "")) if isinstance(v, dict) else "" for v in listed
    ]
    # Voices voxgate uploaded for the speaker cache (``engine.upstream_voices``) are clones, not presets.
    names = [n for n in names if n and n.lower() != _PLACEHOLDER_VOICE and not is_uploaded(n)]
    kept = list(dict.fromkeys(n for n in names if len(n) <= MAX_VOICE_NAME_CHARS))[:MAX_LISTED_VOICES]
    if len(kept) < len(names):
        logger.warning(
            "the upstream lists %d voices: kept the first %d (names up to %d characters, no repeats)",
            len(names),
            len(kept),
            MAX_VOICE_NAME_CHARS,
        )
    return kept


class Survey:
    """What is known of the upstreams of one remote engine, and the rounds that learn it.

    Args:
        pool: the engine's upstreams; probes set their health.
        client: the engine's HTTP client (a function: it exists once the engine has started).
        model: the ``model`` the engine sends (empty: the checkpoint is read from ``/v1/models``).
        probe_s: the deadline of each probe, connection included.
    """

    def __init__(
        self, pool: UpstreamPool, client: Callable[[], httpx.AsyncClient], *, model: str, probe_s: float
    ) -> None:
        self.pool = pool
        self._client = client
        self.model = model
        self.probe_s = probe_s
        #: The voices listed upstream (vllm-omni's placeholder left out); None until some upstream lists.
        self.names: list[str] | None = None
        #: The model family upstream (``engine.families``), if its model id or path names one.
        self.family: Family | None = None
        #: Per upstream URL: whether it can time words (launched with ``--forced-aligner``); absent: unknown.
        self.aligners: dict[str, bool] = {}
        self._probed: set[str] = set()  # upstreams whose answer to the word-timestamp probe came

    async def round(self) -> None:
        """Ask every upstream at once; ends within a few ``probe_s`` however they answer."""
        found = await asyncio.gather(*(self._one(u) for u in self.pool.upstreams))
        if self.names is not None:
            return
        for upstream, listed in zip(self.pool.upstreams, found, strict=True):
            if listed is not None:
                self.names, self.family = listed
                logger.info(
                    "upstream %s lists %d voices (model family: %s)",
                    upstream.label,
                    len(self.names),
                    self.family.label if self.family else "unknown",
                )
                return

    async def _one(self, upstream: Upstream) -> tuple[list[str], Family | None] | None:
        """Health, then (until learned) voices and checkpoint, then the aligner probe of one upstream."""
        try:
            status, _ = await self.fetch("GET", f"{upstream.url}/health")
        except ProbeFailed as exc:
            self.pool.down(upstream, f"health check failed: {exc}")
            return None
        upstream.healthy = status == 200
        if not upstream.healthy:
            upstream.last_error = f"health check answered {status}"
            return None
        listed = None
        if self.names is None:
            try:
                listed = await self._listed(upstream)
            except ProbeFailed as exc:  # it answers /health but hangs on the rest: not usable now
                self.pool.down(upstream, f"voice list: {exc}")
                return None
        if upstream.url not in self._probed:
            await self._probe_aligner(upstream)
        return listed

    async def fetch(
        self, method: str, url: str, body: dict[str, object] | None = None, limit_bytes: int = _LIST_BYTES
    ) -> tuple[int, bytes]:
        """A probe's status and (at most ``limit_bytes`` of) body, within ``probe_s`` in all.

        Raises ``ProbeFailed`` when it cannot connect, or does not answer in time.
        """
        client = self._client()
        try:
            async with asyncio.timeout(self.probe_s):
                response = await client.send(client.build_request(method, url, json=body), stream=True)
                try:
                    async with httpx_reader(response) as read:
                        return response.status_code, await bounded_read(read, limit_bytes)
                finally:
                    await response.aclose()
        except TimeoutError:
            raise ProbeFailed(f"no answer within {self.probe_s:g} s") from None
        except httpx.HTTPError as exc:
            raise ProbeFailed(repr(exc)) from exc

    async def _listed(self, upstream: Upstream) -> tuple[list[str], Family | None] | None:
        """The voices ``upstream`` lists, and its model family; None when it lists none."""
        status, content = await self.fetch("GET", f"{upstream.url}/v1/audio/voices")
        try:
            if status != 200:
                raise ValueError(f"status {status}")
            names = voice_names(json.loads(content))
        except ValueError as exc:  # a voice list that is not one (JSONDecodeError is a ValueError)
            logger.warning("could not learn from upstream %s: %s", upstream.label, upstream.scrub(repr(exc)))
            return None
        return names, detect([self.model]) if self.model else await self._served_family(upstream)

    async def _served_family(self, upstream: Upstream) -> Family | None:
        """The family the upstream serves, from its model list's first ``id`` and ``root``."""
        try:
            _, content = await self.fetch("GET", f"{upstream.url}/v1/models")
            model = json.loads(content)["data"][0]
            return detect([str(model["id"]), str(model.get("root") or "")])
        except (ProbeFailed, ValueError, LookupError, TypeError, AttributeError):  # not an OpenAI model list
            return None

    async def _probe_aligner(self, upstream: Upstream) -> None:
        """Learn whether ``upstream`` times words; no synthesis runs.

        vllm-omni 0.30 checks ``word_timestamps`` against ``--forced-aligner`` before it reads the input
        (serving_speech.py ``create_speech``), so an empty input is refused for the missing aligner when
        there is none, and for being empty when there is one. Any other answer leaves it unknown (the
        first segment that asks for words finds out); an upstream that answered is not asked again.
        """
        body: dict[str, object] = {"input": "", "word_timestamps": True}
        if self.model:
            body["model"] = self.model
        try:
            url = f"{upstream.url}/v1/audio/speech"
            status, content = await self.fetch("POST", url, body, _REFUSAL_BYTES)
        except ProbeFailed as exc:
            logger.info("word-timestamp probe of %s failed: %s", upstream.label, upstream.scrub(str(exc)))
            return
        self._probed.add(upstream.url)  # answered: not asked again, whatever it said
        if status == 400:
            self.learn_aligner(upstream, ALIGNER_FLAG not in content.decode(errors="replace"))

    def learn_aligner(self, upstream: Upstream, present: bool) -> None:
        """Whether ``upstream`` times words, as a probe or a segment's answer showed."""
        if self.aligners.get(upstream.url) != present:
            logger.info(
                "upstream %s %s word timestamps", upstream.label, "times" if present else "cannot time"
            )
        self.aligners[upstream.url] = present

    def may_time_words(self) -> bool:
        """Whether some upstream has the aligner or has not said (every one known without: no)."""
        return any(self.aligners.get(u.url, True) for u in self.pool.upstreams)
