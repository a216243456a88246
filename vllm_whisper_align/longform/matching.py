"""Matching the given words to the heard words: a minimum edit-distance path (linear memory), its
anchors, and the stretches it shows to be text that is not in the audio, or audio that is not in the text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vllm_whisper_align.options import COMPRESSION_RATIO_THRESHOLD, compression_ratio

# A run of at least this many given words between two matches, against which the model heard at most
# this fraction as many words, is text that is not in the audio (a skipped paragraph, a heading).
# Shorter runs are misheard words: forcing them costs their neighbours little.
SKIP_MIN_WORDS = 10
SKIP_MAX_HEARD = 0.25
# Runs of at least this many consecutive matches bound text that is not in the audio.
SOLID_MATCH_WORDS = 3
# Inside such bounds, the text not in the audio is the stretch with most unmatched words, less this
# many per (chance) match.
MATCH_WEIGHT = 2.0
# A single-word match is kept as an anchor only if the runs on both sides of it differ by at most
# this many words between text and hypothesis: a lone "the" inside a skipped paragraph must not split it.
LONE_MATCH_MAX_IMBALANCE = 2
# Between two runs of SOLID_MATCH_WORDS matches, at least this many heard words against at most
# EXTRA_MAX_GIVEN as many given words are audio that is not in the text (an aside, a line the model
# invented over music): the heard words the edit path pairs with no given word are forced too, as
# filler, so that the DTW gives their frames to them rather than to the text's words around them; they
# are not returned. Fewer are the model's own extra words ("uh"); more given words make the stretch
# speech the model misheard (its words are the text's, however garbled, and must keep their frames).
# So is a stretch as repetitive as openai-whisper's fallback rule calls a loop ("mad, mad, mad, ..."
# heard over a sentence): no aside.
EXTRA_MIN_WORDS = 4
EXTRA_MAX_GIVEN = 0.25


# ---------------------------------------------------------------------------- matching


def anchors(given: Sequence[str], heard: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices (given, heard) of matched words, increasing in both: the equal pairs of a minimum
    edit-distance alignment (:func:`edit_path`), less lone matches that would split a skipped run;
    and every pair of that alignment, equal or substituted.

    A global minimum, not the longest common blocks first: transcripts repeat phrases, and a greedy
    block matcher pairs a phrase with the wrong repetition, shifting everything after it."""
    vocabulary: dict[str, int] = {}
    # Words that normalise to nothing (a lone dash) never match: each gets its own negative id.
    given_ids = np.array(
        [vocabulary.setdefault(k, len(vocabulary)) if k else -1 - i for i, k in enumerate(given)],
        dtype=np.int64,
    )
    heard_ids = np.array([vocabulary.get(k, -1) if k else -1 for k in heard], dtype=np.int64)
    heard_ids[heard_ids < 0] = -(len(given) + 1)  # unknown to the text: equal to no given word
    pairs = edit_path(given_ids, heard_ids)
    equal = pairs[given_ids[pairs[:, 0]] == heard_ids[pairs[:, 1]]] if len(pairs) else pairs
    blocks = _blocks(equal)
    kept = [b for k, b in enumerate(blocks) if b[2] > 1 or _balanced(blocks, k, len(given), len(heard))]
    return (*_pairs(kept), pairs)


def _pairs(blocks: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    ai = np.array([b[0] + d for b in blocks for d in range(b[2])], dtype=np.int64)
    aj = np.array([b[1] + d for b in blocks for d in range(b[2])], dtype=np.int64)
    return ai, aj


# Rows of the edit-distance table kept between recomputations: memory is about
# (len(given) / EDIT_CHECKPOINT_ROWS + EDIT_CHECKPOINT_ROWS) rows of len(heard) + 1 int32.
EDIT_CHECKPOINT_ROWS = 128


def edit_path(given: np.ndarray, heard: np.ndarray) -> np.ndarray:
    """(i, j) pairs of a minimum Levenshtein alignment (unit costs) of two id sequences: equal and
    substituted pairs, in order. One NumPy pass per row; rows are kept every EDIT_CHECKPOINT_ROWS and
    recomputed for the walk back, so memory stays linear (30k x 30k words: two passes, no table)."""
    if len(given) == 0 or len(heard) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    checkpoints = {0: np.arange(len(heard) + 1, dtype=np.int32)}
    row = checkpoints[0]
    for i in range(1, len(given) + 1):
        row = edit_row(row, given[i - 1], heard, i)
        if i % EDIT_CHECKPOINT_ROWS == 0:
            checkpoints[i] = row
    pairs = []
    i, j = len(given), len(heard)
    while i > 0 and j > 0:
        base = (i - 1) // EDIT_CHECKPOINT_ROWS * EDIT_CHECKPOINT_ROWS
        rows = [checkpoints[base]]
        for k in range(base + 1, i + 1):
            rows.append(edit_row(rows[-1], given[k - 1], heard, k))
        while i > base and j > 0:
            current, previous = rows[i - base], rows[i - base - 1]
            substitute = previous[j - 1] + (given[i - 1] != heard[j - 1])
            if current[j] == substitute:
                pairs.append((i - 1, j - 1))
                i, j = i - 1, j - 1
            elif current[j] == previous[j] + 1:
                i -= 1
            else:
                j -= 1
    return np.array(pairs[::-1], dtype=np.int64).reshape(-1, 2)


def edit_row(previous: np.ndarray, word: int, heard: np.ndarray, i: int) -> np.ndarray:
    """Row i of the edit-distance table from row i - 1: substitute or delete, then insert along the row
    (a running minimum of cost - j, plus j)."""
    candidate = np.empty_like(previous)
    candidate[0] = i
    candidate[1:] = np.minimum(previous[:-1] + (heard != word), previous[1:] + 1)
    steps = np.arange(len(previous), dtype=np.int32)
    return np.minimum.accumulate(candidate - steps) + steps


def _blocks(pairs: np.ndarray) -> list[tuple[int, int, int]]:
    """Runs of consecutive equal pairs as (given start, heard start, size)."""
    if len(pairs) == 0:
        return []
    breaks = np.flatnonzero(np.any(np.diff(pairs, axis=0) != 1, axis=1)) + 1
    starts = np.concatenate([[0], breaks])
    sizes = np.diff(np.concatenate([starts, [len(pairs)]]))
    return [(int(pairs[s, 0]), int(pairs[s, 1]), int(n)) for s, n in zip(starts, sizes, strict=True)]


def _balanced(blocks: list[tuple[int, int, int]], k: int, num_given: int, num_heard: int) -> bool:
    given_at, heard_at, size = blocks[k]
    before = blocks[k - 1] if k else None
    after = blocks[k + 1] if k + 1 < len(blocks) else None
    given_before = given_at - (before[0] + before[2] if before else 0)
    heard_before = heard_at - (before[1] + before[2] if before else 0)
    given_after = (after[0] if after else num_given) - given_at - size
    heard_after = (after[1] if after else num_heard) - heard_at - size
    imbalance = max(abs(given_before - heard_before), abs(given_after - heard_after))
    return imbalance <= LONE_MATCH_MAX_IMBALANCE


def not_in_audio(num_given: int, num_heard: int, ai: np.ndarray, aj: np.ndarray) -> np.ndarray:
    """Per given word: True inside a run of SKIP_MIN_WORDS or more words between two runs of
    SOLID_MATCH_WORDS matches, against which the model heard at most SKIP_MAX_HEARD as many.

    Only solid runs bound it: the edit-distance path threads a skipped paragraph's common words
    ("the", "of the") through the heard words around it, which would cut it into short runs."""
    matched = np.zeros(num_given, dtype=bool)
    matched[ai] = True
    bounds_given, bounds_heard, run_given, run_heard = _solid_stretches(ai, aj, num_given, num_heard)
    skipped = np.zeros(num_given, dtype=bool)
    for k in np.flatnonzero((run_given >= SKIP_MIN_WORDS) & (run_heard <= SKIP_MAX_HEARD * run_given)):
        lo, hi = _least_matched(matched[bounds_given[k] + 1 : bounds_given[k + 1]])
        if hi - lo >= SKIP_MIN_WORDS:
            skipped[bounds_given[k] + 1 + lo : bounds_given[k] + 1 + hi] = True
    return skipped


def extra_audio(
    ai: np.ndarray, aj: np.ndarray, pairs: np.ndarray, num_given: int, heard: Sequence[str]
) -> list[tuple[int, int]]:
    """Heard words that are audio not in the text, as ``(heard index, given word that follows it)``:
    in a stretch between solid runs of anchors ``(ai, aj)`` with EXTRA_MIN_WORDS or more heard words
    and at most EXTRA_MAX_GIVEN as many given words, not a loop, those the edit path ``pairs`` with
    no given word (``num_given`` follows the last ones)."""
    num_heard = len(heard)
    _, bounds_heard, run_given, run_heard = _solid_stretches(ai, aj, num_given, num_heard)
    paired = np.zeros(num_heard, dtype=bool)
    paired[pairs[:, 1]] = True
    extra = []
    for k in np.flatnonzero((run_heard >= EXTRA_MIN_WORDS) & (run_given <= EXTRA_MAX_GIVEN * run_heard)):
        stretch = range(bounds_heard[k] + 1, bounds_heard[k + 1])
        repetition = compression_ratio(" ".join(heard[j] for j in stretch))
        if repetition > COMPRESSION_RATIO_THRESHOLD:
            continue
        for j in stretch:
            if not paired[j]:
                after = int(np.searchsorted(pairs[:, 1], j))
                extra.append((j, int(pairs[after, 0]) if after < len(pairs) else num_given))
    return extra


def _solid_stretches(
    ai: np.ndarray, aj: np.ndarray, num_given: int, num_heard: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The stretches between runs of SOLID_MATCH_WORDS or more anchors: their bounds (the anchor
    before each, -1 at the start, and the end) in given and in heard words, and how many of each
    every stretch holds."""
    solid = [b for b in _blocks(np.stack([ai, aj], axis=1)) if b[2] >= SOLID_MATCH_WORDS]
    solid_given, solid_heard = _pairs(solid)
    bounds_given = np.concatenate([[-1], solid_given, [num_given]])
    bounds_heard = np.concatenate([[-1], solid_heard, [num_heard]])
    return bounds_given, bounds_heard, np.diff(bounds_given) - 1, np.diff(bounds_heard) - 1


def _least_matched(matched: np.ndarray) -> tuple[int, int]:
    """[lo, hi) of the stretch of a run with the most unmatched words less MATCH_WEIGHT per match
    (maximum subarray): the spoken words misheard at its edges stay out of it."""
    scores = np.where(matched, -MATCH_WEIGHT, 1.0)
    best, best_range, total, start = 0.0, (0, 0), 0.0, 0
    for index, score in enumerate(scores):
        if total <= 0:
            total, start = 0.0, index
        total += score
        if total > best:
            best, best_range = total, (start, index + 1)
    return best_range
