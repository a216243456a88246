"""The per-window decoding policy: from audio (or audio and text) to engine requests, and back.

Engine-agnostic: the offline API (``LLM.generate``) and the server (``engine_client``) run what
:mod:`.driver` asks, and the driver plans its requests with :func:`plan_transcription` /
:func:`plan_alignment` / :func:`plan_hearing`, runs every window as its own engine request, and reads
what comes back with :func:`window_output`. Prompts, sampling options, output caps and suppressed
tokens are decided here and nowhere else, and so is openai-whisper's per-window quality policy: the
temperature fallback (:func:`fall_back`) and the rule that drops a window as silence
(:func:`is_silent`). Above temperature 0 a window runs as ``best_of`` candidates
(:meth:`WindowRequest.candidates`), of which :func:`keep_best` keeps one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from vllm import SamplingParams

from vllm_whisper_align.align.results import DecodedWindow, RequestInfo, WindowOutput
from vllm_whisper_align.align.words import Word, tokens_of
from vllm_whisper_align.audio.decode import SpilledSamples
from vllm_whisper_align.audio.windows import AudioChunk, audible_windows, speech_windows
from vllm_whisper_align.constants import (
    CHUNK_SECONDS,
    MAX_DECODER_TOKENS,
    N_SAMPLES,
    N_SAMPLES_PER_TOKEN,
    SAMPLE_RATE,
    num_mel_frames,
)
from vllm_whisper_align.errors import AlignmentInputError, OptionError
from vllm_whisper_align.options import (
    DEFAULT_ALIGNMENT_METHOD,
    MAX_BEST_OF,
    FallbackOptions,
    TranscriptionOptions,
    compression_ratio,
    method_named,
)
from vllm_whisper_align.protocol import AlignmentParams, AlignmentRequest, NoSpeechParams, new_alignment_key
from vllm_whisper_align.tokens import WhisperTokens

# Output tokens allowed per second of audio (plus a constant). Fast English is ~5-6 tokens/s, CJK ~8;
# without timestamp tokens a repetition loop otherwise runs to the 448-token context and holds its batch.
MAX_TOKENS_PER_SECOND = 12
MAX_TOKENS_BASE = 16
# Encoder frames (20 ms, two mel frames each) a window needs to be aligned: over a single frame
# the attention's z-score is 0/0, and DTW's path through the NaNs leaves the matrix (times of
# -0.02 s); with none there is nothing to normalise at all.
MIN_ALIGNMENT_FRAMES = 2
MIN_ALIGNMENT_SECONDS = MIN_ALIGNMENT_FRAMES * N_SAMPLES_PER_TOKEN / SAMPLE_RATE
# Forced alignment teacher-forces the whole text against one window.
MAX_ALIGNMENT_SECONDS = CHUNK_SECONDS
# Seed of a window's first sampled candidate when the caller gives none (see _at_temperature).
FALLBACK_SEED = 0
# What long-form alignment hears in a window is read at temperature 0 alone (plan_hearing).
GREEDY_ONLY = FallbackOptions(temperatures=(0.0,))


def suppressed_tokens(model_config) -> list[int]:
    """generation_config's ``suppress_tokens`` of a vLLM ``ModelConfig`` (for ``plan_transcription``)."""
    return list(model_config.try_get_generation_config().get("suppress_tokens") or [])


@dataclass
class WindowRequest:
    """One ≤30 s window of one input, ready for ``generate``."""

    audio: AudioChunk  # positions in the input; its samples are read on each use
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    alignment: AlignmentParams | None
    # Forced alignment: the text tokens are part of the prompt.
    forced_tokens: list[int] | None = None
    # Words already read in this window (a live stream's confirmed words; times in the input): their
    # tokens forced after the start tokens, the window's first text tokens (captured and aligned with
    # what is decoded after them).
    prefix: tuple[Word, ...] = ()
    # Text tokens kept of the output (the engine may be asked for one more: see text_token_cap).
    max_text_tokens: int | None = None
    no_speech: NoSpeechParams | None = None
    # What the sampling parameters are built from again at another temperature.
    sampling_options: dict[str, Any] = field(default_factory=dict)
    suppress_tokens: tuple[int, ...] = ()
    # Which temperature of the plan's schedule this attempt runs at.
    attempt: int = 0
    # The other candidates sampled for this attempt (best_of - 1 of them above temperature 0), each
    # with its own seed and capture key; keep_best leaves one.
    siblings: tuple[WindowRequest, ...] = ()

    @property
    def temperature(self) -> float:
        return self.sampling_params.temperature

    def candidates(self) -> tuple[WindowRequest, ...]:
        """The engine requests this attempt runs: itself and its siblings."""
        return (self, *self.siblings)

    def capture_keys(self) -> list[str]:
        """The keys under which the workers keep something for this attempt's candidates."""
        return [p.key for c in self.candidates() for p in (c.alignment, c.no_speech) if p is not None]

    @property
    def prefix_tokens(self) -> list[int]:
        return tokens_of(self.prefix)

    @property
    def samples(self) -> np.ndarray:
        return self.audio.samples

    @property
    def offset(self) -> float:
        """Seconds from the start of the input to samples[0]."""
        return self.audio.offset

    @property
    def duration(self) -> float:
        return self.audio.num_samples / SAMPLE_RATE

    def engine_prompt(self) -> dict[str, Any]:
        return {
            "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (self.samples, SAMPLE_RATE)}},
            "decoder_prompt": {"prompt_token_ids": self.prompt_token_ids},
        }


@dataclass
class Plan:
    """All window requests of one input (one audio file)."""

    windows: list[WindowRequest]
    info: RequestInfo
    fallback: FallbackOptions = field(default_factory=FallbackOptions)
    # Per window still falling back: its most likely attempt so far, kept in case every temperature
    # fails the test (see fall_back).
    failed_attempts: dict[int, tuple[WindowRequest, WindowOutput]] = field(default_factory=dict)

    def capture_keys(self) -> list[str]:
        """Every key under which the workers may keep something for this plan."""
        attempts = [*self.windows, *(window for window, _ in self.failed_attempts.values())]
        return [key for window in attempts for key in window.capture_keys()]

    def decoded(self, outputs: Sequence[WindowOutput]) -> list[DecodedWindow]:
        """The windows kept (not dropped as silence), as the alignment reads them."""
        kept = (self.decoded_window(index, output) for index, output in enumerate(outputs))
        return [window for window in kept if window is not None]

    def decoded_window(self, index: int, output: WindowOutput) -> DecodedWindow | None:
        """Window ``index`` as the alignment reads it; None where it is dropped as silence."""
        window = self.windows[index]
        if is_silent(output, self.fallback):
            return None
        return DecodedWindow(
            window.audio, output, window.alignment, window.forced_tokens is not None, window.prefix
        )


# ---------------------------------------------------------------------------- language detection


@dataclass
class LanguageDetection:
    """Whisper's language detection exactly as vLLM's model class defines it: one step on the first
    window, constrained to the language tokens (multilingual models only)."""

    model_cls: Any
    stt_config: Any
    tokenizer: Any

    @classmethod
    def for_model(cls, model_config, tokenizer) -> LanguageDetection:
        from vllm.model_executor.model_loader import get_model_cls

        model_cls = get_model_cls(model_config)
        return cls(model_cls, model_cls.get_speech_to_text_config(model_config, "transcribe"), tokenizer)

    def request(self, samples: np.ndarray) -> tuple[Any, SamplingParams]:
        prompt = self.model_cls.get_language_detection_prompt(samples[:N_SAMPLES], self.stt_config)
        allowed = self.model_cls.get_language_token_ids(self.tokenizer)
        return prompt, SamplingParams(temperature=0.0, max_tokens=1, allowed_token_ids=allowed)

    def language(self, token_ids: Sequence[int]) -> str:
        return self.model_cls.parse_language_detection_output(list(token_ids), self.tokenizer)


# ---------------------------------------------------------------------------- planning


def max_output_tokens(num_samples: int, num_prompt_tokens: int) -> int:
    """The output cap of a window: what fits the decoder context, and no more than speech can fill."""
    per_second = MAX_TOKENS_BASE + int(MAX_TOKENS_PER_SECOND * num_samples / SAMPLE_RATE)
    return min(MAX_DECODER_TOKENS - num_prompt_tokens, per_second)


def previous_text_tokens(prompt: str | None, tokens: WhisperTokens) -> list[int]:
    """``<|startofprev|>`` + the prompt's last tokens, as openai-whisper's initial_prompt (223 tokens)."""
    if not prompt:
        return []
    kept = MAX_DECODER_TOKENS // 2 - 1
    return [tokens.start_of_prev, *tokens.encode(" " + tokens.tail(prompt.strip(), kept))[-kept:]]


def text_token_cap(options: dict[str, Any] | None, num_samples: int, num_prompt_tokens: int) -> int:
    """Text tokens a window may produce: the caller's ``max_tokens``, never above the output cap."""
    cap = max_output_tokens(num_samples, num_prompt_tokens)
    return min((options or {}).get("max_tokens") or cap, cap)


def transcription_sampling(
    options: dict[str, Any] | None,
    suppress_tokens: Sequence[int],
    max_text_tokens: int,
    num_prompt_tokens: int,
    alignment: AlignmentParams | None,
    no_speech: NoSpeechParams | None = None,
    temperature: float = 0.0,
) -> SamplingParams:
    """``temperature`` (0: greedy) and the caller's other options; ``suppress_tokens``
    (generation_config's: non-speech symbols such as "[" and "♪") can never be sampled, as in
    openai-whisper's decoding: without it tiny models answer music-like noise with "[Music]".

    With word timings the engine may run one token past ``max_text_tokens`` (dropped again by
    :func:`window_output`): a token's decoder row only exists once it is fed back, and a request
    stopped by its token limit never feeds its last token, which would be left without an end.
    """
    options = dict(options or {})
    if "temperature" in options:
        raise ValueError("the temperature comes from the plan's FallbackOptions, not the sampling options")
    if suppress_tokens:
        options["logit_bias"] = {**{t: -100.0 for t in suppress_tokens}, **(options.get("logit_bias") or {})}
    extra = 1 if alignment is not None else 0
    options["max_tokens"] = min(max_text_tokens + extra, MAX_DECODER_TOKENS - num_prompt_tokens)
    extra_args = options.pop("extra_args", None)
    if alignment is not None:
        extra_args = alignment.to_extra_args(extra_args)
    if no_speech is not None:
        extra_args = no_speech.to_extra_args(extra_args)
    return SamplingParams(logprobs=0, extra_args=extra_args, temperature=temperature, **options)


def no_speech_row(previous: Sequence[int]) -> int:
    """Decoder row of ``<|startoftranscript|>``, after the ``<|startofprev|>`` prompt: the row
    whose prediction gives openai-whisper's no_speech_prob (its ``probs_at_sot``)."""
    return len(previous)


def can_align(num_samples: int) -> bool:
    """Whether a window this long has the encoder frames that word alignment needs."""
    return num_mel_frames(num_samples) // 2 >= MIN_ALIGNMENT_FRAMES


def plan_transcription(
    samples: np.ndarray | SpilledSamples,
    tokens: WhisperTokens,
    *,
    language: str | None,
    task: str = "transcribe",
    word_timestamps: bool = True,
    prompt: str | None = None,
    options: TranscriptionOptions | None = None,
    suppress_tokens: Sequence[int] = (),
    windows: Sequence[AudioChunk] | None = None,
    prefix: Sequence[Word] = (),
) -> Plan:
    """One request per ≤30 s window of ``windows`` (default :func:`windows_to_decode`, NumPy work that a
    caller on an event loop runs apart), decoded as ``options`` say (default: openai-whisper's transcribe
    options; the temperature is the fallback schedule's first). ``prefix``: words each window is
    known to begin with (a live stream's buffer, one window; times in ``samples``), their tokens forced
    rather than decoded again, and the acoustic model places only the words after them."""
    options = options or TranscriptionOptions()
    if not options.method.transcribes:
        raise OptionError(
            f"alignment_method {options.alignment_method} is for forced alignment; transcription reads "
            "auto or fixed",
            "alignment_method",
        )
    previous = previous_text_tokens(prompt, tokens)
    start = tokens.transcription_prompt(language, task)
    fallback = options.fallback
    windows = [
        _at_temperature(
            _transcription_window(
                chunk,
                tokens,
                previous,
                start,
                word_timestamps,
                options.alignment_method,
                options.sampling,
                suppress_tokens,
                tuple(prefix),
            ),
            0,
            fallback.temperatures[0],
            fallback.best_of,
        )
        for chunk in (windows_to_decode(samples, options) if windows is None else windows)
    ]
    language = "en" if tokens.is_english_only else language
    info = RequestInfo(task, language or "en", len(samples) / SAMPLE_RATE, word_timestamps)
    return Plan(windows, info, fallback)


def windows_to_decode(
    samples: np.ndarray | SpilledSamples, options: TranscriptionOptions | None = None
) -> list[AudioChunk]:
    """The windows worth transcribing: those that hold speech (``audio.windows.speech_windows``), since
    Whisper writes text into digital silence, noise and tones; every audible one when the no-speech rule
    is off (``no_speech_threshold`` none: each window decoded and its ``no_speech_prob`` reported)."""
    options = options or TranscriptionOptions()
    if options.fallback.no_speech_threshold is None:
        return audible_windows(samples)
    return speech_windows(samples)


def plan_hearing(
    audio: AudioChunk,
    tokens: WhisperTokens,
    language: str,
    suppress_tokens: Sequence[int],
    max_tokens: int | None = None,
) -> Plan:
    """What the model hears in one window of a longer input: greedy, without word timings, its first
    ``max_tokens`` tokens (None: all). A window that fails openai-whisper's thresholds is not sampled
    again at higher temperatures: its greedy words still locate the text (long-form matching tolerates
    misheard words), and each retry would decode the window again."""
    start = tokens.transcription_prompt(language)
    sampling = {"max_tokens": max_tokens} if max_tokens else {}
    window = _transcription_window(
        audio, tokens, [], start, False, DEFAULT_ALIGNMENT_METHOD, sampling, suppress_tokens
    )
    language = "en" if tokens.is_english_only else language
    info = RequestInfo("transcribe", language, audio.duration, word_timestamps=False)
    return Plan([_at_temperature(window, 0, 0.0, 1)], info, GREEDY_ONLY)


def _transcription_window(
    chunk: AudioChunk,
    tokens: WhisperTokens,
    previous: list[int],
    start: list[int],
    word_timestamps: bool,
    method: str,
    sampling: dict[str, Any],
    suppress_tokens: Sequence[int],
    prefix: tuple[Word, ...] = (),
) -> WindowRequest:
    """One window's request before its temperature is chosen (see _at_temperature). ``prefix``'s text
    tokens follow the start tokens in the decoder prompt, one prefill step rather than a decode step
    each; the window's output cap counts them, and their log-probabilities are the prompt's."""
    alignment = None
    # Too short a window still gets words (results.unaligned_jump_times), no attention to align.
    if word_timestamps and can_align(chunk.num_samples):
        alignment = AlignmentParams.for_prompt(
            num_mel_frames(chunk.num_samples), len(previous), len(start), alignment_method=method
        )
    no_speech = None
    if tokens.no_speech is not None:
        no_speech = NoSpeechParams(no_speech_row(previous), tokens.no_speech)
    forced = tokens_of(prefix)
    decoder_prompt = [*previous, *start, *forced]
    cap = text_token_cap(sampling, chunk.num_samples, len(decoder_prompt) - len(forced)) - len(forced)
    return WindowRequest(
        chunk,
        decoder_prompt,
        None,
        alignment,
        max_text_tokens=max(cap, 1),
        no_speech=no_speech,
        sampling_options={**sampling, "prompt_logprobs": 0} if prefix else dict(sampling),
        suppress_tokens=tuple(suppress_tokens),
        prefix=prefix,
    )


def later_attempts(window: WindowRequest, fallback: FallbackOptions) -> list[WindowRequest]:
    """The attempts of ``window`` after its own, each as :func:`fall_back` would make it: the same
    temperature, seeds and candidates, its own capture keys."""
    return [
        _at_temperature(window, attempt, fallback.temperatures[attempt], fallback.best_of)
        for attempt in range(window.attempt + 1, len(fallback.temperatures))
    ]


def _at_temperature(window: WindowRequest, attempt: int, temperature: float, best_of: int) -> WindowRequest:
    """``window`` as attempt ``attempt``, with fresh capture keys (the workers keep each attempt's
    capture apart, so a superseded one can be discarded while its successor runs), and above
    temperature 0 with ``best_of - 1`` siblings sampled beside it."""
    count = best_of if temperature > 0 else 1
    seed = window.sampling_options.get("seed")
    if seed is None:
        # Sampled candidates are reproducible (the same input gives the same text, alone or in any
        # batch: vLLM seeds each request's own generator) unless the caller gives a seed.
        seed = FALLBACK_SEED + attempt * MAX_BEST_OF
    candidates = [
        _candidate(window, attempt, temperature, seed + index if temperature > 0 else None, index == 0)
        for index in range(count)
    ]
    return replace(candidates[0], siblings=tuple(candidates[1:]))


def _candidate(
    window: WindowRequest, attempt: int, temperature: float, seed: int | None, primary: bool
) -> WindowRequest:
    alignment = window.alignment and replace(window.alignment, key=new_alignment_key())
    # no_speech_prob is read at the first step, which every candidate shares: the primary reads it.
    no_speech = None
    if window.no_speech is not None and primary:
        no_speech = replace(window.no_speech, key=new_alignment_key())
    options = window.sampling_options if seed is None else {**window.sampling_options, "seed": seed}
    sampling_params = transcription_sampling(
        options,
        window.suppress_tokens,
        window.max_text_tokens,
        len(window.prompt_token_ids),
        alignment,
        no_speech,
        temperature,
    )
    return replace(
        window,
        sampling_params=sampling_params,
        alignment=alignment,
        no_speech=no_speech,
        attempt=attempt,
        siblings=(),
    )


# ---------------------------------------------------------------------------- quality policy


def sum_logprob_score(output: WindowOutput) -> float:
    """openai-whisper's ranking of sampled candidates (MaximumLikelihoodRanker, no length penalty):
    the summed log-probability of the text tokens and eot, over the number of text tokens."""
    length = len(output.token_ids)
    return output.avg_logprob * (length + 1) / max(length, 1)


def best_candidate(outputs: Sequence[WindowOutput]) -> int:
    """The position of the candidate kept among one attempt's ``outputs``: the best
    :func:`sum_logprob_score`, the first of equals."""
    return max(range(len(outputs)), key=lambda i: sum_logprob_score(outputs[i]))


def keep_best(
    windows: Sequence[WindowRequest], outputs: Sequence[WindowOutput]
) -> tuple[list[WindowRequest], list[WindowOutput], list[str]]:
    """For each window, the candidate with the best :func:`sum_logprob_score` and its output.

    ``outputs`` are those of every window's ``candidates()``, in order. The kept output carries the
    primary candidate's no_speech_prob. Returns the kept windows, their outputs, and the capture
    keys of the candidates not kept, to discard.
    """
    kept_windows, kept_outputs, dropped = [], [], []
    position = 0
    for window in windows:
        candidates = window.candidates()
        scored = outputs[position : position + len(candidates)]
        position += len(candidates)
        best = best_candidate(scored)
        kept_windows.append(replace(candidates[best], siblings=(), no_speech=window.no_speech))
        kept_outputs.append(replace(scored[best], no_speech_prob=scored[0].no_speech_prob))
        dropped += [
            c.alignment.key for i, c in enumerate(candidates) if i != best and c.alignment is not None
        ]
    if position != len(outputs):
        raise ValueError(f"{len(outputs)} outputs for {position} candidates")
    return kept_windows, kept_outputs, dropped


def needs_fallback(output: WindowOutput, options: FallbackOptions) -> bool:
    """openai-whisper's ``decode_with_fallback`` test: too repetitive or too improbable, unless the
    window is silence (then another temperature would only invent text)."""
    silence = (
        options.no_speech_threshold is not None
        and output.no_speech_prob > options.no_speech_threshold
        and is_too_improbable(output, options)
    )
    return not passes_outright(output, options) and not silence


def passes_outright(output: WindowOutput, options: FallbackOptions) -> bool:
    """Passes :func:`needs_fallback` whatever its window's no-speech probability: known from the
    engine's output alone, before the workers are asked for that probability."""
    return not (is_too_repetitive(output, options) or is_too_improbable(output, options))


def is_too_improbable(output: WindowOutput, options: FallbackOptions) -> bool:
    """openai-whisper's confidence test: the text's average log-probability under the threshold."""
    return options.logprob_threshold is not None and output.avg_logprob < options.logprob_threshold


def is_too_repetitive(output: WindowOutput, options: FallbackOptions) -> bool:
    """openai-whisper's loop test: the text compresses too well."""
    return (
        options.compression_ratio_threshold is not None
        and output.compression_ratio > options.compression_ratio_threshold
    )


def is_silent(output: WindowOutput, options: FallbackOptions) -> bool:
    """openai-whisper's rule for skipping a window: the no-speech token is likely, and the text is
    not confident enough to overrule it."""
    if options.no_speech_threshold is None or output.no_speech_prob <= options.no_speech_threshold:
        return False
    return not (options.logprob_threshold is not None and output.avg_logprob > options.logprob_threshold)


def fall_back(
    plan: Plan, outputs: list[WindowOutput], just_run: Sequence[int]
) -> tuple[list[int], list[str]]:
    """Replaces, in ``plan``, every window of ``just_run`` that needs another temperature (and has one
    left) by its next attempt. Returns their indices, to re-submit, and the capture keys of the
    attempts no longer needed, to discard.

    When the last temperature fails too, the window keeps its most likely attempt (faster-whisper's
    rule: the least repetitive, then the highest ``avg_logprob``), not the last: openai-whisper keeps
    the last, which at temperature 1.0 is mostly invented text.
    """
    retried, superseded = [], []
    for index in just_run:
        window, output = plan.windows[index], outputs[index]
        if window.forced_tokens is not None:
            continue
        best_failed = plan.failed_attempts.pop(index, None)
        if not needs_fallback(output, plan.fallback):
            superseded += best_failed[0].capture_keys() if best_failed else []
            continue
        kept, other = _more_likely((window, output), best_failed, plan.fallback)
        superseded += other[0].capture_keys() if other else []
        following = window.attempt + 1
        if following < len(plan.fallback.temperatures):
            plan.failed_attempts[index] = kept
            plan.windows[index] = _at_temperature(
                window, following, plan.fallback.temperatures[following], plan.fallback.best_of
            )
            retried.append(index)
        else:
            plan.windows[index], outputs[index] = kept
    return retried, superseded


def _more_likely(latest, earlier, options: FallbackOptions):
    """Of two failed attempts ``(window, output)``, the one to keep and the other (None if none)."""
    if earlier is None:
        return latest, None

    def rank(attempt: tuple[WindowRequest, WindowOutput]) -> tuple[bool, float]:
        output = attempt[1]
        return not is_too_repetitive(output, options), output.avg_logprob

    return (latest, earlier) if rank(latest) > rank(earlier) else (earlier, latest)


def dropped_keys(
    plan: Plan, outputs: Sequence[WindowOutput], indices: Sequence[int] | None = None
) -> list[str]:
    """Alignment keys of the windows (of ``indices``; None: all) dropped as silence: nothing of them is
    fetched."""
    return [
        plan.windows[i].alignment.key
        for i in (range(len(plan.windows)) if indices is None else indices)
        if plan.windows[i].alignment is not None and is_silent(outputs[i], plan.fallback)
    ]


def text_to_tokens(
    text: str | None, token_ids: Sequence[int] | None, tokens: WhisperTokens, room: int | None = None
) -> list[int]:
    """The given text's tokens (or the given ids, checked). ``room``: the most tokens that can be
    aligned; a text surely longer is refused before it is tokenized (a megabyte takes seconds)."""
    if token_ids is not None:
        ids = [int(t) for t in token_ids]
        if not ids:  # as an empty text is: nothing to align is a mistake, not an empty answer
            raise AlignmentInputError("`tokens` is empty: give the token ids of the text to align", "tokens")
        bad = [t for t in ids if not tokens.is_text_token(t)]
        if bad:
            raise AlignmentInputError(
                f"token ids must be text tokens in 0..{tokens.eot - 1}; got {bad[:5]}", "tokens"
            )
        return ids
    text = _given_text(text)
    if room is not None and tokens.surely_longer(text, room):
        raise AlignmentInputError(
            f"text is {len(text) - 1} characters, more than the {room} tokens that fit in Whisper's "
            f"{MAX_DECODER_TOKENS}-token decoder context",
            "text",
        )
    return tokens.encode(text)


def character_tokens(
    text: str | None, token_ids: Sequence[int] | None, tokens: WhisperTokens, room: int
) -> list[int]:
    """The given text (or the text of the given ids) as one token a character or more
    (``WhisperTokens.encode_characters``); a text of more characters than ``room`` is refused before
    it is tokenized (a megabyte takes seconds)."""
    if token_ids is not None:
        text = tokens.decode(text_to_tokens(None, token_ids, tokens))
    text = _given_text(text)
    characters = sum(len(word) for word in text.split())
    if characters > room:
        raise AlignmentInputError(
            f"text is {characters} characters; at most {room} fit in Whisper's {MAX_DECODER_TOKENS}-token "
            "decoder context",
            "text",
        )
    return tokens.encode_characters(text)


def _given_text(text: str | None) -> str:
    if text is None or not text.strip():
        raise AlignmentInputError("give the text to align (text or tokens)", "text")
    # A leading space: Whisper's text always starts with a space-prefixed token.
    return " " + text.strip()


def plan_alignment(
    samples: np.ndarray | AudioChunk,
    tokens: WhisperTokens,
    *,
    text: str | None = None,
    token_ids: Sequence[int] | None = None,
    language: str | None = None,
    alignment_method: str = DEFAULT_ALIGNMENT_METHOD,
    report_ranks: bool = False,
) -> Plan:
    """Teacher-forced alignment of given text: one engine step over [sot…, no_timestamps, text, eot].
    ``samples``: the audio, or a window of a longer input (times are then the input's)."""
    method = method_named(alignment_method)
    language = "en" if tokens.is_english_only and language is None else (language or "en")
    audio = AudioChunk.whole(samples)
    duration = audio.duration
    if audio.num_samples > MAX_ALIGNMENT_SECONDS * SAMPLE_RATE:
        raise AlignmentInputError(
            f"audio is {duration:.1f} s; forced alignment takes one window of at most "
            f"{MAX_ALIGNMENT_SECONDS} s"
        )
    if not can_align(audio.num_samples):
        raise AlignmentInputError(
            f"audio is {duration:.3f} s; forced alignment needs at least {MIN_ALIGNMENT_SECONDS:g} s"
        )
    room = tokens.alignment_room()
    if method.forces_characters:
        text_tokens = character_tokens(text, token_ids, tokens, room)
    else:
        text_tokens = text_to_tokens(text, token_ids, tokens, room)
    if len(text_tokens) > room:
        unit = "characters" if method.forces_characters else "tokens"
        raise AlignmentInputError(
            f"text is {len(text_tokens)} {unit}; at most {room} fit in Whisper's {MAX_DECODER_TOKENS}-token "
            "decoder context"
        )
    start = tokens.transcription_prompt(language)
    alignment = AlignmentParams.for_prompt(
        num_mel_frames(audio.num_samples), 0, len(start), alignment_method=method.name
    )
    sampling = SamplingParams(
        temperature=0.0, max_tokens=1, prompt_logprobs=0, extra_args=alignment.to_extra_args()
    )
    window = WindowRequest(
        audio, [*start, *text_tokens, tokens.eot], sampling, alignment, forced_tokens=text_tokens
    )
    return Plan([window], RequestInfo("align", language, duration, True, report_ranks))


# ---------------------------------------------------------------------------- engine outputs


def window_output(
    window: WindowRequest, output: Any, tokens: WhisperTokens, no_speech_prob: float = 0.0
) -> WindowOutput:
    """Text tokens and their log-probabilities from a vLLM RequestOutput, and the window's figures
    as openai-whisper computes them (``no_speech_prob`` comes from the workers: see
    :class:`NoSpeechParams`)."""
    if window.forced_tokens is not None:
        forced = window.forced_tokens
        entries = _prompt_text_entries(window, output, len(forced))
        token_logprobs = [_logprob_of(entry, token) for entry, token in zip(entries, forced, strict=True)]
        token_ranks = [_rank_of(entry, token) for entry, token in zip(entries, forced, strict=True)]
        return WindowOutput(list(window.forced_tokens), token_logprobs, token_ranks=token_ranks)
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    sampled = completion.logprobs or [None] * len(ids)
    pairs = [(t, _logprob_of(lp, t)) for t, lp in zip(ids, sampled, strict=False) if tokens.is_text_token(t)]
    prefix = window.prefix_tokens
    entries = _prompt_text_entries(window, output, len(prefix))
    given = [(t, _logprob_of(e, t)) for t, e in zip(prefix, entries, strict=True)]
    pairs = given + pairs[: window.max_text_tokens]
    token_ids, logprobs = [t for t, _ in pairs], [lp for _, lp in pairs]
    # The reference sums the sampled tokens' log-probabilities up to and including eot, over len + 1.
    eot_logprobs = (_logprob_of(lp, t) for t, lp in zip(ids, sampled, strict=False) if t == tokens.eot)
    eot_logprob = next(eot_logprobs, 0.0)
    return WindowOutput(
        token_ids,
        logprobs,
        avg_logprob=(sum(logprobs) + eot_logprob) / (len(token_ids) + 1),
        compression_ratio=compression_ratio(tokens.decode(token_ids).strip()),
        no_speech_prob=no_speech_prob,
        temperature=window.temperature,
    )


def _prompt_text_entries(window: WindowRequest, output: Any, count: int) -> list[Any]:
    """The prompt log-probability entries of the first ``count`` text tokens of a window whose text
    begins in its prompt (None where vLLM gave none, as for a window without alignment rows)."""
    if not count:
        return []
    logprobs = output.prompt_logprobs or []
    first = (
        window.alignment.first_text_position() if window.alignment else len(window.prompt_token_ids) - count
    )
    return [logprobs[first + i] if first + i < len(logprobs) else None for i in range(count)]


def _rank_of(entry: Any, token: int) -> int:
    """The token's rank in a log-probability entry; 0 where vLLM gave none."""
    if not entry or token not in entry:
        return 0
    return int(getattr(entry[token], "rank", 0) or 0)


def _logprob_of(entry: Any, token: int) -> float:
    if not entry or token not in entry:
        return 0.0
    value = entry[token]
    return float(getattr(value, "logprob", value))


def alignment_requests(
    plan: Plan, outputs: Sequence[WindowOutput], indices: Sequence[int] | None = None
) -> list[AlignmentRequest]:
    """What to fetch from the workers for the windows (of ``indices``; None: all) that asked for word
    timings and are kept."""
    return [
        AlignmentRequest(plan.windows[i].alignment.key, len(outputs[i].token_ids))
        for i in (range(len(plan.windows)) if indices is None else indices)
        if plan.windows[i].alignment is not None and not is_silent(outputs[i], plan.fallback)
    ]


def no_speech_keys(windows: Sequence[WindowRequest]) -> list[str]:
    return [w.no_speech.key for w in windows if w.no_speech is not None]


def no_speech_probs(windows: Sequence[WindowRequest], answers: Sequence[dict[str, Any]]) -> list[float]:
    """Each window's no_speech_prob from the workers' answers (0.0 where none came: never silent)."""
    by_key = {a["key"]: a["no_speech_prob"] for a in answers if "no_speech_prob" in a}
    return [by_key.get(w.no_speech.key, 0.0) if w.no_speech is not None else 0.0 for w in windows]
