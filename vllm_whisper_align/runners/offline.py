"""Python API over ``vllm.LLM``: transcribe or align many files with one engine.

Plain ``LLM.generate`` works too — put :class:`AlignmentParams` in ``SamplingParams.extra_args``
(see :func:`vllm_whisper_align.runners.decoding.plan_transcription`) and fetch the matrices afterwards
with ``llm.collective_rpc("whisper_align_fetch", args=([{"key": ..., "num_text_tokens": ...}],))``;
:class:`WhisperAligner` does exactly that.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from vllm_whisper_align import longform
from vllm_whisper_align.align import results
from vllm_whisper_align.audio.decode import AudioSource, SpilledSamples, decode_audio
from vllm_whisper_align.checkpoints.bundled import resolve_model
from vllm_whisper_align.engine import vllm_internals
from vllm_whisper_align.engine.settings import engine_environment, engine_settings
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.protocol import (
    DEFAULT_ALIGNMENT_METHOD,
    NO_CAPTURE_MESSAGE,
    RPC_CLEAR_ENCODER_CACHE,
    RPC_DISCARD,
    RPC_FETCH,
    RPC_NO_SPEECH,
    RPC_STATS,
    AlignmentRequest,
    WhisperAlignConfig,
)
from vllm_whisper_align.runners import decoding
from vllm_whisper_align.tokens import WhisperTokens

logger = get_logger(__name__)


def default_engine_args(model: str, **overrides: Any) -> dict[str, Any]:
    """Engine settings sized to the model and the machine (see engine.settings); anything given wins.

    Returns arguments only: the environment the engine also needs is :func:`engine_environment`'s.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    args = {"model": model, **engine_settings(model, given), **given}
    # Checked here so that a typo is one clear error, not an engine that fails to start.
    WhisperAlignConfig.from_additional_config(args.get("additional_config"))
    return args


def prepare_engine(model: str | None, **engine_args: Any) -> dict[str, Any]:
    """The engine arguments for ``model`` (resolved: a bundled name, a CT2 dir...), with this process's
    environment set for the engine's processes, which inherit it: what ``WhisperAligner`` and the corpus
    job's replicas do before they build an engine. The one place they change ``os.environ``."""
    args = default_engine_args(resolve_model(model), **engine_args)
    os.environ.update(engine_environment(args))
    return args


# How long close() lets the engine's processes exit before they are killed. vLLM's own default (5 s)
# is too short for a loaded 2-core machine, and a killed engine core leaks its shared memory.
ENGINE_SHUTDOWN_TIMEOUT_S = 60.0


class WhisperAligner:
    """One vLLM engine serving transcription and forced alignment with word timestamps.

    ``close()`` it (or use it as a context manager) when done: left to interpreter exit, vLLM's
    shutdown races it, and warns of an engine core that "exited unexpectedly" or was killed.
    """

    def __init__(self, model: str | None = None, **engine_args: Any):
        from vllm import LLM

        args = prepare_engine(model, **engine_args)
        self.model = args["model"]
        self.llm = LLM(**args)
        model_config = self.llm.llm_engine.model_config
        tokenizer = self.llm.get_tokenizer()
        self.tokens = WhisperTokens.from_tokenizer(tokenizer, model_config.hf_config.vocab_size)
        self.suppress_tokens = decoding.suppressed_tokens(model_config)
        self.language_detection = (
            decoding.LanguageDetection.for_model(model_config, tokenizer)
            if self.tokens.is_multilingual
            else None
        )

    def close(self) -> None:
        """Stop the engine's processes and wait for them; a second call does nothing."""
        vllm_internals.shutdown_llm(self.llm, ENGINE_SHUTDOWN_TIMEOUT_S)

    def __enter__(self) -> WhisperAligner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- public API --------------------------------------------------------------------------

    def transcribe(
        self,
        audios: Sequence[AudioSource | np.ndarray],
        *,
        language: str | None = None,
        task: str = "transcribe",
        word_timestamps: bool = True,
        prompt: str | None = None,
        temperature: float = 0.0,
        compression_ratio_threshold: float | None = decoding.COMPRESSION_RATIO_THRESHOLD,
        logprob_threshold: float | None = decoding.LOGPROB_THRESHOLD,
        no_speech_threshold: float | None = decoding.NO_SPEECH_THRESHOLD,
        best_of: int = decoding.BEST_OF,
        alignment_method: str = DEFAULT_ALIGNMENT_METHOD,
        use_tqdm: bool = False,
    ) -> list[dict[str, Any]]:
        """verbose_json-shaped results, one per input (``words`` and ``tokens`` when asked).

        ``temperature`` starts openai-whisper's fallback schedule (then +0.2 up to 1.0); the
        thresholds are its ``transcribe`` arguments, with its defaults (None turns one off); above
        temperature 0 each window samples ``best_of`` candidates and keeps the likeliest.
        ``alignment_method``: "auto" (per-window heads, onset-refined starts) or "fixed" (the tuned
        alignment heads, openai-whisper's way).
        """
        fallback = decoding.FallbackOptions.starting_at(
            temperature,
            compression_ratio_threshold=compression_ratio_threshold,
            logprob_threshold=logprob_threshold,
            no_speech_threshold=no_speech_threshold,
            best_of=best_of,
        )
        fallback.validate()
        samples = [_samples(audio) for audio in audios]
        with self._one_call():
            languages = self.detect_languages(samples) if language is None else [language] * len(samples)
            plans = [
                decoding.plan_transcription(
                    s,
                    self.tokens,
                    language=lang,
                    task=task,
                    word_timestamps=word_timestamps,
                    prompt=prompt,
                    suppress_tokens=self.suppress_tokens,
                    fallback=fallback,
                    alignment_method=alignment_method,
                )
                for s, lang in zip(samples, languages, strict=True)
            ]
            return self._run(plans, use_tqdm)

    def align(
        self,
        audios: Sequence[AudioSource | np.ndarray],
        texts: Sequence[str] | None = None,
        *,
        token_ids: Sequence[Sequence[int]] | None = None,
        language: str | None = None,
        alignment_method: str = DEFAULT_ALIGNMENT_METHOD,
        use_tqdm: bool = False,
    ) -> list[dict[str, Any]]:
        """Word and token times of text the model did not produce; audio of any length (over one
        window: ``longform``), every word with ``aligned``. ``alignment_method`` as in ``transcribe``."""
        if (texts is None) == (token_ids is None):
            raise ValueError("give either texts or token_ids")
        items = texts if texts is not None else token_ids
        if len(items) != len(audios):
            raise ValueError(f"{len(audios)} audios but {len(items)} texts")
        samples = [_samples(audio) for audio in audios]
        nothing = [None] * len(samples)
        given = [
            {"text": text, "token_ids": ids}
            for text, ids in zip(texts or nothing, token_ids or nothing, strict=True)
        ]
        long = [i for i, s in enumerate(samples) if longform.needs_windows(s)]
        short = [i for i, s in enumerate(samples) if not longform.needs_windows(s)]
        if long:  # before any engine work: the short ones would otherwise run for nothing
            longform.check_method(alignment_method)
        plans = [
            decoding.plan_alignment(
                samples[i], self.tokens, language=language, alignment_method=alignment_method, **given[i]
            )
            for i in short
        ]
        with self._one_call():
            answers = dict(zip(short, map(longform.mark_aligned, self._run(plans, use_tqdm)), strict=True))
            long_answers = self._align_long(
                [samples[i] for i in long], [given[i] for i in long], language, alignment_method
            )
        answers.update(zip(long, long_answers, strict=True))
        return [answers[i] for i in range(len(samples))]

    def detect_languages(self, samples: Sequence[np.ndarray]) -> list[str]:
        if self.language_detection is None:
            return ["en"] * len(samples)
        requests = [self.language_detection.request(s) for s in samples]
        outputs = self.llm.generate([p for p, _ in requests], [sp for _, sp in requests], use_tqdm=False)
        return [self.language_detection.language(o.outputs[0].token_ids) for o in outputs]

    def fetch(self, requests: Iterable[AlignmentRequest]) -> list[dict[str, Any]]:
        payload = [asdict(r) for r in requests]
        if not payload:
            return []
        return self.llm.collective_rpc(RPC_FETCH, args=(payload,))[0]

    def discard(self, keys: Sequence[str]) -> int:
        return self.llm.collective_rpc(RPC_DISCARD, args=(list(keys),))[0] if keys else 0

    def no_speech_probs(self, windows: Sequence[decoding.WindowRequest]) -> list[float]:
        keys = decoding.no_speech_keys(windows)
        try:
            answers = self.llm.collective_rpc(RPC_NO_SPEECH, args=(keys,))[0] if keys else []
        except Exception as error:
            if NO_CAPTURE_MESSAGE not in str(error):
                raise
            answers = []  # no capture on this engine (TP > 1): no window counts as silence
        return decoding.no_speech_probs(windows, answers)

    def capture_stats(self) -> dict[str, int]:
        return self.llm.collective_rpc(RPC_STATS)[0]

    # ---- internals ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _one_call(self):
        """The engine's encoder cache serves a call's own repeats (a fallback retry, the second pass
        of a long alignment) and is emptied when the call ends, as the server empties it when idle:
        nothing is held, or reused, between calls."""
        try:
            yield
        finally:
            self.llm.collective_rpc(RPC_CLEAR_ENCODER_CACHE)

    def _align_long(
        self, samples: list[np.ndarray], given: list[dict], language: str | None, alignment_method: str
    ) -> list[dict]:
        """``longform.alignment_steps`` of every input, the steps of all inputs that are at one run
        in one ``generate`` call."""
        language = language or "en"
        steps = [
            longform.alignment_steps(
                s,
                decoding.text_to_tokens(item["text"], item["token_ids"], self.tokens),
                self.tokens,
                language,
                self.suppress_tokens,
                alignment_method,
            )
            for s, item in zip(samples, given, strict=True)
        ]
        answers: list[dict | None] = [None] * len(steps)
        pending = {i: longform.advance(job, None)[0] for i, job in enumerate(steps)}
        while pending:
            plans_now = [plan for _, plans in pending.values() for plan in plans]
            bodies = iter(self._run(plans_now, use_tqdm=False))
            ran, pending = pending, {}
            for i, (_, plans) in ran.items():
                step, answers[i] = longform.advance(steps[i], [next(bodies) for _ in plans])
                if step is not None:
                    pending[i] = step
        return answers

    def _run(self, plans: list[decoding.Plan], use_tqdm: bool) -> list[dict[str, Any]]:
        per_plan: list[list[decoding.WindowOutput | None]] = [[None] * len(plan.windows) for plan in plans]
        # (plan, window) pairs to run: first all of them, then those that fall back, all in one call.
        pending = [(p, w) for p, plan in enumerate(plans) for w in range(len(plan.windows))]
        while pending:
            self._generate(plans, per_plan, pending, use_tqdm)
            retried, superseded = [], []
            for p, plan in enumerate(plans):
                indices, keys = decoding.fall_back(plan, per_plan[p], [w for q, w in pending if q == p])
                retried += [(p, w) for w in indices]
                superseded += keys
            self.discard(superseded)
            pending = retried
        # Windows dropped as silence are never aligned: their captures go.
        self.discard(
            [k for plan, outs in zip(plans, per_plan, strict=True) for k in decoding.dropped_keys(plan, outs)]
        )
        requests = [
            r
            for plan, outs in zip(plans, per_plan, strict=True)
            for r in decoding.alignment_requests(plan, outs)
        ]
        fetched = self.fetch(requests)
        return results.finish_all(plans, per_plan, fetched, self.tokens)

    def _generate(self, plans, per_plan, pending: list[tuple[int, int]], use_tqdm: bool) -> None:
        """Runs the windows ``pending`` names (every candidate of each) and stores, in ``plans`` and
        ``per_plan``, the candidate kept of each and its output."""
        windows = [plans[p].windows[w] for p, w in pending]
        runs = [candidate for window in windows for candidate in window.candidates()]
        request_outputs = self.llm.generate(
            [r.engine_prompt() for r in runs], [r.sampling_params for r in runs], use_tqdm=use_tqdm
        )
        probs = self.no_speech_probs(runs)
        outputs = [
            decoding.window_output(run, output, self.tokens, prob)
            for run, output, prob in zip(runs, request_outputs, probs, strict=True)
        ]
        kept, kept_outputs, dropped = decoding.keep_best(windows, outputs)
        for (p, w), window, output in zip(pending, kept, kept_outputs, strict=True):
            plans[p].windows[w], per_plan[p][w] = window, output
        self.discard(dropped)


def _samples(audio: AudioSource | np.ndarray | SpilledSamples) -> np.ndarray | SpilledSamples:
    if isinstance(audio, np.ndarray):
        return audio.astype(np.float32, copy=False)
    if isinstance(audio, SpilledSamples):
        return audio
    return decode_audio(audio, spill=True)  # a long recording is read back a window at a time
