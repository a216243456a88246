"""The second pass checked on its own output (its token ranks and word spans): which words the model
does not hear where they were forced, the boundaries widened over them (rezone), and the windows
that go through a full first pass again.
"""

from __future__ import annotations

import numpy as np

from vllm_whisper_align.audio.features import true_runs
from vllm_whisper_align.longform.join import Reading
from vllm_whisper_align.longform.split import ZONE_MAX_WORDS, Split

# When windows fail the check (unheard_windows), each boundary with unheard words within REZONE_WORDS
# of its cut is first shared over them, and the window across it forced again with them (rezone): a
# start placed wrong, as when the model's transcript skips a window's first sentences (14 words, 4 s of
# Opus-coded continuous speech with tiny.en), is mended by one forced pass of a window or two; only the
# windows that still fail go through a full first pass.
REZONE_WORDS = ZONE_MAX_WORDS
# Such a run of unheard words may hold this many heard words in a row (a word the model would say
# anywhere: "the", "of").
REZONE_GAP_WORDS = 2
# Every AGREEMENT_SPAN consecutive tokens of the text, each read in the window that keeps it, must hold
# at least MIN_AGREEMENT tokens the model would have picked itself there (rank 1). Measured on tiny.en
# (docs/longform.md): spoken text 0.58 at worst, a skipped paragraph of 10-21 words 0.2 at most.
AGREEMENT_SPAN = 12
MIN_AGREEMENT = 0.4
# A kept word spanning longer than this holds audio that is not in the text (an aside measured 6.6 s;
# spoken words at most 1.7 s).
MAX_WORD_SECONDS = 3.0


def unheard_windows(reading: Reading, unheard: np.ndarray | None = None) -> np.ndarray:
    """Per window of a :func:`prefix_split`'s second pass, whether the text it keeps fails what a full
    first pass would have caught: it keeps a word of :func:`unheard_words` (``unheard``, where the
    caller has them already)."""
    unheard = unheard_words(reading) if unheard is None else unheard
    failed = np.zeros(len(reading.windows), dtype=bool)
    failed[reading.owner[unheard & (reading.owner >= 0)]] = True
    return failed


def unheard_words(reading: Reading) -> np.ndarray:
    """Per given word, whether the window that keeps it has no usable result for it, or it holds a
    token of a stretch the model does not hear: some AGREEMENT_SPAN consecutive tokens (read in
    text order across windows, so that a paragraph cut by a boundary is seen whole) holding under
    MIN_AGREEMENT tokens the model would have said itself; or it spans an aside (MAX_WORD_SECONDS)."""
    unheard = np.zeros(len(reading.owner), dtype=bool)
    agreement: list[np.ndarray] = []
    holder: list[np.ndarray] = []
    for index, window in enumerate(reading.owner):
        if window < 0:
            continue
        words = reading.windows[window]
        said = words.said(index)
        if said is None:
            unheard[index] = True
            continue
        agreement.append(said)
        holder.append(np.full(len(said), index))
        unheard[index] |= words.seconds(index) > MAX_WORD_SECONDS
    if agreement:
        unheard[np.concatenate(holder)[_disagreeing(np.concatenate(agreement))]] = True
    return unheard


def _disagreeing(agreement: np.ndarray) -> np.ndarray:
    """Per token, whether it is not of rank 1 and lies in AGREEMENT_SPAN consecutive tokens (all, if
    fewer) holding under MIN_AGREEMENT tokens of rank 1 (the window before such a stretch keeps
    only tokens the model would say, and passes)."""
    span = min(AGREEMENT_SPAN, len(agreement))
    counts = np.convolve(agreement.astype(np.float64), np.ones(span), mode="valid")
    low = (counts < MIN_AGREEMENT * span - 1e-9).astype(np.float64)
    return (np.convolve(low, np.ones(span), mode="full")[: len(agreement)] > 0) & ~agreement


def realign_regions(failed: np.ndarray) -> list[tuple[int, int]]:
    """The windows to align again from a full first pass, as [first, end) runs: each failed window
    and its neighbours (a misplaced or skipped stretch moves the text at the boundaries it shares),
    runs that meet merged."""
    failed = np.asarray(failed, dtype=bool)
    marked = failed.copy()
    marked[1:] |= failed[:-1]
    marked[:-1] |= failed[1:]
    starts, ends = true_runs(marked)
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def widen_zones(split: Split, cuts: np.ndarray, owner: np.ndarray, unheard: np.ndarray, reach: int) -> Split:
    """``split`` with each boundary's zone reaching over the ``unheard`` words that run from its cut
    (``cuts``; :func:`_unheard_run`) into the window before, which then may be the next window's,
    or into the window after, which then may be the previous one's (``owner``: each word's window).
    Zones keep running forward."""
    zones = split.zones.copy()
    for boundary, cut in enumerate(cuts):
        before = _unheard_run(unheard, owner == boundary, cut, -1, reach)
        after = _unheard_run(unheard, owner == boundary + 1, cut, 1, reach)
        if before is not None:
            zones[boundary] = [min(zones[boundary, 0], before), max(zones[boundary, 1], cut)]
        if after is not None:
            zones[boundary] = [min(zones[boundary, 0], cut), max(zones[boundary, 1], after + 1)]
    zones = np.maximum.accumulate(zones, axis=0) if len(zones) else zones
    return Split(split.words, split.aligned, split.estimates, zones, split.extra, dict(split.fillers))


def _unheard_run(unheard: np.ndarray, kept: np.ndarray, cut: int, direction: int, reach: int) -> int | None:
    """The farthest word of a run of ``unheard`` words among the ``kept`` ones that starts at ``cut``
    (going back from the word before it, direction -1, or on from it, +1) and goes on while at most
    REZONE_GAP_WORDS kept words in a row are heard, within ``reach`` words; None without one."""
    farthest, gap = None, 0
    first = cut - 1 if direction < 0 else cut
    for index in range(first, first + direction * reach, direction):
        if not 0 <= index < len(unheard) or not kept[index]:
            break
        if unheard[index]:
            farthest, gap = index, 0
        else:
            gap += 1
            if gap > REZONE_GAP_WORDS:
                break
    return farthest
