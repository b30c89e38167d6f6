"""The command-line client of a running gateway: ``voxgate say`` (the ``voices`` commands are
``voxgate.voice_client``'s, on the settings, URLs and errors of this module).

``say`` streams text over ``WS /v1/audio/speech/stream`` and writes the audio as it arrives. Every failure
is a ``ClientError`` whose message is meant for a person; ``voxgate.cli`` prints it and exits 1.
"""

from __future__ import annotations

import codecs
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO, Protocol, TextIO, TypeVar
from urllib.parse import urlsplit, urlunsplit

import msgspec
import numpy as np
import soundfile
from websockets.exceptions import (
    ConnectionClosed,
    ConnectionClosedOK,
    InvalidHandshake,
    InvalidStatus,
    InvalidURI,
)
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from .protocol.codecs.stream import EXTENSIONS_SUBPROTOCOL
from .protocol.messages import (
    Error,
    InputDone,
    InputText,
    ServerMessage,
    SessionClose,
    SessionConfig,
    SessionDone,
    SessionReady,
)

# The server's prefix (engine.options.ENV_PREFIX), repeated: the client imports nothing of the server.
_ENV_PREFIX = "VOXGATE_"


class ClientSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of the command-line client (``voxgate say`` / ``voxgate voices``)."""

    url: str = "http://127.0.0.1:8000"
    api_key: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> ClientSettings:
        """``VOXGATE_URL`` and ``VOXGATE_API_KEY``, then explicit overrides (CLI flags)."""
        env = os.environ if environ is None else environ
        raw: dict[str, object] = {
            name: env[_ENV_PREFIX + name.upper()]
            for name in cls.__struct_fields__
            if _ENV_PREFIX + name.upper() in env
        }
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return msgspec.convert(raw, cls, strict=False)


STREAM_PATH = "/v1/audio/speech/stream"
VOICES_PATH = "/v1/audio/voices"
# Long enough for a gateway that is still loading its engine, short enough not to hang on a dead one.
OPEN_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 30.0
# The gateway finishes the utterance before it closes; by then everything has been sent.
CLOSE_TIMEOUT_S = 5.0
# A voice upload carries up to 10 MiB of audio.
HTTP_TIMEOUT_S = 60.0
# Even fully \u-escaped (6 bytes a character) this stays well under the gateway's 128 KiB message limit.
MAX_TEXT_CHARS = 8192
# Bytes of stdin taken at once: whatever is there is sent, so speech starts while the writer writes.
STDIN_READ_BYTES = 4096
RAW_SUFFIXES = frozenset({".pcm", ".raw"})

_decode_server = msgspec.json.Decoder(ServerMessage).decode
_T = TypeVar("_T")
_encode = msgspec.json.Encoder().encode


class ClientError(Exception):
    """A failure to report to the user (exit status 1)."""


# --- URLs and auth ---------------------------------------------------------------------------------------


def ws_url(base: str, path: str = STREAM_PATH) -> str:
    """The WebSocket URL of ``path`` under the gateway ``base`` (http becomes ws, https becomes wss)."""
    parts = urlsplit(base)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ClientError(f"invalid gateway URL {base!r}: use http://host:port or https://host")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + path, parts.query, ""))


def http_url(base: str, path: str) -> str:
    """The HTTP URL of ``path`` under the gateway ``base`` (ws becomes http, wss becomes https)."""
    parts = urlsplit(base)
    scheme = {"http": "http", "https": "https", "ws": "http", "wss": "https"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ClientError(f"invalid gateway URL {base!r}: use http://host:port or https://host")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + path, parts.query, ""))


def _auth_headers(settings: ClientSettings) -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}


def _refused(status: int, detail: str) -> str:
    if status in (401, 403):
        return f"{detail} (HTTP {status}): check --api-key / VOXGATE_API_KEY"
    return f"{detail} (HTTP {status})"


# --- say: audio sinks ------------------------------------------------------------------------------------


class Sink(Protocol):
    """Where ``say`` writes s16le PCM as it arrives."""

    def write(self, pcm: bytes) -> None: ...

    def close(self) -> None: ...


class _RawSink:
    """Raw PCM into a binary stream, flushed per frame so a pipe reader gets it at once."""

    def __init__(self, stream: BinaryIO, *, owned: bool) -> None:
        self.stream, self.owned = stream, owned

    def write(self, pcm: bytes) -> None:
        self.stream.write(pcm)
        self.stream.flush()

    def close(self) -> None:
        if self.owned:
            self.stream.close()


class _SoundFileSink:
    """A sound file written progressively; its header is completed on close."""

    def __init__(self, path: str, sample_rate: int) -> None:
        self.file = soundfile.SoundFile(path, "w", samplerate=sample_rate, channels=1)
        self._odd = b""

    def write(self, pcm: bytes) -> None:
        data = self._odd + pcm
        whole = len(data) - len(data) % 2
        self._odd = data[whole:]
        self.file.write(np.frombuffer(data[:whole], dtype="<i2"))

    def close(self) -> None:
        self.file.close()


def output_problem(output: str) -> str | None:
    """Why ``-o output`` cannot be written, or None when it can: ``-``, ``.pcm``/``.raw`` or a sound file."""
    suffix = Path(output).suffix.lower()
    if output == "-" or suffix in RAW_SUFFIXES or suffix[1:].upper() in soundfile.available_formats():
        return None
    return (
        f"cannot tell the format of {output!r}: use a .wav, .flac, .ogg, .pcm or .raw file, or - for stdout"
    )


def open_sink(output: str, sample_rate: int, stdout: BinaryIO) -> Sink:
    """The sink for ``-o output``: raw PCM to ``stdout`` for ``-``, else a file chosen by its suffix."""
    try:
        if output == "-":
            return _RawSink(stdout, owned=False)
        if Path(output).suffix.lower() in RAW_SUFFIXES:
            return _RawSink(open(output, "wb"), owned=True)  # noqa: SIM115 - closed by the sink
        return _SoundFileSink(output, sample_rate)
    except (OSError, soundfile.SoundFileError) as exc:
        raise ClientError(f"cannot write {output}: {exc}") from exc


# --- say: text sources -----------------------------------------------------------------------------------


def stdin_texts(fd: int = 0) -> Iterator[str]:
    """Text from a file descriptor as soon as it arrives (not line by line: an LLM rarely ends a line).

    Reads the descriptor directly rather than ``sys.stdin`` so that the sender thread, if it is still
    blocked here when ``say`` fails, holds no lock the interpreter needs at exit.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := os.read(fd, STDIN_READ_BYTES):
        if text := decoder.decode(chunk):
            yield text
    if tail := decoder.decode(b"", final=True):
        yield tail


def _pieces(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        for start in range(0, len(text), MAX_TEXT_CHARS):
            yield text[start : start + MAX_TEXT_CHARS]


class _Sender(threading.Thread):
    """Sends the text, then ``input.done``, while the main thread receives audio."""

    def __init__(self, ws: ClientConnection, texts: Iterable[str]) -> None:
        super().__init__(name="voxgate-say-sender", daemon=True)
        self.ws, self.texts = ws, texts
        self.first_text_at: float | None = None
        self.failure: Exception | None = None

    def run(self) -> None:
        try:
            for piece in _pieces(self.texts):
                if self.first_text_at is None:
                    self.first_text_at = time.monotonic()
                self.ws.send(_encode(InputText(text=piece)).decode())
            self.ws.send(_encode(InputDone()).decode())
        except ConnectionClosed:
            pass  # the receiving side reports why
        except (OSError, ValueError) as exc:
            self.failure = exc
            self.ws.close()


# --- say -------------------------------------------------------------------------------------------------


class SayOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What ``say`` asks of the gateway; None leaves the gateway's default."""

    voice: str | None = None
    sample_rate: int | None = None
    speed: float | None = None


class SayResult(msgspec.Struct, frozen=True, kw_only=True):
    """What ``say`` produced, for its summary line."""

    sample_rate: int
    samples: int
    first_audio_s: float | None  # from the first text sent to the first audio received
    total_s: float

    @property
    def audio_s(self) -> float:
        return self.samples / self.sample_rate if self.sample_rate else 0.0

    def summary(self) -> str:
        first = "no audio" if self.first_audio_s is None else f"first audio after {self.first_audio_s:.2f} s"
        audio = f"{self.audio_s:.2f} s of audio at {self.sample_rate} Hz"
        return f"voxgate: {audio}, {first}, {self.total_s:.2f} s in all"


def _server_error(msg: Error) -> str:
    field = f" ({msg.field})" if msg.field else ""
    return f"gateway error {msg.code}{field}: {msg.message}"


def _receive(ws: ClientConnection, timeout: float | None = None) -> ServerMessage | bytes | None:
    """The next message: audio bytes, a known server message, or None for one this client does not know."""
    data = ws.recv(timeout=timeout)
    if isinstance(data, bytes):
        return data
    try:
        return _decode_server(data)
    except msgspec.ValidationError:
        return None  # a message type added by a newer gateway


def _open(settings: ClientSettings) -> ClientConnection:
    url = ws_url(settings.url)
    try:
        return connect(
            url,
            additional_headers=_auth_headers(settings),
            subprotocols=[Subprotocol(EXTENSIONS_SUBPROTOCOL)],  # session.ready, input.cancel, timings
            open_timeout=OPEN_TIMEOUT_S,
            max_size=None,
        )
    except InvalidStatus as exc:
        raise ClientError(_refused(exc.response.status_code, f"the gateway refused {url}")) from exc
    except InvalidURI as exc:
        raise ClientError(f"invalid gateway URL {settings.url!r}: {exc}") from exc
    except TimeoutError as exc:
        raise ClientError(f"cannot connect to {url}: timed out after {OPEN_TIMEOUT_S:g} s") from exc
    except (OSError, InvalidHandshake) as exc:
        raise ClientError(f"cannot connect to {url}: {exc}") from exc


def _await_ready(ws: ClientConnection) -> SessionReady:
    try:
        while True:
            match _receive(ws, READY_TIMEOUT_S):
                case SessionReady() as ready:
                    return ready
                case Error() as error:
                    raise ClientError(_server_error(error))
    except TimeoutError as exc:
        raise ClientError(f"no session.ready from the gateway within {READY_TIMEOUT_S:g} s") from exc
    except ConnectionClosed as exc:
        raise ClientError(f"the gateway closed the connection before session.ready ({exc})") from exc


def say(
    settings: ClientSettings,
    texts: Iterable[str],
    output: str,
    options: SayOptions,
    *,
    stdout: BinaryIO,
    stderr: TextIO,
) -> SayResult:
    """Speak ``texts`` (sent as they come) and write the audio to ``output`` as it arrives.

    Non-fatal gateway errors (a segment that failed) are printed to ``stderr`` as they happen and
    raise ``ClientError`` once the utterance is done; fatal ones raise at once.
    """
    started = time.monotonic()
    config = SessionConfig(
        voice=options.voice,
        response_format="pcm",
        sample_rate=options.sample_rate,
        speed=1.0 if options.speed is None else options.speed,
    )
    with _open(settings) as ws:
        ws.send(_encode(config).decode())
        ready = _await_ready(ws)
        rate = ready.config.sample_rate
        sink = open_sink(output, rate, stdout)
        sender = _Sender(ws, texts)
        samples, first_audio_at, errors = 0, None, 0
        try:
            sender.start()
            while not isinstance(msg := _receive(ws), SessionDone):
                match msg:
                    case bytes():
                        first_audio_at = first_audio_at or time.monotonic()
                        samples += len(msg) // 2
                        sink.write(msg)
                    case Error(fatal=True):
                        raise ClientError(_server_error(msg))
                    case Error():
                        errors += 1
                        print(f"voxgate: {_server_error(msg)}", file=stderr, flush=True)
            ws.send(_encode(SessionClose()).decode())
            _drain(ws)
        except ConnectionClosed as exc:
            if sender.failure is not None:
                raise ClientError(f"cannot read the text: {sender.failure}") from exc
            raise ClientError(f"the gateway closed the connection before the audio was done ({exc})") from exc
        finally:
            sink.close()
        sender.join()
    if errors:
        raise ClientError(f"{errors} gateway error(s): the audio is incomplete")
    if sender.first_text_at is None:
        raise ClientError("nothing to say: no text came on stdin")
    if not samples:
        raise ClientError("the gateway made no audio: the text has nothing to speak (no letter or digit)")
    first_text_at = sender.first_text_at
    first_audio_s = (
        None if first_audio_at is None or first_text_at is None else first_audio_at - first_text_at
    )
    return SayResult(
        sample_rate=rate, samples=samples, first_audio_s=first_audio_s, total_s=time.monotonic() - started
    )


def _drain(ws: ClientConnection) -> None:
    """Wait for the gateway's close after ``session.close``."""
    deadline = time.monotonic() + CLOSE_TIMEOUT_S
    try:
        while (left := deadline - time.monotonic()) > 0:
            _receive(ws, left)
    except (ConnectionClosedOK, TimeoutError):
        pass
