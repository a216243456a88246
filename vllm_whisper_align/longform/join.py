"""Joining a second pass: each window's forced transcript read against its share of the text, the cut
at every boundary chosen, and every given word taken, in order, from the window that keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from vllm_whisper_align.align.results import (
    DecodedWindow,
    RequestInfo,
    Segment,
    TokenTiming,
    Transcript,
    WindowOutput,
    WindowResult,
    assemble,
    window_segments,
)
from vllm_whisper_align.align.words import Word, tokens_of
from vllm_whisper_align.audio.windows import AudioChunk
from vllm_whisper_align.longform.split import MIN_LOGPROB, Item, Split, choose_cuts, owners
from vllm_whisper_align.longform.words import TextWord
from vllm_whisper_align.tokens import WhisperTokens

if TYPE_CHECKING:
    from vllm_whisper_align.longform.steps import Force


@dataclass
class Reading:
    """A second pass read against its split: each window's result, and the window that keeps each
    given word (after :func:`choose_cuts`)."""

    windows: list[_WindowWords]
    jobs: list[Force | None]
    cuts: np.ndarray  # per boundary: the first word kept by the window after it
    owner: np.ndarray  # per given word: its window, -1 where aligned nowhere
    # What it was read from (rezone forces some windows again); :meth:`replace` leaves them.
    split: Split
    transcripts: list[Transcript | None]

    @classmethod
    def read(
        cls,
        split: Split,
        jobs: Sequence[Force | None],
        transcripts: Sequence[Transcript | None],
        first_word: int = 0,
    ) -> Reading:
        """``transcripts`` (per window, in window order) against ``split``, whose words are the given
        words from ``first_word`` on."""
        windows = [
            _WindowWords.read(split, w, transcript, first_word) for w, transcript in enumerate(transcripts)
        ]
        cuts = choose_cuts(split, [w.logprobs for w in windows])
        return cls(windows, list(jobs), cuts, owners(split, cuts), split, list(transcripts))

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
        self.jobs[first:end] = redone.jobs
        self.owner[first_word:hi] = np.where(redone.owner >= 0, redone.owner + first, -1)


def finish(
    given: list[TextWord], reading: Reading, tokens: WhisperTokens, duration: float, language: str
) -> Transcript:
    """Every given word in order, from the window that keeps it (``aligned`` False where none does)."""
    taken = [
        reading.windows[window].take(index, word) if window >= 0 else None
        for index, (window, word) in enumerate(zip(reading.owner, given, strict=True))
    ]
    places = _unaligned_times([piece[0] if piece else None for piece in taken])
    words: list[Word] = []
    timings: list[TokenTiming] = []
    for word, piece, place in zip(given, taken, places, strict=True):
        word_result, token_timings = piece if piece is not None else _unaligned(word, place, tokens)
        words.append(word_result)
        timings += token_timings
    _monotonic(words)
    segments = [
        segment
        for window, job in zip(reading.windows, reading.jobs, strict=True)
        if job is not None
        for segment in window.segments(job.audio, tokens)
    ]
    errors = [e for window in reading.windows for e in window.errors]
    transcript = assemble(
        RequestInfo("align", language, duration), [WindowResult(segments, words, timings, None)]
    )
    transcript.text = tokens.decode([t for w in given for t in w.tokens]).strip()
    transcript.alignment_errors = errors
    return transcript


class _WindowWords:
    """One window's forced transcript, by given-word index (its fillers are read past)."""

    def __init__(self, items: list[Item], transcript: Transcript | None, first_word: int = 0):
        given = [(position, index) for position, (index, _) in enumerate(items) if index >= 0]
        # given word (counted from the recording's first, hence first_word) -> item position
        self.share = {first_word + index: position for position, index in given}
        self.given_positions = np.array([position for position, _ in given], dtype=np.int64)
        self.num_items = len(items)
        self.words: list[Word] = (transcript.words or []) if transcript else []
        self.tokens: list[TokenTiming] = (transcript.tokens or []) if transcript else []
        self.ranks: list[int] = (transcript.token_ranks or []) if transcript else []
        self.errors: list[str] = list(transcript.alignment_errors) if transcript else []
        self.usable = transcript is not None and len(self.tokens) == sum(len(t) for _, t in items)
        self.token_start = np.zeros(len(items) + 1, dtype=np.int64)
        self.token_start[1:] = np.cumsum([len(item_tokens) for _, item_tokens in items])
        self.chosen: list[tuple[Word, list[float]]] = []

    @classmethod
    def read(
        cls, split: Split, window: int, transcript: Transcript | None, first_word: int = 0
    ) -> _WindowWords:
        return cls(split.items(window, split.fillers.get(window, ())), transcript, first_word)

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
        return self.words[position].end - self.words[position].start

    @property
    def logprobs(self) -> np.ndarray:
        """Teacher-forced log-probability of each share word (MIN_LOGPROB each without a result)."""
        if not self.usable:
            return np.full(len(self.share), MIN_LOGPROB)
        if not self.num_items:
            return np.zeros(0)
        token_logprobs = np.log(np.maximum([t.probability for t in self.tokens], 1e-30))
        return np.add.reduceat(token_logprobs, self.token_start[:-1])[self.given_positions]

    def take(self, index: int, word: TextWord) -> tuple[Word, list[TokenTiming]] | None:
        position = self.share.get(index)
        if not self.usable or position is None:
            return None
        timings = [
            replace(t) for t in self.tokens[self.token_start[position] : self.token_start[position + 1]]
        ]
        if len(self.words) == self.num_items:  # the word rules' times (durations, out of silence)
            timed = self.words[position]
            start, end, probability = timed.start, timed.end, timed.probability
            aligned, confidence = timed.aligned, timed.confidence
        else:
            start, end = timings[0].start, timings[-1].end
            probability = float(np.mean([t.probability for t in timings]))
            aligned, confidence = True, None
        chosen = Word(start, end, word.text, probability, list(word.tokens), aligned, confidence)
        self.chosen.append((chosen, [float(np.log(max(t.probability, 1e-30))) for t in timings]))
        return chosen, timings

    def segments(self, audio: AudioChunk, tokens: WhisperTokens) -> list[Segment]:
        if not self.chosen:
            return []
        words = [w for w, _ in self.chosen]
        ids = tokens_of(words)
        output = WindowOutput(ids, [lp for _, lps in self.chosen for lp in lps])
        segments, _ = window_segments(
            DecodedWindow(audio, output, None, forced=True), words, tokens.decode(ids)
        )
        return segments


def _unaligned(word: TextWord, time: float, tokens: WhisperTokens) -> tuple[Word, list[TokenTiming]]:
    """A word aligned nowhere: zero length at ``time``, probability and confidence 0."""
    timings = [TokenTiming(t, tokens.decode_with_special([t]), time, time, 0.0) for t in word.tokens]
    return Word(time, time, word.text, 0.0, list(word.tokens), aligned=False, confidence=0.0), timings


def _unaligned_times(aligned: list[Word | None]) -> np.ndarray:
    """Where each unaligned word sits: the previous aligned word's end, else the next one's start."""
    ends = np.array([np.nan if w is None else w.end for w in aligned], dtype=np.float64)
    starts = np.array([np.nan if w is None else w.start for w in aligned], dtype=np.float64)
    known = np.flatnonzero(~np.isnan(ends))
    if len(known) == 0:
        return np.zeros(len(aligned))
    previous = np.searchsorted(known, np.arange(len(aligned)), side="right") - 1
    return np.where(previous >= 0, ends[known[np.maximum(previous, 0)]], starts[known[0]])


def _monotonic(words: list[Word]) -> None:
    """Starts never go back across window joins; a word never ends before it starts."""
    latest = 0.0
    for word in words:
        word.start = max(word.start, latest)
        word.end = max(word.end, word.start)
        latest = word.start
