"""The per-window decoding policy: from audio (or audio and text) to engine requests, and back.

Engine-agnostic: the offline API (``LLM.generate``) and the HTTP server (``AsyncLLM``) both plan
their requests with :func:`plan_transcription` / :func:`plan_alignment`, run every window as its own
engine request, and read what comes back with :func:`window_output`. Prompts, sampling options,
output caps and suppressed tokens are decided here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from vllm import SamplingParams

from vllm_whisper_align.audio import (
    CHUNK_SECONDS, N_SAMPLES, N_SAMPLES_PER_TOKEN, SAMPLE_RATE, chunk_audio, num_mel_frames,
)
from vllm_whisper_align.params import MAX_DECODER_TOKENS, AlignmentParams, AlignmentRequest
from vllm_whisper_align.tokenizer import WhisperTokens

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


class AlignmentInputError(ValueError):
    """Text or token ids that cannot be aligned (too long, out of vocabulary, empty audio)."""


def suppressed_tokens(model_config) -> list[int]:
    """generation_config's ``suppress_tokens`` of a vLLM ``ModelConfig`` (for ``plan_transcription``)."""
    return list(model_config.try_get_generation_config().get("suppress_tokens") or [])


@dataclass
class WindowRequest:
    """One ≤30 s window of one input, ready for ``generate``."""

    samples: np.ndarray
    offset: float  # seconds from the start of the input to samples[0]
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    alignment: AlignmentParams | None
    # Forced alignment: the text tokens are part of the prompt.
    forced_tokens: list[int] | None = None
    # Text tokens kept of the output (the engine may be asked for one more: see text_token_cap).
    max_text_tokens: int | None = None

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE

    def engine_prompt(self) -> dict[str, Any]:
        return {
            "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (self.samples, SAMPLE_RATE)}},
            "decoder_prompt": {"prompt_token_ids": self.prompt_token_ids},
        }


@dataclass
class WindowOutput:
    """What the engine returned for a WindowRequest: its text tokens and their log-probabilities."""

    token_ids: list[int]
    token_logprobs: list[float]


@dataclass
class Plan:
    """All window requests of one input (one audio file)."""

    windows: list[WindowRequest]
    duration: float
    language: str
    task: str = "transcribe"
    word_timestamps: bool = True


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
    return [tokens.start_of_prev, *tokens.encode(" " + prompt.strip())[-(MAX_DECODER_TOKENS // 2 - 1) :]]


def text_token_cap(options: dict[str, Any] | None, num_samples: int, num_prompt_tokens: int) -> int:
    """Text tokens a window may produce: the caller's ``max_tokens``, never above the output cap."""
    cap = max_output_tokens(num_samples, num_prompt_tokens)
    return min((options or {}).get("max_tokens") or cap, cap)


def transcription_sampling(
    options: dict[str, Any] | None, suppress_tokens: Sequence[int], max_text_tokens: int,
    num_prompt_tokens: int, alignment: AlignmentParams | None,
) -> SamplingParams:
    """Greedy unless the caller says otherwise; ``suppress_tokens`` (generation_config's: non-speech
    symbols such as "[" and "♪") can never be sampled, as in openai-whisper's decoding: without it
    tiny models answer music-like noise with "[Music]".

    With word timings the engine may run one token past ``max_text_tokens`` (dropped again by
    :func:`window_output`): a token's decoder row only exists once it is fed back, and a request
    stopped by its token limit never feeds its last token, which would be left without an end.
    """
    options = {"temperature": 0.0, **(options or {})}
    if suppress_tokens:
        options["logit_bias"] = {**{t: -100.0 for t in suppress_tokens}, **(options.get("logit_bias") or {})}
    extra = 1 if alignment is not None else 0
    options["max_tokens"] = min(max_text_tokens + extra, MAX_DECODER_TOKENS - num_prompt_tokens)
    extra_args = options.pop("extra_args", None)
    if alignment is not None:
        extra_args = alignment.to_extra_args(extra_args)
    return SamplingParams(logprobs=0, extra_args=extra_args, **options)


def can_align(num_samples: int) -> bool:
    """Whether a window this long has the encoder frames that word alignment needs."""
    return num_mel_frames(num_samples) // 2 >= MIN_ALIGNMENT_FRAMES


def plan_transcription(
    samples: np.ndarray,
    tokens: WhisperTokens,
    *,
    language: str | None,
    task: str = "transcribe",
    word_timestamps: bool = True,
    prompt: str | None = None,
    sampling: dict[str, Any] | None = None,
    suppress_tokens: Sequence[int] = (),
) -> Plan:
    """One request per ≤30 s window; ``sampling`` adds SamplingParams fields (temperature, top_p…)."""
    previous = previous_text_tokens(prompt, tokens)
    start = tokens.transcription_prompt(language, task)
    decoder_prompt = [*previous, *start]
    windows = []
    for chunk in chunk_audio(samples):
        if num_mel_frames(len(chunk.samples)) == 0:  # nothing to hear
            continue
        alignment = None
        # Too short a window still gets words (results.unaligned_jump_times), no attention to align.
        if word_timestamps and can_align(len(chunk.samples)):
            alignment = AlignmentParams.for_prompt(num_mel_frames(len(chunk.samples)), len(previous), len(start))
        cap = text_token_cap(sampling, len(chunk.samples), len(decoder_prompt))
        sampling_params = transcription_sampling(sampling, suppress_tokens, cap, len(decoder_prompt), alignment)
        windows.append(WindowRequest(
            chunk.samples, chunk.offset, decoder_prompt, sampling_params, alignment, max_text_tokens=cap
        ))
    language = "en" if tokens.is_english_only else language
    return Plan(windows, len(samples) / SAMPLE_RATE, language or "en", task, word_timestamps)


def text_to_tokens(text: str | None, token_ids: Sequence[int] | None, tokens: WhisperTokens) -> list[int]:
    if token_ids is not None:
        ids = [int(t) for t in token_ids]
        bad = [t for t in ids if not tokens.is_text_token(t)]
        if bad:
            raise AlignmentInputError(f"token ids must be text tokens in 0..{tokens.eot - 1}; got {bad[:5]}")
        return ids
    if text is None or not text.strip():
        raise AlignmentInputError("give the text to align (text or tokens)")
    # A leading space: Whisper's text always starts with a space-prefixed token.
    return tokens.encode(" " + text.strip())


def plan_alignment(
    samples: np.ndarray,
    tokens: WhisperTokens,
    *,
    text: str | None = None,
    token_ids: Sequence[int] | None = None,
    language: str | None = None,
) -> Plan:
    """Teacher-forced alignment of given text: one engine step over [sot…, no_timestamps, text, eot]."""
    language = "en" if tokens.is_english_only and language is None else (language or "en")
    duration = len(samples) / SAMPLE_RATE
    if len(samples) > MAX_ALIGNMENT_SECONDS * SAMPLE_RATE:
        raise AlignmentInputError(
            f"audio is {duration:.1f} s; forced alignment takes one window of at most {MAX_ALIGNMENT_SECONDS} s"
        )
    if not can_align(len(samples)):
        raise AlignmentInputError(
            f"audio is {duration:.3f} s; forced alignment needs at least {MIN_ALIGNMENT_SECONDS:g} s"
        )
    text_tokens = text_to_tokens(text, token_ids, tokens)
    start = tokens.transcription_prompt(language)
    prompt = [*start, *text_tokens, tokens.eot]
    if len(prompt) > MAX_DECODER_TOKENS:
        raise AlignmentInputError(
            f"text is {len(text_tokens)} tokens; at most {MAX_DECODER_TOKENS - len(start) - 1} "
            f"fit in Whisper's {MAX_DECODER_TOKENS}-token decoder context"
        )
    alignment = AlignmentParams.for_prompt(num_mel_frames(len(samples)), 0, len(start))
    sampling = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, extra_args=alignment.to_extra_args())
    window = WindowRequest(samples, 0.0, prompt, sampling, alignment, forced_tokens=text_tokens)
    return Plan([window], duration, language, "align", True)


# ---------------------------------------------------------------------------- engine outputs


def window_output(window: WindowRequest, output: Any, tokens: WhisperTokens) -> WindowOutput:
    """Text tokens and their log-probabilities from a vLLM RequestOutput."""
    if window.forced_tokens is not None:
        logprobs = output.prompt_logprobs or []
        first = window.alignment.first_text_position()
        token_logprobs = [
            _logprob_of(logprobs[first + i] if first + i < len(logprobs) else None, token)
            for i, token in enumerate(window.forced_tokens)
        ]
        return WindowOutput(list(window.forced_tokens), token_logprobs)
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    sampled = completion.logprobs or [None] * len(ids)
    pairs = [(t, _logprob_of(lp, t)) for t, lp in zip(ids, sampled, strict=False) if tokens.is_text_token(t)]
    pairs = pairs[: window.max_text_tokens]
    return WindowOutput([t for t, _ in pairs], [lp for _, lp in pairs])


def _logprob_of(entry: Any, token: int) -> float:
    if not entry or token not in entry:
        return 0.0
    value = entry[token]
    return float(getattr(value, "logprob", value))


def alignment_requests(plan: Plan, outputs: Sequence[WindowOutput]) -> list[AlignmentRequest]:
    """What to fetch from the workers for the windows that asked for word timings."""
    return [
        AlignmentRequest(window.alignment.key, len(output.token_ids))
        for window, output in zip(plan.windows, outputs, strict=True)
        if window.alignment is not None
    ]
