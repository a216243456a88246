"""Cross-attention alignment math: from attention logits to per-token times.

Mirrors the numeric half of openai-whisper's ``whisper/timing.py`` (``median_filter``,
``dtw_cpu`` + ``backtrace`` and the matrix steps of ``find_alignment``) so that the same
logits give the same word times. The reference runs these in torch/numba; here they are
NumPy for the vectorised steps and ``numba.njit(nogil=True, cache=True)`` kernels for the
loops, so they can run on a worker thread next to the model without holding the GIL.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from vllm_whisper_align.constants import TOKENS_PER_SECOND
from vllm_whisper_align.protocol import MEDFILT_WIDTH

# ---------------------------------------------------------------------------- median filter


@numba.njit(nogil=True, cache=True, inline="always")
def _sorts_after(a, b):
    # torch's sort() puts NaN last, so a NaN ranks above every number.
    return a > b or (a != a and b == b)


@numba.njit(nogil=True, parallel=True, cache=True)
def _median_filter_rows(rows, width):
    num_rows, length = rows.shape
    pad = width // 2
    result = np.empty_like(rows)
    for r in numba.prange(num_rows):
        # windows[w, k] = w-th value of the reflect-padded window centred on k
        windows = np.empty((width, length), dtype=rows.dtype)
        for w in range(width):
            for k in range(length):
                index = k - pad + w
                if index < 0:
                    index = -index
                elif index >= length:
                    index = 2 * (length - 1) - index
                windows[w, k] = rows[r, index]
        # Odd-even transposition sort of every window at once: `width` rounds of compare-exchange
        # between neighbouring slots. Branch-free, so the k loop runs in SIMD; an insertion sort
        # per window was ~10x slower (a mispredicted branch per comparison).
        for sort_round in range(width):
            for w in range(sort_round % 2, width - 1, 2):
                for k in range(length):
                    a = windows[w, k]
                    b = windows[w + 1, k]
                    swap = _sorts_after(a, b)
                    windows[w, k] = b if swap else a
                    windows[w + 1, k] = a if swap else b
        # element by element: a slice assignment here doubles numba's compile time
        for k in range(length):
            result[r, k] = windows[pad, k]
    return result


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median of each ``width``-wide window along the last axis, reflect-padded by ``width // 2``.

    Same values as ``whisper.timing.median_filter`` (``F.pad(mode="reflect")`` then the middle of
    each sorted window), including its edge cases: a last axis no longer than ``width // 2`` is
    returned unchanged (reflect padding is impossible there), and only then is an even or
    non-positive width rejected. Works on any number of leading axes; float32 in and out.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] <= width // 2:
        return x
    if width <= 0 or width % 2 == 0:
        raise ValueError(f"median filter width should be a positive odd number, got {width}")
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    return _median_filter_rows(rows, width).reshape(x.shape)


# ---------------------------------------------------------------------------- DTW


@numba.njit(nogil=True, cache=True)
def _dtw_trace(x):
    """The reference's ``dtw_cpu`` cost recurrence; returns its ``trace`` (0 = diagonal,
    1 = from the row above, 2 = from the column to the left).

    Rows are swept in C order (the reference goes column by column) for the cache: every cell
    only needs its three upper/left neighbours, so the costs are identical. Only two cost rows
    are kept; the reference's full float32 cost matrix is never read back.
    """
    num_rows, num_cols = x.shape
    previous = np.full(num_cols + 1, np.inf, dtype=np.float32)  # cost row i - 1
    current = np.full(num_cols + 1, np.inf, dtype=np.float32)  # cost row i
    previous[0] = 0.0
    trace = np.full((num_rows + 1, num_cols + 1), -1, dtype=np.int8)
    for i in range(1, num_rows + 1):
        left = np.float32(np.inf)  # cost[i, j - 1], kept in a register: it is the loop-carried one
        current[0] = left
        for j in range(1, num_cols + 1):
            c0 = previous[j - 1]
            c1 = previous[j]
            c2 = left
            # The reference's choice, 0 if c0 < c1 and c0 < c2, 1 if c1 < c0 and c1 < c2,
            # else 2, regrouped so that c2 (just computed) meets one comparison and the rest
            # are branch-free selects: ties go to c2, and c0 == c1 gives 2 via an inf candidate.
            c0_first = c0 < c1
            c1_first = c1 < c0
            candidate = c0 if c0_first else (c1 if c1_first else np.float32(np.inf))
            t = 0 if c0_first else (1 if c1_first else 2)
            take = candidate < c2
            c = candidate if take else c2
            # float32 + float32 rounds once, exactly like the reference's float64 sum stored
            # into float32; a float64 x adds in float64 then rounds, as the reference does.
            left = np.float32(x[i - 1, j - 1] + c)
            current[j] = left
            trace[i, j] = t if take else 2
        previous, current = current, previous
    return trace


@numba.njit(nogil=True, cache=True)
def _backtrace(trace):
    """The reference ``backtrace``: walk from the bottom-right corner back to (0, 0)."""
    i = trace.shape[0] - 1
    j = trace.shape[1] - 1
    trace[0, :] = 2
    trace[:, 0] = 1
    text_indices = np.empty(i + j, dtype=np.int64)
    time_indices = np.empty(i + j, dtype=np.int64)
    step = i + j  # the path never has more than i + j steps; it is filled from its end
    while i > 0 or j > 0:
        step -= 1
        text_indices[step] = i - 1
        time_indices[step] = j - 1
        t = trace[i, j]
        if t == 0:
            i -= 1
            j -= 1
        elif t == 1:
            i -= 1
        elif t == 2:
            j -= 1
        else:
            raise ValueError("Unexpected trace[i, j]")
    return text_indices[step:].copy(), time_indices[step:].copy()


@numba.njit(nogil=True, cache=True)
def _dtw(x):
    return _backtrace(_dtw_trace(x))


def dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum-cost monotonic path through ``x`` (tokens × frames), as (text, time) indices.

    Exactly ``whisper.timing.dtw_cpu`` (with ``backtrace``): same recurrence, tie-breaking, borders
    and float32 costs, so equal inputs give equal paths. int64 index arrays, path order.
    """
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)  # the reference calls x.double()
    return _dtw(np.ascontiguousarray(x))


# Measured on 2 cores, 32 matrices of 100×1500 float32: a thread pool over the nogil kernel
# takes ~13 ms, one after another ~21 ms, and a numba prange over the matrices copied into one
# packed buffer 15-26 ms (the copy alone is a few ms). The pool also keeps numba's parallel
# threads out of it, so it composes with a caller's own threads.
@functools.cache
def _thread_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(numba.config.NUMBA_NUM_THREADS, thread_name_prefix="dtw")


def _parallel_map(function, items: Sequence) -> list:
    if len(items) <= 1:
        return [function(item) for item in items]
    return list(_thread_pool().map(function, items))


def dtw_batch(matrices: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``dtw`` of each matrix (shapes may differ), run in parallel; results in input order."""
    return _parallel_map(dtw, matrices)


# ---------------------------------------------------------------------------- alignment matrix


def _softmax(x: np.ndarray) -> np.ndarray:
    exp = np.exp(x - x.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def alignment_matrix(
    qk: np.ndarray, num_frames: int, medfilt_width: int = MEDFILT_WIDTH, qk_scale: float = 1.0
) -> np.ndarray:
    """Token-to-frame attention matrix (tokens × frames, float32) that DTW aligns.

    ``qk``: pre-softmax cross-attention logits of the alignment heads, (heads, tokens, encoder
    frames), already scaled by 1/sqrt(head_dim). ``num_frames``: mel frames of the real audio, so
    encoder frames past ``num_frames // 2`` (padding) are dropped. Same steps as the reference
    ``find_alignment``: softmax over frames, z-score over tokens, median filter along frames,
    mean over heads. The z-score statistics are taken over every row given: pass the rows the
    reference normalises over (its whole decoder sequence: sot sequence, text and eot; see
    ``AlignmentParams.rows_sent``).
    """
    weights = np.asarray(qk, dtype=np.float32)[:, :, : num_frames // 2]
    weights = _softmax(weights * np.float32(qk_scale))
    mean = weights.mean(axis=-2, keepdims=True)
    std = weights.std(axis=-2, keepdims=True)  # ddof=0, as std_mean(unbiased=False)
    with np.errstate(divide="ignore", invalid="ignore"):  # a single row gives 0/0 = nan there too
        weights = (weights - mean) / std
    weights = median_filter(weights, medfilt_width)
    return weights.mean(axis=0)


# ---------------------------------------------------------------------------- head selection


def head_scores(qk: np.ndarray, num_frames: int, medfilt_width: int = MEDFILT_WIDTH) -> np.ndarray:
    """How sharply each head's attention aligns text to audio in this utterance (one score per head).

    The filter of Yeh, Meng and Tang, "Whisper Has an Internal Word Aligner" (arXiv 2509.09987): the
    logits are median-filtered along frames and softmaxed over the real frames, then a head scores
    the sum of its rows' L2 norms (each token looks at few frames) plus the sum of its columns' L2
    norms (each frame is looked at by few tokens). ``qk``: (heads, rows, encoder frames), the rows
    to score (the text rows).
    """
    weights = median_filter(np.asarray(qk, dtype=np.float32)[:, :, : num_frames // 2], medfilt_width)
    weights = _softmax(weights)
    return np.linalg.norm(weights, axis=-1).sum(axis=-1) + np.linalg.norm(weights, axis=-2).sum(axis=-1)


def select_heads(scores: np.ndarray, candidates: Sequence[int], at_most: int | None = None) -> list[int]:
    """The better-scoring half of ``candidates`` (indices into ``scores``), but no more than ``at_most``
    heads (the model's tuned alignment heads: as many as openai-whisper reads), in ascending order.

    Half, because on tiny.en's 12 upper-half heads the top 6 aligned best on both continuous speech
    and speech with pauses (top 4-5 and 7-8 were worse; benchmarks/RESULTS.md). At most the tuned
    heads' number, because of base's 24 the top 8 (its tuned heads' number) placed more starts than the
    top 12 on every replay set but one (docs/boundaries.md#how-many-heads-base-2026-12-05).
    """
    candidates = list(candidates)
    ranked = sorted(candidates, key=lambda index: -float(scores[index]))
    count = max(1, len(candidates) // 2)
    return sorted(ranked[: count if at_most is None else max(1, min(count, at_most))])


# ---------------------------------------------------------------------------- jump times


def _first_step_times(text_indices: np.ndarray, time_indices: np.ndarray) -> np.ndarray:
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    return time_indices[jumps] / TOKENS_PER_SECOND


def jump_times(matrix: np.ndarray) -> np.ndarray:
    """Seconds at which the DTW path through ``-matrix`` enters each row (one entry per row)."""
    return _first_step_times(*dtw(-np.asarray(matrix)))


def jump_times_batch(matrices: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``jump_times`` of each matrix, with the DTWs run in parallel."""
    return _parallel_map(jump_times, matrices)


def warmup() -> None:
    """Compile (or load from numba's cache) every kernel, on tiny inputs of each dtype used."""
    for dtype in (np.float32, np.float64):
        dtw(np.zeros((2, 3), dtype=dtype))
    median_filter(np.zeros((1, 2, 8), dtype=np.float32), MEDFILT_WIDTH)
