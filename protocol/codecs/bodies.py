"""REST bodies as codecs: pure writers of one HTTP answer's bytes, one per route's shape.

A REST surface is a route that picks a body codec and hands it to the one session host
(``gateway.session.host``) and its body transport (``gateway.transport.body``); the transport feeds the codec
what the session gives, in order, and writes what it returns. Like h11's ``ContentLengthWriter`` and
``ChunkedWriter``, a codec never touches a socket: each method returns bytes (``b""``: nothing to write
yet), so every shape is tested without an event loop (``tests/protocol/test_bodies.py``).

- ``audio(data, audio_s)``: a piece of encoded audio as the session made it;
- ``message(msg)``: a server message (``audio.done``, word timings, ...);
- ``end(done)``: the utterance's ``session.done``: the body's last bytes;
- ``error(err)``: a failure after the head went out (the status is already sent): what the body says of
  it, if its shape has a place for it (SSE does; a raw audio body just ends early).

A codec that is ``held`` wants the whole answer before anything is written (its headers depend on the
end: word timings, true WAV and FLAC sizes): ``end`` returns the whole body, and ``headers`` is read after
it.

Shapes: OpenAI's raw audio (``Body`` itself), its SSE deltas (``SseBody``) and a whole answer (``HeldAudio``:
``word_timestamps``, ``stream: false``, each batch item); ElevenLabs' per-segment bodies (``ElevenAudio``,
``ElevenLines``, ``ElevenWhole``); vllm-omni's batch answer (``BatchBody``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Literal

import msgspec

from ..alignment import Alignment, seconds_alignment
from ..audio import wav_header
from ..errors import ProtocolError
from ..messages import ServerMessage, SessionDone, WordTimestamps
from .elevenlabs import Stream

#: Output tokens reported per second of audio: Qwen3-TTS's codec rate (12.5 frames a second); no
#: tokenizer runs here, so a character counts as an input token.
OUTPUT_TOKENS_PER_S = 12.5
#: vllm-omni's budget for the ``X-Word-Timestamps`` header: larger headers become opaque 502s at common
#: reverse-proxy defaults, so past it the header is replaced by ``X-Word-Timestamps-Omitted``.
MAX_WORDS_HEADER_CHARS = 4096
_WAV_HEADER_BYTES = 44
#: Where FLAC's STREAMINFO keeps its 36-bit total sample count: ``fLaC``, the block header, 13 bytes in.
_FLAC_TOTAL_AT = 4 + 4 + 13
#: Audio per base64 slice of a batch item (a multiple of 3: the slices' base64 is the whole's).
SLICE_BYTES = 3 * 256 * 1024
_encode = msgspec.json.Encoder().encode


def output_tokens(audio_ms: float) -> int:
    """Output tokens of ``audio_ms`` of audio (``OUTPUT_TOKENS_PER_S``)."""
    return round(audio_ms / 1000.0 * OUTPUT_TOKENS_PER_S)


class Body:
    """A body that is its audio, as it comes: OpenAI's ``stream_format: "audio"``, and the base of the rest.

    Args:
        media_type: its ``Content-Type``.
    """

    held = False

    def __init__(self, media_type: str) -> None:
        self.media_type = media_type

    def head(self) -> bytes:
        """The body's opening, before anything of the session."""
        return b""

    def audio(self, data: bytes, audio_s: float) -> bytes:
        """A piece of encoded audio, ``audio_s`` seconds of it."""
        return data

    def message(self, msg: ServerMessage) -> bytes:
        """A server message of the session."""
        return b""

    def end(self, done: SessionDone) -> bytes:
        """The utterance's end: the body's last bytes."""
        return b""

    def error(self, err: ProtocolError) -> bytes:
        """A failure once the head went out: the body ends early (its status is already sent)."""
        return b""

    def headers(self) -> dict[str, str]:
        """Headers the body adds (a held body's are known at its end)."""
        return {}


def _event(payload: dict[str, object]) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


class SseBody(Body):
    """OpenAI's ``stream_format: "sse"``: ``speech.audio.delta`` events, then ``speech.audio.done`` with its
    usage, or ``speech.audio.error``.

    Args:
        characters: the input's length (its input tokens).
    """

    def __init__(self, characters: int) -> None:
        super().__init__("text/event-stream")
        self.characters = characters

    def audio(self, data: bytes, audio_s: float) -> bytes:
        return _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})

    def end(self, done: SessionDone) -> bytes:
        tokens = output_tokens(done.audio_ms)
        usage = {
            "input_tokens": self.characters,
            "output_tokens": tokens,
            "total_tokens": self.characters + tokens,
        }
        return _event({"type": "speech.audio.done", "usage": usage})

    def error(self, err: ProtocolError) -> bytes:
        return _event({"type": "speech.audio.error", "error": {"message": err.message, "code": err.code}})


class HeldAudio(Body):
    """A whole answer: its audio with true lengths (a ``wav``'s RIFF sizes, a ``flac``'s total samples),
    and vllm-omni's ``X-Word-Timestamps`` header when word timings were asked for.

    Args:
        media_type: its ``Content-Type``.
        fmt: the audio format (``wav`` and ``flac`` get their sizes filled in).
        sample_rate: the audio's rate.
        words: send the word timings' header.
    """

    held = True

    def __init__(self, media_type: str, fmt: str, sample_rate: int, *, words: bool = False) -> None:
        super().__init__(media_type)
        self.fmt, self.sample_rate, self.words = fmt, sample_rate, words
        self._audio: list[bytes] = []
        self._samples = 0.0
        self.timed: list[dict[str, object]] = []
        self.done: SessionDone | None = None

    def audio(self, data: bytes, audio_s: float) -> bytes:
        self._audio.append(data)
        self._samples += audio_s * self.sample_rate
        return b""

    def message(self, msg: ServerMessage) -> bytes:
        if isinstance(msg, WordTimestamps):
            # vllm-omni's shape (forced_aligner.py ``extract_word_timestamps``): whole milliseconds.
            self.timed += [
                {"word": w.word, "start_ms": round(w.start_ms), "end_ms": round(w.end_ms)}
                for w in msg.timestamps
            ]
        return b""

    def end(self, done: SessionDone) -> bytes:
        return b"".join(self.parts(done))

    def parts(self, done: SessionDone) -> list[bytes]:
        """The whole answer as the pieces it came in, its head patched (``end`` without the join: a batch
        item, about 100 MB of WAV at 48 kHz, is written from them with no copy of it made)."""
        self.done = done
        chunks, self._audio = self._audio, []
        size, samples = sum(len(c) for c in chunks), round(self._samples)
        if chunks and len(chunks[0]) < _FLAC_TOTAL_AT + 5:
            chunks = [b"".join(chunks)]  # a head split over pieces (too short to be a real answer)
        if chunks:
            chunks[0] = sized(chunks[0], self.fmt, self.sample_rate, samples, size)
        return chunks

    def headers(self) -> dict[str, str]:
        return words_headers(self.timed) if self.words else {}


def sized(data: bytes, fmt: str, sample_rate: int, samples: int, size: int | None = None) -> bytes:
    """A whole ``wav`` or ``flac`` with the sizes its streamed head could not know; other formats as they are.

    A streamed WAV's RIFF and data sizes say "unknown" (0xFFFFFFFF), and a streamed FLAC's STREAMINFO has a
    total of 0 samples; readers of whole files (Python's ``wave``, libsndfile) take those literally.
    ``data`` may be the file's head alone, with ``size`` the whole file's bytes.
    """
    size = len(data) if size is None else size
    if fmt == "wav" and len(data) >= _WAV_HEADER_BYTES:
        return wav_header(sample_rate, size - _WAV_HEADER_BYTES) + data[_WAV_HEADER_BYTES:]
    if fmt == "flac" and len(data) >= _FLAC_TOTAL_AT + 5 and data.startswith(b"fLaC"):
        at = _FLAC_TOTAL_AT
        high = bytes(((data[at] & 0xF0) | ((samples >> 32) & 0x0F),))
        return data[:at] + high + (samples & 0xFFFFFFFF).to_bytes(4, "big") + data[at + 5 :]
    return data


def words_headers(words: list[dict[str, object]]) -> dict[str, str]:
    """vllm-omni's ``X-Word-Timestamps`` header (ASCII JSON), or its ``-Omitted`` marker past 4 KB."""
    text = json.dumps(words)
    if len(text) <= MAX_WORDS_HEADER_CHARS:
        return {"x-word-timestamps": text}
    return {"x-word-timestamps-omitted": f"oversize; bytes={len(text)}; limit={MAX_WORDS_HEADER_CHARS}"}


class _Segments(Body):
    """ElevenLabs' REST bodies: each segment whole, with its alignment
    (``protocol.codecs.elevenlabs.Stream``)."""

    def __init__(self, media_type: str, stream: Stream) -> None:
        super().__init__(media_type)
        self.stream = stream

    def audio(self, data: bytes, audio_s: float) -> bytes:
        self.stream.hold(data)  # its audio.done comes next, with its length
        return b""

    def message(self, msg: ServerMessage) -> bytes:
        self.stream.observe(msg)
        segment = self.stream.take_segment()
        return b"" if segment is None else self.segment(*segment)

    def segment(self, audio: bytes, alignment: Alignment, duration_ms: float) -> bytes:
        """One segment's bytes."""
        return audio


class ElevenAudio(_Segments):
    """``POST /v1/text-to-speech/{voice_id}`` and ``.../stream``: each segment's audio (a compressed format's
    as one complete file per segment)."""


class ElevenLines(_Segments):
    """``.../stream/with-timestamps``: NDJSON, a line a segment: ``audio_base64``, ``alignment`` and
    ``normalized_alignment`` (seconds from the start of the answer)."""

    def __init__(self, stream: Stream) -> None:
        super().__init__("application/json", stream)
        self._offset_ms = 0.0

    def segment(self, audio: bytes, alignment: Alignment, duration_ms: float) -> bytes:
        shape = msgspec.to_builtins(seconds_alignment(alignment, self._offset_ms))
        self._offset_ms += duration_ms
        line = {
            "audio_base64": base64.b64encode(audio).decode(),
            "alignment": shape,
            "normalized_alignment": shape,
        }
        return _encode(line) + b"\n"


class ElevenWhole(_Segments):
    """``.../with-timestamps``: one JSON object, written as its segments come.

    ``{"audio_base64":"<base64 of every segment's audio>","alignment":A,"normalized_alignment":A}``, byte for
    byte what one ``json.dumps`` of the whole answer gives: the base64 of the audio so far, up to its last
    whole 3-byte group (a base64 of 3-byte pieces is the base64 of their sum), goes out with each segment;
    the up to 2 bytes left wait for the next. Only the alignment is kept to the end.
    """

    def __init__(self, stream: Stream) -> None:
        super().__init__("application/json", stream)
        self._base64 = Base64Stream()
        self._offset_ms = 0.0
        self._chars: list[str] = []
        self._starts: list[float] = []
        self._ends: list[float] = []

    def head(self) -> bytes:
        return b'{"audio_base64":"'

    def segment(self, audio: bytes, alignment: Alignment, duration_ms: float) -> bytes:
        shape = seconds_alignment(alignment, self._offset_ms)
        self._offset_ms += duration_ms
        self._chars += shape.characters
        self._starts += shape.character_start_times_seconds
        self._ends += shape.character_end_times_seconds
        return self._base64.push(audio)

    def end(self, done: SessionDone) -> bytes:
        shape = {
            "characters": self._chars,
            "character_start_times_seconds": self._starts,
            "character_end_times_seconds": self._ends,
        }
        alignment = json.dumps(shape, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
        return (
            self._base64.end()
            + b'","alignment":'
            + alignment
            + b',"normalized_alignment":'
            + alignment
            + b"}"
        )


class Base64Stream:
    """Base64 of a byte stream given in pieces: each piece's whole 3-byte groups at once, the rest carried."""

    def __init__(self) -> None:
        self._left = b""  # the last bytes that do not fill a 3-byte group yet

    def push(self, data: bytes) -> bytes:
        data = self._left + data if self._left else data
        whole = len(data) - len(data) % 3
        self._left = data[whole:]
        return base64.b64encode(memoryview(data)[:whole])

    def end(self) -> bytes:
        rest, self._left = self._left, b""
        return base64.b64encode(rest)


# -- vllm-omni's batch answer --------------------------------------------------------------------------------


class InputTokenDetails(msgspec.Struct, kw_only=True):
    """vllm-omni's ``SpeechInputTokenDetails``; voxgate counts a character as a text token."""

    text_tokens: int = 0
    audio_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    """vllm-omni's ``SpeechTokenUsage``: an output token is 80 ms of audio (``OUTPUT_TOKENS_PER_S``)."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    input_token_details: InputTokenDetails = msgspec.field(default_factory=InputTokenDetails)

    @classmethod
    def of(cls, characters: int, audio_ms: float) -> Usage:
        tokens = output_tokens(audio_ms)
        details = InputTokenDetails(text_tokens=characters)
        return cls(
            input_tokens=characters,
            output_tokens=tokens,
            total_tokens=characters + tokens,
            input_token_details=details,
        )


class ItemResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """vllm-omni's ``SpeechBatchItemResult``, its null fields left out as vllm-omni leaves them out."""

    index: int
    status: Literal["success", "error"]
    audio_data: str | None = None
    media_type: str | None = None
    error: str | None = None
    usage: Usage | None = None


class BatchBody:
    """vllm-omni's ``BatchSpeechResponse``, written one result at a time as each is ready in turn.

    Args:
        batch_id: the answer's ``id`` (``speech-batch-<hex>``).
        total: the batch's item count.
    """

    media_type = "application/json"

    def __init__(self, batch_id: str, total: int) -> None:
        self.batch_id, self.total = batch_id, total
        self.succeeded = 0
        self._written = 0

    def head(self) -> bytes:
        return b'{"id":' + _encode(self.batch_id) + b',"results":['

    def result(self, result: ItemResult) -> bytes:
        """One item's result, in order (a failed one, or one without audio)."""
        self.succeeded += result.status == "success"
        return self._comma() + _encode(result)

    def success(self, index: int, audio: list[bytes], media_type: str, usage: Usage) -> Iterator[bytes]:
        """A successful item's result, in pieces: the base64 of its audio (given in pieces) in slices of
        about ``SLICE_BYTES`` of audio, so that the answer never holds a second copy of an item's audio
        (the same bytes as ``result``)."""
        self.succeeded += 1
        yield self._comma() + b'{"index":' + str(index).encode() + b',"status":"success","audio_data":"'
        encoder, out, held = Base64Stream(), [], 0
        for piece in audio:
            out.append(encoder.push(piece))
            held += len(piece)
            if held >= SLICE_BYTES:
                yield b"".join(out)
                out, held = [], 0
        yield b"".join(out) + encoder.end()
        yield b'","media_type":' + _encode(media_type) + b',"usage":' + _encode(usage) + b"}"

    def _comma(self) -> bytes:
        comma = b"," if self._written else b""
        self._written += 1
        return comma

    def end(self) -> bytes:
        counts = {"total": self.total, "succeeded": self.succeeded, "failed": self.total - self.succeeded}
        return b"]," + _encode(counts)[1:]


#: Makes a route's body codec for one answer (the route's choice of shape).
BodyFactory = Callable[[], Body]
