"""Reference clips and speaker embeddings as clients send them, decoded and checked.

Used by voice uploads (``gateway.voices``) and by the inline ``ref_audio`` of a request
(``gateway.catalog``); every problem raises ``Rejected`` naming the field it concerns.
"""

from __future__ import annotations

import base64
import binascii
import io
import json

import numpy as np
import numpy.typing as npt
import soundfile

from voxgate.engine.base import VoiceReference
from voxgate.gateway.http import Rejected

# vllm-omni's limit for a reference clip.
MAX_AUDIO_BYTES = 10 * 1024 * 1024
MAX_EMBEDDING_DIM = 8192  # vllm-omni's bound on speaker_embedding
MIN_DURATION_S = 1.0  # shorter clips carry too little of a voice to clone
MAX_DURATION_S = 30.0  # cloning models condition on a few seconds; longer only costs memory
MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 192000
MAX_CHANNELS = 8
_MIME_TYPES = {"WAV": "audio/wav", "FLAC": "audio/flac", "OGG": "audio/ogg", "MP3": "audio/mpeg"}


def parse_embedding(text: str) -> npt.NDArray[np.float32]:
    """A speaker embedding from its JSON text: a non-empty list of at most 8192 finite numbers."""
    param = "speaker_embedding"
    try:
        values = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise Rejected(400, "invalid_embedding", "speaker_embedding is not valid JSON", param) from exc
    if not isinstance(values, list) or any(
        isinstance(v, bool) or not isinstance(v, int | float) for v in values
    ):
        raise Rejected(400, "invalid_embedding", "speaker_embedding must be a JSON list of numbers", param)
    if not values:
        raise Rejected(400, "empty_embedding", "speaker_embedding is empty", param)
    if len(values) > MAX_EMBEDDING_DIM:
        raise Rejected(
            400, "embedding_too_long", f"speaker_embedding has over {MAX_EMBEDDING_DIM} values", param
        )
    try:
        with np.errstate(over="ignore"):
            embedding = np.asarray(values, dtype=np.float64).astype(np.float32)
    except OverflowError:  # an integer beyond float64
        embedding = np.array([np.inf], dtype=np.float32)
    if not np.isfinite(embedding).all():
        raise Rejected(400, "embedding_not_finite", "speaker_embedding has NaN or infinite values", param)
    return embedding


def decode_audio(
    data: bytes | bytearray, param: str = "audio_sample"
) -> tuple[npt.NDArray[np.float32], int, str]:
    """Mono float32 samples, sample rate and MIME type of a wav, flac, ogg/opus or mp3 clip."""
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as f:
            rate, channels, fmt = f.samplerate, f.channels, f.format
            if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE or not 1 <= channels <= MAX_CHANNELS:
                raise Rejected(
                    400, "invalid_audio", f"unsupported audio: {rate} Hz, {channels} channels", param
                )
            # Reading one frame past the limit bounds the memory a long (or lying) file can take.
            frames = f.read(frames=int(MAX_DURATION_S * rate) + 1, dtype="float32", always_2d=True)
    except (soundfile.SoundFileError, ValueError, EOFError) as exc:
        message = f"{param} could not be decoded as wav, flac, ogg/opus or mp3"
        raise Rejected(415, "unsupported_audio", message, param) from exc
    samples = frames.mean(axis=1, dtype=np.float32) if frames.shape[1] > 1 else frames[:, 0].copy()
    duration_s = len(samples) / rate
    if not MIN_DURATION_S <= duration_s <= MAX_DURATION_S:
        message = f"{param} must be {MIN_DURATION_S:g} to {MAX_DURATION_S:g} s long"
        raise Rejected(400, "invalid_duration", message, param)
    if not np.isfinite(samples).all():
        raise Rejected(400, "invalid_audio", f"{param} has NaN or infinite samples", param)
    return samples, rate, _MIME_TYPES.get(fmt, f"audio/x-{fmt.lower()}")


def inline_reference(ref_audio: str, ref_text: str | None) -> VoiceReference:
    """A one-request voice from ``ref_audio`` (a ``data:`` URL or bare base64 of a clip) and its transcript.

    The gateway never fetches URLs (it may have no network, and fetching on a client's behalf is an
    SSRF risk): upload the clip as a voice, or send it inline.

    Raises:
        Rejected: the value is not base64 of a decodable clip of 1 to 30 s.
    """
    header, _, payload = ref_audio.partition(",") if ref_audio.startswith("data:") else ("", "", ref_audio)
    if header and not header.endswith(";base64"):
        raise Rejected(400, "invalid_ref_audio", "a ref_audio data URL must be base64 encoded", "ref_audio")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        message = (
            "ref_audio must be a data: URL or base64 of a wav, flac, ogg or mp3 clip (URLs are not fetched)"
        )
        raise Rejected(400, "invalid_ref_audio", message, "ref_audio") from None
    if len(data) > MAX_AUDIO_BYTES:
        raise Rejected(413, "audio_too_large", f"ref_audio is over {MAX_AUDIO_BYTES} bytes", "ref_audio")
    audio, rate, _ = decode_audio(data, "ref_audio")
    return VoiceReference(name="ref_audio", audio=audio, sample_rate=rate, ref_text=ref_text)
