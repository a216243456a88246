"""The engine work of one recording's long-form alignment, as a generator of steps.

Each step is a name and a list of jobs (:class:`Hear`: what the model hears in a window; :class:`Force`:
a text teacher-forced on a window), run concurrently by whoever drives the generator
(``runners.driver``); it sends back one :class:`~vllm_whisper_align.align.results.Transcript` per job,
in order, and the generator returns the recording's transcript. This module does no I/O: it knows
neither vLLM nor HTTP.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from vllm_whisper_align.align.results import Transcript
from vllm_whisper_align.audio.windows import AudioChunk
from vllm_whisper_align.constants import MAX_DECODER_TOKENS
from vllm_whisper_align.errors import AlignmentInputError, OptionError
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.longform.check import (
    REZONE_WORDS,
    realign_regions,
    unheard_windows,
    unheard_words,
    widen_zones,
)
from vllm_whisper_align.longform.join import Reading, finish
from vllm_whisper_align.longform.prefixes import PREFIX_TOKENS, place_prefixes
from vllm_whisper_align.longform.split import Split, prefix_split, split_text
from vllm_whisper_align.longform.words import TextWord, heard_words, text_words
from vllm_whisper_align.options import DEFAULT_ALIGNMENT_METHOD, method_named
from vllm_whisper_align.tokens import WhisperTokens

logger = get_logger(__name__)

# The short pass runs PASS_BLOCK_WINDOWS windows' prefixes a step, with the second pass of the windows
# the steps before placed: a window is forced while its encoder output is still in the engine's cache
# (``engine.encoder_cache``; 233 windows of tiny.en in bfloat16, 111 in float32). Run as two whole
# passes, a 3-hour recording's 397 windows encoded 164 twice.
PASS_BLOCK_WINDOWS = 32


@dataclass(frozen=True)
class Hear:
    """Transcribe ``audio`` greedily, without word times: its first ``max_tokens`` tokens (None: all)."""

    audio: AudioChunk
    max_tokens: int | None = None


@dataclass(frozen=True)
class Force:
    """Teacher-force ``token_ids`` on ``audio`` with word times and each token's rank."""

    audio: AudioChunk
    token_ids: list[int] = field(default_factory=list)


Job = Hear | Force
# What a step asks the driver to run: a name (for request ids) and its jobs, run concurrently.
Step = tuple[str, list[Job]]
# A recording's alignment, step by step: each ``yield`` hands out a Step and takes back its jobs'
# transcripts, in order; the generator returns the recording's transcript.
Steps = Generator[Step, list[Transcript], Transcript]


def check_method(alignment_method: str) -> None:
    """Only methods that keep the given words' tokens can split a long text over windows."""
    if not method_named(alignment_method).spans_windows:
        raise OptionError(
            f"alignment_method {alignment_method} aligns audio of at most one window (30 s); use auto or "
            "fixed for longer audio",
            "alignment_method",
        )


def hear_jobs(windows: Sequence[AudioChunk], max_tokens: int | None = None) -> list[Job]:
    return [Hear(window, max_tokens) for window in windows]


def force_jobs(
    split: Split,
    windows: Sequence[AudioChunk],
    transcribed: Sequence[Sequence[TextWord]],
    tokens: WhisperTokens,
    language: str,
    indices: Sequence[int] | None = None,
) -> list[Force | None]:
    """One forced job per window (or per window of ``indices``) for its share of ``split`` (None for a
    window without text), with the fillers of ``split.extra`` (indices into ``transcribed``, its heard
    words)."""
    room = tokens.alignment_room()
    jobs: list[Force | None] = []
    for index in range(len(windows)) if indices is None else indices:
        window = windows[index]
        share = split.share_tokens(index)
        if not share:
            jobs.append(None)
            continue
        if len(share) > room:
            raise AlignmentInputError(
                f"the text that falls in {window.offset:.1f}-{window.offset + window.duration:.1f} s is "
                f"{len(share)} tokens; at most {room} fit in Whisper's {MAX_DECODER_TOKENS}-token "
                "decoder context"
            )
        fillers = [(before, transcribed[index][j].tokens) for before, j in split.extra[index]]
        if len(share) + sum(len(t) for _, t in fillers) <= room:  # else the text alone, as before
            split.fillers[index] = fillers
        forced = split.items(index, split.fillers.get(index, ()))
        jobs.append(Force(window, [t for _, word_tokens in forced for t in word_tokens]))
    return jobs


def split_and_force(
    windows: Sequence[AudioChunk],
    heard: Sequence[Transcript],
    tokens: WhisperTokens,
    given: list[TextWord],
    language: str,
) -> tuple[Split, list[Force | None]]:
    """The given words (:func:`text_words`) split over ``windows`` (transcribed as ``heard``), and
    one forced job per window (None for a window without text)."""
    transcribed = [heard_words(transcript.text, tokens, language) for transcript in heard]
    split = split_text(given, [[w.key for w in words] for words in transcribed])
    return split, force_jobs(split, windows, transcribed, tokens, language)


def second_pass_order(jobs: Sequence[Force | None]) -> list[int]:
    """Indices of the windows to align (those with text), last transcribed first: when a recording has
    more windows than the engine's encoder cache holds (``engine.encoder_cache``), the cache has kept
    the newest, and these come back before the least recently used are dropped to make room."""
    return [k for k in range(len(jobs) - 1, -1, -1) if jobs[k] is not None]


def in_window_order(
    order: Sequence[int], transcripts: Sequence[Transcript], num_windows: int
) -> list[Transcript | None]:
    """The transcripts of windows run in ``order`` (:func:`second_pass_order`) put back in window
    order, None for a window without text."""
    placed: list[Transcript | None] = [None] * num_windows
    for k, transcript in zip(order, transcripts, strict=True):
        placed[k] = transcript
    return placed


# ---------------------------------------------------------------------------- the steps


def alignment_steps(
    windows: Sequence[AudioChunk],
    token_ids: Sequence[int],
    tokens: WhisperTokens,
    language: str,
    duration: float,
    alignment_method: str = DEFAULT_ALIGNMENT_METHOD,
) -> Steps:
    """The engine work of one recording's long-form alignment (the package's docstring): the short first
    pass and its second pass; then, for the windows whose text fails :func:`unheard_windows` even with
    the boundaries next to its unheard words shared (:func:`rezone`), and their neighbours
    (:func:`realign_regions`), or for all of them if a prefix's share overflowed the decoder, a full
    first pass and a second pass over the text those windows kept. ``alignment_method`` is the
    driver's business (how each forced job reads its times); it is checked here."""
    check_method(alignment_method)
    given = text_words(token_ids, tokens, language)
    reading = yield from short_pass(windows, given, tokens, language)
    if reading is None:
        regions = [(0, len(windows))]
    else:
        unheard = unheard_words(reading)
        failed = unheard_windows(reading, unheard)
        if failed.any():
            first_failed = int(failed.sum())
            reading = yield from rezone(reading, unheard, windows, tokens, language)
            failed = unheard_windows(reading)
            logger.info(
                "Long-form alignment: %d of %d windows failed the check, %d still do with the "
                "boundaries next to their unheard words shared",
                first_failed,
                len(windows),
                int(failed.sum()),
            )
        regions = realign_regions(failed)
    if regions:
        logger.info(
            "Long-form alignment: %d of %d windows from a full first pass (%s)",
            sum(end - first for first, end in regions),
            len(windows),
            "a share overflowed the decoder" if reading is None else f"{int(failed.sum())} failed the check",
        )
        wanted = [k for first, end in regions for k in range(first, end)]
        heard = dict(zip(wanted, (yield "h", hear_jobs([windows[k] for k in wanted])), strict=True))
        ranges = [reading.text_range(*region) if reading else (0, len(given)) for region in regions]
        redo = [
            split_and_force(
                windows[first:end], [heard[k] for k in range(first, end)], tokens, given[lo:hi], language
            )
            for (first, end), (lo, hi) in zip(regions, ranges, strict=True)
        ]
        forced = iter((yield from _second_pass("a", [job for _, jobs in redo for job in jobs])))
        for (first, _), (lo, _), (split, jobs) in zip(regions, ranges, redo, strict=True):
            redone = Reading.read(split, jobs, [next(forced) for _ in jobs], lo)
            if reading is None:
                reading = redone
            else:
                reading.replace(first, lo, redone)
    assert reading is not None  # the full pass above read every window
    return finish(given, reading, tokens, duration, language)


def short_pass(
    windows: Sequence[AudioChunk], given: list[TextWord], tokens: WhisperTokens, language: str
) -> Generator[Step, list[Transcript], Reading | None]:
    """Step 0 of the package's docstring: each window's first PREFIX_TOKENS tokens heard and placed
    (:func:`place_prefixes`), and its share forced, in blocks of PASS_BLOCK_WINDOWS; the second pass
    read (None where a share would not fit the decoder: the recording takes the full first pass). A
    window's share is known once the next window is placed, so each step forces the shares the steps
    before placed while the next block is heard."""
    keys = [w.key for w in given]
    durations = np.array([window.duration for window in windows])
    heard: list[list[str]] = []
    starts, unsure = np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    jobs: list[Force | None] = [None] * len(windows)
    forced_answers: list[Transcript | None] = [None] * len(windows)
    forced, step = 0, 0
    no_words: list[list[TextWord]] = [[] for _ in windows]
    while forced < len(windows):
        listen = range(len(heard), min(len(heard) + PASS_BLOCK_WINDOWS, len(windows)))
        known = len(heard) if len(heard) == len(windows) else max(len(heard) - 1, 0)
        force = range(forced, known)
        if force:
            split = prefix_split(given, starts, unsure)
            try:
                jobs[forced:known] = force_jobs(split, windows, no_words, tokens, language, force)
            except AlignmentInputError:  # a share too long for the decoder: the full pass decides
                return None
        with_text = [w for w in force if jobs[w] is not None]
        asked = hear_jobs([windows[w] for w in listen], PREFIX_TOKENS) + _present(jobs[w] for w in with_text)
        answers = (yield f"p{step}-", asked) if asked else []
        heard += [[w.key for w in heard_words(a.text, tokens, language)] for a in answers[: len(listen)]]
        for w, answer in zip(with_text, answers[len(listen) :], strict=True):
            forced_answers[w] = answer
        starts, unsure = place_prefixes(keys, heard, durations, starts, unsure)
        forced, step = known, step + 1
    return Reading.read(prefix_split(given, starts, unsure), jobs, forced_answers)


def rezone(
    reading: Reading, unheard: np.ndarray, windows: Sequence[AudioChunk], tokens: WhisperTokens, language: str
) -> Generator[Step, list[Transcript], Reading]:
    """The short pass's ``reading`` with each boundary next to its ``unheard`` words
    (:func:`unheard_words`) shared over them (:func:`widen_zones`), so that ``choose_cuts`` can move a
    start the prefix placed wrong (the model's transcript skipped a window's first sentences: its
    prefix, and a full first pass, miss them). One forced pass of the windows whose share grew; the
    others keep their answers."""
    split = widen_zones(reading.split, reading.cuts, reading.owner, unheard, REZONE_WORDS)
    changed = [
        w for w in range(split.num_windows) if not np.array_equal(split.share(w), reading.split.share(w))
    ]
    if not changed:
        return reading
    jobs, answers = list(reading.jobs), list(reading.transcripts)
    no_words: list[list[TextWord]] = [[] for _ in windows]
    try:
        for w, job in zip(
            changed, force_jobs(split, windows, no_words, tokens, language, changed), strict=True
        ):
            jobs[w], answers[w] = job, None
    except AlignmentInputError:  # a widened share too long for the decoder: the full pass decides
        return reading
    redone = yield from _second_pass("z", [job if w in changed else None for w, job in enumerate(jobs)])
    for w in changed:
        answers[w] = redone[w]
    return Reading.read(split, jobs, answers)


def _second_pass(name: str, jobs: Sequence[Force | None]) -> Generator[Step, list[Transcript], list]:
    """The windows with text, in :func:`second_pass_order`; their transcripts back in window order."""
    order = second_pass_order(jobs)
    transcripts = (yield name, _present(jobs[k] for k in order)) if order else []
    return in_window_order(order, transcripts, len(jobs))


def _present(jobs: Iterable[Force | None]) -> list[Job]:
    """The jobs that are there (a window without text has none)."""
    return [job for job in jobs if job is not None]


def advance(steps: Steps, transcripts: list[Transcript] | None) -> tuple[Step | None, Transcript | None]:
    """(the next step, None), or (None, the recording's transcript): ``steps`` given the last step's
    transcripts (None to start). StopIteration cannot cross an asyncio future, hence this."""
    try:
        return steps.send(transcripts), None  # type: ignore[arg-type]  # None starts the generator
    except StopIteration as done:
        return None, done.value
