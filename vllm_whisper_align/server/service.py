"""Runs transcription and alignment requests on the server's engine and fetches their timings.

Every window of every HTTP request is its own engine request, so they batch with all other traffic.
Once a request's tokens are back, its alignment matrix is fetched from the worker through
``collective_rpc``; DTW then runs here, in a thread (the numba kernels release the GIL), so the
event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from vllm import envs

from vllm_whisper_align import transcribe
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.plugin import NO_CAPTURE_MESSAGE, RPC_DISCARD, RPC_FETCH, RPC_STATS
from vllm_whisper_align.tokenizer import WhisperTokens

logger = get_logger(__name__)

MAX_AUDIO_ENV = "VLLM_WHISPER_ALIGN_MAX_AUDIO_S"


class RequestError(Exception):
    """A client mistake: answered with HTTP 400 and OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message = " ".join(message.split())
        self.param = param
        self.status = status


@dataclass(frozen=True)
class ServiceLimits:
    max_audio_s: float = 3600.0
    max_file_mb: float = 25.0

    @classmethod
    def from_env(cls) -> ServiceLimits:
        return cls(
            max_audio_s=float(os.environ.get(MAX_AUDIO_ENV, cls.max_audio_s)),
            max_file_mb=float(envs.VLLM_MAX_AUDIO_CLIP_FILESIZE_MB),
        )


class AlignmentService:
    def __init__(self, engine_client, tokens: WhisperTokens, served_model_names: list[str], limits: ServiceLimits):
        self.engine_client = engine_client
        self.suppress_tokens = transcribe.suppressed_tokens(engine_client.model_config)
        self.tokens = tokens
        self.served_model_names = served_model_names
        self.limits = limits

    @classmethod
    async def create(cls, engine_client, served_model_names: list[str], limits: ServiceLimits) -> AlignmentService:
        tokenizer = engine_client.get_tokenizer()
        if asyncio.iscoroutine(tokenizer):
            tokenizer = await tokenizer
        return cls(engine_client, WhisperTokens.from_tokenizer(tokenizer), served_model_names, limits)

    # ---- validation --------------------------------------------------------------------------

    def check_model(self, model: str | None) -> None:
        if model and model not in self.served_model_names:
            raise RequestError(
                f"The model `{model}` does not exist; this server serves {self.served_model_names}", "model"
            )

    def check_duration(self, samples: np.ndarray) -> None:
        seconds = len(samples) / 16000
        if seconds > self.limits.max_audio_s:
            raise RequestError(
                f"audio is {seconds:.0f} s long; this server accepts at most {self.limits.max_audio_s:.0f} s "
                f"(set {MAX_AUDIO_ENV})", "file",
            )

    # ---- requests ----------------------------------------------------------------------------

    async def transcribe(
        self,
        samples: np.ndarray,
        *,
        request_id: str,
        language: str | None,
        task: str,
        word_timestamps: bool,
        prompt: str | None,
        sampling: dict[str, Any],
    ) -> dict[str, Any]:
        self.check_duration(samples)
        if task == "translate" and self.tokens.is_english_only:
            raise RequestError("this English-only model cannot translate", "model")
        if language is None and self.tokens.is_multilingual and len(samples):
            language = await self.detect_language(samples, f"{request_id}-lang")
        try:
            plan = transcribe.plan_transcription(
                samples, self.tokens, language=language, task=task,
                word_timestamps=word_timestamps, prompt=prompt, sampling=sampling,
                suppress_tokens=self.suppress_tokens,
            )
        except ValueError as error:
            raise RequestError(str(error), "language") from None
        return await self._run(plan, request_id)

    async def align(
        self, samples: np.ndarray, *, request_id: str, text: str | None, token_ids: list[int] | None,
        language: str | None,
    ) -> dict[str, Any]:
        try:
            plan = transcribe.plan_alignment(
                samples, self.tokens, text=text, token_ids=token_ids, language=language
            )
        except ValueError as error:
            raise RequestError(str(error), "tokens" if token_ids is not None else "text") from None
        return await self._run(plan, request_id)

    async def detect_language(self, samples: np.ndarray, request_id: str) -> str:
        prompt, params = transcribe.language_detection_request(samples, self.tokens)
        final = None
        async for final in self.engine_client.generate(prompt, params, request_id):
            pass
        return transcribe.language_from_token(final.outputs[0].token_ids[0], self.tokens)

    async def _run(self, plan: transcribe.Plan, request_id: str) -> dict[str, Any]:
        ids = [f"{request_id}-{i}" for i in range(len(plan.chunks))]
        keys = [c.alignment.key for c in plan.chunks if c.alignment is not None]
        try:
            outputs = await asyncio.gather(*[self._generate(c, i) for c, i in zip(plan.chunks, ids)])
            results = await self.fetch(transcribe.alignment_requests(plan, outputs))
        except asyncio.CancelledError:
            # The client went away: stop its engine requests and drop what was captured for them.
            await asyncio.gather(self.engine_client.abort(ids), self.discard(keys), return_exceptions=True)
            raise
        # Normalisation and DTW (numba, GIL released) off the event loop.
        return await asyncio.to_thread(transcribe.finish, plan, outputs, results, self.tokens)

    async def _generate(self, chunk: transcribe.ChunkRequest, request_id: str) -> transcribe.ChunkOutput:
        final = None
        async for final in self.engine_client.generate(chunk.engine_prompt(), chunk.sampling_params, request_id):
            pass
        return transcribe.chunk_output_from_request_output(chunk, final, self.tokens)

    # ---- worker RPCs -------------------------------------------------------------------------

    async def fetch(self, requests: list[transcribe.AlignmentRequest]) -> list[dict[str, Any]]:
        if not requests:
            return []
        per_engine = await self._rpc_all_engines(RPC_FETCH, [asdict(r) for r in requests])
        # Under data parallelism only the engine that served a request has its capture; the
        # others answer with an error for that key.
        merged: dict[str, dict[str, Any]] = {}
        for engine_results in per_engine:
            for result in engine_results:
                if "error" not in result or result["key"] not in merged:
                    merged[result["key"]] = result
        return list(merged.values())

    async def stats(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for engine_stats in await self._rpc_all_engines(RPC_STATS):
            for name, value in engine_stats.items():
                totals[name] = totals.get(name, 0) + value
        return totals

    async def discard(self, keys: list[str]) -> None:
        if keys:
            await self._rpc_all_engines(RPC_DISCARD, keys)

    async def _rpc_all_engines(self, method: str, *args: Any) -> list[Any]:
        """The first worker's answer from every engine core.

        ``engine_client.collective_rpc`` reaches only the first engine core when there are several
        (data parallelism), so with more than one we ask each of them through the core client.
        """
        core = getattr(self.engine_client, "engine_core", None)
        try:
            if len(getattr(core, "core_engines", ())) > 1:
                answers = await core.call_utility_all_async("collective_rpc", method, None, args, None)
                return [answer[0] for answer in answers]
            return [(await self.engine_client.collective_rpc(method, args=args))[0]]
        except Exception as error:
            if NO_CAPTURE_MESSAGE in str(error):
                raise RequestError(f"word timestamps are unavailable: {NO_CAPTURE_MESSAGE}", "model") from None
            raise
