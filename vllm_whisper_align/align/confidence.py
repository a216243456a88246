"""How far to trust each word's place: an alignment confidence in [0, 1] that a word's start is within
``GOOD_WITHIN_S`` of where it is spoken, and the ``aligned`` flag of forced alignment read from it.

Nothing new is computed for it: the evidence (:func:`word_evidence`) is what one window's alignment
already holds. How likely the model found the word's tokens here (forced text that is not in the audio is
improbable to it, every token of it), and the window's text as a whole; whether the DTW path runs through
the attention peak of each of the word's tokens or past it (text not in the audio spreads its attention
and the path goes where it must); how much of the word's span the speech mask covers, and whether the
window holds a voice at all (``audio.features.holds_speech``); whether the word was squeezed into a
zero-length span. A logistic model (:data:`WEIGHTS`, one per :data:`FEATURES`) turns them into the
confidence; ``benchmarks/confidence.py`` fits it on the synthetic and real-speech sets and scores it on
held-out data (figures: benchmarks/RESULTS.md#alignment-confidence).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vllm_whisper_align.align.words import Word
from vllm_whisper_align.audio.features import speech_share

# What the confidence predicts: the word's start within this of the truth.
GOOD_WITHIN_S = 0.1
# Forced alignment: a word whose confidence is under this is ``aligned: false`` (text that the audio
# does not hold, or holds nowhere near where it was placed).
ALIGNED_MIN_CONFIDENCE = 0.1
# One encoder frame: the DTW's resolution.
FRAME_S = 0.02
# How far before a start to look for silence (a start after a pause is where the sound begins).
PAUSE_LOOK_S = 0.1
# Probabilities are read as logs from this floor (a forced token the model would never write).
MIN_PROBABILITY = 1e-6

FEATURES = (
    "bias",
    "log_probability",  # the log of the word's probability (openai-whisper's: its tokens' mean)
    "window_log_probability",  # the window's mean token log-probability
    "attention_peak",  # per token, its path's attention minus its row's peak (z-scores), the word's mean
    "speech_share",  # share of the word's frames under the speech mask
    "window_has_voice",  # 1 when the window holds speech (audio.features.holds_speech)
    "zero_length",  # 1 when the word was given no frame of its own
    "forced",  # 1 for given text (forced alignment), 0 for transcribed
    "start_moved",  # seconds between the DTW's start and the start moved to the audio (0.5 s cap)
    "after_pause",  # share of the 100 ms before the start that the speech mask calls silence
)
# Fitted by ``benchmarks/confidence.py report --fit`` on its dev split (tiny.en, float32).
WEIGHTS = np.array([0.944, 0.247, 1.022, 0.383, 0.273, 0.201, -0.232, 1.352, 0.417, 0.486])


def word_evidence(
    words: Sequence[Word],
    matrix: np.ndarray | None,
    jumps: np.ndarray,
    speech: np.ndarray,
    offset: float,
    window_logprobs: Sequence[float],
    has_voice: bool,
    forced: bool,
) -> np.ndarray:
    """One row of :data:`FEATURES` per word of one window, in order.

    ``matrix``: the DTW's input (text rows then eot, frames), None for a window too short to align;
    ``jumps``: the seconds at which the path enters each row (window time); ``speech``: the window's
    speech mask (20 ms frames); word times are absolute (``offset`` is the window's start)."""
    rows = np.zeros((len(words), len(FEATURES)))
    window_logprob = float(np.mean(window_logprobs)) if len(window_logprobs) else 0.0
    position = 0
    for k, word in enumerate(words):
        token_rows = range(position, position + len(word.tokens))
        position += len(word.tokens)
        duration = word.end - word.start
        rows[k] = (
            1.0,
            np.log(max(word.probability, MIN_PROBABILITY)),
            max(window_logprob, np.log(MIN_PROBABILITY)),
            _attention_peak(matrix, jumps, token_rows),
            speech_share(speech, word.start - offset, word.end - offset),
            float(has_voice),
            float(duration < FRAME_S / 2),
            float(forced),
            min(abs(word.start - offset - float(jumps[min(token_rows.start, len(jumps) - 1)])), 0.5),
            1.0 - speech_share(speech, word.start - offset - PAUSE_LOOK_S, word.start - offset),
        )
    return rows


def confidences(evidence: np.ndarray) -> np.ndarray:
    """The logistic model's probability that each word's start is within GOOD_WITHIN_S."""
    return 1.0 / (1.0 + np.exp(-np.clip(evidence @ WEIGHTS, -30.0, 30.0)))


def set_confidences(words: Sequence[Word], evidence: np.ndarray, forced: bool) -> None:
    """Each word's ``confidence`` (rounded to 3 places), and for given text its ``aligned`` flag."""
    for word, value in zip(words, confidences(evidence), strict=True):
        word.confidence = round(float(value), 3)
        if forced:
            word.aligned = word.confidence >= ALIGNED_MIN_CONFIDENCE


def request_confidence(words: Sequence[Word]) -> float | None:
    """A request's score: its words' mean confidence, the share of them expected within GOOD_WITHIN_S
    (None without words)."""
    values = [w.confidence for w in words if w.confidence is not None]
    return round(float(np.mean(values)), 3) if values else None


def _attention_peak(matrix: np.ndarray | None, jumps: np.ndarray, token_rows: range) -> float:
    """The mean over ``token_rows`` of (the row's attention on its path's frames, one frame of slack each
    side) minus (the row's peak): 0 when the path runs through every peak, negative when past them."""
    if matrix is None or len(token_rows) == 0:
        return 0.0
    num_frames = matrix.shape[1]
    gaps = []
    for row in token_rows:
        if row + 1 >= len(jumps) or row >= matrix.shape[0]:
            continue
        first = int(np.floor(jumps[row] / FRAME_S)) - 1
        last = int(np.ceil(jumps[row + 1] / FRAME_S)) + 1
        span = matrix[row, max(first, 0) : min(max(last, first + 1), num_frames)]
        values = matrix[row, :num_frames]
        if span.size == 0 or not np.isfinite(values).any():
            continue
        gaps.append(float(np.nanmax(span) - np.nanmax(values)) if np.isfinite(span).any() else -10.0)
    return float(np.mean(gaps)) if gaps else 0.0
