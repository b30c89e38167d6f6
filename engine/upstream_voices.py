"""Reference clips uploaded to each vllm-omni upstream once, then named, so its speaker cache is used.

vllm-omni 0.30 keeps what a model extracts from a reference clip (Fish Speech's codec tokens, CosyVoice3's
and GLM-TTS's speaker features, ...) in a process-wide LRU, ``vllm_omni/utils/speaker_cache.py``, keyed by
``(model type, voice name, created_at)``. Its adapters hand the model that key only for a request that names
a voice uploaded to it and carries no inline ``ref_audio`` (tts_adapters/fish_speech.py ``_build_prompt``:
``if voice_lower in server.uploaded_speakers and not has_inline_ref_audio: info["voice_name"] = ...``; the
same test in cosyvoice3.py, glm_tts.py, higgs_audio_v2.py, moss_tts.py, omnivoice.py, voxcpm2.py,
ming_tts.py). A clip sent inline, as every clone went before, is re-encoded by the model for every request,
that is for every sentence. (Qwen3-TTS alone caches an inline clip too, by the hash of its data URL,
serving_speech.py ``_resolve_ref_audio``; for it naming saves the clip's bytes on every request.)

So for a family in ``NAMED_FAMILIES`` the first request that carries a clip goes inline as before, and the
clip is uploaded to that upstream meanwhile, in the background, through vllm-omni's own
``POST /v1/audio/voices`` (with its transcript, which vllm-omni then sends with it). Once the upload is in,
requests name it (``voice``) instead of carrying it. The name is the hash of the clip's bytes and its
transcript (``voxgate-`` and 32 hex digits): the same voice has the same name on every gateway of a fleet,
a name never means another voice (so nothing stale is ever served), and it says nothing of the voxgate
voice or owner it came from. The survey leaves these names out of the upstream's voice list.

A request that names a voice the upstream no longer has (restarted without its speaker folder, a voice
deleted there) is refused before any audio; it is then sent inline at once, and the name forgotten until
uploaded again. Each upstream keeps at most ``MAX_VOICES_PER_UPSTREAM`` of these voices: the least
recently used is deleted from it (``DELETE /v1/audio/voices/{name}``). An upload that fails is retried
after ``RETRY_S``; meanwhile that voice goes inline.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable

import httpx

from .base import AudioChunk, RequestRefused
from .families import Family
from .upstreams import Upstream

logger = logging.getLogger(__name__)

#: The start of every name voxgate gives a voice it uploads (the survey leaves such names out).
PREFIX = "voxgate-"
#: Families whose vllm-omni adapter gives the model the speaker cache's key for a named upload (see above).
#: Voxtral names only its presets; Ming-flash-omni does not clone from a clip; other upstreams may not be
#: vllm-omni at all.
NAMED_FAMILIES = frozenset(
    {
        "qwen3_tts_base",
        "fish_tts",
        "cosyvoice3",
        "glm_tts",
        "higgs_audio_v2",
        "moss_tts",
        "omnivoice",
        "voxcpm2",
        "ming_tts",
    }
)
# A tenth of the uploads vllm-omni allows by default (SPEAKER_MAX_UPLOADED=1000), leaving room for its
# other clients; far more voices than one gateway has in use at a time.
MAX_VOICES_PER_UPSTREAM = 100
# An upload is a few hundred KB to a server on the same network: seconds mean it is not coming.
UPLOAD_TIMEOUT_S = 30.0
# A failed upload is not tried again sooner: the voice keeps working inline meanwhile.
RETRY_S = 60.0
# vllm-omni records a consent with each upload; voxgate's own store holds the speaker's.
CONSENT = "voxgate-gateway"
# What a named request leaves out: the upload carries the clip and its transcript.
_INLINE_FIELDS = ("ref_audio", "ref_text", "x_vector_only_mode")
# Clips seen recently, by (data URL, transcript): the same string objects come back (remote's data URL
# cache), so a lookup costs no hashing of the clip.
_MAX_NAMES = 256
_DATA_URL = "data:audio/wav;base64,"


def voice_name(ref_audio: str, ref_text: str) -> str:
    """The name a clip (a WAV data URL) and its transcript are uploaded under."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(ref_audio.encode())
    digest.update(b"\0" + ref_text.encode())
    return PREFIX + digest.hexdigest()


def is_uploaded(name: str) -> bool:
    """Whether ``name`` is one voxgate gave a voice it uploaded (not a voice of the upstream's own)."""
    return name.lower().startswith(PREFIX)


class UpstreamVoices:
    """The clips uploaded to each upstream, and the requests that name them.

    Args:
        client: the engine's HTTP client (a function: it exists once the engine has started).
        limit: voices kept on each upstream; the least recently used beyond it are deleted there.
    """

    def __init__(
        self, client: Callable[[], httpx.AsyncClient], *, limit: int = MAX_VOICES_PER_UPSTREAM
    ) -> None:
        self._client = client
        self.limit = limit
        #: Per upstream URL: the names it holds, least recently used first.
        self.ready: dict[str, OrderedDict[str, None]] = {}
        self._names: dict[tuple[str, str], str] = {}
        self._failed: dict[tuple[str, str], float] = {}
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._deletes: set[asyncio.Task[None]] = set()

    def shape(self, upstream: Upstream, family: Family, body: dict[str, object]) -> dict[str, object]:
        """``body`` naming its clip when ``upstream`` holds it; else ``body`` itself, the upload started."""
        ref_audio, ref_text = body.get("ref_audio"), body.get("ref_text") or ""
        if (
            family.name not in NAMED_FAMILIES
            or not isinstance(ref_audio, str)
            or not isinstance(ref_text, str)
        ):
            return body
        if not ref_audio.startswith(_DATA_URL):
            return body
        key = (ref_audio, ref_text)
        name = self._names.get(key)
        if name is None:
            if len(self._names) >= _MAX_NAMES:
                self._names.clear()
            name = self._names[key] = voice_name(ref_audio, ref_text)
        held = self.ready.setdefault(upstream.url, OrderedDict())
        if name in held:
            held.move_to_end(name)
            named = {k: v for k, v in body.items() if k not in _INLINE_FIELDS}
            named["voice"] = name
            return named
        self._upload(upstream, name, ref_audio, ref_text)
        return body

    async def stream(
        self,
        upstream: Upstream,
        family: Family,
        body: dict[str, object],
        open_stream: Callable[[dict[str, object]], AsyncGenerator[AudioChunk, None]],
    ) -> AsyncGenerator[AudioChunk, None]:
        """``open_stream`` of the body to send ``upstream`` (``shape``); a request whose named voice the
        upstream does not have (its refusal names it, before any audio) is sent inline at once, and the name
        forgotten there until uploaded again."""
        sent = self.shape(upstream, family, body)
        started = False
        try:
            async with contextlib.aclosing(open_stream(sent)) as chunks:
                async for chunk in chunks:
                    started = True
                    yield chunk
            return
        except RequestRefused as exc:
            name = str(sent.get("voice"))
            # vllm-omni names the voice it does not have ("Invalid voice 'voxgate-…'"); any other refusal
            # is the request's own, inline as well.
            if sent is body or started or name not in str(exc):
                raise
            self.ready.get(upstream.url, OrderedDict()).pop(name, None)
            logger.warning(
                "upstream %s refused uploaded voice %s, sending it inline: %s", upstream.label, name, exc
            )
        async with contextlib.aclosing(open_stream(body)) as chunks:
            async for chunk in chunks:
                yield chunk

    def _upload(self, upstream: Upstream, name: str, ref_audio: str, ref_text: str) -> None:
        key = (upstream.url, name)
        if key in self._tasks or time.monotonic() < self._failed.get(key, float("-inf")):
            return
        task = asyncio.create_task(self._send(upstream, name, ref_audio, ref_text))
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._tasks.pop(key, None))

    async def _send(self, upstream: Upstream, name: str, ref_audio: str, ref_text: str) -> None:
        """Upload one clip through vllm-omni's own route; on success the name may be sent."""
        try:
            wav = base64.b64decode(ref_audio[len(_DATA_URL) :], validate=True)
        except (binascii.Error, ValueError):
            return
        form = {"name": name, "consent": CONSENT, **({"ref_text": ref_text} if ref_text else {})}
        try:
            async with asyncio.timeout(UPLOAD_TIMEOUT_S):
                response = await self._client().post(
                    f"{upstream.url}/v1/audio/voices",
                    data=form,
                    files={"audio_sample": ("voice.wav", wav, "audio/wav")},
                )
            # vllm-omni's ``immutable`` policy refuses a name it holds: by its name, the same clip.
            if response.status_code != 200 and "already exists" not in response.text:
                logger.info(
                    "upstream %s answered the upload %d: %r",
                    upstream.label,
                    response.status_code,
                    response.text[:200],
                )
                raise RuntimeError(f"answered {response.status_code}")
        except (httpx.HTTPError, TimeoutError, RuntimeError) as exc:
            self._failed[(upstream.url, name)] = time.monotonic() + RETRY_S
            reason = upstream.scrub(repr(exc))
            logger.warning("could not upload voice %s to upstream %s: %s", name, upstream.label, reason)
            return
        self._failed.pop((upstream.url, name), None)
        held = self.ready.setdefault(upstream.url, OrderedDict())
        held[name] = None
        logger.info("voice %s uploaded to upstream %s: requests name it from now on", name, upstream.label)
        while len(held) > self.limit:
            old, _ = held.popitem(last=False)
            task = asyncio.create_task(self._delete(upstream, old))
            self._deletes.add(task)
            task.add_done_callback(self._deletes.discard)

    async def _delete(self, upstream: Upstream, name: str) -> None:
        try:
            async with asyncio.timeout(UPLOAD_TIMEOUT_S):
                await self._client().delete(f"{upstream.url}/v1/audio/voices/{name}")
        except (httpx.HTTPError, TimeoutError) as exc:  # it stays there; vllm-omni's cap still holds
            reason = upstream.scrub(repr(exc))
            logger.warning("could not delete voice %s from upstream %s: %s", name, upstream.label, reason)

    async def settled(self) -> None:
        """Wait for the uploads and deletes in flight (tests, and a clean close)."""
        await asyncio.gather(*self._tasks.values(), *self._deletes, return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel the uploads and deletes in flight."""
        tasks = [*self._tasks.values(), *self._deletes]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
