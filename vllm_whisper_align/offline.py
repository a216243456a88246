"""Python API over ``vllm.LLM``: transcribe or align many files with one engine.

Plain ``LLM.generate`` works too — put :class:`AlignmentParams` in ``SamplingParams.extra_args``
(see :func:`vllm_whisper_align.decoding.plan_transcription`) and fetch the matrices afterwards
with ``llm.collective_rpc("whisper_align_fetch", args=([{"key": ..., "num_text_tokens": ...}],))``;
:class:`WhisperAligner` does exactly that.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any, Iterable, Sequence

import numpy as np
from vllm.logger import init_logger

from vllm_whisper_align import decoding, longform, results
from vllm_whisper_align.audio import SAMPLE_RATE, AudioSource, decode_audio
from vllm_whisper_align.checkpoints import resolve_model
from vllm_whisper_align.params import AlignmentRequest, WhisperAlignConfig
from vllm_whisper_align.plugin import RPC_DISCARD, RPC_FETCH, RPC_STATS
from vllm_whisper_align.tokenizer import WhisperTokens

logger = init_logger(__name__)


def default_engine_args(model: str, **overrides: Any) -> dict[str, Any]:
    """Engine settings that work for Whisper on CPU and GPU; anything given overrides them."""
    from vllm.platforms import current_platform

    args: dict[str, Any] = {
        "model": model,
        "limit_mm_per_prompt": {"audio": 1},
        "max_num_seqs": 32,
    }
    if current_platform.is_cpu():
        # The CPU backend checks one NUMA node's memory, and sizes its KV cache from this variable.
        args["gpu_memory_utilization"] = 0.5
        single_worker = all(overrides.get(k) in (None, 1) for k in PARALLEL_SIZE_ARGS)
        set_cpu_environment(single_worker)
    args.update({k: v for k, v in overrides.items() if v is not None})
    # Checked here so that a typo is one clear error, not an engine that fails to start.
    WhisperAlignConfig.from_additional_config(args.get("additional_config"))
    return args


PARALLEL_SIZE_ARGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
# Up to this many cores, the model's threads get every core (see set_cpu_environment).
ALL_CORES_UP_TO = 4


def set_cpu_environment(single_worker: bool) -> None:
    """Environment the CPU backend reads when the engine starts; values already set win.

    vLLM binds the model's OpenMP threads to all cores but one, which it leaves to its scheduler and
    API processes. Those mostly wait on the model, so on a small machine the reserved core is lost:
    on 2 cores, binding both took offline throughput from 9.4 to 15.1 audio-s per wall-s
    (benchmarks/TUNING.md). With more workers (TP/PP/DP) vLLM needs one list per worker: left alone.
    """
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    cores = sorted(os.sched_getaffinity(0))
    if single_worker and len(cores) <= ALL_CORES_UP_TO:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))


class WhisperAligner:
    """One vLLM engine serving transcription and forced alignment with word timestamps."""

    def __init__(self, model: str | None = None, **engine_args: Any):
        from vllm import LLM

        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        self.model = resolve_model(model)
        self.llm = LLM(**default_engine_args(self.model, **engine_args))
        model_config = self.llm.llm_engine.model_config
        tokenizer = self.llm.get_tokenizer()
        self.tokens = WhisperTokens.from_tokenizer(tokenizer, model_config.hf_config.vocab_size)
        self.suppress_tokens = decoding.suppressed_tokens(model_config)
        self.language_detection = (
            decoding.LanguageDetection.for_model(model_config, tokenizer) if self.tokens.is_multilingual else None
        )

    # ---- public API --------------------------------------------------------------------------

    def transcribe(
        self,
        audios: Sequence[AudioSource | np.ndarray],
        *,
        language: str | None = None,
        task: str = "transcribe",
        word_timestamps: bool = True,
        prompt: str | None = None,
        use_tqdm: bool = False,
    ) -> list[dict[str, Any]]:
        """verbose_json-shaped results, one per input (``words`` and ``tokens`` when asked)."""
        samples = [_samples(audio) for audio in audios]
        languages = self.detect_languages(samples) if language is None else [language] * len(samples)
        plans = [
            decoding.plan_transcription(
                s, self.tokens, language=lang, task=task, word_timestamps=word_timestamps, prompt=prompt,
                suppress_tokens=self.suppress_tokens,
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
        use_tqdm: bool = False,
    ) -> list[dict[str, Any]]:
        """Word and token times of text the model did not produce; audio of any length (over one
        window: ``longform``), every word with ``aligned``."""
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
        plans = [
            decoding.plan_alignment(samples[i], self.tokens, language=language, **given[i]) for i in short
        ]
        answers = dict(zip(short, map(longform.mark_aligned, self._run(plans, use_tqdm))))
        long_answers = self._align_long([samples[i] for i in long], [given[i] for i in long], language)
        answers.update(zip(long, long_answers))
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
        return self.llm.collective_rpc(RPC_DISCARD, args=(list(keys),))[0]

    def capture_stats(self) -> dict[str, int]:
        return self.llm.collective_rpc(RPC_STATS)[0]

    # ---- internals ---------------------------------------------------------------------------

    def _align_long(self, samples: list[np.ndarray], given: list[dict], language: str | None) -> list[dict]:
        """``longform``'s two passes, each one ``generate`` call over every window of every input."""
        language = language or "en"
        given_ids = [decoding.text_to_tokens(item["text"], item["token_ids"], self.tokens) for item in given]
        heard = [
            longform.transcription_plans(s, self.tokens, language, self.suppress_tokens) for s in samples
        ]
        transcripts = iter(self._run([p for plans in heard for p in plans], use_tqdm=False))
        splits = [
            longform.alignment_plans(plans, [next(transcripts) for _ in plans], self.tokens, ids, language)
            for plans, ids in zip(heard, given_ids, strict=True)
        ]
        runnable = [p for _, plans in splits for p in plans if p is not None]
        aligned = iter(self._run(runnable, use_tqdm=False))
        return [
            longform.finish(
                split, plans, [next(aligned) if p is not None else None for p in plans], self.tokens,
                len(s) / SAMPLE_RATE, language,
            )
            for (split, plans), s in zip(splits, samples, strict=True)
        ]

    def _run(self, plans: list[decoding.Plan], use_tqdm: bool) -> list[dict[str, Any]]:
        windows = [window for plan in plans for window in plan.windows]
        request_outputs = self.llm.generate(
            [w.engine_prompt() for w in windows], [w.sampling_params for w in windows], use_tqdm=use_tqdm
        ) if windows else []
        outputs = iter([
            decoding.window_output(w, o, self.tokens) for w, o in zip(windows, request_outputs, strict=True)
        ])
        per_plan = [[next(outputs) for _ in plan.windows] for plan in plans]
        requests = [
            r for plan, outs in zip(plans, per_plan, strict=True) for r in decoding.alignment_requests(plan, outs)
        ]
        fetched = self.fetch(requests)
        return [results.finish(plan, outs, fetched, self.tokens) for plan, outs in zip(plans, per_plan, strict=True)]


def _samples(audio: AudioSource | np.ndarray) -> np.ndarray:
    if isinstance(audio, np.ndarray):
        return audio.astype(np.float32, copy=False)
    return decode_audio(audio)
