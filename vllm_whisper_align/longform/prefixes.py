"""The short first pass: each window's first PREFIX_TOKENS tokens laid on the text where the speaking
rate so far expects them, which says where the window's share begins.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vllm_whisper_align.longform.matching import edit_row
from vllm_whisper_align.longform.split import ZONE_MAX_WORDS

# ---------------------------------------------------------------------------- the short first pass

# The first pass need not hear whole windows to place their text: each window's first PREFIX_TOKENS
# tokens, laid on the text where the speaking rate so far expects them, say where its share begins.
# What only a whole transcript shows (text not in the audio, audio not in the text, a misplaced
# window) is checked on the second pass's own output (unheard_windows); a window that fails the check
# is aligned again, with its neighbours, from a full first pass. Figures: docs/longform.md, "What the
# short first pass bought".
PREFIX_TOKENS = 16
# A prefix is looked for within this many words of where the speaking rate so far expects it, and
# placed only where at least MIN_PREFIX_MATCH of its words match the text in order (else its window
# starts where the rate expects, with the widest zone). Low: tiny.en hears noisy or unusual voices
# badly (down to 3 of 10 words in a window of the benchmark's continuous recording), and a prefix
# placed wrong forces text where the model does not hear it, which unheard_windows catches.
PLACE_BAND_WORDS = 40
MIN_PREFIX_MATCH = 0.25
# A placed start is sure when at least PREFIX_SURE_MATCHES of the prefix's first PREFIX_SURE_WORDS
# words equal the text's at the same places (a misheard word or two leave it sure) and at least
# PREFIX_SURE_SHARE of all its words match. A sure start needs no zone, and none is better: a window
# forced with its neighbour's words gives them its first frames (measured: a 1.5 s error on a
# window's first word behind six such words). An unsure one shares, on each side, as many words as
# the prefix has unmatched (at least the places that differ, at most ZONE_MAX_WORDS) with the window
# before, forced in both (choose_cuts decides): a prefix matching 3 of 10 words was placed 6 words
# late on the benchmark's continuous recording.
PREFIX_SURE_WORDS = 4
PREFIX_SURE_MATCHES = 2
PREFIX_SURE_SHARE = 0.5


def place_prefixes(
    given: Sequence[str],
    prefixes: Sequence[Sequence[str]],
    durations: np.ndarray,
    starts: Sequence[int] | np.ndarray = (0,),
    unsure: Sequence[int] | np.ndarray = (),
) -> tuple[np.ndarray, np.ndarray]:
    """First given word of each window, from the normalised words of its prefix, and, per start after
    the first, the words on each side of it that its window shares with the one before
    (:func:`_zone_words`). A prefix that is empty or of which under MIN_PREFIX_MATCH of the words match
    near where the speaking rate so far expects it starts its window there, ZONE_MAX_WORDS each side
    (a floor sent 12 of 396 windows of a 3-hour recording to the full first pass, when one such
    window sent the whole recording there). ``prefixes`` of the first windows, as many as are heard
    (``durations`` of all of them); ``starts`` and ``unsure`` of those placed before, which stay."""
    starts, unsure = [int(s) for s in starts], [int(u) for u in unsure]
    for window in range(len(starts), len(prefixes)):
        prefix = prefixes[window]
        elapsed = durations[: window - 1].sum()
        rate = starts[-1] / elapsed if starts[-1] and elapsed else len(given) / durations.sum()
        expected = int(round(starts[-1] + rate * durations[window - 1]))
        position, matched = _place(prefix, given, expected, starts[-1])
        if prefix and matched >= MIN_PREFIX_MATCH * len(prefix):
            starts.append(position)
            unsure.append(_zone_words(prefix, given[position : position + PREFIX_SURE_WORDS], matched))
        else:  # where the rate expects it, as unsure as a start can be; unheard_windows decides
            starts.append(max(starts[-1], min(expected, len(given))))
            unsure.append(ZONE_MAX_WORDS)
    return np.array(starts, dtype=np.int64), np.array(unsure, dtype=np.int64)


def _zone_words(prefix: Sequence[str], text: Sequence[str], matched: int) -> int:
    """Words on each side of a start shared with the window before: none if the start is sure
    (PREFIX_SURE_MATCHES of the prefix's first words equal ``text``'s, PREFIX_SURE_SHARE of all its
    words ``matched``), else as many as the prefix has unmatched (at least the first places that
    differ), at most ZONE_MAX_WORDS."""
    same = sum(a == b for a, b in zip(prefix[:PREFIX_SURE_WORDS], text, strict=False))
    if same >= PREFIX_SURE_MATCHES and matched >= PREFIX_SURE_SHARE * len(prefix):
        return 0
    return min(max(PREFIX_SURE_WORDS - same, len(prefix) - matched), ZONE_MAX_WORDS)


def _place(prefix: Sequence[str], given: Sequence[str], expected: int, earliest: int) -> tuple[int, int]:
    """(position, words matched): where the text, read from there, is fewest edits from ``prefix``
    (its end free), within PLACE_BAND_WORDS of ``expected`` and not before ``earliest``; among equals
    the nearest ``expected``, moved back over equal neighbours (a misheard first word costs as much
    substituted as skipped: the speech starts at the earlier)."""
    lo, hi = max(earliest, expected - PLACE_BAND_WORDS), min(len(given), expected + PLACE_BAND_WORDS + 1)
    if lo >= hi or not prefix:
        return max(earliest, min(expected, len(given))), 0
    vocabulary: dict[str, int] = {}
    prefix_ids = np.array([vocabulary.setdefault(w, len(vocabulary)) for w in prefix], dtype=np.int64)
    text_ids = np.array([vocabulary.get(w, -1) for w in given[lo : hi + 2 * len(prefix)]], dtype=np.int64)
    costs = np.array(
        [_prefix_cost(prefix_ids, text_ids[p - lo : p - lo + 2 * len(prefix)]) for p in range(lo, hi)]
    )
    best = np.flatnonzero(costs == costs.min()) + lo
    position = int(best[np.argmin(np.abs(best - expected))])
    while position > lo and costs[position - 1 - lo] == costs[position - lo]:
        position -= 1
    return position, len(prefix) - int(costs.min())


def _prefix_cost(prefix: np.ndarray, text: np.ndarray) -> int:
    """Fewest edits that turn the start of ``text`` (any length) into ``prefix``."""
    row = np.arange(len(text) + 1, dtype=np.int32)
    for i, word in enumerate(prefix, start=1):
        row = edit_row(row, word, text, i)
    return int(row.min())
