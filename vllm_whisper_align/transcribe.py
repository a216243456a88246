"""From audio to engine requests, and from engine outputs to OpenAI-shaped results.

Engine-agnostic: the offline API (``LLM.generate``) and the HTTP server (``AsyncLLM``) both build
their requests with :func:`plan_transcription` / :func:`plan_alignment` and turn what comes back
into results with :func:`finish`. Nothing here talks to an engine.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from vllm import SamplingParams

from vllm_whisper_align import timing, words
from vllm_whisper_align.audio import (
    CHUNK_SECONDS, HOP_LENGTH, SAMPLE_RATE, chunk_audio, num_mel_frames, speech_frames,
)
from vllm_whisper_align.params import MAX_DECODER_TOKENS, AlignmentParams, AlignmentRequest
from vllm_whisper_align.tokenizer import WhisperTokens

# A new segment starts after a sentence end or a pause this long (no timestamp tokens are decoded).
SEGMENT_PAUSE_S = 1.0
SEGMENT_MAX_S = 15.0
# Output tokens allowed per second of audio (plus a constant). Fast English is ~5-6 tokens/s, CJK ~8; without
# timestamp tokens a repetition loop otherwise runs to the 448-token context and holds its batch.
MAX_TOKENS_PER_SECOND = 12
MAX_TOKENS_BASE = 16
# Encoder frames (20 ms, two mel frames each) a window needs to be aligned: over a single frame
# the attention's z-score is 0/0, and DTW's path through the NaNs leaves the matrix (times of
# -0.02 s); with none there is nothing to normalise at all.
MIN_ALIGNMENT_FRAMES = 2
MIN_ALIGNMENT_SECONDS = MIN_ALIGNMENT_FRAMES * 2 * HOP_LENGTH / SAMPLE_RATE
# Forced alignment teacher-forces the whole text against one window.
MAX_ALIGNMENT_SECONDS = CHUNK_SECONDS


def suppressed_tokens(model_config) -> list[int]:
    """generation_config's ``suppress_tokens`` of a vLLM ``ModelConfig`` (for ``plan_transcription``)."""
    return list(model_config.try_get_generation_config().get("suppress_tokens") or [])


class AlignmentInputError(ValueError):
    """Text or token ids that cannot be aligned (too long, out of vocabulary, empty audio)."""


@dataclass
class ChunkRequest:
    """One ≤30 s window of one input, ready for ``generate``."""

    samples: np.ndarray
    offset: float
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    alignment: AlignmentParams | None
    # Forced alignment: the text tokens are part of the prompt.
    forced_tokens: list[int] | None = None

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE

    def engine_prompt(self) -> dict[str, Any]:
        return {
            "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (self.samples, SAMPLE_RATE)}},
            "decoder_prompt": {"prompt_token_ids": self.prompt_token_ids},
        }


@dataclass
class ChunkOutput:
    """What the engine returned for a ChunkRequest."""

    token_ids: list[int]
    token_logprobs: list[float]
    matrix: np.ndarray | None = None
    error: str | None = None


@dataclass
class Plan:
    """All chunk requests of one input (one audio file)."""

    chunks: list[ChunkRequest]
    duration: float
    language: str
    task: str = "transcribe"
    word_timestamps: bool = True
    # Move word boundaries out of silences (see words.snap_to_speech); off gives the reference's times.
    snap_to_speech: bool = True


def language_detection_request(samples: np.ndarray, tokens: WhisperTokens) -> tuple[dict, SamplingParams]:
    """One step on the first 30 s, constrained to language tokens (multilingual models only)."""
    window = samples[: 30 * SAMPLE_RATE]
    prompt = {
        "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (window, SAMPLE_RATE)}},
        "decoder_prompt": {"prompt_token_ids": [tokens.sot]},
    }
    params = SamplingParams(
        temperature=0.0, max_tokens=1, allowed_token_ids=sorted(tokens.language_ids.values())
    )
    return prompt, params


def language_from_token(token: int, tokens: WhisperTokens) -> str:
    for language, index in tokens.language_ids.items():
        if index == token:
            return language
    return "en"


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
    """One request per ≤30 s window; ``sampling`` adds SamplingParams fields (temperature, top_p…).

    ``suppress_tokens`` (generation_config's: non-speech symbols such as "[" and "♪") can never be
    sampled, as in openai-whisper's decoding; without it tiny models answer music-like noise with
    "[Music]" or "♪".
    """
    language = "en" if tokens.is_english_only else language
    duration = len(samples) / SAMPLE_RATE
    prefix = []
    if prompt:
        # <|startofprev|> + previous text, as openai-whisper's initial_prompt (last 223 tokens).
        prefix = [tokens.start_of_prev, *tokens.encode(" " + prompt.strip())[-(MAX_DECODER_TOKENS // 2 - 1) :]]
    decoder_prompt = [*prefix, *tokens.transcription_prompt(language, task)]
    chunks = []
    for chunk in chunk_audio(samples):
        if num_mel_frames(len(chunk.samples)) == 0:  # nothing to hear
            continue
        alignment = None
        # Too short a window still gets words (see assemble), just no attention to align.
        if word_timestamps and can_align(len(chunk.samples)):
            alignment = AlignmentParams(
                num_frames=num_mel_frames(len(chunk.samples)),
                sot_row=len(prefix),
                text_row=len(decoder_prompt) - 1,
            )
        options = {"temperature": 0.0, **(sampling or {})}
        if suppress_tokens:
            options["logit_bias"] = {**{t: -100.0 for t in suppress_tokens}, **(options.get("logit_bias") or {})}
        max_tokens = min(
            MAX_DECODER_TOKENS - len(decoder_prompt),
            MAX_TOKENS_BASE + int(MAX_TOKENS_PER_SECOND * len(chunk.samples) / SAMPLE_RATE),
        )
        options["max_tokens"] = min(options.get("max_tokens") or max_tokens, max_tokens)
        extra_args = options.pop("extra_args", None)
        if alignment is not None:
            extra_args = alignment.to_extra_args(extra_args)
        sampling_params = SamplingParams(logprobs=0, extra_args=extra_args, **options)
        chunks.append(ChunkRequest(chunk.samples, chunk.offset, decoder_prompt, sampling_params, alignment))
    return Plan(chunks, duration, language or "en", task, word_timestamps)


def text_to_tokens(text: str | None, token_ids: Sequence[int] | None, tokens: WhisperTokens) -> list[int]:
    if token_ids is not None:
        ids = [int(t) for t in token_ids]
        bad = [t for t in ids if not tokens.is_text_token(t)]
        if bad:
            raise AlignmentInputError(
                f"token ids must be text tokens in 0..{tokens.eot - 1}; got {bad[:5]}"
            )
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
    language = "en" if tokens.is_english_only else (language or "en")
    duration = len(samples) / SAMPLE_RATE
    if duration > MAX_ALIGNMENT_SECONDS:
        raise AlignmentInputError(
            f"audio is {duration:.1f} s; forced alignment takes one window of at most "
            f"{MAX_ALIGNMENT_SECONDS} s"
        )
    if not can_align(len(samples)):
        raise AlignmentInputError(
            f"audio is {duration:.3f} s; forced alignment needs at least {MIN_ALIGNMENT_SECONDS:g} s"
        )
    text_tokens = text_to_tokens(text, token_ids, tokens)
    prompt = tokens.alignment_prompt(language, text_tokens)
    if len(prompt) > MAX_DECODER_TOKENS:
        raise AlignmentInputError(
            f"text is {len(text_tokens)} tokens; at most {MAX_DECODER_TOKENS - len(prompt) + len(text_tokens)} "
            f"fit in Whisper's {MAX_DECODER_TOKENS}-token decoder context"
        )
    alignment = AlignmentParams(
        num_frames=num_mel_frames(len(samples)), sot_row=0, text_row=len(prompt) - len(text_tokens) - 2
    )
    sampling = SamplingParams(
        temperature=0.0, max_tokens=1, prompt_logprobs=0, extra_args=alignment.to_extra_args()
    )
    chunk = ChunkRequest(samples, 0.0, prompt, sampling, alignment, forced_tokens=text_tokens)
    return Plan([chunk], duration, language, "align", True)


def chunk_output_from_request_output(
    chunk: ChunkRequest, output: Any, tokens: WhisperTokens
) -> ChunkOutput:
    """Text tokens and their log-probabilities from a vLLM RequestOutput."""
    if chunk.forced_tokens is not None:
        logprobs = output.prompt_logprobs or []
        first = len(chunk.prompt_token_ids) - len(chunk.forced_tokens) - 1
        token_logprobs = [
            _logprob_of(logprobs[first + i] if first + i < len(logprobs) else None, token)
            for i, token in enumerate(chunk.forced_tokens)
        ]
        return ChunkOutput(list(chunk.forced_tokens), token_logprobs)
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    sampled = completion.logprobs or [None] * len(ids)
    pairs = [(t, _logprob_of(lp, t)) for t, lp in zip(ids, sampled) if tokens.is_text_token(t)]
    return ChunkOutput([t for t, _ in pairs], [lp for _, lp in pairs])


def _logprob_of(entry: Any, token: int) -> float:
    if not entry or token not in entry:
        return 0.0
    value = entry[token]
    return float(getattr(value, "logprob", value))


def alignment_requests(plan: Plan, outputs: Sequence[ChunkOutput]) -> list[AlignmentRequest]:
    return [
        AlignmentRequest(chunk.alignment.key, len(output.token_ids))
        for chunk, output in zip(plan.chunks, outputs)
        if chunk.alignment is not None
    ]


def attach_matrices(plan: Plan, outputs: Sequence[ChunkOutput], results: Sequence[dict]) -> None:
    """Turn the workers' cross-attention logits into each window's DTW matrix."""
    by_key = {r["key"]: r for r in results}
    for chunk, output in zip(plan.chunks, outputs):
        if chunk.alignment is None:
            continue
        result = by_key.get(chunk.alignment.key)
        if result is None or "error" in result:
            output.error = (result or {}).get("error", "no alignment returned")
            continue
        cross_qk = np.frombuffer(result["cross_qk"], dtype=np.float32).reshape(result["shape"])
        output.matrix = text_alignment_matrix(cross_qk, chunk.alignment, len(output.token_ids))


def text_alignment_matrix(cross_qk: np.ndarray, params: AlignmentParams, num_text_tokens: int) -> np.ndarray:
    """Rows of the normalised matrix that predict the text tokens and eot (the DTW's input)."""
    matrix = timing.alignment_matrix(
        cross_qk, params.num_frames, medfilt_width=params.medfilt_width, qk_scale=params.qk_scale
    )
    text_start = params.text_row - params.sot_row
    return matrix[text_start : text_start + num_text_tokens + 1]


def finish(
    plan: Plan, outputs: Sequence[ChunkOutput], results: Sequence[dict], tokens: WhisperTokens
) -> dict[str, Any]:
    attach_matrices(plan, outputs, results)
    return assemble(plan, outputs, tokens)


def assemble(plan: Plan, outputs: Sequence[ChunkOutput], tokens: WhisperTokens) -> dict[str, Any]:
    """OpenAI's verbose_json shape (+ ``tokens`` with per-token times when words were asked)."""
    segments, all_words, token_timings = [], [], []
    last_speech = 0.0
    aligned = [o for o in outputs if o.matrix is not None and o.matrix.shape[0] >= 2]
    times = timing.jump_times_batch([o.matrix for o in aligned]) if aligned else []
    times_of = {id(o): t for o, t in zip(aligned, times)}
    for chunk, output in zip(plan.chunks, outputs):
        text = tokens.decode(output.token_ids)
        if not text.strip():
            continue
        chunk_end = chunk.offset + chunk.duration
        chunk_segment = _segment(chunk, output, text, chunk.offset, chunk_end)
        jumps = times_of.get(id(output))
        if jumps is None and plan.word_timestamps and chunk.alignment is None:
            jumps = _unaligned_jump_times(len(output.token_ids), chunk.duration)
        if jumps is None:
            segments.append(chunk_segment)
            continue
        # A path through a degenerate matrix can step off its edge; times stay inside the window.
        jumps = np.clip(jumps, 0.0, chunk.duration)
        text_tokens = output.token_ids[: len(jumps) - 1]
        probs = np.exp(np.asarray(output.token_logprobs[: len(text_tokens)], dtype=np.float64))
        alignment = words.word_timings(
            text_tokens, jumps, probs, tokens.decode_with_special, tokens.eot, plan.language
        )
        token_timings.extend(_token_timings(text_tokens, jumps, probs, chunk.offset, tokens))
        chunk_segment["tokens"] = list(text_tokens)
        last_speech = words.add_word_timestamps(
            [chunk_segment], alignment, eot=tokens.eot, time_offset=chunk.offset,
            last_speech_timestamp=last_speech,
        )
        chunk_words = chunk_segment.pop("words")
        if plan.snap_to_speech:
            words.snap_to_speech(chunk_words, speech_frames(chunk.samples), chunk.offset)
        all_words.extend(chunk_words)
        segments.extend(_split_segment(chunk, output, chunk_words, chunk_segment))
    for index, segment in enumerate(segments):
        segment["id"] = index
    result = {
        "task": "translate" if plan.task == "translate" else "transcribe",
        "language": plan.language,
        "duration": round(plan.duration, 3),
        "text": "".join(s["text"] for s in segments).strip(),
        "segments": segments,
    }
    if plan.word_timestamps:
        result["words"] = [w.to_dict() for w in all_words]
        result["tokens"] = token_timings
        errors = [o.error for o in outputs if o.error]
        if errors:
            result["alignment_errors"] = errors
    return result


def _unaligned_jump_times(num_text_tokens: int, duration: float) -> np.ndarray:
    """Token times for a window too short to align (under MIN_ALIGNMENT_SECONDS): its tokens
    share it evenly, all that its length says. Floored to centiseconds, the rounding of output
    times, so that no rounded time passes the audio's end."""
    span = np.floor(duration * 100) / 100
    return np.linspace(0.0, span, num_text_tokens + 1)


def _token_timings(text_tokens, jumps, probs, offset, tokens: WhisperTokens) -> list[dict]:
    return [
        {
            "id": int(token),
            "text": tokens.decode_with_special([token]),
            "start": words.round_time(offset + jumps[i]),
            "end": words.round_time(offset + jumps[i + 1]),
            "probability": float(probs[i]),
        }
        for i, token in enumerate(text_tokens)
    ]


def _segment(chunk: ChunkRequest, output: ChunkOutput, text: str, start: float, end: float) -> dict:
    logprobs = output.token_logprobs
    text_bytes = text.encode("utf-8")
    return {
        "id": 0,
        "seek": int(round(chunk.offset * 100)),
        "start": round(start, 2),
        "end": round(end, 2),
        "text": text,
        "tokens": list(output.token_ids),
        "temperature": chunk.sampling_params.temperature,
        "avg_logprob": float(np.mean(logprobs)) if logprobs else 0.0,
        "compression_ratio": len(text_bytes) / max(1, len(zlib.compress(text_bytes))),
        "no_speech_prob": 0.0,
    }


def _split_segment(chunk, output, chunk_words, chunk_segment) -> list[dict]:
    """Cut one window's words into segments at sentence ends and pauses."""
    if not chunk_words:
        return [chunk_segment]
    groups, current = [], []
    for word in chunk_words:
        if current and (
            word.start - current[-1].end > SEGMENT_PAUSE_S
            or current[-1].word.rstrip()[-1:] in words.SENTENCE_END_MARKS
            or word.end - current[0].start > SEGMENT_MAX_S
        ):
            groups.append(current)
            current = []
        current.append(word)
    groups.append(current)
    segments = []
    position = 0
    for group in groups:
        count = sum(len(w.tokens) for w in group)
        piece = ChunkOutput(
            output.token_ids[position : position + count],
            output.token_logprobs[position : position + count],
        )
        position += count
        text = "".join(w.word for w in group)
        segments.append(_segment(chunk, piece, text, group[0].start, group[-1].end))
    return segments

