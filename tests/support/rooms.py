"""Recordings played in a simulated room: the direct sound, then a diffuse tail.

The room's impulse response is 1 (the direct sound) followed, from ``PRE_DELAY_S`` on, by noise whose
level falls by 60 dB in the reverberation time (RT60). Its energy against the direct sound's grows with
the RT60 as it does for one talker at one distance in rooms of one size with harder walls: a
direct-to-reverberant ratio of ``REFERENCE_DRR_DB`` at ``REFERENCE_RT60_S`` (3 dB at 0.6 s, 0.8 dB at
1 s). The direct sound keeps the recording's times, so word-level truth holds; what the room adds after
a word's end is not the word.
"""

from __future__ import annotations

import numpy as np

from vllm_whisper_align.constants import SAMPLE_RATE

REFERENCE_RT60_S, REFERENCE_DRR_DB = 0.3, 6.0
PRE_DELAY_S = 0.005  # the first reflection after the direct sound


def room_response(rt60_s: float, seed: int) -> np.ndarray:
    """The impulse response of a room whose tail falls by 60 dB in ``rt60_s`` seconds."""
    t = np.arange(int(rt60_s * SAMPLE_RATE)) / SAMPLE_RATE
    tail = np.random.default_rng(seed).normal(0.0, 1.0, len(t)) * 10 ** (-3 * t / rt60_s)
    tail[t < PRE_DELAY_S] = 0.0
    drr_db = REFERENCE_DRR_DB - 10 * np.log10(rt60_s / REFERENCE_RT60_S)
    tail *= np.sqrt(10 ** (-drr_db / 10) / np.sum(tail**2))
    tail[0] = 1.0
    return tail


def in_room(samples: np.ndarray, rt60_s: float, seed: int) -> np.ndarray:
    """``samples`` convolved with :func:`room_response` (as long as they were; the tail past their end
    is cut), at their peak level."""
    response = room_response(rt60_s, seed)
    size = len(samples) + len(response) - 1
    wet = np.fft.irfft(np.fft.rfft(samples, size) * np.fft.rfft(response, size), size)[: len(samples)]
    return (wet * np.max(np.abs(samples)) / max(float(np.max(np.abs(wet))), 1e-12)).astype(np.float32)
