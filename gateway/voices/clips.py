"""Reference clips and speaker embeddings as clients send them, decoded and checked.

Used by voice uploads (``gateway.routes.voices``) and by the inline ``ref_audio`` of a request
(``gateway.voices.catalog``); every problem raises ``Rejected`` naming the field it concerns.

A clip costs what it is worth: its header (rate, channels, length) is checked before anything is decoded,
then it is decoded block by block, mixed down to mono and resampled to at most the stored rate on the way
(``MAX_STORED_RATE``, or the deployment's ``max_clip_rate_hz`` up to ``MAX_CLIP_RATE``), on one of
``MAX_CONCURRENT_DECODES`` decode threads.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt
import soundfile

from ...engine.base import VoiceReference
from ...protocol.audio import Resampler
from ...protocol.errors import ErrorCode
from ..middleware.http import Rejected

# vllm-omni's limit for a reference clip.
MAX_AUDIO_BYTES = 10 * 1024 * 1024
MAX_EMBEDDING_DIM = 8192  # vllm-omni's bound on speaker_embedding
#: vllm-omni's cap on an uploaded embedding (serving_speech.py ``upload_voice_embedding``), below the 8192
#: a request's ``speaker_embedding`` may have: the largest speaker encoders give 2048 values.
MAX_UPLOAD_EMBEDDING_DIM = 4096
#: A voice's text fields (name, consent, transcript, description): names, consent records and transcripts
#: of 30 s of speech are far shorter.
MAX_TEXT_BYTES = 16 * 1024
MIN_DURATION_S = 1.0  # shorter clips carry too little of a voice to clone
MAX_DURATION_S = 30.0  # cloning models condition on a few seconds; longer only costs memory
MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 192000
MAX_CHANNELS = 8
# The canonical form of a clip is mono at most at this rate: most cloning models voxgate serves condition on
# 16-24 kHz audio (Qwen3-TTS: 24 kHz), so more is only bytes. 30 s of it is 1.4 MB stored as 16-bit PCM.
MAX_STORED_RATE = 24000
# The most a deployment may keep (``max_clip_rate_hz``): Fish Speech's codec runs at 44.1 kHz, VoxCPM2 at 48.
# 30 s at 48 kHz is 2.9 MB stored.
MAX_CLIP_RATE = 48000
# Source audio decoded per step: 1 MiB of float32 frames is 0.17 s of 192 kHz 8-channel audio, 16 s of
# 16 kHz mono; a 30 s clip then costs this plus its canonical form, never its decoded size (184 MB there).
DECODE_BLOCK_BYTES = 1 << 20
# Decodes at once in the process, each on its own thread (an upload's also stores the result there): each
# holds a few MB (block, resampler, result, the file written); more wait their turn (30 s at 192 kHz with
# 8 channels take about half a second) instead of adding up. Few threads matter as much as few buffers:
# glibc keeps a thread's freed memory in that thread's arena, so 20 uploads decoded on 20 threads kept
# 140 MB where 4 threads keep 40.
MAX_CONCURRENT_DECODES = 4
# libsndfile's frame count for a file whose header does not say (SF_COUNT_MAX).
_UNKNOWN_FRAMES = 2**63 - 1
_MIME_TYPES = {"WAV": "audio/wav", "FLAC": "audio/flac", "OGG": "audio/ogg", "MP3": "audio/mpeg"}
_DECODER_THREAD = "voxgate-decode"
_decoder = ThreadPoolExecutor(MAX_CONCURRENT_DECODES, thread_name_prefix=_DECODER_THREAD)
_P = ParamSpec("_P")
_T = TypeVar("_T")


def _on_decoder(fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``fn`` run on a decode thread, the caller blocking meanwhile (at once when it is one)."""
    if threading.current_thread().name.startswith(_DECODER_THREAD):
        return fn(*args, **kwargs)
    return _decoder.submit(fn, *args, **kwargs).result()


async def decoding(fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Await ``fn`` run on one of the ``MAX_CONCURRENT_DECODES`` decode threads: a decode, and what is
    made of its result (a voice file), so that concurrent uploads cannot add their buffers up."""
    return await asyncio.wrap_future(_decoder.submit(fn, *args, **kwargs))


def parse_embedding(text: str) -> npt.NDArray[np.float32]:
    """A speaker embedding from its JSON text: a non-empty list of at most 8192 finite numbers."""
    param = "speaker_embedding"
    try:
        values = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise Rejected(ErrorCode.INVALID_EMBEDDING, "speaker_embedding is not valid JSON", param) from exc
    if not isinstance(values, list) or any(
        isinstance(v, bool) or not isinstance(v, int | float) for v in values
    ):
        raise Rejected(ErrorCode.INVALID_EMBEDDING, "speaker_embedding must be a JSON list of numbers", param)
    if not values:
        raise Rejected(ErrorCode.EMPTY_EMBEDDING, "speaker_embedding is empty", param)
    if len(values) > MAX_EMBEDDING_DIM:
        raise Rejected(
            ErrorCode.EMBEDDING_TOO_LONG, f"speaker_embedding has over {MAX_EMBEDDING_DIM} values", param
        )
    try:
        with np.errstate(over="ignore"):
            embedding = np.asarray(values, dtype=np.float64).astype(np.float32)
    except OverflowError:  # an integer beyond float64
        embedding = np.array([np.inf], dtype=np.float32)
    return check_embedding(embedding, param)


def check_embedding(
    embedding: npt.NDArray[np.float32], param: str = "speaker_embedding", max_dim: int = MAX_EMBEDDING_DIM
) -> npt.NDArray[np.float32]:
    """``embedding`` when it is a non-empty vector of at most ``max_dim`` finite values: what a request's
    ``speaker_embedding`` is held to, an upload's (``MAX_UPLOAD_EMBEDDING_DIM``), an imported and a
    stored one's."""
    if embedding.ndim != 1 or embedding.size == 0:
        raise Rejected(ErrorCode.EMPTY_EMBEDDING, f"{param} is empty or not a vector", param)
    if embedding.size > max_dim:
        message = f"{param} has {embedding.size} values, over the {max_dim} allowed"
        raise Rejected(ErrorCode.EMBEDDING_TOO_LONG, message, param)
    check_finite(embedding, param, ErrorCode.EMBEDDING_NOT_FINITE, "values")
    return embedding


def check_finite(
    values: npt.NDArray[np.float32],
    param: str,
    code: ErrorCode = ErrorCode.INVALID_AUDIO,
    what: str = "samples",
) -> None:
    """Refuse samples (or values) that are NaN or infinite: an engine would speak noise or fail."""
    if not np.isfinite(values).all():
        raise Rejected(code, f"{param} has NaN or infinite {what}", param)


def check_text(value: str | None, param: str) -> None:
    """Refuse a text field of a voice over ``MAX_TEXT_BYTES`` (as an upload's form refuses it)."""
    if value is not None and len(value.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise Rejected(ErrorCode.FIELD_TOO_LARGE, f"{param} is larger than {MAX_TEXT_BYTES} bytes", param)


def check_clip(rate: int, channels: int, frames: int, param: str, *, slack_s: float = 0.0) -> None:
    """Refuse a clip by what its header says: rate, channels, an unknown length, a length outside 1 to 30 s
    (``slack_s`` more either way, for a clip resampled since). Nothing is decoded."""
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE or not 1 <= channels <= MAX_CHANNELS:
        message = (
            f"unsupported audio: {rate} Hz, {channels} channels ({MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz, "
            f"1-{MAX_CHANNELS} channels)"
        )
        raise Rejected(ErrorCode.INVALID_AUDIO, message, param)
    if frames >= _UNKNOWN_FRAMES:
        message = f"{param} does not state its length in its header (a streamed file?); re-encode it whole"
        raise Rejected(ErrorCode.INVALID_AUDIO, message, param)
    if not (MIN_DURATION_S - slack_s) * rate <= frames <= (MAX_DURATION_S + slack_s) * rate:
        length = f"{MIN_DURATION_S:g} to {MAX_DURATION_S:g} s"
        message = f"{param} must be {length} long; its header says {frames / rate:.6g} s"
        raise Rejected(ErrorCode.INVALID_DURATION, message, param)


class _Bytes:
    """A read-only file over a client's bytes, for libsndfile; ``io.BytesIO`` would copy a bytearray."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._view = memoryview(data).cast("B")
        self._position = 0

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._position, len(self._view))[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size < 0 else min(len(self._view), self._position + size)
        data = bytes(self._view[self._position : end])
        self._position = max(self._position, end)
        return data

    def readinto(self, buffer: memoryview) -> int:
        data = self._view[self._position : self._position + len(buffer)]
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)


class _Header(NamedTuple):
    rate: int
    channels: int
    frames: int
    mime_type: str


def _check_header(f: soundfile.SoundFile, param: str) -> _Header:
    """What the container says about the clip, refused before a single sample is decoded."""
    rate, channels, frames, fmt = f.samplerate, f.channels, f.frames, f.format
    check_clip(rate, channels, frames, param)
    return _Header(rate, channels, frames, _MIME_TYPES.get(fmt, f"audio/x-{fmt.lower()}"))


def _decode_blocks(
    f: soundfile.SoundFile, header: _Header, param: str, max_rate: int
) -> tuple[npt.NDArray[np.float32], int]:
    """The clip as mono float32 at ``min(rate, max_rate)``, decoded, mixed down and resampled one
    block at a time, so memory holds one block of the source and the (small) canonical result; and the
    number of source frames decoded."""
    block = np.empty((max(1, DECODE_BLOCK_BYTES // (4 * header.channels)), header.channels), np.float32)
    resampler = Resampler(header.rate, min(header.rate, max_rate))
    pieces: list[npt.NDArray[np.float32]] = []
    # libsndfile never reads past the frames the header states, and the header was checked; the bound
    # only guards against a decoder that would.
    remaining = int(MAX_DURATION_S * header.rate) + 1
    while remaining > 0:
        read = f.read(frames=min(len(block), remaining), dtype="float32", out=block)
        if len(read) == 0:
            break
        remaining -= len(read)
        # ``block`` is reused, so what is kept must be a copy: the mean is one, the single channel is not.
        mono = read.mean(axis=1, dtype=np.float32) if header.channels > 1 else read[:, 0].copy()
        check_finite(mono, param)
        pieces.append(resampler.process(mono))
    pieces.append(resampler.process(np.zeros(0, np.float32), last=True))
    decoded = int(MAX_DURATION_S * header.rate) + 1 - remaining
    return np.concatenate(pieces), decoded


def decode_audio(
    data: bytes | bytearray | memoryview, param: str = "audio_sample", max_rate: int = MAX_STORED_RATE
) -> tuple[npt.NDArray[np.float32], int, str]:
    """The canonical form of a wav, flac, ogg/opus or mp3 clip: mono float32 at its rate, or at
    ``max_rate`` when higher; with that rate and the clip's MIME type.

    Rate, channels and length are read from the header and refused before any decoding; the decode
    then goes block by block (``DECODE_BLOCK_BYTES``) on a decode thread, at most
    ``MAX_CONCURRENT_DECODES`` at once, so a clip costs a few MB of memory whatever its rate and channel
    count. Blocks the calling thread meanwhile.

    Raises:
        Rejected: 415 ``unsupported_audio`` (not decodable), 400 ``invalid_audio`` (rate, channels,
            unknown length, NaN or infinite samples) or ``invalid_duration`` (not 1 to 30 s).
    """
    return _on_decoder(_decode, data, param, max_rate)


def _decode(
    data: bytes | bytearray | memoryview, param: str, max_rate: int
) -> tuple[npt.NDArray[np.float32], int, str]:
    try:
        with soundfile.SoundFile(_Bytes(data)) as f:
            header = _check_header(f, param)
            samples, frames = _decode_blocks(f, header, param, max_rate)
    except (soundfile.SoundFileError, ValueError, EOFError) as exc:
        message = f"{param} could not be decoded as wav, flac, ogg/opus or mp3"
        raise Rejected(ErrorCode.UNSUPPORTED_AUDIO, message, param) from exc
    if not MIN_DURATION_S <= frames / header.rate <= MAX_DURATION_S:  # shorter than its header said
        message = f"{param} must be {MIN_DURATION_S:g} to {MAX_DURATION_S:g} s long"
        raise Rejected(ErrorCode.INVALID_DURATION, message, param)
    return samples, min(header.rate, max_rate), header.mime_type


def inline_reference(ref_audio: str, ref_text: str | None, max_rate: int = MAX_STORED_RATE) -> VoiceReference:
    """A one-request voice from ``ref_audio`` (a ``data:`` URL or bare base64 of a clip) and its transcript.

    The gateway never fetches URLs (it may have no network, and fetching on a client's behalf is an
    SSRF risk): upload the clip as a voice, or send it inline.

    Raises:
        Rejected: the value is not base64 of a decodable clip of 1 to 30 s.
    """
    header, _, payload = ref_audio.partition(",") if ref_audio.startswith("data:") else ("", "", ref_audio)
    if header and not header.endswith(";base64"):
        raise Rejected(
            ErrorCode.INVALID_REF_AUDIO, "a ref_audio data URL must be base64 encoded", "ref_audio"
        )
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        message = (
            "ref_audio must be a data: URL or base64 of a wav, flac, ogg or mp3 clip (URLs are not fetched)"
        )
        raise Rejected(ErrorCode.INVALID_REF_AUDIO, message, "ref_audio") from None
    if len(data) > MAX_AUDIO_BYTES:
        raise Rejected(ErrorCode.AUDIO_TOO_LARGE, f"ref_audio is over {MAX_AUDIO_BYTES} bytes", "ref_audio")
    audio, rate, _ = decode_audio(data, "ref_audio", max_rate)
    return VoiceReference(name="ref_audio", audio=audio, sample_rate=rate, ref_text=ref_text)
