"""The asynchronous runner: requests on the server's ``engine_client`` (the HTTP server, the corpus
job's replicas), each carried out as ``runners.driver`` asks.

Every window of every request is its own engine request, so they batch with all other traffic. Once a
request's tokens are back, its alignment matrices are fetched from the workers through
``collective_rpc``; DTW and the long-form text matching then run in threads (NumPy and the numba
kernels release the GIL), so the event loop keeps serving. A request whose client goes away is
cancelled: its engine requests are aborted and its captures dropped. Knows no HTTP: it raises the
domain errors of ``vllm_whisper_align.errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from vllm_whisper_align import memory
from vllm_whisper_align.align.results import Transcript
from vllm_whisper_align.audio.decode import AudioTooLongError, SpilledSamples
from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.engine.vllm_internals import collective_rpc_every_engine
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.options import AlignmentOptions, TranscriptionOptions
from vllm_whisper_align.protocol import (
    RPC_DISCARD,
    RPC_FETCH,
    RPC_NO_SPEECH,
    RPC_RETURN_IDLE_MEMORY,
    RPC_STATS,
)
from vllm_whisper_align.runners import decoding, driver
from vllm_whisper_align.tokens import WhisperTokens

logger = get_logger(__name__)


def windows_in_flight(vllm_config: Any) -> int:
    """How many windows of one request are in the engines at once: as many as they run together.

    A long recording's windows go in as earlier ones finish, not all at once: a 1-hour file is 120
    windows, and a request that arrives after it would wait behind every one of them (the engines
    admit requests first come, first served); it waits behind one round now. One request alone still
    keeps every engine full.
    """
    return vllm_config.scheduler_config.max_num_seqs * vllm_config.parallel_config.data_parallel_size


class AlignmentService:
    def __init__(self, engine_client: Any, tokenizer: Any, max_audio_s: float = math.inf):
        model_config = engine_client.model_config
        self.engine_client = engine_client
        self.tokens = WhisperTokens.from_tokenizer(tokenizer, model_config.hf_config.vocab_size)
        detection = (
            decoding.LanguageDetection.for_model(model_config, tokenizer)
            if self.tokens.is_multilingual
            else None
        )
        self.facts = driver.EngineFacts(
            self.tokens, tuple(decoding.suppressed_tokens(model_config)), detection
        )
        # A safety net: the server decodes with this bound, which refuses longer audio first.
        self.max_audio_s = max_audio_s
        self.windows_in_flight = windows_in_flight(engine_client.vllm_config)
        self._requests_in_flight = 0
        self._requests_started = 0
        self._idle_tasks: set[asyncio.Task] = set()

    @classmethod
    async def create(cls, engine_client: Any, max_audio_s: float = math.inf) -> AlignmentService:
        tokenizer = engine_client.get_tokenizer()
        if asyncio.iscoroutine(tokenizer):
            tokenizer = await tokenizer
        service = cls(engine_client, tokenizer, max_audio_s)
        service._when_idle_return_memory()  # what start-up freed
        return service

    # ---- memory ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def request_in_flight(self):
        """Around every request: once none has run for a moment (see memory.py), idle memory goes back."""
        self._requests_in_flight += 1
        self._requests_started += 1
        try:
            yield
        finally:
            self._requests_in_flight -= 1
            if self._requests_in_flight == 0:
                self._when_idle_return_memory()

    def _when_idle_return_memory(self) -> None:
        task = asyncio.create_task(self._return_memory_if_still_idle(self._requests_started))
        self._idle_tasks.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._idle_tasks.discard)

    async def _return_memory_if_still_idle(self, requests_started: int) -> None:
        await asyncio.sleep(memory.IDLE_BEFORE_RETURNING_MEMORY_S)
        if self._requests_in_flight or self._requests_started != requests_started:
            return  # not idle since: the request that came, or the task its end made, does it
        await asyncio.to_thread(memory.return_freed_heap)
        try:
            await self._rpc_all_engines(RPC_RETURN_IDLE_MEMORY)
        except Exception as error:  # the engines are no request's business: report, keep serving
            logger.warning("whisper-align: the engines did not return idle memory: %s", error)

    # ---- requests ----------------------------------------------------------------------------

    async def transcribe(
        self,
        samples: np.ndarray | SpilledSamples,
        *,
        request_id: str,
        language: str | None = None,
        task: str = "transcribe",
        word_timestamps: bool = True,
        prompt: str | None = None,
        options: TranscriptionOptions | None = None,
    ) -> Transcript:
        self.check_duration(samples)
        work = driver.transcription(
            samples,
            self.facts,
            language=language,
            task=task,
            word_timestamps=word_timestamps,
            prompt=prompt,
            options=options,
        )
        return await self.run(work, request_id)

    async def align(
        self,
        samples: np.ndarray | SpilledSamples,
        *,
        request_id: str,
        text: str | None = None,
        token_ids: Sequence[int] | None = None,
        language: str | None = None,
        options: AlignmentOptions | None = None,
    ) -> Transcript:
        self.check_duration(samples)
        work = driver.alignment(
            samples, self.facts, text=text, token_ids=token_ids, language=language, options=options
        )
        return await self.run(work, request_id)

    def check_duration(self, samples: np.ndarray | SpilledSamples) -> None:
        seconds = len(samples) / SAMPLE_RATE
        if seconds > self.max_audio_s:
            raise AudioTooLongError(self.max_audio_s, seconds)

    async def run(self, work: driver.Driver, request_id: str) -> Any:
        """``work``'s commands carried out on the engines, at most ``windows_in_flight`` of its engine
        requests at a time (one request's share). Cancelled (the client went away), it aborts the
        engine requests it started and drops what was captured for them."""
        slots = asyncio.Semaphore(self.windows_in_flight)
        started: list[str] = []
        keys: list[str] = []

        async def answer(command: driver.Command) -> Any:
            if isinstance(command, driver.Generate):
                return await self._generate(command.requests, request_id, slots, started, keys)
            if isinstance(command, driver.Compute):
                return await asyncio.gather(*(asyncio.to_thread(function) for function in command.functions))
            if isinstance(command, driver.NoSpeech):
                return await self.no_speech(command.keys)
            if isinstance(command, driver.Fetch):
                return await self.fetch(command.requests)
            await self.discard(command.keys)
            return None

        try:
            return await driver.carry_out_async(work, answer)
        except asyncio.CancelledError:
            await asyncio.gather(
                self.engine_client.abort(started), self.discard(keys), return_exceptions=True
            )
            logger.info(
                "%s: the client went away; aborted its %d engine requests and dropped their captures",
                request_id,
                len(started),
            )
            raise

    async def _generate(
        self,
        requests: list[driver.EngineRequest],
        request_id: str,
        slots: asyncio.Semaphore,
        started: list[str],
        keys: list[str],
    ) -> list[Any]:
        async def generate_in_turn(request: driver.EngineRequest) -> Any:
            async with slots:
                engine_id = f"{request_id}-{request.name}"
                started.append(engine_id)
                keys.extend(request.capture_keys)
                final = None
                async for output in self.engine_client.generate(
                    request.prompt, request.sampling_params, engine_id
                ):
                    final = output
                return final

        return list(await asyncio.gather(*[generate_in_turn(request) for request in requests]))

    # ---- worker RPCs -------------------------------------------------------------------------

    async def fetch(self, requests: list[Any]) -> list[dict[str, Any]]:
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
        """What the engines hold for word timestamps, summed, and the requests in flight here."""
        totals: dict[str, int] = {"requests_in_flight": self._requests_in_flight}
        for engine_stats in await self._rpc_all_engines(RPC_STATS):
            for name, value in engine_stats.items():
                totals[name] = totals.get(name, 0) + value
        return totals

    async def no_speech(self, keys: list[str]) -> list[dict[str, Any]]:
        """no_speech_prob answers for ``keys`` (NoCaptureError on an engine without capture)."""
        if not keys:
            return []
        per_engine = await self._rpc_all_engines(RPC_NO_SPEECH, keys)
        return [answer for answers in per_engine for answer in answers if "error" not in answer]

    async def discard(self, keys: list[str]) -> None:
        if keys:
            await self._rpc_all_engines(RPC_DISCARD, keys)

    async def _rpc_all_engines(self, method: str, *args: Any) -> list[Any]:
        """The first worker's answer from every engine core (data parallelism: each holds its own)."""
        try:
            return await collective_rpc_every_engine(self.engine_client, method, args)
        except Exception as error:
            raise driver.no_capture_error(error) or error from None
