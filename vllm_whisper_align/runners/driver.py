"""The one engine driver: a request's work as a generator of commands, which both runners carry out.

A driver (:func:`transcription`, :func:`alignment`) plans its windows, then yields what it needs done
and is sent the answer: :class:`Generate` (engine requests → their final outputs), :class:`NoSpeech`
(no-speech probabilities from the workers), :class:`Fetch` (captured attention), :class:`Discard`
(captures no longer needed) and :class:`Compute` (NumPy and numba work, off an event loop). It does
no I/O itself, so the temperature fallback, best-of candidates, the discarding of superseded captures
and long-form alignment's steps are written once: :mod:`.offline` carries the commands out over
``vllm.LLM`` (all inputs of a call in lockstep: one ``generate`` call per round), :mod:`.service`
over the server's ``engine_client`` (each request's windows concurrently).

:func:`together` runs several drivers as one, merging their commands of a kind into one command:
the offline API's inputs, and the jobs of one long-form step.

A runner answers a command that fails by throwing the error into the driver. "No capture on this
engine" (``errors.NoCaptureError``) is answered once, here: no window counts as silence without
no-speech probabilities, and word timings asked of such an engine fail the request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from vllm import SamplingParams

from vllm_whisper_align.align.results import InOrder, TimedWindow, Transcript, finish, time_windows
from vllm_whisper_align.align.words import Word
from vllm_whisper_align.audio import phones
from vllm_whisper_align.audio.decode import SpilledSamples
from vllm_whisper_align.audio.windows import AudioChunk, audible_windows
from vllm_whisper_align.constants import N_SAMPLES, SAMPLE_RATE
from vllm_whisper_align.errors import InputError, NoCaptureError
from vllm_whisper_align.longform.steps import Force, Hear, Job, advance, alignment_steps
from vllm_whisper_align.options import AlignmentOptions, TranscriptionOptions
from vllm_whisper_align.protocol import NO_CAPTURE_MESSAGE, AlignmentRequest, WhisperAlignConfig
from vllm_whisper_align.runners import decoding
from vllm_whisper_align.tokens import WhisperTokens

# ---------------------------------------------------------------------------- commands


@dataclass
class EngineRequest:
    """One request for the engine: a prompt, its sampling parameters, a name unique within the driver
    (the server's request id ends with it), and the capture keys the workers keep for it."""

    prompt: Any
    sampling_params: SamplingParams
    name: str
    capture_keys: list[str] = field(default_factory=list)


@dataclass
class Generate:
    """Run ``requests`` (concurrently); answer: each one's final ``RequestOutput``, in order.

    ``unneeded``, where given, names the requests whose answers no longer matter once others have
    finished: called with the finals so far (None: not finished yet), it returns the positions of
    unfinished requests that may be aborted. A runner that sees requests finish one by one (the
    server's) aborts them and answers None for each; one that runs a round in lockstep (the offline
    API's) answers every request."""

    requests: list[EngineRequest]
    unneeded: Callable[[list[Any]], list[int]] | None = None


@dataclass
class NoSpeech:
    """The workers' no-speech probabilities under ``keys``; answer: their answers (dicts)."""

    keys: list[str]


@dataclass
class Fetch:
    """The captured attention of finished requests; answer: the workers' answers (dicts)."""

    requests: list[AlignmentRequest]


@dataclass
class Discard:
    """Drop what the workers keep under ``keys``; answer: None."""

    keys: list[str]


@dataclass
class Compute:
    """Call ``functions`` (NumPy and numba work that releases the GIL), in parallel threads where the
    runner can; answer: their results, in order."""

    functions: list[Callable[[], Any]]


Command = Generate | NoSpeech | Fetch | Discard | Compute
# A driver: yields commands, is sent their answers, returns its result.
Driver = Generator[Command, Any, Any]


@dataclass(frozen=True)
class EngineFacts:
    """What the drivers need to know of the engine they run on."""

    tokens: WhisperTokens
    # generation_config's suppress_tokens (decoding.suppressed_tokens).
    suppress_tokens: tuple[int, ...] = ()
    # Multilingual models only (decoding.LanguageDetection).
    language_detection: decoding.LanguageDetection | None = None

    @classmethod
    def of_engine(cls, model_config: Any, tokenizer: Any) -> EngineFacts:
        """The facts of an engine serving ``model_config`` (vLLM's ModelConfig) with ``tokenizer``."""
        tokens = WhisperTokens.from_tokenizer(tokenizer, model_config.hf_config.vocab_size)
        detection = (
            decoding.LanguageDetection.for_model(model_config, tokenizer) if tokens.is_multilingual else None
        )
        return cls(tokens, tuple(decoding.suppressed_tokens(model_config)), detection)


def plugin_options(additional_config: Any) -> WhisperAlignConfig:
    """The plugin's options of an engine (``--additional-config``'s ``whisper_align``), with this
    process's phone aligner set by them (one setting a process: ``audio.phones.configure``) and its
    first worker started."""
    config = WhisperAlignConfig.from_additional_config(additional_config)
    phones.configure(dereverberate=config.dereverberate, denoise=config.denoise)
    phones.start()
    return config


# ---------------------------------------------------------------------------- one plan


def run_plan(plan: decoding.Plan, tokens: WhisperTokens) -> Generator[Command, Any, Transcript]:
    """A plan's windows through the engine: every window, then those that fall back to the next
    temperature, together; superseded and unkept captures discarded; the kept windows' captures
    fetched and finished into a transcript."""
    outputs: list[decoding.WindowOutput | None] = [None] * len(plan.windows)
    yield from decode_windows(plan, outputs, list(range(len(plan.windows))), tokens)
    # Windows dropped as silence are never aligned: their captures go.
    yield from _discard(decoding.dropped_keys(plan, outputs))
    requests = decoding.alignment_requests(plan, outputs)
    fetched = (yield Fetch(requests)) if requests else []
    decoded = plan.decoded(outputs)
    [transcript] = yield Compute([lambda: finish(decoded, fetched, tokens, plan.info)])
    return transcript


def decode_windows(
    plan: decoding.Plan, outputs: list, pending: list[int], tokens: WhisperTokens
) -> Generator[Command, Any, None]:
    """The windows ``pending`` names decoded, those that fall back to the next temperature again,
    together, until each has its output in ``outputs``; superseded captures discarded. Where the plan's
    fallback runs its temperatures at once, those that fail their first run all the later ones in one
    round more (:func:`_later_temperatures_at_once`)."""
    while pending:
        yield from _generate_windows(plan, outputs, pending, tokens)
        pending, superseded = decoding.fall_back(plan, outputs, pending)
        yield from _discard(superseded)
        if pending and plan.fallback.at_once:
            yield from _later_temperatures_at_once(plan, outputs, pending, tokens)
            return


def _generate_windows(
    plan: decoding.Plan, outputs: list, pending: list[int], tokens: WhisperTokens
) -> Generator[Command, Any, None]:
    """Runs the windows ``pending`` names (every candidate of each) and stores, in ``plan`` and
    ``outputs``, the candidate kept of each and its output."""
    names = [f"{i}-{plan.windows[i].attempt}" for i in pending]
    kept = yield from _run_attempts([plan.windows[i] for i in pending], names, tokens)
    for index, (window, output) in zip(pending, kept, strict=True):
        plan.windows[index], outputs[index] = window, output


def _later_temperatures_at_once(
    plan: decoding.Plan, outputs: list, pending: list[int], tokens: WhisperTokens
) -> Generator[Command, Any, None]:
    """Each window ``pending`` names (its next attempt planned, not run) with every attempt after it,
    all in one round, then read in order as :func:`decoding.fall_back` reads them a round at a time: the
    first that passes is kept (where all fail, the likeliest), and the captures of the attempts it
    would not have reached are discarded."""
    attempts = {
        i: [plan.windows[i], *decoding.later_attempts(plan.windows[i], plan.fallback)] for i in pending
    }
    flat = [(i, attempt) for i in pending for attempt in attempts[i]]
    names = [f"{i}-{a.attempt}" for i, a in flat]
    unneeded = _after_an_outright_pass([a for _, a in flat], [i for i, _ in flat], plan.fallback, tokens)
    answers = iter((yield from _run_attempts([a for _, a in flat], names, tokens, unneeded)))
    for index in pending:
        ran = [next(answers) for _ in attempts[index]]
        for position, attempt in enumerate(ran):
            if attempt is None:  # cut short: an earlier attempt passes outright, so this is never read
                raise RuntimeError(f"window {index}: attempt {position} read, but it was cut short")
            plan.windows[index], outputs[index] = attempt
            retried, superseded = decoding.fall_back(plan, outputs, [index])
            yield from _discard(superseded)
            if not retried:
                unread = [key for later in ran[position + 1 :] if later for key in later[0].capture_keys()]
                yield from _discard(unread)
                break


def _after_an_outright_pass(
    attempts: Sequence[decoding.WindowRequest],
    owners: Sequence[int],
    fallback: decoding.FallbackOptions,
    tokens: WhisperTokens,
) -> Callable[[list[Any]], list[int]]:
    """:attr:`Generate.unneeded` for ``attempts`` (of the windows ``owners`` names, each window's in
    the order the schedule runs them) sent in one round: the unfinished candidates of every attempt
    after one whose candidates have all finished and whose kept one passes the fallback test outright.
    Read in order, that window stops there or before (:func:`decoding.passes_outright`), so no later
    attempt is ever read."""
    spans = _candidate_spans(attempts)

    def unneeded(finals: list[Any]) -> list[int]:
        passed: set[int] = set()
        cut = []
        for attempt, owner, span in zip(attempts, owners, spans, strict=True):
            if owner in passed:
                cut += [j for j in span if finals[j] is None]
            elif all(finals[j] is not None for j in span):
                outputs = [
                    decoding.window_output(candidate, finals[j], tokens)
                    for candidate, j in zip(attempt.candidates(), span, strict=True)
                ]
                if decoding.passes_outright(outputs[decoding.best_candidate(outputs)], fallback):
                    passed.add(owner)
        return cut

    return unneeded


def _candidate_spans(attempts: Sequence[decoding.WindowRequest]) -> list[range]:
    """Where each attempt's candidates lie in the round's engine requests (every attempt's
    ``candidates()``, in order)."""
    spans, position = [], 0
    for attempt in attempts:
        count = len(attempt.candidates())
        spans.append(range(position, position + count))
        position += count
    return spans


def _run_attempts(
    attempts: Sequence[decoding.WindowRequest],
    names: Sequence[str],
    tokens: WhisperTokens,
    unneeded: Callable[[list[Any]], list[int]] | None = None,
) -> Generator[Command, Any, list[tuple[decoding.WindowRequest, decoding.WindowOutput] | None]]:
    """Every candidate of ``attempts`` in one round: the candidate kept of each attempt and its output
    (the others' captures discarded). ``unneeded`` as :attr:`Generate.unneeded`: an attempt the runner
    cut short is None, its captures discarded."""
    runs = [candidate for attempt in attempts for candidate in attempt.candidates()]
    run_names = [
        f"{name}-{j}"
        for attempt, name in zip(attempts, names, strict=True)
        for j in range(len(attempt.candidates()))
    ]
    finals = yield Generate(
        [
            EngineRequest(r.engine_prompt(), r.sampling_params, name, r.capture_keys())
            for r, name in zip(runs, run_names, strict=True)
        ],
        unneeded,
    )
    spans = _candidate_spans(attempts)
    finished = [all(finals[j] is not None for j in span) for span in spans]
    ran = [attempt for attempt, done in zip(attempts, finished, strict=True) if done]
    cut = [attempt for attempt, done in zip(attempts, finished, strict=True) if not done]
    yield from _discard([key for attempt in cut for key in attempt.capture_keys()])
    runs_ran = [candidate for attempt in ran for candidate in attempt.candidates()]
    finals_ran = [finals[j] for span, done in zip(spans, finished, strict=True) if done for j in span]
    keys = decoding.no_speech_keys(runs_ran)
    try:
        answers = (yield NoSpeech(keys)) if keys else []
    except NoCaptureError:
        answers = []  # no window counts as silence
    probs = decoding.no_speech_probs(runs_ran, answers)
    run_outputs = [
        decoding.window_output(run, final, tokens, prob)
        for run, final, prob in zip(runs_ran, finals_ran, probs, strict=True)
    ]
    kept, kept_outputs, dropped = decoding.keep_best(ran, run_outputs)
    yield from _discard(dropped)
    answers_kept = iter(zip(kept, kept_outputs, strict=True))
    return [next(answers_kept) if done else None for done in finished]


def _discard(keys: list[str]) -> Generator[Command, Any, None]:
    if keys:
        yield Discard(keys)


# ---------------------------------------------------------------------------- requests


def needs_windows(samples: np.ndarray | SpilledSamples) -> bool:
    """Forced alignment of audio over one window goes through long-form alignment; one window keeps
    the exact single pass."""
    return len(samples) > N_SAMPLES


def detect_language(samples: np.ndarray | SpilledSamples, facts: EngineFacts) -> Generator[Command, Any, str]:
    prompt, params = facts.language_detection.request(samples)
    [final] = yield Generate([EngineRequest(prompt, params, "lang")])
    return facts.language_detection.language(final.outputs[0].token_ids)


def transcription(
    samples: np.ndarray | SpilledSamples,
    facts: EngineFacts,
    *,
    language: str | None,
    task: str = "transcribe",
    word_timestamps: bool = True,
    prompt: str | None = None,
    options: TranscriptionOptions | None = None,
) -> Generator[Command, Any, Transcript]:
    """One input transcribed (or translated): its language detected where none is given (multilingual
    models), its windows decoded with openai-whisper's fallback, their words timed."""
    plan = yield from transcription_plan(
        samples,
        facts,
        language=language,
        task=task,
        word_timestamps=word_timestamps,
        prompt=prompt,
        options=options,
    )
    return (yield from run_plan(plan, facts.tokens))


def transcription_plan(
    samples: np.ndarray | SpilledSamples,
    facts: EngineFacts,
    *,
    language: str | None,
    task: str = "transcribe",
    word_timestamps: bool = True,
    prompt: str | None = None,
    options: TranscriptionOptions | None = None,
    prefix: Sequence[Word] = (),
) -> Generator[Command, Any, decoding.Plan]:
    """The windows of :func:`transcription`, planned once its language is known (``prefix``:
    :func:`decoding.plan_transcription`'s)."""
    facts.tokens.check_language(language, task)
    # Which windows hold speech (none: nothing is decoded): NumPy work of milliseconds a window.
    [windows] = yield Compute([lambda: decoding.windows_to_decode(samples, options)])
    if language is None and facts.language_detection is not None and windows:
        language = yield from detect_language(samples, facts)
    return decoding.plan_transcription(
        samples,
        facts.tokens,
        language=language,
        task=task,
        word_timestamps=word_timestamps,
        prompt=prompt,
        options=options,
        suppress_tokens=facts.suppress_tokens,
        windows=windows,
        prefix=prefix,
    )


# ---------------------------------------------------------------------------- window by window


@dataclass
class Streamed:
    """A plan run window by window, for an answer that is sent as it comes: ``windows`` holds one
    driver per window (decoded with the fallback, its capture fetched, its DTW run; it returns the
    window's ``TimedWindow``, or None for silence), which a runner carries out each on its own,
    concurrently (a window's words do not wait for the other windows' decoding); ``in_order`` reads
    their answers in window order into the same transcript :func:`run_plan` gives."""

    plan: decoding.Plan
    windows: list[Driver]
    in_order: InOrder


def streamed(plan: decoding.Plan, tokens: WhisperTokens) -> Streamed:
    outputs: list[decoding.WindowOutput | None] = [None] * len(plan.windows)
    windows = [final_window(plan, outputs, index, tokens) for index in range(len(plan.windows))]
    return Streamed(plan, windows, InOrder(tokens, plan.info))


def final_window(
    plan: decoding.Plan, outputs: list, index: int, tokens: WhisperTokens
) -> Generator[Command, Any, TimedWindow | None]:
    """Window ``index`` of ``plan`` alone, as :func:`run_plan` runs every window: decoded with the
    fallback, its capture discarded if it is silence, else fetched and its DTW run."""
    yield from decode_windows(plan, outputs, [index], tokens)
    yield from _discard(decoding.dropped_keys(plan, outputs, [index]))
    window = plan.decoded_window(index, outputs[index])
    if window is None:
        return None
    requests = decoding.alignment_requests(plan, outputs, [index])
    fetched = (yield Fetch(requests)) if requests else []
    [[timed]] = yield Compute([lambda: time_windows([window], fetched)])
    return timed


def alignment(
    samples: np.ndarray | SpilledSamples,
    facts: EngineFacts,
    *,
    text: str | None = None,
    token_ids: Sequence[int] | None = None,
    language: str | None = None,
    options: AlignmentOptions | None = None,
) -> Generator[Command, Any, Transcript]:
    """Forced alignment of a text (or token ids) to audio of any length: one window in one pass, longer
    audio window by window (``longform``)."""
    options = options or AlignmentOptions()
    tokens = facts.tokens
    tokens.check_language(language)
    if not needs_windows(samples):
        plan = alignment_plan(samples, facts, text, token_ids, language, options)
        return (yield from run_plan(plan, tokens))
    language = language or "en"
    # Off the event loop: a long text (a book's chapter) takes a while to tokenize.
    [given] = yield Compute([lambda: decoding.text_to_tokens(text, token_ids, tokens)])
    steps = alignment_steps(
        audible_windows(samples),
        given,
        tokens,
        language,
        len(samples) / SAMPLE_RATE,
        options.alignment_method,
    )
    transcripts = None
    while True:
        # The text matching between steps is NumPy work of up to seconds (30k words).
        [(step, done)] = yield Compute([lambda answers=transcripts: advance(steps, answers)])
        if step is None:
            return done
        name, jobs = step
        plans = [_job_plan(job, facts, language, options) for job in jobs]
        transcripts = yield from together([run_plan(plan, tokens) for plan in plans], prefix=name)


def alignment_plan(
    samples: np.ndarray | SpilledSamples,
    facts: EngineFacts,
    text: str | None = None,
    token_ids: Sequence[int] | None = None,
    language: str | None = None,
    options: AlignmentOptions | None = None,
) -> decoding.Plan:
    """The one teacher-forced pass of a forced alignment of audio up to one window."""
    facts.tokens.check_language(language)
    return decoding.plan_alignment(
        samples,
        facts.tokens,
        text=text,
        token_ids=token_ids,
        language=language,
        alignment_method=(options or AlignmentOptions()).alignment_method,
    )


def _job_plan(job: Job, facts: EngineFacts, language: str, options: AlignmentOptions) -> decoding.Plan:
    if isinstance(job, Hear):
        return decoding.plan_hearing(job.audio, facts.tokens, language, facts.suppress_tokens, job.max_tokens)
    assert isinstance(job, Force)
    return decoding.plan_alignment(
        AudioChunk.whole(job.audio),
        facts.tokens,
        token_ids=job.token_ids,
        language=language,
        alignment_method=options.alignment_method,
        report_ranks=True,
    )


# ---------------------------------------------------------------------------- several as one

# The order in which one round's commands are carried out: what frees the workers' memory first.
ROUND_ORDER = (Discard, NoSpeech, Fetch, Generate, Compute)


def together(drivers: Sequence[Driver], prefix: str = "") -> Generator[Command, Any, list]:
    """``drivers`` run as one: each round, every unfinished driver's command, those of a kind merged
    into one command (engine requests renamed ``{prefix}{k}.{name}`` after their driver ``k``); returns
    every driver's result, in order. A merged command that fails is thrown into each driver that
    asked it."""
    results: list[Any] = [None] * len(drivers)
    commands: dict[int, Command] = {}
    for k in range(len(drivers)):
        _step(drivers, k, None, None, commands, results)
    while commands:
        answers: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        for kind in ROUND_ORDER:
            asking = [k for k, command in commands.items() if isinstance(command, kind)]
            if not asking:
                continue
            merged, spans = _merge(kind, [commands[k] for k in asking], asking, prefix)
            try:
                answer = yield merged
            except Exception as error:  # the runner's answer to this command: for each driver
                errors.update((k, error) for k in asking)
                continue
            for k, (lo, hi) in zip(asking, spans, strict=True):
                answers[k] = None if answer is None else answer[lo:hi]
        pending = dict(commands)
        commands.clear()
        for k in pending:
            _step(drivers, k, answers.get(k), errors.get(k), commands, results)
    return results


def settled(work: Driver) -> Generator[Command, Any, tuple[Any, Exception | None]]:
    """``work`` whose failure is its own: (its result, None), or (None, the error it raised), so that
    one driver's failure among several run :func:`together` fails none of the others."""
    try:
        return (yield from work), None
    except Exception as error:
        return None, error


def _step(drivers, k: int, answer: Any, error: BaseException | None, commands: dict, results: list) -> None:
    """Sends driver ``k`` its answer (or throws its error) and keeps its next command, or its result."""
    try:
        commands[k] = drivers[k].throw(error) if error is not None else drivers[k].send(answer)
    except StopIteration as done:
        results[k] = done.value


def _merge(kind: type, commands: list[Command], owners: list[int], prefix: str) -> tuple[Command, list]:
    """One command of ``kind`` made of ``commands``, and the span of the merged answer each one's is."""
    if kind is Discard:
        return Discard([key for c in commands for key in c.keys]), [(0, 0)] * len(commands)
    parts = {
        NoSpeech: lambda c: c.keys,
        Fetch: lambda c: c.requests,
        Generate: lambda c: c.requests,
        Compute: lambda c: c.functions,
    }[kind]
    items, spans = [], []
    for owner, command in zip(owners, commands, strict=True):
        part = parts(command)
        if kind is Generate:
            part = [
                EngineRequest(r.prompt, r.sampling_params, f"{prefix}{owner}.{r.name}", r.capture_keys)
                for r in part
            ]
        spans.append((len(items), len(items) + len(part)))
        items += part
    if kind in (NoSpeech, Fetch):
        # The workers answer by key, not by position: every driver is handed the whole answer.
        return kind(items), [(0, None)] * len(commands)
    if kind is Generate:
        return Generate(items, _merged_unneeded(commands, spans)), spans  # type: ignore[arg-type]
    return kind(items), spans


def _merged_unneeded(commands: list, spans: list[tuple[int, int]]) -> Callable[[list[Any]], list[int]] | None:
    """:attr:`Generate.unneeded` of merged commands: each one's, on its own span of the finals."""
    parts = [(c.unneeded, lo, hi) for c, (lo, hi) in zip(commands, spans, strict=True) if c.unneeded]
    if not parts:
        return None
    return lambda finals: [lo + j for unneeded, lo, hi in parts for j in unneeded(finals[lo:hi])]


def no_capture_error(error: BaseException) -> NoCaptureError | None:
    """The domain error for a worker's answer that it captures nothing (the RPCs raise it as text)."""
    if NO_CAPTURE_MESSAGE in str(error):
        return NoCaptureError(f"word timestamps are unavailable: {NO_CAPTURE_MESSAGE}")
    return None


def carry_out(work: Driver, answer: Callable[[Command], Any]) -> Any:
    """``work`` driven to its result, each command answered by ``answer``; an input error ``answer``
    raises (no capture on this engine...) is thrown into ``work``, which may answer it."""
    reply, error = None, None
    while True:
        try:
            command = work.throw(error) if error is not None else work.send(reply)
        except StopIteration as done:
            return done.value
        reply, error = None, None
        try:
            reply = answer(command)
        except InputError as failure:
            error = failure


async def carry_out_async(work: Driver, answer: Callable[[Command], Awaitable[Any]]) -> Any:
    """:func:`carry_out` with ``answer`` awaited."""
    reply, error = None, None
    while True:
        try:
            command = work.throw(error) if error is not None else work.send(reply)
        except StopIteration as done:
            return done.value
        reply, error = None, None
        try:
            reply = await answer(command)
        except InputError as failure:
            error = failure
