"""Python API over ``vllm.LLM``: transcribe or align many files with one engine.

Plain ``LLM.generate`` works too — put :class:`AlignmentParams` in ``SamplingParams.extra_args``
(see :func:`vllm_whisper_align.transcribe.plan_transcription`) and fetch the matrices afterwards
with ``llm.collective_rpc("whisper_align_fetch", args=([{"key": ..., "num_text_tokens": ...}],))``;
:class:`WhisperAligner` does exactly that.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any, Iterable, Sequence

import numpy as np

from vllm_whisper_align import transcribe
from vllm_whisper_align.audio import AudioSource, decode_audio
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.model import WhisperAlignConfig
from vllm_whisper_align.models import resolve_model
from vllm_whisper_align.plugin import RPC_DISCARD, RPC_FETCH, RPC_STATS
from vllm_whisper_align.tokenizer import WhisperTokens

logger = get_logger(__name__)


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
# How long close() lets the engine's processes exit before they are killed. vLLM's own default (5 s)
# is too short for a loaded 2-core machine, and a killed engine core leaks its shared memory.
ENGINE_SHUTDOWN_TIMEOUT_S = 60.0


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
    """One vLLM engine serving transcription and forced alignment with word timestamps.

    ``close()`` it (or use it as a context manager) when done: left to interpreter exit, vLLM's
    shutdown races it, and warns of an engine core that "exited unexpectedly" or was killed.
    """

    def __init__(self, model: str | None = None, **engine_args: Any):
        from vllm import LLM

        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        self.model = resolve_model(model)
        self.llm = LLM(**default_engine_args(self.model, **engine_args))
        self.tokens = WhisperTokens.from_tokenizer(self.llm.get_tokenizer())
        self.suppress_tokens = transcribe.suppressed_tokens(self.llm.llm_engine.model_config)

    def close(self) -> None:
        """Stop the engine's processes and wait for them; a second call does nothing."""
        self.llm.llm_engine.engine_core.shutdown(timeout=ENGINE_SHUTDOWN_TIMEOUT_S)

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
        use_tqdm: bool = False,
    ) -> list[dict[str, Any]]:
        """verbose_json-shaped results, one per input (``words`` and ``tokens`` when asked)."""
        samples = [_samples(audio) for audio in audios]
        languages = self.detect_languages(samples) if language is None else [language] * len(samples)
        plans = [
            transcribe.plan_transcription(
                s, self.tokens, language=lang, task=task, word_timestamps=word_timestamps, prompt=prompt,
                suppress_tokens=self.suppress_tokens,
            )
            for s, lang in zip(samples, languages)
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
        """Word and token times of text the model did not produce (one ≤30 s window each)."""
        if (texts is None) == (token_ids is None):
            raise ValueError("give either texts or token_ids")
        items = texts if texts is not None else token_ids
        if len(items) != len(audios):
            raise ValueError(f"{len(audios)} audios but {len(items)} texts")
        plans = [
            transcribe.plan_alignment(
                _samples(audio),
                self.tokens,
                text=texts[i] if texts is not None else None,
                token_ids=token_ids[i] if token_ids is not None else None,
                language=language,
            )
            for i, audio in enumerate(audios)
        ]
        return self._run(plans, use_tqdm)

    def detect_languages(self, samples: Sequence[np.ndarray]) -> list[str]:
        if self.tokens.is_english_only:
            return ["en"] * len(samples)
        requests = [transcribe.language_detection_request(s, self.tokens) for s in samples]
        outputs = self.llm.generate([p for p, _ in requests], [sp for _, sp in requests], use_tqdm=False)
        return [transcribe.language_from_token(o.outputs[0].token_ids[0], self.tokens) for o in outputs]

    def fetch(self, requests: Iterable[transcribe.AlignmentRequest]) -> list[dict[str, Any]]:
        payload = [asdict(r) for r in requests]
        if not payload:
            return []
        return self.llm.collective_rpc(RPC_FETCH, args=(payload,))[0]

    def discard(self, keys: Sequence[str]) -> int:
        return self.llm.collective_rpc(RPC_DISCARD, args=(list(keys),))[0]

    def capture_stats(self) -> dict[str, int]:
        return self.llm.collective_rpc(RPC_STATS)[0]

    # ---- internals ---------------------------------------------------------------------------

    def _run(self, plans: list[transcribe.Plan], use_tqdm: bool) -> list[dict[str, Any]]:
        chunks = [chunk for plan in plans for chunk in plan.chunks]
        request_outputs = self.llm.generate(
            [c.engine_prompt() for c in chunks], [c.sampling_params for c in chunks], use_tqdm=use_tqdm
        ) if chunks else []
        outputs = [
            transcribe.chunk_output_from_request_output(c, o, self.tokens)
            for c, o in zip(chunks, request_outputs)
        ]
        per_plan, start = [], 0
        for plan in plans:
            per_plan.append(outputs[start : start + len(plan.chunks)])
            start += len(plan.chunks)
        requests = [r for plan, outs in zip(plans, per_plan) for r in transcribe.alignment_requests(plan, outs)]
        results = self.fetch(requests)
        return [transcribe.finish(plan, outs, results, self.tokens) for plan, outs in zip(plans, per_plan)]


def _samples(audio: AudioSource | np.ndarray) -> np.ndarray:
    if isinstance(audio, np.ndarray):
        return audio.astype(np.float32, copy=False)
    return decode_audio(audio)
