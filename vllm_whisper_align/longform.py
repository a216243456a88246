"""Long-form forced alignment: splitting a transcript over the ≤30 s windows of a recording, and
joining the windows back.

Whisper aligns one 30 s window at a time, so text of any length is aligned to audio of any length in
two engine passes, each a batch of all windows (:func:`alignment_steps` drives them):

0. The short way, tried first: each window decodes only its first PREFIX_TOKENS tokens
   (:func:`transcription_plans` with ``max_tokens``), :func:`short_pass` lays each prefix on the text
   (:func:`place_prefixes`) and forces every window's share (step 3), a block of windows at a time.
   A window's words stand unless :func:`unheard_windows` finds in the second pass's own token ranks
   and word spans text the model does not hear, or an aside. Unheard words next to a boundary are
   first shared with the window across it (:func:`rezone`: a start placed wrong); windows that still
   fail and their neighbours (:func:`realign_regions`) go through steps 1-4 with the text they kept
   between them; all windows do if a share overflows the decoder:
1. :func:`transcription_plans`: the windows of ``decoding.plan_transcription`` (cut in pauses by
   ``audio.windows.chunk_audio``), transcribed greedily without word timings: what the model hears in each.
2. :func:`split_text`: the given words are matched to the heard words (normalised, minimum edit
   distance); a matched word belongs to its heard word's window. Between two matches the unmatched
   given words are spread over the windows of the unmatched heard words between them, in proportion.
   Words near a window boundary whose side is uncertain (a *zone*) go into both windows. A long run of
   given words with hardly any heard counterpart is text that is not in the audio: aligned nowhere.
   Heard words with hardly any given counterpart are audio that is not in the text (an aside):
   :func:`extra_audio`.
3. :func:`alignment_plans`: each window's share of the text, teacher-forced on that window
   (``decoding.plan_alignment`` on the window's audio, which carries its offset), with the heard
   words of any aside forced as filler in their place, so that the aside's frames go to them;
   fillers are never returned.
4. :func:`finish`: each zone is cut where the two windows' teacher-forced log-probabilities of its
   words say (a word the window's audio does not hold gets a low one), and every given word comes
   back in order: from its window, or with ``aligned: false``, a zero-length span at the previous
   aligned word's end and probability 0.

Engine-agnostic: this module builds decoding Plans and reads the verbose_json bodies of
``results.finish``; the offline API and the server run the requests.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_whisper_align.align import results
from vllm_whisper_align.align.words import WordTiming, merge_punctuations, split_to_word_tokens
from vllm_whisper_align.audio.decode import SpilledSamples
from vllm_whisper_align.audio.features import true_runs
from vllm_whisper_align.constants import MAX_DECODER_TOKENS, N_SAMPLES, SAMPLE_RATE
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.protocol import DEFAULT_ALIGNMENT_METHOD
from vllm_whisper_align.runners import decoding
from vllm_whisper_align.tokens import WhisperTokens

logger = get_logger(__name__)

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
# Words on each side of a boundary's estimated cut that go into both windows, plus one per word the
# counts disagree by; at most ZONE_MAX_WORDS per side.
ZONE_MARGIN_WORDS = 1
ZONE_MAX_WORDS = 16
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
# Floor of a log-probability when cutting zones (a window without a result scores this per word).
MIN_LOGPROB = -1e4
# What the model hears in each window is read at temperature 0 alone (see transcription_plans).
GREEDY_ONLY = decoding.FallbackOptions(temperatures=(0.0,))


def needs_windows(samples: np.ndarray | SpilledSamples) -> bool:
    """Audio over one window goes through this module; one window keeps the exact single pass."""
    return len(samples) > N_SAMPLES


# ---------------------------------------------------------------------------- words


@dataclass
class TextWord:
    text: str
    tokens: list[int]
    key: str  # normalised for matching: case-folded, without punctuation or spaces


def normalise(word: str) -> str:
    folded = unicodedata.normalize("NFKC", word).casefold()
    return "".join(ch for ch in folded if unicodedata.category(ch)[0] not in "PZ")


def text_words(token_ids: Sequence[int], tokens: WhisperTokens, language: str) -> list[TextWord]:
    """Words of a token sequence exactly as the alignment groups them (``align.words``' split and
    punctuation merge), so a window's result words line up one to one with its share."""
    if not token_ids:
        return []
    words, groups = split_to_word_tokens(
        [*token_ids, tokens.eot], tokens.decode_with_special, tokens.eot, language
    )
    timings = [WordTiming(w, g, 0.0, 0.0, 0.0) for w, g in zip(words[:-1], groups[:-1], strict=True)]
    merge_punctuations(timings)
    return [TextWord(t.word, t.tokens, normalise(t.word)) for t in timings]


def heard_words(text: str, tokens: WhisperTokens, language: str) -> list[TextWord]:
    """Words of a window's transcript, grouped as the given text's words are."""
    if not text.strip():
        return []
    return text_words(tokens.encode(" " + text.strip()), tokens, language)


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
        row = _edit_row(row, given[i - 1], heard, i)
        if i % EDIT_CHECKPOINT_ROWS == 0:
            checkpoints[i] = row
    pairs = []
    i, j = len(given), len(heard)
    while i > 0 and j > 0:
        base = (i - 1) // EDIT_CHECKPOINT_ROWS * EDIT_CHECKPOINT_ROWS
        rows = [checkpoints[base]]
        for k in range(base + 1, i + 1):
            rows.append(_edit_row(rows[-1], given[k - 1], heard, k))
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


def _edit_row(previous: np.ndarray, word: int, heard: np.ndarray, i: int) -> np.ndarray:
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
        repetition = decoding.compression_ratio(" ".join(heard[j] for j in stretch))
        if repetition > decoding.COMPRESSION_RATIO_THRESHOLD:
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


# ---------------------------------------------------------------------------- the short first pass

# The first pass need not hear whole windows to place their text: each window's first PREFIX_TOKENS
# tokens, laid on the text where the speaking rate so far expects them, say where its share begins.
# What only a whole transcript shows (text not in the audio, audio not in the text, a misplaced
# window) is checked on the second pass's own output (unheard_windows); a window that fails the check
# is aligned again, with its neighbours, from a full first pass. Figures: README, "Long-form forced
# alignment".
PREFIX_TOKENS = 16
# The short pass runs PASS_BLOCK_WINDOWS windows' prefixes a step, with the second pass of the windows
# the steps before placed: a window is forced while its encoder output is still in the engine's cache
# (``encoder_cache``; 233 windows of tiny.en in bfloat16, 111 in float32). Run as two whole passes, a
# 3-hour recording's 397 windows encoded 164 twice.
PASS_BLOCK_WINDOWS = 32
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
# (README): spoken text 0.58 at worst, a skipped paragraph of 10-21 words 0.2 at most.
AGREEMENT_SPAN = 12
MIN_AGREEMENT = 0.4
# A kept word spanning longer than this holds audio that is not in the text (an aside measured 6.6 s;
# spoken words at most 1.7 s).
MAX_WORD_SECONDS = 3.0


def place_prefixes(
    given: Sequence[str],
    prefixes: Sequence[Sequence[str]],
    durations: np.ndarray,
    starts: Sequence[int] = (0,),
    unsure: Sequence[int] = (),
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
        row = _edit_row(row, word, text, i)
    return int(row.min())


def prefix_split(words: list[TextWord], starts: np.ndarray, unsure: np.ndarray) -> Split:
    """Given words over windows that begin at ``starts``: every word aligned, ``unsure`` (per start
    after the first) on each side of a start in both windows."""
    estimates = np.asarray(starts[1:], dtype=np.int64)
    margins = np.asarray(unsure, dtype=np.int64)
    zones = np.clip(np.stack([estimates - margins, estimates + margins], axis=1), 0, len(words))
    zones = np.maximum.accumulate(zones, axis=0) if len(zones) else zones
    return Split(words, np.ones(len(words), dtype=bool), estimates, zones, [[] for _ in starts])


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


def choose_cuts(split: Split, logprobs: Sequence[np.ndarray]) -> np.ndarray:
    """Per boundary, the first word of window w + 1: where the zone's words are likeliest.

    ``logprobs[w]``: teacher-forced log-probability of each word of ``split.share(w)`` in window w."""
    cuts = split.estimates.copy()
    for boundary, (lo, hi) in enumerate(split.zones):
        if hi <= lo:
            continue
        left = _zone_scores(split, boundary, logprobs[boundary], lo, hi)
        right = _zone_scores(split, boundary + 1, logprobs[boundary + 1], lo, hi)
        if left is None:
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


# ---------------------------------------------------------------------------- plans


def check_method(alignment_method: str) -> None:
    """Characters are aligned one window at a time only: a long text's split over windows counts
    the given words' tokens (``Split``), which characters would not keep."""
    if alignment_method == "characters":
        raise decoding.AlignmentInputError(
            f"alignment_method characters aligns audio of at most {decoding.MAX_ALIGNMENT_SECONDS} s "
            "(one window); use auto or fixed for longer audio"
        )


def transcription_plans(
    samples: np.ndarray | SpilledSamples,
    tokens: WhisperTokens,
    language: str,
    suppress_tokens: Sequence[int],
    max_tokens: int | None = None,
) -> list[decoding.Plan]:
    """One greedy transcription plan per window (no word timings): what the model hears in each, or
    its first ``max_tokens`` tokens (:func:`short_pass`).

    Greedy only: a window that fails openai-whisper's thresholds is not sampled again at higher
    temperatures. Its greedy words still locate the text (matching tolerates misheard words), and
    each retry would decode the window again.
    """
    plan = decoding.plan_transcription(
        samples,
        tokens,
        language=language,
        word_timestamps=False,
        suppress_tokens=suppress_tokens,
        fallback=GREEDY_ONLY,
        sampling={"max_tokens": max_tokens} if max_tokens else None,
    )
    return [
        decoding.Plan([w], w.duration, plan.language, plan.task, False, plan.fallback) for w in plan.windows
    ]


def alignment_plans(
    heard: Sequence[decoding.Plan],
    bodies: Sequence[dict[str, Any]],
    tokens: WhisperTokens,
    given: list[TextWord],
    language: str,
    alignment_method: str = DEFAULT_ALIGNMENT_METHOD,
) -> tuple[Split, list[decoding.Plan | None]]:
    """The given words (:func:`text_words`) split over the windows of ``heard`` (transcribed as
    ``bodies``), and one alignment plan per window (None for a window without text)."""
    transcribed = [heard_words(body["text"], tokens, language) for body in bodies]
    split = split_text(given, [[w.key for w in words] for words in transcribed])
    return split, window_plans(split, heard, transcribed, tokens, language, alignment_method)


def window_plans(
    split: Split,
    heard: Sequence[decoding.Plan],
    transcribed: Sequence[Sequence[TextWord]],
    tokens: WhisperTokens,
    language: str,
    alignment_method: str,
    windows: Sequence[int] | None = None,
) -> list[decoding.Plan | None]:
    """One alignment plan per window of ``heard`` (or of those of its ``windows``) for its share of
    ``split`` (None for a window without text), with the fillers of ``split.extra`` (indices into
    ``transcribed``, its heard words)."""
    room = MAX_DECODER_TOKENS - len(tokens.transcription_prompt(language)) - 1
    plans: list[decoding.Plan | None] = []
    for index in range(len(heard)) if windows is None else windows:
        window = heard[index].windows[0]
        share = split.share_tokens(index)
        if not share:
            plans.append(None)
            continue
        if len(share) > room:
            raise decoding.AlignmentInputError(
                f"the text that falls in {window.offset:.1f}-{window.offset + window.duration:.1f} s is "
                f"{len(share)} tokens; at most {room} fit in Whisper's {MAX_DECODER_TOKENS}-token "
                "decoder context"
            )
        fillers = [(before, transcribed[index][j].tokens) for before, j in split.extra[index]]
        if len(share) + sum(len(t) for _, t in fillers) <= room:  # else the text alone, as before
            split.fillers[index] = fillers
        forced = split.items(index, split.fillers.get(index, ()))
        share = [t for _, word_tokens in forced for t in word_tokens]
        aligned = decoding.plan_alignment(
            window.audio, tokens, token_ids=share, language=language, alignment_method=alignment_method
        )
        aligned.report_ranks = True
        plans.append(aligned)
    return plans


def second_pass_order(plans: Sequence[decoding.Plan | None]) -> list[int]:
    """Indices of the windows to align (those with text), last transcribed first: when a recording has
    more windows than the engine's encoder cache holds (``encoder_cache``), the cache has kept the
    newest, and these come back before the least recently used are dropped to make room."""
    return [k for k in range(len(plans) - 1, -1, -1) if plans[k] is not None]


def in_window_order(
    order: Sequence[int], bodies: Sequence[dict[str, Any]], num_windows: int
) -> list[dict[str, Any] | None]:
    """The bodies of windows run in ``order`` (:func:`second_pass_order`) put back in window order,
    None for a window without text."""
    placed: list[dict[str, Any] | None] = [None] * num_windows
    for k, body in zip(order, bodies, strict=True):
        placed[k] = body
    return placed


# ---------------------------------------------------------------------------- the steps

# What a step asks the caller to run: a name (for request ids) and its plans, run concurrently.
Step = tuple[str, list[decoding.Plan]]
# A recording's alignment, step by step: each ``yield`` hands out a Step and takes back its plans'
# bodies, in order; the generator returns the finished body.
Steps = Generator[Step, list[dict[str, Any]], dict[str, Any]]


def alignment_steps(
    samples: np.ndarray | SpilledSamples,
    token_ids: Sequence[int],
    tokens: WhisperTokens,
    language: str,
    suppress_tokens: Sequence[int],
    alignment_method: str = DEFAULT_ALIGNMENT_METHOD,
) -> Steps:
    """The engine work of one recording's long-form alignment (module docstring): the short first pass
    and its second pass; then, for the windows whose text fails :func:`unheard_windows` even with
    the boundaries next to its unheard words shared (:func:`rezone`), and their neighbours
    (:func:`realign_regions`), or for all of them if a prefix's share overflowed the
    decoder, a full first pass and a second pass over the text those windows kept. Both doors drive
    it: the offline API runs one step of every recording in one ``generate`` call, the server each
    step's plans concurrently."""
    given = text_words(token_ids, tokens, language)
    prefixes = transcription_plans(samples, tokens, language, suppress_tokens, PREFIX_TOKENS)
    reading = yield from short_pass(prefixes, given, tokens, language, alignment_method)
    if reading is None:
        regions = [(0, len(prefixes))]
    else:
        unheard = unheard_words(reading)
        failed = unheard_windows(reading, unheard)
        if failed.any():
            first_failed = int(failed.sum())
            reading = yield from rezone(reading, unheard, prefixes, tokens, language, alignment_method)
            failed = unheard_windows(reading)
            logger.info(
                "Long-form alignment: %d of %d windows failed the check, %d still do with the "
                "boundaries next to their unheard words shared",
                first_failed,
                len(prefixes),
                int(failed.sum()),
            )
        regions = realign_regions(failed)
    if regions:
        logger.info(
            "Long-form alignment: %d of %d windows from a full first pass (%s)",
            sum(end - first for first, end in regions),
            len(prefixes),
            "a share overflowed the decoder" if reading is None else f"{int(failed.sum())} failed the check",
        )
        full = transcription_plans(samples, tokens, language, suppress_tokens)
        wanted = [k for first, end in regions for k in range(first, end)]
        transcripts = dict(zip(wanted, (yield "h", [full[k] for k in wanted]), strict=True))
        ranges = [reading.text_range(*region) if reading else (0, len(given)) for region in regions]
        redo = [
            alignment_plans(
                full[first:end],
                [transcripts[k] for k in range(first, end)],
                tokens,
                given[lo:hi],
                language,
                alignment_method,
            )
            for (first, end), (lo, hi) in zip(regions, ranges, strict=True)
        ]
        bodies = iter((yield from _second_pass("a", [p for _, plans in redo for p in plans])))
        for (first, _), (lo, _), (split, plans) in zip(regions, ranges, redo, strict=True):
            redone = Reading.read(split, plans, [next(bodies) for _ in plans], lo)
            if reading is None:
                reading = redone
            else:
                reading.replace(first, lo, redone)
    return finish(given, reading, tokens, len(samples) / SAMPLE_RATE, language)


def short_pass(
    prefixes: Sequence[decoding.Plan],
    given: list[TextWord],
    tokens: WhisperTokens,
    language: str,
    alignment_method: str,
) -> Generator[Step, list[dict[str, Any]], Reading | None]:
    """Step 0 of the module docstring: each window's prefix (``prefixes``, :func:`transcription_plans`
    with PREFIX_TOKENS) heard and placed (:func:`place_prefixes`), and its share forced, in blocks of
    PASS_BLOCK_WINDOWS; the second pass read (None where a share would not fit the decoder: the
    recording takes the full first pass). A window's share is known once the next window is placed,
    so each step forces the shares the steps before placed while the next block is heard."""
    keys = [w.key for w in given]
    durations = np.array([plan.windows[0].duration for plan in prefixes])
    heard: list[list[str]] = []
    starts, unsure = np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    plans: list[decoding.Plan | None] = [None] * len(prefixes)
    bodies: list[dict[str, Any] | None] = [None] * len(prefixes)
    forced, step = 0, 0
    while forced < len(prefixes):
        listen = range(len(heard), min(len(heard) + PASS_BLOCK_WINDOWS, len(prefixes)))
        known = len(heard) if len(heard) == len(prefixes) else max(len(heard) - 1, 0)
        force = range(forced, known)
        if force:
            split = prefix_split(given, starts, unsure)
            try:
                plans[forced:known] = window_plans(
                    split, prefixes, [[] for _ in prefixes], tokens, language, alignment_method, force
                )
            except decoding.AlignmentInputError:  # a share too long for the decoder: the full pass decides
                return None
        with_text = [w for w in force if plans[w] is not None]
        asked = [prefixes[w] for w in listen] + [plans[w] for w in with_text]
        answers = (yield f"p{step}-", asked) if asked else []
        heard += [[w.key for w in heard_words(b["text"], tokens, language)] for b in answers[: len(listen)]]
        for w, body in zip(with_text, answers[len(listen) :], strict=True):
            bodies[w] = body
        starts, unsure = place_prefixes(keys, heard, durations, starts, unsure)
        forced, step = known, step + 1
    return Reading.read(prefix_split(given, starts, unsure), plans, bodies)


def rezone(
    reading: Reading,
    unheard: np.ndarray,
    prefixes: Sequence[decoding.Plan],
    tokens: WhisperTokens,
    language: str,
    alignment_method: str,
) -> Generator[Step, list[dict[str, Any]], Reading]:
    """The short pass's ``reading`` with each boundary next to its ``unheard`` words
    (:func:`unheard_words`) shared over them (:func:`widen_zones`), so that :func:`choose_cuts` can
    move a start the prefix placed wrong (the model's transcript skipped a window's first sentences:
    its prefix, and a full first pass, miss them). One forced pass of the windows whose share grew;
    the others keep their answers."""
    split = widen_zones(reading.split, reading.cuts, reading.owner, unheard, REZONE_WORDS)
    changed = [
        w for w in range(split.num_windows) if not np.array_equal(split.share(w), reading.split.share(w))
    ]
    if not changed:
        return reading
    plans, bodies = list(reading.plans), list(reading.bodies)
    try:
        for w, plan in zip(
            changed,
            window_plans(
                split, prefixes, [[] for _ in prefixes], tokens, language, alignment_method, changed
            ),
            strict=True,
        ):
            plans[w], bodies[w] = plan, None
    except decoding.AlignmentInputError:  # a widened share too long for the decoder: the full pass decides
        return reading
    answers = yield from _second_pass("z", [plan if w in changed else None for w, plan in enumerate(plans)])
    for w in changed:
        bodies[w] = answers[w]
    return Reading.read(split, plans, bodies)


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


def _second_pass(name: str, plans: Sequence[decoding.Plan | None]) -> Generator[Step, Any, list]:
    """The windows with text, in :func:`second_pass_order`; their bodies back in window order."""
    order = second_pass_order(plans)
    bodies = (yield name, [plans[k] for k in order]) if order else []
    return in_window_order(order, bodies, len(plans))


def advance(steps: Steps, bodies: list[dict[str, Any]] | None) -> tuple[Step | None, dict[str, Any] | None]:
    """(the next step, None), or (None, the finished body): ``steps`` given the last step's bodies
    (None to start). StopIteration cannot cross an asyncio future, hence this."""
    try:
        return steps.send(bodies), None
    except StopIteration as done:
        return None, done.value


# ---------------------------------------------------------------------------- joining


@dataclass
class Reading:
    """A second pass read against its split: each window's result, and the window that keeps each
    given word (after :func:`choose_cuts`)."""

    windows: list[_WindowWords]
    plans: list[decoding.Plan | None]
    cuts: np.ndarray  # per boundary: the first word kept by the window after it
    owner: np.ndarray  # per given word: its window, -1 where aligned nowhere
    # What it was read from (rezone forces some windows again); :meth:`replace` leaves them.
    split: Split
    bodies: list[dict[str, Any] | None]

    @classmethod
    def read(
        cls,
        split: Split,
        plans: Sequence[decoding.Plan | None],
        bodies: Sequence[dict[str, Any] | None],
        first_word: int = 0,
    ) -> Reading:
        """``bodies`` (per window, in window order) against ``split``, whose words are the given
        words from ``first_word`` on."""
        windows = [_WindowWords.read(split, w, body, first_word) for w, body in enumerate(bodies)]
        cuts = choose_cuts(split, [w.logprobs for w in windows])
        return cls(windows, list(plans), cuts, owners(split, cuts), split, list(bodies))

    def text_range(self, first: int, end: int) -> tuple[int, int]:
        """[lo, hi) of the given words kept by windows [first, end), all of them aligned."""
        lo = int(self.cuts[first - 1]) if first > 0 else 0
        hi = int(self.cuts[end - 1]) if end < len(self.windows) else len(self.owner)
        return lo, hi

    def replace(self, first: int, first_word: int, redone: Reading) -> None:
        """Windows from ``first`` on, and the words they keep from ``first_word`` on, as ``redone``
        read them."""
        end, hi = first + len(redone.windows), first_word + len(redone.owner)
        self.windows[first:end] = redone.windows
        self.plans[first:end] = redone.plans
        self.owner[first_word:hi] = np.where(redone.owner >= 0, redone.owner + first, -1)


def finish(
    given: list[TextWord], reading: Reading, tokens: WhisperTokens, duration: float, language: str
) -> dict[str, Any]:
    """Every given word in order, from the window that keeps it, as ``results.finish``'s body
    (+ ``aligned`` on each word)."""
    taken = [
        reading.windows[window].take(index, word) if window >= 0 else None
        for index, (window, word) in enumerate(zip(reading.owner, given, strict=True))
    ]
    flags = [piece is not None for piece in taken]
    places = _unaligned_times([piece[0] if piece else None for piece in taken])
    words: list[results.Word] = []
    timings: list[results.TokenTiming] = []
    for word, piece, place in zip(given, taken, places, strict=True):
        word_result, token_timings = piece if piece is not None else _unaligned(word, place, tokens)
        words.append(word_result)
        timings += token_timings
    _monotonic(words)
    segments = [
        segment
        for window, plan in zip(reading.windows, reading.plans, strict=True)
        if plan is not None
        for segment in window.segments(plan.windows[0], tokens)
    ]
    plan = decoding.Plan([], duration, language, "align", True)
    body = results.assemble(plan, [results.WindowResult(segments, words, timings)])
    body["text"] = tokens.decode([t for w in given for t in w.tokens]).strip()
    for entry, flag in zip(body["words"], flags, strict=True):
        entry["aligned"] = flag
    errors = [e for window in reading.windows for e in window.errors]
    if errors:
        body["alignment_errors"] = errors
    return body


def mark_aligned(body: dict[str, Any]) -> dict[str, Any]:
    """A single-window alignment's body in the long form's shape: every word aligned."""
    for word in body.get("words") or []:
        word["aligned"] = True
    return body


class _WindowWords:
    """One window's alignment result, by given-word index (its fillers are read past)."""

    def __init__(self, items: list[Item], body: dict[str, Any] | None, first_word: int = 0):
        given = [(position, index) for position, (index, _) in enumerate(items) if index >= 0]
        # given word (counted from the recording's first, hence first_word) -> item position
        self.share = {first_word + index: position for position, index in given}
        self.given_positions = np.array([position for position, _ in given], dtype=np.int64)
        self.num_items = len(items)
        self.words: list[dict] = (body.get("words") or []) if body else []
        self.tokens: list[dict] = (body.get("tokens") or []) if body else []
        self.ranks: list[int] = (body.get("token_ranks") or []) if body else []
        self.errors: list[Any] = body.get("alignment_errors", []) if body else []
        self.usable = body is not None and len(self.tokens) == sum(len(t) for _, t in items)
        self.token_start = np.zeros(len(items) + 1, dtype=np.int64)
        self.token_start[1:] = np.cumsum([len(item_tokens) for _, item_tokens in items])
        self.chosen: list[tuple[results.Word, list[float]]] = []

    @classmethod
    def read(
        cls, split: Split, window: int, body: dict[str, Any] | None, first_word: int = 0
    ) -> _WindowWords:
        return cls(split.items(window, split.fillers.get(window, ())), body, first_word)

    def said(self, index: int) -> np.ndarray | None:
        """Per token of given word ``index``: whether the model would have said it there (rank 1);
        None without a result or ranks for it."""
        position = self.share.get(index)
        if not self.usable or position is None or len(self.ranks) != self.token_start[-1]:
            return None
        return np.asarray(self.ranks[self.token_start[position] : self.token_start[position + 1]]) == 1

    def seconds(self, index: int) -> float:
        """How long given word ``index`` lasts by the word rules (0 without them)."""
        position = self.share.get(index)
        if position is None or len(self.words) != self.num_items:
            return 0.0
        return self.words[position]["end"] - self.words[position]["start"]

    @property
    def logprobs(self) -> np.ndarray:
        """Teacher-forced log-probability of each share word (MIN_LOGPROB each without a result)."""
        if not self.usable:
            return np.full(len(self.share), MIN_LOGPROB)
        if not self.num_items:
            return np.zeros(0)
        token_logprobs = np.log(np.maximum([t["probability"] for t in self.tokens], 1e-30))
        return np.add.reduceat(token_logprobs, self.token_start[:-1])[self.given_positions]

    def take(self, index: int, word: TextWord) -> tuple[results.Word, list[results.TokenTiming]] | None:
        position = self.share.get(index)
        if not self.usable or position is None:
            return None
        pieces = self.tokens[self.token_start[position] : self.token_start[position + 1]]
        timings = [results.TokenTiming(**piece) for piece in pieces]
        if len(self.words) == self.num_items:  # the word rules' times (durations, out of silence)
            timed = self.words[position]
            start, end, probability = timed["start"], timed["end"], timed["probability"]
        else:
            start, end = timings[0].start, timings[-1].end
            probability = float(np.mean([t.probability for t in timings]))
        chosen = results.Word(start, end, word.text, probability, list(word.tokens))
        self.chosen.append((chosen, [float(np.log(max(t.probability, 1e-30))) for t in timings]))
        return chosen, timings

    def segments(self, window: decoding.WindowRequest, tokens: WhisperTokens) -> list[results.Segment]:
        if not self.chosen:
            return []
        words = [w for w, _ in self.chosen]
        ids = [t for w in words for t in w.tokens]
        output = decoding.WindowOutput(ids, [lp for _, lps in self.chosen for lp in lps])
        segments, _ = results.window_segments(window, output, words, tokens.decode(ids))
        return segments


def _unaligned(word: TextWord, time: float, tokens: WhisperTokens):
    """A word aligned nowhere: zero length at ``time``, probability 0."""
    timings = [results.TokenTiming(t, tokens.decode_with_special([t]), time, time, 0.0) for t in word.tokens]
    return results.Word(time, time, word.text, 0.0, list(word.tokens)), timings


def _unaligned_times(aligned: list[results.Word | None]) -> np.ndarray:
    """Where each unaligned word sits: the previous aligned word's end, else the next one's start."""
    ends = np.array([np.nan if w is None else w.end for w in aligned], dtype=np.float64)
    starts = np.array([np.nan if w is None else w.start for w in aligned], dtype=np.float64)
    known = np.flatnonzero(~np.isnan(ends))
    if len(known) == 0:
        return np.zeros(len(aligned))
    previous = np.searchsorted(known, np.arange(len(aligned)), side="right") - 1
    return np.where(previous >= 0, ends[known[np.maximum(previous, 0)]], starts[known[0]])


def _monotonic(words: list[results.Word]) -> None:
    """Starts never go back across window joins; a word never ends before it starts."""
    latest = 0.0
    for word in words:
        word.start = max(word.start, latest)
        word.end = max(word.end, word.start)
        latest = word.start
