"""voxgate's sans-I/O protocol: the session core, its wire messages and errors, and one codec per surface.

No event loop, socket or clock in here (``tests/protocol/test_purity.py``): the gateway shell feeds bytes and
times in and writes what comes out. The main public names are importable from the package itself::

    from voxgate.protocol import Core, OutputFormat, ProtocolError, SessionConfig

Each one loads its module on first use (PEP 562 ``__getattr__``), so ``import voxgate.protocol`` stays
cheap: the audio codecs (PyAV) and numpy load only with the modules that use them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .codecs.base import Codec
    from .codecs.bodies import Body
    from .codecs.cartesia import CartesiaSocket
    from .codecs.deepgram import DeepgramSocket
    from .codecs.elevenlabs_socket import ElevenLabsSocket
    from .codecs.stream import SessionCodec
    from .codecs.telephony import Telephony
    from .codecs.wyoming import WyomingCodec
    from .core import Core
    from .errors import CloseCode, ErrorCode, ProtocolError
    from .events import Event
    from .frames import FrameHeader
    from .messages import ClientMessage, ServerMessage, SessionConfig
    from .output import Output, OutputFormat
    from .session import Session, State

# Each public name, and the module (in this package) that defines it.
_HOMES = {
    "Body": "codecs.bodies",
    "CartesiaSocket": "codecs.cartesia",
    "ClientMessage": "messages",
    "CloseCode": "errors",
    "Codec": "codecs.base",
    "Core": "core",
    "DeepgramSocket": "codecs.deepgram",
    "ElevenLabsSocket": "codecs.elevenlabs_socket",
    "ErrorCode": "errors",
    "Event": "events",
    "FrameHeader": "frames",
    "Output": "output",
    "OutputFormat": "output",
    "ProtocolError": "errors",
    "ServerMessage": "messages",
    "Session": "session",
    "SessionCodec": "codecs.stream",
    "SessionConfig": "messages",
    "State": "session",
    "Telephony": "codecs.telephony",
    "WyomingCodec": "codecs.wyoming",
}

__all__ = [
    "Body",
    "CartesiaSocket",
    "ClientMessage",
    "CloseCode",
    "Codec",
    "Core",
    "DeepgramSocket",
    "ElevenLabsSocket",
    "ErrorCode",
    "Event",
    "FrameHeader",
    "Output",
    "OutputFormat",
    "ProtocolError",
    "ServerMessage",
    "Session",
    "SessionCodec",
    "SessionConfig",
    "State",
    "Telephony",
    "WyomingCodec",
]


def __getattr__(name: str) -> object:
    """A public name, from its module, imported now (and kept: the next lookup finds it here)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
