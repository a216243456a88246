"""Where a live stream's audio comes from outside a server: a file played at real time, or raw PCM16 on
a pipe, as chunks as they come. Free of vLLM: the CLI's client of a server (``stream --server``) reads
them without starting, or importing, an engine."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from vllm_whisper_align.audio.pcm import pcm16_samples, pcm16_to_float
from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.errors import InputError

# A file played, or a pipe read, in chunks of this long.
CHUNK_S = 0.1


def played(samples: np.ndarray, speed: float = 1.0, chunk_s: float = CHUNK_S) -> Iterable[np.ndarray]:
    """``samples`` in chunks of ``chunk_s``, each as its time comes (at ``speed`` times real time; 0: all
    at once)."""
    step = int(chunk_s * SAMPLE_RATE)
    started = time.monotonic()
    for start in range(0, len(samples), step):
        if speed > 0:
            due = started + (start + step) / SAMPLE_RATE / speed
            time.sleep(max(0.0, due - time.monotonic()))
        yield samples[start : start + step]


def stdin_chunks(pipe: Any, chunk_s: float = CHUNK_S) -> Iterable[np.ndarray]:
    """Raw PCM16 (16 kHz, mono, little-endian) from ``pipe`` as float chunks, each as it comes; an odd
    number of bytes in all is an InputError (not PCM16), once the pipe ends."""
    size = 2 * int(chunk_s * SAMPLE_RATE)
    rest = b""
    while data := pipe.read1(size) if hasattr(pipe, "read1") else pipe.read(size):
        data = rest + data
        whole = len(data) - len(data) % 2
        rest = data[whole:]
        yield pcm16_to_float(pcm16_samples(data[:whole]))
    if rest:
        raise InputError("stdin is not PCM16: an odd number of bytes")
