"""Where each given word may be: its window's share of the text, with the words near a boundary
(a zone) forced in both windows, and the cut chosen where the forced log-probabilities say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from vllm_whisper_align.longform.matching import anchors, extra_audio, not_in_audio
from vllm_whisper_align.longform.words import TextWord

# Words on each side of a boundary's estimated cut that go into both windows, plus one per word the
# counts disagree by; at most ZONE_MAX_WORDS per side.
ZONE_MARGIN_WORDS = 1
ZONE_MAX_WORDS = 16
# Floor of a log-probability when cutting zones (a window without a result scores this per word).
MIN_LOGPROB = -1e4


# ---------------------------------------------------------------------------- splitting


# A word forced in a window: (index of the given word, or -1 for a filler; its token ids).
Item = tuple[int, list[int]]
# Heard words forced as filler: (index of the given word they precede; their token ids).
Filler = tuple[int, list[int]]


@dataclass
class Split:
    """Where each given word may be: its window share, or nowhere."""

    words: list[TextWord]
    aligned: np.ndarray  # bool per word; False: not in the audio, forced in no window
    estimates: np.ndarray  # per boundary (window w | w + 1): first word estimated in window w + 1
    zones: np.ndarray  # per boundary: [lo, hi) of the words forced in both windows (lo == hi: none)
    # Per window: heard words not in the text (extra_audio), as (the given word they precede, their
    # index among the window's heard words); alignment_plans forces them as filler where they fit.
    extra: list[list[tuple[int, int]]] = field(default_factory=list)
    # Per window: the fillers its plan forces, as (the given word they precede, tokens).
    fillers: dict[int, list[Filler]] = field(default_factory=dict)

    @property
    def num_windows(self) -> int:
        return len(self.estimates) + 1

    def share(self, window: int) -> np.ndarray:
        """Indices of the words forced in ``window``: its words and the zones on both sides."""
        lo = self.zones[window - 1, 0] if window > 0 else 0
        hi = self.zones[window, 1] if window < len(self.zones) else len(self.words)
        return lo + np.flatnonzero(self.aligned[lo:hi])

    def share_tokens(self, window: int) -> list[int]:
        return [t for i in self.share(window) for t in self.words[i].tokens]

    def items(self, window: int, fillers: Sequence[Filler] = ()) -> list[Item]:
        """The window's forced words in order as ``(given index, tokens)``: its share, with each filler
        ``(the given word it precedes, tokens)`` before that word, marked -1."""
        items: list[Item] = []
        pending = list(fillers)
        for index in self.share(window):
            while pending and pending[0][0] <= index:
                items.append((-1, list(pending.pop(0)[1])))
            items.append((int(index), list(self.words[index].tokens)))
        return items + [(-1, list(tokens)) for _, tokens in pending]


def split_text(words: list[TextWord], heard: Sequence[Sequence[str]]) -> Split:
    """Given words over windows, from the normalised words heard in each window."""
    num_windows = len(heard)
    heard_all = [key for keys in heard for key in keys]
    heard_window = np.repeat(np.arange(num_windows), [len(keys) for keys in heard])
    ai, aj, pairs = anchors([w.key for w in words], heard_all)
    aligned = ~not_in_audio(len(words), len(heard_all), ai, aj)
    ai, aj = ai[aligned[ai]], aj[aligned[ai]]  # matches inside text not in the audio are chance
    first_heard = np.searchsorted(heard_window, np.arange(num_windows + 1))  # per window; M at the end
    anchor_window = heard_window[aj]
    active = np.flatnonzero(aligned)
    estimates = np.zeros(max(0, num_windows - 1), dtype=np.int64)
    zones = np.zeros((len(estimates), 2), dtype=np.int64)
    for boundary in range(len(estimates)):
        k = int(np.searchsorted(anchor_window, boundary, side="right"))  # anchors in windows <= boundary
        given_before, heard_before = (ai[k - 1], aj[k - 1]) if k > 0 else (-1, -1)
        given_after, heard_after = (ai[k], aj[k]) if k < len(ai) else (len(words), len(heard_all))
        between = active[
            np.searchsorted(active, given_before, side="right") : np.searchsorted(active, given_after)
        ]
        heard_split = min(max(first_heard[boundary + 1], heard_before + 1), heard_after)
        estimates[boundary], zones[boundary] = _boundary(
            between, heard_split - heard_before - 1, heard_after - heard_split, given_after
        )
    # Boundaries never cross: window shares run forward.
    estimates = np.maximum.accumulate(estimates) if len(estimates) else estimates
    zones = np.maximum.accumulate(zones, axis=0) if len(zones) else zones
    extra: list[list[tuple[int, int]]] = [[] for _ in range(num_windows)]
    for j, before in extra_audio(ai, aj, pairs, len(words), heard_all):
        extra[heard_window[j]].append((before, j - first_heard[heard_window[j]]))
    return Split(words, aligned, estimates, zones, extra)


def _boundary(
    between: np.ndarray, heard_left: int, heard_right: int, given_after: int
) -> tuple[int, np.ndarray]:
    """Estimated cut and zone of a boundary from the unmatched words around it: ``between`` (given
    word indices) against ``heard_left`` / ``heard_right`` unmatched heard words on either side."""
    count = len(between)
    if count == 0:
        return given_after, np.array([given_after, given_after])
    heard = heard_left + heard_right
    if heard == 0:  # nothing heard between the anchors: every word may be on either side
        return int(between[count // 2]), np.array([between[0], between[-1] + 1])
    position = int(round(count * heard_left / heard))
    margin = min(ZONE_MARGIN_WORDS + abs(count - heard), ZONE_MAX_WORDS)
    lo, hi = max(0, position - margin), min(count, position + margin)
    estimate = int(between[position]) if position < count else int(between[-1]) + 1
    zone = np.array([between[lo], between[hi - 1] + 1]) if hi > lo else np.array([estimate, estimate])
    return estimate, zone


def prefix_split(words: list[TextWord], starts: np.ndarray, unsure: np.ndarray) -> Split:
    """Given words over windows that begin at ``starts``: every word aligned, ``unsure`` (per start
    after the first) on each side of a start in both windows."""
    estimates = np.asarray(starts[1:], dtype=np.int64)
    margins = np.asarray(unsure, dtype=np.int64)
    zones = np.clip(np.stack([estimates - margins, estimates + margins], axis=1), 0, len(words))
    zones = np.maximum.accumulate(zones, axis=0) if len(zones) else zones
    return Split(words, np.ones(len(words), dtype=bool), estimates, zones, [[] for _ in starts])


def choose_cuts(split: Split, logprobs: Sequence[np.ndarray]) -> np.ndarray:
    """Per boundary, the first word of window w + 1: where the zone's words are likeliest.

    ``logprobs[w]``: teacher-forced log-probability of each word of ``split.share(w)`` in window w."""
    cuts = split.estimates.copy()
    for boundary, (lo, hi) in enumerate(split.zones):
        if hi <= lo:
            continue
        left = _zone_scores(split, boundary, logprobs[boundary], lo, hi)
        right = _zone_scores(split, boundary + 1, logprobs[boundary + 1], lo, hi)
        if left is None or right is None:
            continue
        positions = lo + np.flatnonzero(split.aligned[lo:hi])
        # score[c]: words before position c from the left window, the rest from the right one.
        from_left = np.concatenate([[0.0], np.cumsum(left)])
        from_right = np.concatenate([np.cumsum(right[::-1])[::-1], [0.0]])
        score = from_left + from_right
        candidates = np.append(positions, hi)
        best = np.flatnonzero(score >= score.max() - 1e-9)
        cuts[boundary] = candidates[best[np.argmin(np.abs(candidates[best] - split.estimates[boundary]))]]
    return np.maximum.accumulate(cuts) if len(cuts) else cuts


def _zone_scores(split: Split, window: int, logprobs: np.ndarray, lo: int, hi: int) -> np.ndarray | None:
    share = split.share(window)
    inside = (share >= lo) & (share < hi)
    if not inside.any():
        return None
    return np.maximum(np.asarray(logprobs, dtype=np.float64)[inside], MIN_LOGPROB)


def owners(split: Split, cuts: np.ndarray) -> np.ndarray:
    """Window of each given word (-1: not aligned)."""
    window = np.searchsorted(cuts, np.arange(len(split.words)), side="right")
    return np.where(split.aligned, window, -1)
