"""Typed results, and how the engine's answers for a request's windows become one.

Each window the engine answered (a :class:`DecodedWindow`) goes through the same steps: its fetched
Q·Kᵀ becomes the DTW matrix (:func:`window_matrix`), the DTW gives token times (all windows' DTWs run
in parallel), the tokens become words with the reference's rules and their boundaries are moved to
the audio (:func:`window_words`), and the words are cut into segments (:func:`window_segments`).
:func:`finish` runs them and returns a :class:`Transcript`; :meth:`Transcript.to_dict` is OpenAI's
``verbose_json`` body. ``Word`` and ``Segment`` are faster-whisper's shapes.
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
from vllm_whisper_align.align.boundaries import (
    extend_ends,
    extend_ends_through_hiss,
    extend_starts,
    extend_starts_through_hiss,
    join_ends,
    refine_starts,
    snap_to_speech,
)
from vllm_whisper_align.align.confidence import request_confidence, set_confidences, word_evidence
from vllm_whisper_align.align.words import (
    SENTENCE_END_MARKS,
    Word,
    add_word_timestamps,
    round_time,
    word_timings,
)
from vllm_whisper_align.audio.features import (
    ONSET_FRAME_SECONDS,
    hiss_frames,
    holds_speech,
    sound_frames,
    spectral_flux,
    speech_frames,
)
from vllm_whisper_align.audio.phones import place_words
from vllm_whisper_align.audio.windows import AudioChunk
from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.options import METHODS, compression_ratio, method_named
from vllm_whisper_align.protocol import AlignmentParams
from vllm_whisper_align.tokens import WhisperTokens

# A new segment starts after a sentence end or a pause this long (no timestamp tokens are decoded).
SEGMENT_PAUSE_S = 1.0
SEGMENT_MAX_S = 15.0
# A window's prefix (a live stream's confirmed words) is not placed again by the acoustic model, but its
# last words are searched with the words after it (their times kept): the search's features are
# normalised over the audio it is given, and given only the audio after the prefix, a word of an
# espeak-ng sentence was placed 0.24 s from where the whole window put it (with two words, 0.01 s).
PREFIX_CONTEXT_WORDS = 2


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

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class Transcript:
    """One input's result: a transcription, a translation or a forced alignment (``task`` "align")."""

    task: str
    language: str
    duration: float
    text: str
    segments: list[Segment]
    # None where word timestamps were not asked.
    words: list[Word] | None = None
    tokens: list[TokenTiming] | None = None
    # Windows whose word times could not be read (the worker's message); their words are missing.
    alignment_errors: list[str] = field(default_factory=list)
    # Forced windows read for long-form alignment's check: each forced token's rank among the model's
    # choices there (WindowOutput.token_ranks).
    token_ranks: list[int] | None = None

    @property
    def confidence(self) -> float | None:
        """The words' mean alignment confidence: the share of them expected within 100 ms of where they
        are spoken (align.confidence; None without words or confidences)."""
        return request_confidence(self.words or [])

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's verbose_json body (+ ``tokens`` with per-token times when words were asked, and
        ``aligned`` on each word of a forced alignment)."""
        body: dict[str, Any] = {
            "task": "translate" if self.task == "translate" else "transcribe",
            "language": self.language,
            "duration": round(self.duration, 3),
            "text": self.text,
            "segments": [s.to_dict() for s in self.segments],
        }
        if self.words is not None:
            body["words"] = [w.to_dict(with_aligned=self.task == "align") for w in self.words]
            body["tokens"] = [t.to_dict() for t in self.tokens or []]
            if self.confidence is not None:
                body["confidence"] = self.confidence
            if self.alignment_errors:
                body["alignment_errors"] = list(self.alignment_errors)
        if self.token_ranks is not None:
            body["token_ranks"] = list(self.token_ranks)
        return body


@dataclass
class WindowOutput:
    """What the engine returned for one window: its text tokens and their log-probabilities, and
    openai-whisper's per-window figures (its ``DecodingResult``)."""

    token_ids: list[int]
    token_logprobs: list[float]
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    temperature: float = 0.0
    # Teacher-forced windows: each forced token's rank among the model's choices there (1: the token
    # the model would have picked itself; vLLM reports it with every prompt log-probability).
    token_ranks: list[int] | None = None


@dataclass
class DecodedWindow:
    """A window the engine has answered, as its alignment needs it."""

    audio: AudioChunk  # where it is in the input; its samples are read on each use
    output: WindowOutput
    # What the worker captured for it (None: no word times asked, or too short to align).
    alignment: AlignmentParams | None
    # Its text was given (forced alignment), not decoded.
    forced: bool = False
    # Words its text was known to begin with, their times known (input times): a live stream's
    # confirmed words, forced after the start tokens.
    prefix: tuple[Word, ...] = ()

    @property
    def offset(self) -> float:
        return self.audio.offset

    @property
    def duration(self) -> float:
        return self.audio.duration


@dataclass(frozen=True)
class RequestInfo:
    """What a request's result says beyond its windows."""

    task: str  # transcribe, translate or align
    language: str
    duration: float
    word_timestamps: bool = True
    # Keep the forced windows' token ranks (long-form alignment checks its windows with them).
    report_ranks: bool = False


@dataclass
class WindowResult:
    segments: list[Segment]
    words: list[Word]
    tokens: list[TokenTiming]
    alignment_error: str | None = None


# ---------------------------------------------------------------------------- per window


def window_matrix(window: DecodedWindow, fetched: dict | None) -> np.ndarray:
    """The DTW's input for one window from the worker's answer: rows that predict text and eot.

    With a method that selects heads (``auto``) they are chosen for this window from the captured pool
    (:func:`timing.select_heads` on the text rows); otherwise they are the model's tuned alignment
    heads. Raises ``ValueError`` with the worker's message when it has nothing for this window."""
    cross_qk = captured_qk(fetched)
    params = window.alignment
    assert params is not None and fetched is not None  # only windows with a capture are fetched
    text_rows = params.text_rows(len(window.output.token_ids))
    heads = alignment_heads(cross_qk[:, text_rows], params.num_frames, params, fetched)
    matrix = timing.alignment_matrix(
        cross_qk[heads], params.num_frames, params.medfilt_width, params.qk_scale
    )
    return matrix[text_rows]


def captured_qk(fetched: dict | None) -> np.ndarray:
    """The worker's captured Q·Kᵀ (heads, rows sent, encoder frames); ``ValueError`` with its message
    where it has none."""
    if fetched is None or "error" in fetched:
        raise ValueError((fetched or {}).get("error", "no alignment returned"))
    return np.frombuffer(fetched["cross_qk"], dtype=np.float32).reshape(fetched["shape"])


def alignment_heads(
    text_qk: np.ndarray, num_frames: int, params: AlignmentParams, fetched: dict
) -> list[int]:
    """The heads to align with: the sharpest half of the captured pool on these text rows, as many as the
    tuned heads at most (a method that selects heads), else the model's tuned heads."""
    if method_named(params.alignment_method).selects_heads:
        scores = timing.head_scores(text_qk, num_frames, params.medfilt_width)
        return timing.select_heads(scores, fetched["candidate_heads"], at_most=len(fetched["tuned_heads"]))
    return list(fetched["tuned_heads"])


def window_words(
    window: DecodedWindow,
    jumps: np.ndarray,
    tokens: WhisperTokens,
    language: str,
    last_speech: float,
    matrix: np.ndarray | None = None,
) -> tuple[list[Word], list[TokenTiming], float]:
    """Words (absolute times, boundaries moved to the audio, each with its confidence where ``matrix``,
    the DTW's input, was read) and token timings of one window, and the new ``last_speech_timestamp``
    of the reference's duration rules."""
    output = window.output
    text_tokens = output.token_ids[: len(jumps) - 1]
    probs = np.exp(np.asarray(output.token_logprobs[: len(text_tokens)], dtype=np.float64))
    # A window too short to align has no captured heads: its words are spread evenly, as the tuned
    # heads would read them.
    method = method_named(window.alignment.alignment_method) if window.alignment else METHODS["fixed"]
    alignment = word_timings(
        text_tokens,
        jumps,
        probs,
        tokens.decode_with_special,
        tokens.eot,
        language,
        at_punctuation=not method.forces_characters,
    )
    span: dict[str, Any] = {
        "tokens": list(text_tokens),
        "start": window.offset,
        "end": window.offset + window.duration,
    }
    last_speech = add_word_timestamps(
        [span], alignment, eot=tokens.eot, time_offset=window.offset, last_speech_timestamp=last_speech
    )
    timed: list[Word] = span["words"]
    samples = window.audio.samples  # read once: a long input's windows may be read back from a file
    speech = speech_frames(samples)
    snap_to_speech(timed, speech, window.offset, neighbour_sound=method.leaves_words_early)
    if method.refines_boundaries:
        refine_starts(
            timed, spectral_flux(samples), speech, window.offset, ONSET_FRAME_SECONDS, language=language
        )
        sound = sound_frames(samples)
        extend_ends(timed, speech, window.offset, sound=sound)
        hiss = hiss_frames(samples)
        extend_ends_through_hiss(timed, hiss, window.offset)
        extend_starts(timed, speech, window.offset, sound)
        extend_starts_through_hiss(timed, hiss, window.offset, language)
        join_ends(timed, speech, window.offset)
    words = timed
    if matrix is not None:
        # Read on the heads' times, before the acoustic model moves the words: what it was fitted on,
        # and the model forces text that is not in the audio somewhere all the same.
        evidence = word_evidence(
            words,
            matrix,
            jumps,
            speech,
            window.offset,
            output.token_logprobs[: len(text_tokens)],
            holds_speech(samples, speech=speech),
            window.forced,
        )
        set_confidences(words, evidence, window.forced)
    # Text DTW squeezed into one instant is dropped by window_segments, as openai-whisper drops it (read
    # on the heads' times): the model would spread it over the window instead.
    spoken = bool(words) and words[-1].end > words[0].start
    # A window without a frame of speech (noise, hiss, a tone given a text) leaves the acoustic model
    # nothing to place words on: its search there finds no path within its beam, is run again with
    # every path kept (its costliest: seconds a window), and forces the words onto the noise anyway.
    if method.places_phones and spoken and speech.any():
        place_after_prefix(window, words, samples, language)
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


def place_after_prefix(window: DecodedWindow, words: list[Word], samples: np.ndarray, language: str) -> None:
    """The acoustic model's times (``audio.phones.place_words``) for the window's words after its prefix
    (a live stream's confirmed words), which keep the prefix's times: the prefix is not placed again at
    each decode, and the search costs in proportion to the audio it reads. Its last
    PREFIX_CONTEXT_WORDS words are searched with the rest, from the start of the first of them."""
    settled = prefix_times(words, window.prefix)
    context = max(len(settled) - PREFIX_CONTEXT_WORDS, 0)
    start = settled[context][0] if context < len(settled) else settled[-1][1] if settled else window.offset
    cut = min(max(int(round((start - window.offset) * SAMPLE_RATE)), 0), len(samples))
    placing = words[context:]
    if place_words(placing, samples[cut:], window.offset + cut / SAMPLE_RATE, language):
        for word in placing:
            word.start, word.end = round_time(word.start), round_time(word.end)
    for word, (start, end) in zip(words, settled, strict=False):
        word.start, word.end = start, end


def prefix_times(words: Sequence[Word], prefix: Sequence[Word]) -> list[tuple[float, float]]:
    """The prefix's (start, end) of each of the window's first ``words`` that are the prefix's words (all
    of the prefix, or fewer). Matched by their tokens: a word that holds the prefix's last tokens and
    more (a decoded comma after it) is not the prefix's, nor is any after it."""
    bounds: dict[int, tuple[float, float]] = {}  # tokens through a prefix word: its start and end
    count = 0
    for word in prefix:
        count += len(word.tokens)
        bounds[count] = (word.start, word.end)
    settled = []
    taken = 0
    for word in words:
        taken += len(word.tokens)
        if taken not in bounds:
            break
        settled.append(bounds[taken])
    return settled


def make_segment(
    window: DecodedWindow, token_ids: list[int], logprobs: list[float], text: str, start: float, end: float
) -> Segment:
    return Segment(
        id=0,
        seek=int(round(window.offset * 100)),
        start=start,
        end=end,
        text=text,
        tokens=list(token_ids),
        temperature=window.output.temperature,
        avg_logprob=float(np.mean(logprobs)) if logprobs else 0.0,
        compression_ratio=compression_ratio(text),
        no_speech_prob=window.output.no_speech_prob,
    )


def window_segments(window: DecodedWindow, words: list[Word], text: str) -> tuple[list[Segment], list[slice]]:
    """One window's text cut into segments at sentence ends and pauses (one segment without words),
    and the slice of the window's text tokens each segment holds.

    As openai-whisper's transcribe, a transcribed segment whose words take no time at all is dropped:
    DTW squeezes text that is not in the audio (typically invented at a window's end) into one instant.
    """
    output = window.output
    if not words:
        end = window.offset + window.duration
        segment = make_segment(window, output.token_ids, output.token_logprobs, text, window.offset, end)
        return [segment], [slice(0, len(output.token_ids))]
    segments, pieces, position = [], [], 0
    for group in _word_groups(words):
        count = sum(len(w.tokens) for w in group)
        piece = slice(position, position + count)
        position += count
        # The reference's "instantaneous" segment; given text (forced alignment) is never dropped.
        if group[0].start == group[-1].end and not window.forced:
            continue
        segments.append(
            make_segment(
                window,
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
    groups: list[list[Word]] = []
    current: list[Word] = []
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


@dataclass
class TimedWindow:
    """A window with its token times: its DTW's jumps (None where it has none), or why it has none."""

    window: DecodedWindow
    jumps: np.ndarray | None
    error: str | None = None
    # The DTW's input, which the words' confidence reads (None where there was none).
    matrix: np.ndarray | None = None


def window_matrices(
    windows: Sequence[DecodedWindow], fetched: Sequence[dict]
) -> tuple[list[np.ndarray | None], list[str | None]]:
    """Each window's DTW matrix (None where there is none, or too few rows) and its capture's error."""
    by_key = {answer["key"]: answer for answer in fetched}
    matrices: list[np.ndarray | None] = []
    errors: list[str | None] = []
    for window in windows:
        matrix, error = None, None
        if window.alignment is not None:
            try:
                matrix = window_matrix(window, by_key.get(window.alignment.key))
            except ValueError as failure:
                error = str(failure)
        usable = matrix is not None and matrix.shape[0] >= 2
        matrices.append(matrix if usable else None)
        errors.append(error)
    return matrices, errors


def time_windows(windows: Sequence[DecodedWindow], fetched: Sequence[dict]) -> list[TimedWindow]:
    """Every window's token times, the DTWs run in parallel."""
    matrices, errors = window_matrices(windows, fetched)
    jump_times = iter(timing.jump_times_batch([m for m in matrices if m is not None]))
    return [
        TimedWindow(window, next(jump_times) if matrix is not None else None, error, matrix)
        for window, matrix, error in zip(windows, matrices, errors, strict=True)
    ]


def window_result(
    timed: TimedWindow, tokens: WhisperTokens, info: RequestInfo, last_speech: float
) -> tuple[WindowResult | None, float]:
    """One window's result (None for a window with no text) and the new ``last_speech_timestamp`` of
    the reference's duration rules, which each window hands to the next: windows are read in order."""
    window, jumps = timed.window, timed.jumps
    if jumps is None and info.word_timestamps and window.alignment is None:
        jumps = unaligned_jump_times(len(window.output.token_ids), window.duration)
    if jumps is not None:
        # A path through a degenerate matrix can step off its edge; times stay inside the window.
        jumps = np.clip(jumps, 0.0, window.duration)
    text = tokens.decode(window.output.token_ids)
    if not text.strip():
        return (WindowResult([], [], [], timed.error) if timed.error else None), last_speech
    words: list[Word] = []
    token_timings: list[TokenTiming] = []
    if jumps is not None:
        words, token_timings, last_speech = window_words(
            window, jumps, tokens, info.language, last_speech, timed.matrix
        )
    segments, pieces = window_segments(window, words, text)
    if words:  # only what the kept segments hold
        words = [w for segment in segments for w in segment.words or []]
        token_timings = [t for piece in pieces for t in token_timings[piece]]
    return WindowResult(segments, words, token_timings, timed.error), last_speech


class InOrder:
    """Windows' results read in window order, each as soon as the ones before it are: what a streamed
    answer sends window by window. Its :meth:`transcript` is what :func:`finish` gives for the same
    windows (segments numbered across the input as they come)."""

    def __init__(self, tokens: WhisperTokens, info: RequestInfo):
        self.tokens, self.info = tokens, info
        self.results: list[WindowResult | None] = []
        self._last_speech = 0.0
        self._segments = 0

    def add(self, timed: TimedWindow | None) -> WindowResult | None:
        """The next window's result (None for a window dropped as silence, or with no text)."""
        result = None
        if timed is not None:
            result, self._last_speech = window_result(timed, self.tokens, self.info, self._last_speech)
        for segment in result.segments if result else []:
            segment.id, self._segments = self._segments, self._segments + 1
        self.results.append(result)
        return result

    def transcript(self) -> Transcript:
        return assemble(self.info, self.results)


def window_results(
    windows: Sequence[DecodedWindow], fetched: Sequence[dict], tokens: WhisperTokens, info: RequestInfo
) -> list[WindowResult | None]:
    """Every window's result (None for a window with no text), the DTWs run in parallel."""
    in_order = InOrder(tokens, info)
    for timed in time_windows(windows, fetched):
        in_order.add(timed)
    return in_order.results


def unaligned_jump_times(num_text_tokens: int, duration: float) -> np.ndarray:
    """Token times for a window too short to align (``runners.decoding.can_align``): its tokens share
    it evenly, all that its length says. Floored to centiseconds, the rounding of output times, so that
    no rounded time passes the audio's end."""
    span = np.floor(duration * 100) / 100
    return np.linspace(0.0, span, num_text_tokens + 1)


def assemble(info: RequestInfo, results: Sequence[WindowResult | None]) -> Transcript:
    """The windows' results as one transcript, segments numbered in order."""
    kept = [r for r in results if r is not None]
    segments = [segment for result in kept for segment in result.segments]
    for index, segment in enumerate(segments):
        segment.id = index
    transcript = Transcript(
        info.task, info.language, info.duration, "".join(s.text for s in segments).strip(), segments
    )
    if info.word_timestamps:
        transcript.words = [w for result in kept for w in result.words]
        transcript.tokens = [t for result in kept for t in result.tokens]
        transcript.alignment_errors = [r.alignment_error for r in kept if r.alignment_error]
    return transcript


def finish(
    windows: Sequence[DecodedWindow], fetched: Sequence[dict], tokens: WhisperTokens, info: RequestInfo
) -> Transcript:
    """The engine's answers for one input's kept windows (those not dropped as silence) and the
    workers' captures, as a transcript."""
    transcript = assemble(info, window_results(windows, fetched, tokens, info))
    if info.report_ranks:
        transcript.token_ranks = [rank for window in windows for rank in (window.output.token_ranks or [])]
    return transcript


def finish_all(
    inputs: Sequence[tuple[Sequence[DecodedWindow], RequestInfo]],
    fetched: Sequence[dict],
    tokens: WhisperTokens,
) -> list[Transcript]:
    """:func:`finish` of every input, in parallel threads (NumPy and numba release the GIL): long-form
    alignment's second pass is an input per window. A pool of its own, as each input's DTWs take
    timing's."""
    if len(inputs) <= 1:
        return [finish(windows, fetched, tokens, info) for windows, info in inputs]
    return list(_finish_pool().map(lambda item: finish(item[0], fetched, tokens, item[1]), inputs))


@functools.cache
def _finish_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(numba.config.NUMBA_NUM_THREADS, thread_name_prefix="finish")
