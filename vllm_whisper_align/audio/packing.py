"""Several short inputs laid end to end in one 30 s window, so that they share one encoder pass.

Whisper encodes every input as a whole window: a 2 s clip pays for 28 s of padding. A packed window
holds inputs in order, each starting on an encoder frame (20 ms) and separated from the next by
``GAP_S`` of digital silence, long enough that Whisper does not run one input's words into the
next's. Where each input lies in the window (:class:`Packed`) is all the alignment needs to split
the window's answer back (``align.packing``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vllm_whisper_align.constants import N_SAMPLES, N_SAMPLES_PER_TOKEN, SAMPLE_RATE

# Silence between two packed inputs. A whole number of encoder frames, so every input starts on one.
GAP_S = 1.0
GAP_SAMPLES = int(GAP_S * SAMPLE_RATE) // N_SAMPLES_PER_TOKEN * N_SAMPLES_PER_TOKEN


def on_frame(num_samples: int) -> int:
    """``num_samples`` rounded up to whole encoder frames."""
    return -(-num_samples // N_SAMPLES_PER_TOKEN) * N_SAMPLES_PER_TOKEN


def packable_length(num_samples: int) -> bool:
    """Whether an input this long can share a window: two of it and a gap fit in one."""
    return 0 < num_samples and 2 * on_frame(num_samples) + GAP_SAMPLES <= N_SAMPLES


@dataclass(frozen=True)
class Packed:
    """One window of several inputs: its samples, and where each input starts and how long it is."""

    samples: np.ndarray
    starts: tuple[int, ...]
    lengths: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.starts)

    def frames(self, index: int) -> slice:
        """Encoder frames (20 ms) of input ``index`` in the window: its last partial frame included."""
        first = self.starts[index] // N_SAMPLES_PER_TOKEN
        return slice(first, first + max(1, self.lengths[index] // N_SAMPLES_PER_TOKEN))


def fits(lengths: Sequence[int]) -> bool:
    """Whether inputs of these lengths fit one window together."""
    return sum(on_frame(n) for n in lengths) + GAP_SAMPLES * (len(lengths) - 1) <= N_SAMPLES


# A window this full takes no more inputs worth waiting for (2 s clips: 8 of them; 8 s clips: 3).
FULL_SAMPLES = 3 * N_SAMPLES // 4


def full(lengths: Sequence[int]) -> bool:
    """Whether inputs of these lengths fill a window: what a busy server waits for before packing."""
    return sum(on_frame(n) for n in lengths) + GAP_SAMPLES * (len(lengths) - 1) >= FULL_SAMPLES


def pack(inputs: Sequence[np.ndarray]) -> Packed:
    """``inputs`` (that :func:`fits`) laid end to end, gaps of silence between them."""
    lengths = [len(samples) for samples in inputs]
    if not inputs or not fits(lengths):
        raise ValueError(f"{len(inputs)} inputs of {sum(lengths)} samples do not fit one window")
    starts = np.cumsum([0, *(on_frame(n) + GAP_SAMPLES for n in lengths[:-1])])
    samples = np.zeros(int(starts[-1]) + lengths[-1], dtype=np.float32)
    for start, piece in zip(starts, inputs, strict=True):
        samples[start : start + len(piece)] = piece
    return Packed(samples, tuple(int(s) for s in starts), tuple(lengths))
