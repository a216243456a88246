"""From the engine's outputs and the workers' cross-attention to typed results, window by window.

Each window goes through the same steps: its fetched Q·Kᵀ becomes the DTW matrix
(:func:`window_matrix`), the DTW gives token times (all windows' DTWs run in parallel), the tokens
become words with the reference's rules and are moved out of silence (:func:`window_words`), and the
words are cut into segments (:func:`window_segments`). :func:`finish` runs them and returns OpenAI's
``verbose_json`` shape. ``Word`` and ``Segment`` are faster-whisper's shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from vllm_whisper_align.align import timing
from vllm_whisper_align.align.boundaries import extend_ends, refine_starts, snap_to_speech
from vllm_whisper_align.align.words import (
    SENTENCE_END_MARKS,
    WordTiming,
    add_word_timestamps,
    round_time,
    word_timings,
)
from vllm_whisper_align.audio.features import ONSET_FRAME_SECONDS, sound_frames, spectral_flux, speech_frames
from vllm_whisper_align.runners.decoding import (
    Plan,
    WindowOutput,
    WindowRequest,
    compression_ratio,
    is_silent,
)
from vllm_whisper_align.tokens import WhisperTokens

# A new segment starts after a sentence end or a pause this long (no timestamp tokens are decoded).
SEGMENT_PAUSE_S = 1.0
SEGMENT_MAX_S = 15.0


@dataclass
class Word:
    start: float
    end: float
    word: str
    probability: float
    tokens: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's word object."""
        return {"word": self.word, "start": self.start, "end": self.end, "probability": self.probability}


@dataclass
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] | None = None

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's segment object (words are listed once, at the top level)."""
        body = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "words"}
        body["start"], body["end"] = round(self.start, 2), round(self.end, 2)
        return body


@dataclass
class TokenTiming:
    id: int
    text: str
    start: float
    end: float
    probability: float


@dataclass
class WindowResult:
    segments: list[Segment]
    words: list[Word]
    tokens: list[TokenTiming]
    alignment_error: str | None = None


# ---------------------------------------------------------------------------- per window


def window_matrix(window: WindowRequest, output: WindowOutput, fetched: dict | None) -> np.ndarray:
    """The DTW's input for one window from the worker's answer: rows that predict text and eot.

    With ``alignment_method="auto"`` the heads are chosen for this window from the captured pool
    (:func:`timing.select_heads` on the text rows); with ``"fixed"`` they are the model's tuned
    alignment heads. Raises ``ValueError`` with the worker's message when it has nothing for this
    window."""
    if fetched is None or "error" in fetched:
        raise ValueError((fetched or {}).get("error", "no alignment returned"))
    params = window.alignment
    cross_qk = np.frombuffer(fetched["cross_qk"], dtype=np.float32).reshape(fetched["shape"])
    text_rows = params.text_rows(len(output.token_ids))
    if params.alignment_method == "auto":  # "fixed" and "characters" read the tuned heads
        scores = timing.head_scores(cross_qk[:, text_rows], params.num_frames, params.medfilt_width)
        heads = timing.select_heads(scores, fetched["candidate_heads"])
    else:
        heads = fetched["tuned_heads"]
    matrix = timing.alignment_matrix(
        cross_qk[heads], params.num_frames, params.medfilt_width, params.qk_scale
    )
    return matrix[text_rows]


def window_words(
    window: WindowRequest,
    output: WindowOutput,
    jumps: np.ndarray,
    tokens: WhisperTokens,
    language: str,
    last_speech: float,
) -> tuple[list[Word], list[TokenTiming], float]:
    """Words (absolute times, out of silence) and token timings of one window, and the new
    ``last_speech_timestamp`` of the reference's duration rules."""
    text_tokens = output.token_ids[: len(jumps) - 1]
    probs = np.exp(np.asarray(output.token_logprobs[: len(text_tokens)], dtype=np.float64))
    alignment = word_timings(text_tokens, jumps, probs, tokens.decode_with_special, tokens.eot, language)
    span = {"tokens": list(text_tokens), "start": window.offset, "end": window.offset + window.duration}
    last_speech = add_word_timestamps(
        [span], alignment, eot=tokens.eot, time_offset=window.offset, last_speech_timestamp=last_speech
    )
    timed: list[WordTiming] = span["words"]
    samples = window.samples  # read once: a long input's windows may be read back from a file
    speech = speech_frames(samples)
    method = window.alignment.alignment_method if window.alignment is not None else "fixed"
    # Characters move on as sharply as the selected heads; onsets and ends moved them the wrong way.
    snap_to_speech(timed, speech, window.offset, neighbour_sound=method != "fixed")
    if method == "auto":
        refine_starts(timed, spectral_flux(samples), speech, window.offset, ONSET_FRAME_SECONDS)
        extend_ends(timed, speech, window.offset, sound=sound_frames(samples))
    words = [Word(w.start, w.end, w.word, w.probability, list(w.tokens)) for w in timed]
    token_timings = [
        TokenTiming(
            int(token),
            tokens.decode_with_special([token]),
            round_time(window.offset + jumps[i]),
            round_time(window.offset + jumps[i + 1]),
            float(probs[i]),
        )
        for i, token in enumerate(text_tokens)
    ]
    return words, token_timings, last_speech


def make_segment(
    window: WindowRequest,
    output: WindowOutput,
    token_ids: list[int],
    logprobs: list[float],
    text: str,
    start: float,
    end: float,
) -> Segment:
    return Segment(
        id=0,
        seek=int(round(window.offset * 100)),
        start=start,
        end=end,
        text=text,
        tokens=list(token_ids),
        temperature=output.temperature,
        avg_logprob=float(np.mean(logprobs)) if logprobs else 0.0,
        compression_ratio=compression_ratio(text),
        no_speech_prob=output.no_speech_prob,
    )


def window_segments(
    window: WindowRequest, output: WindowOutput, words: list[Word], text: str
) -> tuple[list[Segment], list[slice]]:
    """One window's text cut into segments at sentence ends and pauses (one segment without words),
    and the slice of the window's text tokens each segment holds.

    As openai-whisper's transcribe, a transcribed segment whose words take no time at all is dropped:
    DTW squeezes text that is not in the audio (typically invented at a window's end) into one instant.
    """
    if not words:
        end = window.offset + window.duration
        segment = make_segment(
            window, output, output.token_ids, output.token_logprobs, text, window.offset, end
        )
        return [segment], [slice(0, len(output.token_ids))]
    segments, pieces, position = [], [], 0
    for group in _word_groups(words):
        count = sum(len(w.tokens) for w in group)
        piece = slice(position, position + count)
        position += count
        # The reference's "instantaneous" segment; given text (forced alignment) is never dropped.
        if group[0].start == group[-1].end and window.forced_tokens is None:
            continue
        segments.append(
            make_segment(
                window,
                output,
                output.token_ids[piece],
                output.token_logprobs[piece],
                "".join(w.word for w in group),
                group[0].start,
                group[-1].end,
            )
        )
        segments[-1].words = group
        pieces.append(piece)
    return segments, pieces


def _word_groups(words: list[Word]) -> list[list[Word]]:
    groups, current = [], []
    for word in words:
        if current and (
            word.start - current[-1].end > SEGMENT_PAUSE_S
            or current[-1].word.rstrip()[-1:] in SENTENCE_END_MARKS
            or word.end - current[0].start > SEGMENT_MAX_S
        ):
            groups.append(current)
            current = []
        current.append(word)
    groups.append(current)
    return groups


# ---------------------------------------------------------------------------- whole input


def window_results(
    plan: Plan, outputs: Sequence[WindowOutput], fetched: Sequence[dict], tokens: WhisperTokens
) -> list[WindowResult | None]:
    """Every window's result (None for a window with no text), the DTWs run in parallel."""
    by_key = {answer["key"]: answer for answer in fetched}
    matrices: list[np.ndarray | None] = []
    errors: list[str | None] = []
    for window, output in zip(plan.windows, outputs, strict=True):
        matrix, error = None, None
        if window.alignment is not None:
            try:
                matrix = window_matrix(window, output, by_key.get(window.alignment.key))
            except ValueError as failure:
                error = str(failure)
        usable = matrix is not None and matrix.shape[0] >= 2
        matrices.append(matrix if usable else None)
        errors.append(error)
    aligned = [m for m in matrices if m is not None]
    jump_times = iter(timing.jump_times_batch(aligned))
    results: list[WindowResult | None] = []
    last_speech = 0.0
    for window, output, matrix, error in zip(plan.windows, outputs, matrices, errors, strict=True):
        jumps = next(jump_times) if matrix is not None else None
        if jumps is None and plan.word_timestamps and window.alignment is None:
            jumps = unaligned_jump_times(len(output.token_ids), window.duration)
        if jumps is not None:
            # A path through a degenerate matrix can step off its edge; times stay inside the window.
            jumps = np.clip(jumps, 0.0, window.duration)
        text = tokens.decode(output.token_ids)
        if is_silent(output, plan.fallback):  # the reference skips the window: no text, no words
            results.append(None)
            continue
        if not text.strip():
            results.append(WindowResult([], [], [], error) if error else None)
            continue
        words, token_timings = [], []
        if jumps is not None:
            words, token_timings, last_speech = window_words(
                window, output, jumps, tokens, plan.language, last_speech
            )
        segments, pieces = window_segments(window, output, words, text)
        if words:  # only what the kept segments hold
            words = [w for segment in segments for w in segment.words]
            token_timings = [t for piece in pieces for t in token_timings[piece]]
        results.append(WindowResult(segments, words, token_timings, error))
    return results


def unaligned_jump_times(num_text_tokens: int, duration: float) -> np.ndarray:
    """Token times for a window too short to align (``decoding.can_align``): its tokens share it
    evenly, all that its length says. Floored to centiseconds, the rounding of output times, so that
    no rounded time passes the audio's end."""
    span = np.floor(duration * 100) / 100
    return np.linspace(0.0, span, num_text_tokens + 1)


def assemble(plan: Plan, results: Sequence[WindowResult | None]) -> dict[str, Any]:
    """OpenAI's verbose_json shape (+ ``tokens`` with per-token times when words were asked)."""
    kept = [r for r in results if r is not None]
    segments = [segment for result in kept for segment in result.segments]
    for index, segment in enumerate(segments):
        segment.id = index
    body: dict[str, Any] = {
        "task": "translate" if plan.task == "translate" else "transcribe",
        "language": plan.language,
        "duration": round(plan.duration, 3),
        "text": "".join(s.text for s in segments).strip(),
        "segments": [s.to_dict() for s in segments],
    }
    if plan.word_timestamps:
        body["words"] = [w.to_dict() for result in kept for w in result.words]
        body["tokens"] = [vars(t).copy() for result in kept for t in result.tokens]
        errors = [result.alignment_error for result in kept if result.alignment_error]
        if errors:
            body["alignment_errors"] = errors
    return body


def finish_all(
    plans: Sequence[Plan],
    outputs: Sequence[Sequence[WindowOutput]],
    fetched: Sequence[dict],
    tokens: WhisperTokens,
) -> list[dict[str, Any]]:
    """:func:`finish` of every plan, the plans in parallel threads (NumPy and numba release the GIL):
    long-form alignment's second pass is one plan per window. A pool of its own, as each plan's
    DTWs take timing's."""
    if len(plans) <= 1:
        return [finish(plan, outs, fetched, tokens) for plan, outs in zip(plans, outputs, strict=True)]
    pairs = zip(plans, outputs, strict=True)
    return list(_plan_pool().map(lambda pair: finish(*pair, fetched, tokens), pairs))


@functools.cache
def _plan_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(numba.config.NUMBA_NUM_THREADS, thread_name_prefix="finish")


def finish(
    plan: Plan, outputs: Sequence[WindowOutput], fetched: Sequence[dict], tokens: WhisperTokens
) -> dict[str, Any]:
    """The engine's outputs and the workers' answers for one input, as a verbose_json body."""
    body = assemble(plan, window_results(plan, outputs, fetched, tokens))
    if plan.report_ranks:
        body["token_ranks"] = [rank for output in outputs for rank in (output.token_ranks or [])]
    return body
