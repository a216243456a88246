"""Short inputs transcribed several to a window (``audio.packing`` lays them out, ``align.packing``
splits the answer back): one encoder pass and one decode for inputs that each would pay for a whole
30 s window.

:func:`packed_window` is the one pack's work, a driver as ``runners.driver``'s: the window decoded
greedily, its capture fetched, each input's words split back by attention and timed on its own block
of it. An input that cannot be split from its neighbours, or whose own text fails
openai-whisper's fallback test, comes back without a transcript: the first is packed once more, then
runs alone with the full fallback, the second runs alone at once (:func:`packed_transcriptions`): no
input is left without its answer, and none gets a neighbour's words.

Where it applies: inputs that wait together. The offline API packs the inputs of one call
(:func:`transcriptions`); the server and the corpus job pack the requests that wait for the engine
together (:class:`PackQueue`): a request on an idle queue goes in at once, alone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from vllm_whisper_align.align.packing import holds_its_own_words, split_window
from vllm_whisper_align.align.results import InOrder, RequestInfo, TimedWindow, Transcript
from vllm_whisper_align.audio import packing
from vllm_whisper_align.audio.windows import AudioChunk
from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.errors import AlignmentInputError
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.options import AlignmentOptions, FallbackOptions, TranscriptionOptions
from vllm_whisper_align.runners import decoding
from vllm_whisper_align.runners.driver import (
    Command,
    Compute,
    Discard,
    Driver,
    EngineFacts,
    Fetch,
    alignment,
    decode_windows,
    together,
    transcription,
)
from vllm_whisper_align.tokens import WhisperTokens

logger = get_logger(__name__)

# What packed_window answers for an input whose own text fails openai-whisper's fallback test: it runs
# alone at once (its window was read; another window would read it as badly). None: not split from
# its neighbours, worth one more window.
ALONE = "alone"


def packable(
    samples: Any,
    facts: EngineFacts,
    *,
    language: str | None,
    word_timestamps: bool,
    prompt: str | None,
    options: TranscriptionOptions,
) -> bool:
    """Whether an input may share a window: short enough that two fit one, with speech in it, in a
    known language (a multilingual model detecting it would encode the input alone anyway, and then
    decode it from the encoder cache at no further encoder cost), decoded greedily first with no
    options that act on a window's whole text (a prompt, a token cap, sampling options), and word
    timings asked (they are what splits the window's text)."""
    return (
        word_timestamps
        and not prompt
        and (language is not None or facts.language_detection is None)
        and isinstance(samples, np.ndarray)
        and packing.packable_length(len(samples))
        and decoding.can_align(len(samples))
        and options.temperature == 0.0
        and options.method.transcribes
        and not options.sampling
        and len(decoding.windows_to_decode(samples, options)) == 1
    )


# A packed window's text holds its inputs' words and no more: tokens allowed per input and per second of
# its audio (the gaps and the silence after the last input hold none). Whisper now and then loops in a
# packed window, or says a sentence again in the silence after the last input; the window's own cap
# (``decoding.max_output_tokens``, sized for any speech in a whole window) let such a decode run three
# times its text, one token after another, while its inputs waited. An input the cap cuts off is packed
# again, then runs alone, as any input the decode did not reach.
PACKED_TOKENS_PER_INPUT = 4
PACKED_TOKENS_PER_SECOND = 6


def packed_token_cap(lengths: Sequence[int]) -> int:
    """Text tokens a window of inputs of these lengths (samples) may decode."""
    return sum(PACKED_TOKENS_PER_INPUT + int(PACKED_TOKENS_PER_SECOND * n / SAMPLE_RATE) for n in lengths)


def packed_window(
    inputs: Sequence[np.ndarray],
    facts: EngineFacts,
    *,
    language: str | None,
    task: str,
    options: TranscriptionOptions,
) -> Generator[Command, Any, list[Transcript | str | None]]:
    """``inputs`` (each :func:`packable`, that fit one window together) transcribed in one window:
    each one's transcript, or None where it was not split from its neighbours (packed again), or ALONE
    where its own text fails the fallback test (it runs alone)."""
    tokens = facts.tokens
    laid = packing.pack(inputs)
    cap = packed_token_cap([len(samples) for samples in inputs])
    plan = decoding.plan_transcription(
        laid.samples,
        tokens,
        language=language,
        task=task,
        options=replace(options, sampling={**options.sampling, "max_tokens": cap}),
        suppress_tokens=facts.suppress_tokens,
        windows=[AudioChunk.whole(laid.samples)],
    )
    # The window is read greedily once: an input whose own text fails the fallback test runs alone.
    plan.fallback = replace(plan.fallback, temperatures=(0.0,))
    outputs: list[decoding.WindowOutput | None] = [None]
    yield from decode_windows(plan, outputs, [0], tokens)
    window, output = plan.windows[0], outputs[0]
    assert output is not None and window.alignment is not None
    if decoding.is_silent(output, plan.fallback):
        yield Discard([window.alignment.key])
        return [None] * len(inputs)
    [transcripts] = yield from _split(laid, inputs, plan, outputs, tokens, plan.fallback)
    return transcripts


def _split(
    laid: packing.Packed,
    inputs: Sequence[np.ndarray],
    plan: decoding.Plan,
    outputs: list,
    tokens: WhisperTokens,
    fallback: FallbackOptions | None,
    forced: Sequence[int] | None = None,
) -> Generator[Command, Any, list[list[Transcript | str | None]]]:
    """The window's capture fetched and split into each input's transcript (:func:`_transcript`)."""
    window, output = plan.windows[0], outputs[0]
    fetched = yield Fetch(decoding.alignment_requests(plan, outputs))
    answer = next((a for a in fetched if a.get("key") == window.alignment.key), None)
    info = plan.info

    def split() -> list[Transcript | str | None]:
        try:
            parts = split_window(
                laid, inputs, output, window.alignment, answer, tokens, info.language, forced
            )
        except ValueError as failure:  # no capture for the window: every input runs alone
            logger.warning(
                "whisper-align: a packed window has no capture (%s); its inputs run alone", failure
            )
            return [None] * len(inputs)
        return [
            _transcript(part, samples, info, tokens, fallback)
            for part, samples in zip(parts, inputs, strict=True)
        ]

    return (yield Compute([split]))


def _transcript(
    part: TimedWindow | None,
    samples: np.ndarray,
    info: RequestInfo,
    tokens: WhisperTokens,
    fallback: FallbackOptions | None,
) -> Transcript | str | None:
    """One input's transcript from its part of the window; None where it was not split, ALONE where
    its own text fails the fallback test (``fallback``; None: given text, never tested)."""
    if part is None:
        return None
    if fallback is not None and decoding.needs_fallback(part.window.output, fallback):
        return ALONE
    in_order = InOrder(tokens, replace(info, duration=len(samples) / SAMPLE_RATE))
    in_order.add(part)
    transcript = in_order.transcript()
    if fallback is not None and not holds_its_own_words(transcript.words or [], samples):
        return None
    return transcript


# ---------------------------------------------------------------------------- forced alignment


def alignable(
    samples: Any, given: Sequence[int] | None, tokens: WhisperTokens, options: AlignmentOptions
) -> bool:
    """Whether a forced alignment may share a window: short enough that two fit one, its text given as
    tokens that fit the decoder beside another's (``given``: None where the text is not valid: the
    alignment alone says why), aligned by tokens (not characters)."""
    return (
        given is not None
        and isinstance(samples, np.ndarray)
        and packing.packable_length(len(samples))
        and decoding.can_align(len(samples))
        and not options.method.forces_characters
        and 2 * len(given) <= tokens.alignment_room()
    )


def given_tokens(
    text: str | None, token_ids: Sequence[int] | None, tokens: WhisperTokens
) -> list[int] | None:
    """The text's tokens as a forced alignment reads them; None where they are not valid."""
    try:
        return decoding.text_to_tokens(text, token_ids, tokens, tokens.alignment_room())
    except AlignmentInputError:
        return None


def packed_alignment_window(
    inputs: Sequence[np.ndarray],
    given: Sequence[Sequence[int]],
    facts: EngineFacts,
    *,
    language: str | None,
    options: AlignmentOptions,
) -> Generator[Command, Any, list[Transcript | str | None]]:
    """Forced alignments (each :func:`alignable`, that fit one window and the decoder together) in one
    window: their texts forced in order, so each input's tokens are known; each one's transcript (None:
    no capture, it runs alone)."""
    tokens = facts.tokens
    laid = packing.pack(inputs)
    plan = decoding.plan_alignment(
        laid.samples,
        tokens,
        token_ids=[token for ids in given for token in ids],
        language=language,
        alignment_method=options.alignment_method,
    )
    outputs: list[decoding.WindowOutput | None] = [None]
    yield from decode_windows(plan, outputs, [0], tokens)
    counts = [len(ids) for ids in given]
    [transcripts] = yield from _split(laid, inputs, plan, outputs, tokens, None, counts)
    return transcripts


def packed_alignments(
    inputs: Sequence[np.ndarray],
    given: Sequence[Sequence[int]],
    facts: EngineFacts,
    *,
    language: str | None,
    options: AlignmentOptions,
) -> Generator[Command, Any, list[Transcript]]:
    """:func:`packed_alignment_window`, and the inputs it gives back aligned alone."""
    results = yield from packed_alignment_window(inputs, given, facts, language=language, options=options)
    alone = [k for k, result in enumerate(results) if not isinstance(result, Transcript)]
    work = [
        alignment(inputs[k], facts, token_ids=given[k], language=language, options=options) for k in alone
    ]
    for k, result in zip(alone, (yield from together(work, prefix="alone")), strict=True):
        results[k] = result
    return results  # type: ignore[return-value]


def alignments(
    samples: Sequence[Any],
    texts: Sequence[str | None],
    token_ids: Sequence[Sequence[int] | None],
    facts: EngineFacts,
    *,
    language: str | None,
    options: AlignmentOptions,
    pack: bool = True,
) -> Generator[Command, Any, list[Transcript]]:
    """Many forced alignments as :func:`driver.alignment` each, the short ones packed in order
    (:func:`alignable`) unless ``pack`` is off."""
    tokens = facts.tokens
    tokens.check_language(language)
    given = [
        given_tokens(text, ids, tokens) if pack else None for text, ids in zip(texts, token_ids, strict=True)
    ]
    flags = [alignable(s, g, tokens, options) for s, g in zip(samples, given, strict=True)]
    packed = packs_of(
        [len(s) if flag else None for s, flag in zip(samples, flags, strict=True)],
        [len(g or ()) for g in given],
        tokens.alignment_room(),
    )
    return (
        yield from _packed_or_alone(
            len(samples),
            packed,
            lambda group: packed_alignments(
                [samples[i] for i in group],
                [given[i] or [] for i in group],
                facts,
                language=language,
                options=options,
            ),
            lambda i: alignment(
                samples[i], facts, text=texts[i], token_ids=token_ids[i], language=language, options=options
            ),
        )
    )


def _packed_or_alone(
    count: int,
    packed: list[list[int]],
    pack_work: Callable[[list[int]], Driver],
    alone_work: Callable[[int], Driver],
) -> Generator[Command, Any, list]:
    """Every pack's driver and every other input's own, run together; the answers in the inputs' order."""
    in_packs = {i for group in packed for i in group}
    alone = [i for i in range(count) if i not in in_packs]
    answers = yield from together([*(pack_work(group) for group in packed), *(alone_work(i) for i in alone)])
    results: list[Any] = [None] * count
    for group, transcripts in zip(packed, answers, strict=False):
        for i, transcript in zip(group, transcripts, strict=True):
            results[i] = transcript
    for i, transcript in zip(alone, answers[len(packed) :], strict=True):
        results[i] = transcript
    return results


# How many windows an input is packed into before it runs alone: a second one takes the inputs a
# window's decode did not reach (Whisper ends a window early now and then, or loops in it) together.
PACKINGS = 2


def packed_transcriptions(
    inputs: Sequence[np.ndarray],
    facts: EngineFacts,
    *,
    language: str | None,
    task: str,
    options: TranscriptionOptions,
    packings: int = PACKINGS,
) -> Generator[Command, Any, list[Transcript]]:
    """:func:`packed_window`; the inputs it gives back unsplit are packed again (``packings`` windows
    in all), then run alone; those whose own text failed the fallback test (ALONE) run alone at once."""
    results = yield from packed_window(inputs, facts, language=language, task=task, options=options)
    again = [k for k, result in enumerate(results) if result is None]
    alone = [k for k, result in enumerate(results) if result == ALONE]
    if len(again) > 1 and packings > 1:
        packed_again = packed_transcriptions(
            [inputs[k] for k in again],
            facts,
            language=language,
            task=task,
            options=options,
            packings=packings - 1,
        )
    else:
        packed_again, alone = None, sorted(alone + again)
    work = [transcription(inputs[k], facts, language=language, task=task, options=options) for k in alone]
    if packed_again is not None:
        work.append(packed_again)
    answers = yield from together(work, prefix="alone")
    for k, result in zip(alone, answers, strict=False):
        results[k] = result
    if packed_again is not None:
        for k, result in zip(again, answers[-1], strict=True):
            results[k] = result
    return results  # type: ignore[return-value]


def transcriptions(
    samples: Sequence[Any],
    facts: EngineFacts,
    *,
    language: str | None,
    task: str = "transcribe",
    word_timestamps: bool = True,
    prompt: str | None = None,
    options: TranscriptionOptions | None = None,
    pack: bool = True,
) -> Generator[Command, Any, list[Transcript]]:
    """Many inputs transcribed as :func:`driver.transcription` each, the short ones packed in order
    (:func:`packable`) unless ``pack`` is off."""
    options = options or TranscriptionOptions()
    facts.tokens.check_language(language, task)

    def short(s: Any) -> bool:
        return packable(
            s, facts, language=language, word_timestamps=word_timestamps, prompt=prompt, options=options
        )

    [flags] = yield Compute([lambda: [pack and short(s) for s in samples]])
    packed = packs_of([len(s) if flag else None for s, flag in zip(samples, flags, strict=True)])
    return (
        yield from _packed_or_alone(
            len(samples),
            packed,
            lambda group: packed_transcriptions(
                [samples[i] for i in group], facts, language=language, task=task, options=options
            ),
            lambda i: transcription(
                samples[i],
                facts,
                language=language,
                task=task,
                word_timestamps=word_timestamps,
                prompt=prompt,
                options=options,
            ),
        )
    )


def packs_of(
    lengths: Sequence[int | None], token_counts: Sequence[int] | None = None, token_room: int = 0
) -> list[list[int]]:
    """The inputs (by index) that share windows, two or more to a window, in order: those with a length
    (None: not packable); with ``token_counts`` (forced texts), no more than ``token_room`` tokens to a
    window."""
    groups: list[list[int]] = []
    for index, length in enumerate(lengths):
        if length is None:
            continue
        joined = [*(groups[-1] if groups else []), index]
        counts = None if token_counts is None else [token_counts[i] for i in joined]
        if len(joined) > 1 and holds([lengths[i] for i in joined], counts, token_room):  # type: ignore[misc]
            groups[-1].append(index)
        else:
            groups.append([index])
    return [group for group in groups if len(group) > 1]


def holds(lengths: Sequence[int], token_counts: Sequence[int] | None, token_room: int) -> bool:
    """Whether one window holds inputs of these lengths (and, forced, texts of these token counts)."""
    return packing.fits(lengths) and (token_counts is None or sum(token_counts) <= token_room)


# ---------------------------------------------------------------------------- waiting together


@dataclass(eq=False)  # each is itself: the queue finds and removes it by identity
class _Waiting:
    """A short request waiting for the engine, and where its answer goes: a transcription, or a forced
    alignment of ``given`` tokens."""

    samples: np.ndarray
    language: str | None
    task: str
    options: TranscriptionOptions | AlignmentOptions
    request_id: str
    given: list[int] | None = None
    answer: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    # Once taken: the window's task, and everyone in it (a window whose requests all went away stops).
    carried_by: asyncio.Task | None = None
    group: list[_Waiting] = field(default_factory=list)
    gone: bool = False
    # Windows it has been packed into and given back from (PACKINGS in all before it runs alone).
    packings: int = 0

    def joins(self, first: _Waiting) -> bool:
        return (self.language, self.task, self.options) == (first.language, first.task, first.options)


# Runs a driver on the engines under a request id, calling its third argument at the first output of
# each of its engine requests (the service's run).
Run = Callable[[Driver, str, Callable[[], None]], Awaitable[Any]]


class PackQueue:
    """Short transcriptions and forced alignments held while ``room`` of its windows wait for the
    engines to start them (one engine step's encoders), and packed into windows as those start. On an
    idle queue a request goes in at once, alone; while its windows are in the engines, the queue takes
    full windows: requests are packed only with those that wait beside them while the engines are busy,
    and every window taken decodes in the engines' batch at once."""

    def __init__(self, run: Run, facts: EngineFacts, room: int):
        self.run, self.facts, self.room = run, facts, room
        self.waiting: list[_Waiting] = []
        self.unstarted = 0  # windows taken from the queue that the engines have not started
        self.in_flight = 0  # windows taken from the queue and not yet answered
        self._tasks: set[asyncio.Task] = set()
        # For the stats route: windows of several inputs run, the inputs in them, those sent back alone.
        self.counts = {"packed_windows": 0, "packed_inputs": 0, "packed_inputs_run_alone": 0}

    async def transcribe(
        self,
        samples: np.ndarray,
        *,
        request_id: str,
        language: str | None,
        task: str,
        options: TranscriptionOptions,
    ) -> Transcript:
        return await self._answer(_Waiting(samples, language, task, options, request_id))

    async def align(
        self,
        samples: np.ndarray,
        given: list[int],
        *,
        request_id: str,
        language: str | None,
        options: AlignmentOptions,
    ) -> Transcript:
        return await self._answer(_Waiting(samples, language, "align", options, request_id, given))

    async def _answer(self, item: _Waiting) -> Transcript:
        self.waiting.append(item)
        self.wake()
        while True:
            try:
                result = await asyncio.shield(item.answer)
            except asyncio.CancelledError:
                item.gone = True
                if item in self.waiting:  # gone before it was taken: nothing of it ran
                    self.waiting.remove(item)
                elif item.carried_by is not None and all(other.gone for other in item.group):
                    item.carried_by.cancel()  # its engine requests are aborted, their captures dropped
                raise
            if isinstance(result, Transcript):
                return result
            item.packings += 1
            if result == ALONE or item.given is not None or item.packings >= PACKINGS:
                self.counts["packed_inputs_run_alone"] += 1
                return await self.run(self._alone(item), item.request_id, lambda: None)
            # packed again with whoever waits first, ahead of those that came after it
            item.answer = asyncio.get_running_loop().create_future()
            item.carried_by, item.group = None, []
            self.waiting.insert(0, item)
            self.wake()

    def wake(self) -> None:
        """Takes windows from the queue: whatever waits when none of its windows is in the engines
        (one request alone goes in at once), else full windows while the engines have room to start
        them."""
        while self.waiting and self.unstarted < self.room:
            group = self._group()
            if self.in_flight and not packing.full([len(item.samples) for item in group]):
                return  # the engines are busy: the next requests may join these
            for item in group:
                self.waiting.remove(item)
            self.unstarted += 1
            self.in_flight += 1
            task = asyncio.create_task(self._carry(group))
            self._tasks.add(task)  # the loop keeps only a weak reference to a task
            task.add_done_callback(self._tasks.discard)
            for item in group:
                item.carried_by, item.group = task, group

    def _group(self) -> list[_Waiting]:
        """The first waiting request and those after it that can share its window, in order (forced
        texts: as many as the decoder holds)."""
        first = self.waiting[0]
        group = [first]
        room = self.facts.tokens.alignment_room()
        for item in self.waiting[1:]:
            joined = [*group, item]
            counts = None if first.given is None else [len(member.given or ()) for member in joined]
            if item.joins(first) and holds([len(member.samples) for member in joined], counts, room):
                group.append(item)
        return group

    async def _carry(self, group: list[_Waiting]) -> None:
        waiting = True

        def started() -> None:
            nonlocal waiting
            if waiting:
                waiting = False
                self.unstarted -= 1
                self.wake()

        results: list[Any]
        try:
            if len(group) == 1:
                results = [await self.run(self._alone(group[0]), group[0].request_id, started)]
            else:
                work = self._packed(group)
                self.counts["packed_windows"] += 1
                self.counts["packed_inputs"] += len(group)
                results = await self.run(work, f"pack-{uuid.uuid4().hex[:12]}", started)
        except Exception as error:
            if len(group) == 1:
                results = [error]
            else:  # each input tries again alone, where its own error (if any) is its own
                logger.warning("whisper-align: a packed window failed (%s); its inputs run alone", error)
                results = [None] * len(group)
        finally:
            self.in_flight -= 1
            started()  # one that failed before it started
            self.wake()
        for item, result in zip(group, results, strict=True):
            if item.answer.done():
                continue
            if isinstance(result, BaseException):
                item.answer.set_exception(result)
            else:
                item.answer.set_result(result)

    def _packed(self, group: list[_Waiting]) -> Driver:
        first, samples = group[0], [item.samples for item in group]
        if first.given is not None:
            given = [item.given or [] for item in group]
            return packed_alignment_window(
                samples, given, self.facts, language=first.language, options=first.options
            )  # type: ignore[arg-type]
        return packed_window(
            samples, self.facts, language=first.language, task=first.task, options=first.options
        )  # type: ignore[arg-type]

    def _alone(self, item: _Waiting) -> Driver:
        if item.given is not None:
            return alignment(
                item.samples, self.facts, token_ids=item.given, language=item.language, options=item.options
            )  # type: ignore[arg-type]
        return transcription(
            item.samples, self.facts, language=item.language, task=item.task, options=item.options
        )  # type: ignore[arg-type]
