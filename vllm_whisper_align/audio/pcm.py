"""PCM16, the raw audio of live streams (a WebSocket's appends, a pipe): 16-bit little-endian samples,
to float samples in [-1, 1] and back."""

from __future__ import annotations

import numpy as np

# A float sample of -1.0 is PCM16's lowest value; +1.0 is written as its highest, one step short.
FULL_SCALE = 32768.0


def pcm16_samples(data: bytes) -> np.ndarray:
    """``data`` (an even number of bytes) as int16 samples."""
    return np.frombuffer(data, dtype="<i2").astype(np.int16, copy=False)


def pcm16_to_float(samples: np.ndarray) -> np.ndarray:
    return samples.astype(np.float32) / FULL_SCALE


def float_to_pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * (FULL_SCALE - 1)).astype("<i2").tobytes()
