"""Audio of any format the gateway sends, decoded by a real decoder (FFmpeg, through PyAV)."""

from __future__ import annotations

import io

import av
import numpy as np
import numpy.typing as npt


def decoded(data: bytes) -> tuple[npt.NDArray[np.float32], int]:
    """The mono float32 samples (in [-1, 1], whatever the codec's sample format) and rate of a whole
    file or stream (wav, mp3, Ogg Opus, ADTS AAC, FLAC).

    A stream cut anywhere decodes as far as its last whole frame or page.
    """
    chunks: list[npt.NDArray[np.float32]] = []
    rate = 0
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            for frame in container.decode(audio=0):
                rate = frame.sample_rate
                samples = frame.to_ndarray().reshape(-1, frame.samples)[0]
                # Integer sample formats (FLAC's and WAV's s16, s32) as floats in [-1, 1), as float ones are.
                scale = float(np.iinfo(samples.dtype).max + 1) if samples.dtype.kind == "i" else 1.0
                chunks.append((samples / scale).astype(np.float32))
    except (av.error.InvalidDataError, av.error.EOFError):
        pass  # too little to open yet, or cut mid-frame: what came before is what a live player played
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    return samples, rate
