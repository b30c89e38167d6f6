"""The settings of engine ``remote`` (``--engine remote``: vllm-omni or any OpenAI-compatible speech servers),
and the check that they can start it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from .families import FAMILIES
from .options import option

DEFAULT_REFERENCE_AUDIO = str(Path(__file__).with_name("data") / "reference.wav")
DEFAULT_REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog, and then it rests."


class RemoteSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of engine ``remote``: vllm-omni (or any OpenAI-compatible) speech servers."""

    upstreams: Annotated[
        tuple[str, ...], option("speech servers (base URLs)", flag="--upstream", repeat=True)
    ] = ()
    upstream_model: Annotated[str, option("`model` sent to the upstreams", flag=True)] = ""
    # Sent as "Authorization: Bearer" to every upstream (a gateway with API keys, or a vllm-omni --api-key).
    upstream_api_key: Annotated[str, option("sent as `Authorization: Bearer` to every upstream")] = ""
    # vllm-omni detects the family from configs an HTTP client cannot read; voxgate from the model id.
    upstream_family: Annotated[
        str,
        option(
            "the upstreams' model family (docs/deploy.md's table: fish_tts, cosyvoice3, ...); empty: "
            "detected from the model id"
        ),
    ] = ""
    upstream_reference_audio: Annotated[
        str,
        option(
            "WAV the upstream speaks a plain request from when its family needs a reference voice; "
            "empty: the one voxgate ships"
        ),
    ] = ""
    upstream_reference_text: Annotated[str, option("the transcript of `upstream_reference_audio`")] = ""
    # A TTS server on a warm GPU answers within a few hundred ms; 5 s is a loaded one, not a working one.
    upstream_connect_timeout_s: Annotated[
        float, option("seconds to connect to an upstream (or wait for a pooled connection)")
    ] = 5.0
    upstream_first_byte_timeout_s: Annotated[
        float,
        option(
            "seconds from a streamed request to its first audio before failing over to another upstream; "
            "also the limit on each health check and start-up probe"
        ),
    ] = 5.0
    # vllm-omni streams a chunk every few hundred ms once audio flows; 10 s without one is a stall.
    upstream_read_timeout_s: Annotated[
        float, option("seconds without a byte from an upstream once its audio flows: a stalled upstream")
    ] = 10.0
    # Real time (the audio cap's seconds) plus this: a GPU slower than real time on the longest segment
    # its text allows is broken, and an upstream that trickles bytes never finishes otherwise.
    upstream_segment_timeout_s: Annotated[
        float,
        option(
            "seconds, on top of the segment's audio cap (`max_segment_audio_*`), a request may wait on its "
            "upstream in all (a trickle fails here); whole answers (speed, word timestamps) wait this long "
            "for their first byte"
        ),
    ] = 10.0
    upstream_health_interval_s: Annotated[float, option("how often each upstream's `/health` is checked")] = (
        5.0
    )
    # Consecutive failures that open an upstream's circuit, and how long it then stays out.
    upstream_breaker_failures: Annotated[
        int, option("consecutive failures that open an upstream's circuit breaker")
    ] = 3
    upstream_breaker_cooldown_s: Annotated[
        float, option("seconds an upstream with an open circuit stays out")
    ] = 30.0


def invalid(settings: RemoteSettings) -> str | None:
    """Why ``--engine remote`` cannot start with ``settings`` (one line), else None."""
    if not settings.upstreams:
        return "needs an upstream speech server: --upstream URL (repeatable) or VOXGATE_UPSTREAMS"
    if settings.upstream_family and settings.upstream_family not in FAMILIES:
        return f"upstream_family must be one of {', '.join(FAMILIES)} (or empty: detected)"
    if bool(settings.upstream_reference_audio) != bool(settings.upstream_reference_text):
        return "upstream_reference_audio and upstream_reference_text go together (a clip and its transcript)"
    return None
