"""The one place that turns the gateway's and the engines' exceptions into ``ProtocolError``.

Every surface calls it (the WebSocket session, ``POST /v1/audio/speech`` and the ElevenLabs routes), and
each renders the result from ``protocol.errors.FAILURES``, so the same failure gets the same code on all.
"""

from __future__ import annotations

import logging

from ...engine.base import (
    EngineError,
    RequestRefused,
    UnknownVoice,
    UnsupportedOption,
    UnsupportedText,
    UpstreamBusy,
)
from ...protocol.errors import INTERNAL_ERROR_MESSAGE, ErrorCode, ProtocolError
from ..middleware.http import Rejected
from ..voices.catalog import VoiceNotServable
from ..voices.local import VoiceStoreUnavailable

logger = logging.getLogger(__name__)

#: What ``Catalog.prepare`` raises when it refuses a request's voice, reference or options.
REFUSALS = (Rejected, UnknownVoice, VoiceNotServable, UnsupportedOption, VoiceStoreUnavailable)


def error_for(exc: Exception, *, voice_field: str = "$.voice", ref_audio: bool = False) -> ProtocolError:
    """The error to report for ``exc``: a refusal (``REFUSALS``) or a synthesis failure.

    Args:
        exc: what ``Catalog.prepare`` or an engine raised.
        voice_field: where the voice name came from (``$.voice``, or ``$.speaker``).
        ref_audio: the request carried ``ref_audio``, so a voice that cannot be cloned is about it.
    """
    match exc:
        case Rejected(param=param):
            return ProtocolError(
                ErrorCode.INVALID_REF_AUDIO,
                exc.message,
                field=f"$.{param}" if param else None,
                status=exc.status,
            )
        case UnknownVoice():
            return ProtocolError(ErrorCode.VOICE_NOT_FOUND, str(exc), field=voice_field)
        case VoiceNotServable():
            field = "$.ref_audio" if ref_audio else voice_field
            return ProtocolError(ErrorCode.VOICE_REQUIRES_CLONING, str(exc), field=field)
        case UnsupportedOption(field=name):
            return ProtocolError(ErrorCode.UNSUPPORTED_OPTION, str(exc), field=f"$.{name}")
        case VoiceStoreUnavailable():
            logger.error("%s", exc)  # its address stays in the log
            message = "the voice store is unavailable; try again shortly"
            return ProtocolError(ErrorCode.VOICE_STORE_UNAVAILABLE, message, field=voice_field)
    # While synthesizing: text the voice cannot read is the client's to fix; an upstream's refusal keeps its
    # own status and field; busy upstreams are upstream_busy with their Retry-After; any other EngineError
    # is an engine_error; anything else is a bug, an
    # internal_error (the details go to the log).
    if isinstance(exc, UnsupportedText):
        return ProtocolError(ErrorCode.UNSUPPORTED_SCRIPT, str(exc))
    if isinstance(exc, RequestRefused):
        return ProtocolError(ErrorCode.REQUEST_REFUSED, str(exc), field=exc.field, status=exc.status)
    if isinstance(exc, UpstreamBusy):  # its upstreams' Retry-After kept (REST: the header)
        return ProtocolError(ErrorCode.UPSTREAM_BUSY, str(exc), retry_after=exc.retry_after_s)
    if isinstance(exc, EngineError):
        return ProtocolError(ErrorCode.ENGINE_ERROR, str(exc))
    return ProtocolError(ErrorCode.INTERNAL_ERROR, INTERNAL_ERROR_MESSAGE, fatal=True)
