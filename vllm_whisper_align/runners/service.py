"""Runs transcription and alignment requests on the server's engine and fetches their timings.

Every window of every HTTP request is its own engine request, so they batch with all other traffic.
Once a request's tokens are back, its alignment matrix is fetched from the worker through
``collective_rpc``; DTW then runs here, in a thread (the numba kernels release the GIL), so the
event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from vllm import envs

from vllm_whisper_align import longform, memory
from vllm_whisper_align.align import results
from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.engine.vllm_internals import collective_rpc_every_engine
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.protocol import (
    DEFAULT_ALIGNMENT_METHOD,
    NO_CAPTURE_MESSAGE,
    RPC_DISCARD,
    RPC_FETCH,
    RPC_NO_SPEECH,
    RPC_RETURN_IDLE_MEMORY,
    RPC_STATS,
    AlignmentRequest,
)
from vllm_whisper_align.runners import decoding
from vllm_whisper_align.tokens import WhisperTokens

logger = get_logger(__name__)

MAX_AUDIO_ENV = "VLLM_WHISPER_ALIGN_MAX_AUDIO_S"


# Longest quotation of a client's value in an error message, and longest message.
ECHO_CHARS = 80
MAX_MESSAGE_CHARS = 2000


def echo(value: Any) -> str:
    """A client's value quoted in an error message, cut short: messages never echo large inputs."""
    shown = repr(value)
    return shown if len(shown) <= ECHO_CHARS else shown[: ECHO_CHARS - 1] + "…"


class RequestError(Exception):
    """A client mistake: answered with HTTP 400 and OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        message = " ".join(message.split())
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 1] + "…"
        self.message = message
        self.param = param
        self.status = status


@dataclass(frozen=True)
class ServiceLimits:
    max_audio_s: float = 3600.0
    max_file_mb: float = 25.0

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * 2**20)

    @classmethod
    def from_env(cls) -> ServiceLimits:
        return cls(
            max_audio_s=float(os.environ.get(MAX_AUDIO_ENV, cls.max_audio_s)),
            max_file_mb=float(envs.VLLM_MAX_AUDIO_CLIP_FILESIZE_MB),
        )


def windows_in_flight(vllm_config: Any) -> int:
    """How many windows of one request are in the engines at once: as many as they run together.

    A long recording's windows go in as earlier ones finish, not all at once: a 1-hour file is 120
    windows, and a request that arrives after it would wait behind every one of them (the engines
    admit requests first come, first served); it waits behind one round now. One request alone still
    keeps every engine full.
    """
    return vllm_config.scheduler_config.max_num_seqs * vllm_config.parallel_config.data_parallel_size


class AlignmentService:
    def __init__(self, engine_client, tokenizer, served_model_names: list[str], limits: ServiceLimits):
        model_config = engine_client.model_config
        self.engine_client = engine_client
        self.suppress_tokens = decoding.suppressed_tokens(model_config)
        self.tokens = WhisperTokens.from_tokenizer(tokenizer, model_config.hf_config.vocab_size)
        self.language_detection = (
            decoding.LanguageDetection.for_model(model_config, tokenizer)
            if self.tokens.is_multilingual
            else None
        )
        self.served_model_names = served_model_names
        self.limits = limits
        self.windows_in_flight = windows_in_flight(engine_client.vllm_config)
        self._requests_in_flight = 0
        self._requests_started = 0
        self._idle_tasks: set[asyncio.Task] = set()

    @classmethod
    async def create(
        cls, engine_client, served_model_names: list[str], limits: ServiceLimits
    ) -> AlignmentService:
        tokenizer = engine_client.get_tokenizer()
        if asyncio.iscoroutine(tokenizer):
            tokenizer = await tokenizer
        service = cls(engine_client, tokenizer, served_model_names, limits)
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

    # ---- validation --------------------------------------------------------------------------

    def check_model(self, model: str | None) -> None:
        if model and model not in self.served_model_names:
            raise RequestError(
                f"The model {echo(model)} does not exist; this server serves "
                + ", ".join(f"`{name}`" for name in self.served_model_names),
                "model",
            )

    def checked_language(self, language: str | None, task: str = "transcribe") -> str | None:
        """``language`` if this model can ``task`` it (None: detect it); else a 400 naming its languages."""
        try:
            self.tokens.check_language(language, task)
        except ValueError as error:
            language_ok = language in (None, "en") and self.tokens.is_english_only
            raise RequestError(str(error), "model" if language_ok else "language") from None
        return language

    def check_duration(self, samples: np.ndarray) -> None:
        """A safety net: the routes decode with ``max_seconds``, which refuses longer audio first."""
        seconds = len(samples) / SAMPLE_RATE
        if seconds > self.limits.max_audio_s:
            raise self.too_long_error(seconds)

    def too_long_error(self, seconds: float | None) -> RequestError:
        """Audio over the duration limit; ``seconds`` is None when only "longer" is known."""
        limit = self.limits.max_audio_s
        length = f"{seconds:.1f} s long" if seconds is not None else f"longer than {limit:g} s"
        message = f"audio is {length}; this server accepts at most {limit:g} s (set {MAX_AUDIO_ENV})"
        return RequestError(message, "file")

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
        fallback: decoding.FallbackOptions | None = None,
        alignment_method: str = DEFAULT_ALIGNMENT_METHOD,
    ) -> dict[str, Any]:
        self.check_duration(samples)
        language = self.checked_language(language, task)
        if language is None and self.language_detection is not None and len(samples):
            language = await self.detect_language(samples, f"{request_id}-lang")
        try:
            plan = decoding.plan_transcription(
                samples,
                self.tokens,
                language=language,
                task=task,
                word_timestamps=word_timestamps,
                prompt=prompt,
                sampling=sampling,
                suppress_tokens=self.suppress_tokens,
                fallback=fallback,
                alignment_method=alignment_method,
            )
        except ValueError as error:
            raise RequestError(str(error), "language") from None
        return await self._run(plan, request_id)

    async def align(
        self,
        samples: np.ndarray,
        *,
        request_id: str,
        text: str | None,
        token_ids: list[int] | None,
        language: str | None,
        alignment_method: str = DEFAULT_ALIGNMENT_METHOD,
    ) -> dict[str, Any]:
        self.check_duration(samples)
        language = self.checked_language(language)
        field = "tokens" if token_ids is not None else "text"
        if longform.needs_windows(samples):
            return await self._align_long(
                samples, request_id, text, token_ids, language or "en", field, alignment_method
            )
        try:
            plan = decoding.plan_alignment(
                samples,
                self.tokens,
                text=text,
                token_ids=token_ids,
                language=language,
                alignment_method=alignment_method,
            )
        except ValueError as error:
            raise RequestError(str(error), field) from None
        return longform.mark_aligned(await self._run(plan, request_id))

    async def _align_long(
        self,
        samples: np.ndarray,
        request_id: str,
        text: str | None,
        token_ids: list[int] | None,
        language: str,
        field: str,
        alignment_method: str,
    ) -> dict[str, Any]:
        """``longform.alignment_steps``, each step's windows run concurrently, so they batch together;
        the text matching between steps is NumPy work of up to seconds (30k words): off the event loop."""
        try:
            longform.check_method(alignment_method)
            given = decoding.text_to_tokens(text, token_ids, self.tokens)
        except decoding.AlignmentInputError as error:
            raise RequestError(str(error), field) from None
        slots = asyncio.Semaphore(self.windows_in_flight)  # one request: its windows share them
        steps = longform.alignment_steps(
            samples, given, self.tokens, language, self.suppress_tokens, alignment_method
        )
        bodies = None
        while True:
            try:
                step, body = await asyncio.to_thread(longform.advance, steps, bodies)
            except decoding.AlignmentInputError as error:
                raise RequestError(str(error), field) from None
            if step is None:
                return body
            name, plans = step
            bodies = await asyncio.gather(
                *[self._run(plan, f"{request_id}-{name}{k}", slots) for k, plan in enumerate(plans)]
            )

    async def detect_language(self, samples: np.ndarray, request_id: str) -> str:
        prompt, params = self.language_detection.request(samples)
        final = None
        async for output in self.engine_client.generate(prompt, params, request_id):
            final = output
        return self.language_detection.language(final.outputs[0].token_ids)

    async def _run(
        self, plan: decoding.Plan, request_id: str, slots: asyncio.Semaphore | None = None
    ) -> dict[str, Any]:
        """The plan's windows through the engines, at most ``slots`` (one request's share, see
        windows_in_flight) at a time, then the temperature fallback of those that need it."""
        slots = slots or asyncio.Semaphore(self.windows_in_flight)
        outputs: list[decoding.WindowOutput | None] = [None] * len(plan.windows)
        pending, ids = list(range(len(plan.windows))), []
        try:
            # All windows, then those that fall back to the next temperature, together.
            while pending:
                ids = [
                    f"{request_id}-{i}-{plan.windows[i].attempt}-{j}"
                    for i in pending
                    for j in range(len(plan.windows[i].candidates()))
                ]
                await self._generate_windows(plan, outputs, pending, ids, slots)
                pending, superseded = decoding.fall_back(plan, outputs, pending)
                await self.discard(superseded)
            await self.discard(decoding.dropped_keys(plan, outputs))
            fetched = await self.fetch(decoding.alignment_requests(plan, outputs))
        except asyncio.CancelledError:
            # The client went away: stop its engine requests and drop what was captured for them.
            keys = plan.capture_keys()
            await asyncio.gather(self.engine_client.abort(ids), self.discard(keys), return_exceptions=True)
            logger.info(
                "%s: the client went away; aborted its %d engine requests and dropped their captures",
                request_id,
                len(ids),
            )
            raise
        # Normalisation and DTW (numba, GIL released) off the event loop.
        return await asyncio.to_thread(results.finish, plan, outputs, fetched, self.tokens)

    async def _generate_windows(
        self, plan: decoding.Plan, outputs: list, pending: list[int], ids: list[str], slots: asyncio.Semaphore
    ) -> None:
        """Runs the windows ``pending`` names (every candidate of each, under ``ids``, as ``slots``
        allow) and stores, in ``plan`` and ``outputs``, the candidate kept of each and its output."""
        windows = [plan.windows[i] for i in pending]
        runs = [candidate for window in windows for candidate in window.candidates()]

        async def generate_in_turn(run: decoding.WindowRequest, request_id: str) -> Any:
            async with slots:
                return await self._generate(run, request_id)

        finals = await asyncio.gather(*[generate_in_turn(r, i) for r, i in zip(runs, ids, strict=True)])
        probs = decoding.no_speech_probs(runs, await self.no_speech(decoding.no_speech_keys(runs)))
        run_outputs = [
            decoding.window_output(run, final, self.tokens, prob)
            for run, final, prob in zip(runs, finals, probs, strict=True)
        ]
        kept, kept_outputs, dropped = decoding.keep_best(windows, run_outputs)
        for index, window, output in zip(pending, kept, kept_outputs, strict=True):
            plan.windows[index], outputs[index] = window, output
        await self.discard(dropped)

    async def _generate(self, window: decoding.WindowRequest, request_id: str) -> Any:
        final = None
        async for output in self.engine_client.generate(
            window.engine_prompt(), window.sampling_params, request_id
        ):
            final = output
        return final

    # ---- worker RPCs -------------------------------------------------------------------------

    async def fetch(self, requests: list[AlignmentRequest]) -> list[dict[str, Any]]:
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

    async def no_speech(self, keys: list[str]) -> list[dict[str, Any]]:
        """no_speech_prob answers for ``keys`` (none on an engine without capture: TP > 1)."""
        if not keys:
            return []
        try:
            per_engine = await self._rpc_all_engines(RPC_NO_SPEECH, keys)
        except RequestError:
            return []
        return [answer for answers in per_engine for answer in answers if "error" not in answer]

    async def discard(self, keys: list[str]) -> None:
        if keys:
            await self._rpc_all_engines(RPC_DISCARD, keys)

    async def _rpc_all_engines(self, method: str, *args: Any) -> list[Any]:
        """The first worker's answer from every engine core (data parallelism: each holds its own)."""
        try:
            return await collective_rpc_every_engine(self.engine_client, method, args)
        except Exception as error:
            if NO_CAPTURE_MESSAGE in str(error):
                raise RequestError(
                    f"word timestamps are unavailable: {NO_CAPTURE_MESSAGE}", "model"
                ) from None
            raise
