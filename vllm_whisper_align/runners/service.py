"""The asynchronous runner: requests on the server's ``engine_client`` (the HTTP server, the corpus
job's replicas), each carried out as ``runners.driver`` asks.

Every window of every request is its own engine request, so they batch with all other traffic. Once a
request's tokens are back, its alignment matrices are fetched from the workers through
``collective_rpc``; DTW and the long-form text matching then run in threads (NumPy and the numba
kernels release the GIL), so the event loop keeps serving, taken in turn by the requests waiting for
one (:mod:`.fair_threads`). A request whose client goes away is
cancelled: its engine requests are aborted and its captures dropped. Knows no HTTP: it raises the
domain errors of ``vllm_whisper_align.errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict
from itertools import islice
from typing import Any

import numpy as np

from vllm_whisper_align import memory
from vllm_whisper_align.align.results import Transcript, WindowResult
from vllm_whisper_align.audio.decode import AudioTooLongError, SpilledSamples, decode_audio
from vllm_whisper_align.audio.windows import AudioChunk
from vllm_whisper_align.checkpoints.bundled import sample_path
from vllm_whisper_align.constants import N_SAMPLES, SAMPLE_RATE
from vllm_whisper_align.engine import window_features
from vllm_whisper_align.engine.settings import encoder_rows_per_step
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
from vllm_whisper_align.runners import decoding, driver, packing
from vllm_whisper_align.runners.fair_threads import FairThreads

logger = get_logger(__name__)


def windows_in_flight(vllm_config: Any) -> int:
    """How many windows of one request are in the engines at once: as many as they run together.

    A long recording's windows go in as earlier ones finish, not all at once: a 1-hour file is 120
    windows, and a request that arrives after it would wait behind every one of them (the engines
    admit requests first come, first served); it waits behind one round now. One request alone still
    keeps every engine full.
    """
    return vllm_config.scheduler_config.max_num_seqs * vllm_config.parallel_config.data_parallel_size


def encoder_windows_per_step(vllm_config: Any) -> int:
    """How many windows' encoders one engine step starts: while that many windows of short requests
    wait for the engines to start them, a short request waits to be packed with those that come
    beside it (``packing.PackQueue``)."""
    rows = encoder_rows_per_step(vllm_config)
    return max(1, rows // vllm_config.model_config.hf_config.max_source_positions)


# A streamed answer's first windows enter the engines alone, the others once they are done: its first
# words come in the time of one window, not of a round of windows_in_flight windows decoded together
# (the first 32 of a 1-hour file's 120), which costs the rest of the file the time of one window alone.
HEAD_START = 1


def engine_priority(urgent: bool, began: float, head_start_s: float) -> int:
    """vLLM's priority for an engine request sent now by a request that began at ``began``
    (``time.time()``, comparable across API server processes); lower goes first, and vLLM takes
    equal priorities in order of arrival.

    Urgent: one a client waits on as it comes, or that costs one window (live decodes, a streamed
    answer's language detection and HEAD_START windows, requests of at most one window, packed or
    not): dated ``head_start_s`` before it is sent (``WhisperAlignConfig.urgent_head_start_s``). The
    windows of longer files: dated when their file began, but never more than the head start before
    they are sent. So:

    - an urgent request goes before the windows of files that began less than the head start before
      it, and waits only for a place a running window frees;
    - a file that has waited that long goes before every urgent request sent after, in each of its
      rounds (a window that falls back to the next temperature keeps its file's date): a flood of
      short requests holds a file back about that long, not without end;
    - the later windows of a file older than the head start, sent as earlier ones finish
      (``windows_in_flight``), take their turn beside urgent requests, in order of arrival, as under
      ``fcfs``: a long file never shuts short requests out for the rest of its length.
    """
    now = time.time()
    return int(now - head_start_s) if urgent else int(max(began, now - head_start_s))


def is_urgent(samples: np.ndarray | SpilledSamples) -> bool:
    """Audio of one window or less: urgent (:func:`engine_priority`)."""
    return len(samples) <= N_SAMPLES


class AlignmentService:
    """``temperatures_at_once``: a transcription of one window or less (a client waits on it) that fails
    its first temperature decodes every later one together (``FallbackOptions.at_once``): the server's
    choice, where a request that falls back through the whole schedule waited for six rounds one after
    another, each beside everyone else's work; not the corpus job's, where the decodes it may waste
    are throughput."""

    def __init__(
        self,
        engine_client: Any,
        tokenizer: Any,
        max_audio_s: float = math.inf,
        temperatures_at_once: bool = False,
    ):
        self.engine_client = engine_client
        self.facts = driver.EngineFacts.of_engine(engine_client.model_config, tokenizer)
        self.tokens = self.facts.tokens
        # A safety net: the server decodes with this bound, which refuses longer audio first.
        self.max_audio_s = max_audio_s
        self.temperatures_at_once = temperatures_at_once
        self.windows_in_flight = windows_in_flight(engine_client.vllm_config)
        # The requests' Compute work (finishing windows), a thread to each waiting request in turn.
        self.compute = FairThreads()
        self._requests_in_flight = 0
        self._requests_started = 0
        # Engine requests of later temperatures aborted once an earlier one passed (stats route).
        self.counts = {"fallback_attempts_cut": 0}
        self._idle_tasks: set[asyncio.Task] = set()
        config = driver.plugin_options(engine_client.vllm_config.additional_config)
        self.packing, self.pack_alignments = config.packing, config.pack_alignments
        self.urgent_head_start_s = config.urgent_head_start_s
        self.packer = packing.PackQueue(
            functools.partial(self.run, urgent=True),  # short inputs only
            self.facts,
            encoder_windows_per_step(engine_client.vllm_config),
        )

    @classmethod
    async def create(
        cls, engine_client: Any, max_audio_s: float = math.inf, temperatures_at_once: bool = False
    ) -> AlignmentService:
        tokenizer = engine_client.get_tokenizer()
        if asyncio.iscoroutine(tokenizer):
            tokenizer = await tokenizer
        service = cls(engine_client, tokenizer, max_audio_s, temperatures_at_once)
        service._when_idle_return_memory()  # what start-up freed
        return service

    async def warm_up(self) -> None:
        """Transcribes the bundled clip with word timestamps, once for each engine (vLLM hands requests
        sent together to the least busy): the engines compile vLLM's logprob ranks (``torch.compile``)
        at the first request that asks for logprobs, which every one of ours does, and a client's first
        request paid for it. A failure is logged: the server serves without."""
        engines = self.engine_client.vllm_config.parallel_config.data_parallel_size
        try:
            samples = await asyncio.to_thread(decode_audio, sample_path())
            options = self.fallback_for(samples, None)
            work = (
                driver.transcription(samples, self.facts, language=None, options=options)
                for _ in range(engines)
            )
            await asyncio.gather(*(self.run(w, f"warm-up-{i}", urgent=True) for i, w in enumerate(work)))
        except Exception as error:  # the first request pays the compilation, as it would without
            logger.warning("whisper-align: the warm-up transcription failed: %r", error)

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
        window_features.FEATURES.clear()
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
        options = self.fallback_for(samples, options)
        if self.packing and await asyncio.to_thread(
            packing.packable,
            samples,
            self.facts,
            language=language,
            word_timestamps=word_timestamps,
            prompt=prompt,
            options=options,
        ):
            self.tokens.check_language(language, task)  # here: a request's mistake is never its pack's
            return await self.packer.transcribe(
                samples, request_id=request_id, language=language, task=task, options=options
            )
        work = driver.transcription(
            samples,
            self.facts,
            language=language,
            task=task,
            word_timestamps=word_timestamps,
            prompt=prompt,
            options=options,
        )
        return await self.run(work, request_id, urgent=is_urgent(samples))

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
        options = options or AlignmentOptions()
        self.tokens.check_language(language)  # here: a request's mistake is never its pack's
        given = packing.given_tokens(text, token_ids, self.tokens) if self.pack_alignments else None
        if packing.alignable(samples, given, self.tokens, options):
            return await self.packer.align(
                samples, given, request_id=request_id, language=language, options=options
            )
        work = driver.alignment(
            samples, self.facts, text=text, token_ids=token_ids, language=language, options=options
        )
        return await self.run(work, request_id, urgent=is_urgent(samples))

    def fallback_for(
        self, samples: np.ndarray | SpilledSamples, options: TranscriptionOptions | None
    ) -> TranscriptionOptions:
        """``options`` with the later temperatures decoded at once where this service does so for
        ``samples`` (``temperatures_at_once``, one window or less), streamed or not."""
        options = options or TranscriptionOptions()
        if self.temperatures_at_once and is_urgent(samples):
            return options.with_temperatures_at_once()
        return options

    def check_duration(self, samples: np.ndarray | SpilledSamples) -> None:
        seconds = len(samples) / SAMPLE_RATE
        if seconds > self.max_audio_s:
            raise AudioTooLongError(self.max_audio_s, seconds)

    async def transcription_plan(
        self,
        samples: np.ndarray | SpilledSamples,
        *,
        request_id: str,
        language: str | None = None,
        task: str = "transcribe",
        prompt: str | None = None,
        options: TranscriptionOptions | None = None,
    ) -> decoding.Plan:
        """The windows :meth:`transcribe` would run with word timings (its language detected where none
        is given), for :meth:`streamed`: every mistake in the request is raised here, before a streamed
        answer starts."""
        self.check_duration(samples)
        work = driver.transcription_plan(
            samples,
            self.facts,
            language=language,
            task=task,
            prompt=prompt,
            options=self.fallback_for(samples, options),
        )
        return await self.run(work, request_id, urgent=True)

    def alignment_plan(
        self,
        samples: np.ndarray | SpilledSamples,
        *,
        text: str | None = None,
        token_ids: Sequence[int] | None = None,
        language: str | None = None,
        options: AlignmentOptions | None = None,
    ) -> decoding.Plan:
        """The one window of a forced alignment of audio up to 30 s, for :meth:`streamed` (longer audio
        is long-form alignment, whose windows are final only once the whole recording is read)."""
        self.check_duration(samples)
        return driver.alignment_plan(samples, self.facts, text, token_ids, language, options)

    async def streamed(
        self, plan: decoding.Plan, request_id: str
    ) -> AsyncIterator[tuple[AudioChunk, WindowResult | None] | Transcript]:
        """``plan`` window by window: each window's audio and result (None: silence, or no text), in
        order, as soon as it and the windows before it are done, then the whole transcript, the same as
        :meth:`transcribe` (:meth:`align`) gives. The windows run concurrently, each on its own (at most
        ``windows_in_flight`` in the engines), so the first are sent while the rest are decoded. Closed
        early or cancelled, it aborts its engine requests and drops what was captured for them."""
        carrier = _Carrier(self, request_id)
        work = driver.streamed(plan, self.tokens)
        waiting = iter(work.windows)
        tasks = [
            asyncio.create_task(carrier.carry_out(window, urgent=True))
            for window in islice(waiting, HEAD_START)
        ]
        try:
            for index, window in enumerate(plan.windows):
                timed = await tasks[index]
                if index == HEAD_START - 1:
                    tasks += [asyncio.create_task(carrier.carry_out(window)) for window in waiting]
                yield window.audio, await asyncio.to_thread(work.in_order.add, timed)
            yield work.in_order.transcript()
        except BaseException as error:  # cancelled, closed early (GeneratorExit) or failed
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await carrier.abandon(error)
            raise

    async def run(
        self,
        work: driver.Driver,
        request_id: str,
        on_output: Callable[[], None] | None = None,
        urgent: bool = False,
    ) -> Any:
        """``work``'s commands carried out on the engines, at most ``windows_in_flight`` of its engine
        requests at a time (one request's share); ``on_output`` is called at each one's first output
        (the engines have started it). ``urgent``: its engine requests go before the windows of longer
        files begun up to the urgent head start before them (:func:`engine_priority`), where the
        engines schedule by priority (not under ``fcfs``). Cancelled (the client went away), it aborts the
        engine requests it started and drops what was captured for them."""
        carrier = _Carrier(self, request_id, on_output, urgent)
        try:
            return await carrier.carry_out(work)
        except asyncio.CancelledError as error:
            await carrier.abandon(error)
            raise

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
        totals: dict[str, int] = {
            "requests_in_flight": self._requests_in_flight,
            **self.counts,
            **self.packer.counts,
            **window_features.FEATURES.stats(),
        }
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


class _Carrier:
    """One request's commands carried out on the service's engines, for any number of its drivers at
    once: its share of the engines (``windows_in_flight`` engine requests at a time), and what it has
    started and captured, to abort and drop when the request is abandoned."""

    def __init__(
        self,
        service: AlignmentService,
        request_id: str,
        on_output: Callable[[], None] | None = None,
        urgent: bool = False,
    ):
        self.service, self.request_id = service, request_id
        self.on_output, self.urgent = on_output, urgent
        self.began = time.time()
        self.slots = asyncio.Semaphore(service.windows_in_flight)
        self.started: list[str] = []
        self.keys: list[str] = []

    async def carry_out(self, work: driver.Driver, urgent: bool | None = None) -> Any:
        """``work`` carried out, its engine requests urgent or not (default: as the carrier's)."""
        urgent = self.urgent if urgent is None else urgent
        return await driver.carry_out_async(work, lambda command: self.answer(command, urgent))

    async def answer(self, command: driver.Command, urgent: bool) -> Any:
        service = self.service
        if isinstance(command, driver.Generate):
            if command.unneeded is not None:
                return await self.generate_while_needed(command, urgent)
            return list(await asyncio.gather(*(self.generate(r, urgent) for r in command.requests)))
        if isinstance(command, driver.Compute):
            return await service.compute.run(self.request_id, command.functions, urgent)
        if isinstance(command, driver.NoSpeech):
            return await service.no_speech(command.keys)
        if isinstance(command, driver.Fetch):
            return await service.fetch(command.requests)
        await service.discard(command.keys)
        return None

    async def generate(self, request: driver.EngineRequest, urgent: bool) -> Any:
        async with self.slots:
            priority = engine_priority(urgent, self.began, self.service.urgent_head_start_s)
            engine_id = f"{self.request_id}-{request.name}"
            self.started.append(engine_id)
            self.keys.extend(request.capture_keys)
            final = None
            async for output in self.service.engine_client.generate(
                request.prompt, request.sampling_params, engine_id, priority=priority
            ):
                if final is None and self.on_output is not None:
                    self.on_output()
                final = output
            return final

    async def generate_while_needed(self, command: driver.Generate, urgent: bool) -> list[Any]:
        """``command``'s requests run together, each aborted as soon as ``command.unneeded`` says its
        answer no longer matters (None in its place): the later temperatures of a short request
        answer once the first that passes has, not when the slowest is done."""
        assert command.unneeded is not None
        tasks = [asyncio.create_task(self.generate(request, urgent)) for request in command.requests]
        finals: list[Any] = [None] * len(tasks)
        running = set(tasks)
        try:
            while running:
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    finals[tasks.index(task)] = task.result()  # a request's error is the command's
                cut = [tasks[j] for j in command.unneeded(finals) if tasks[j] in running]
                for task in cut:
                    task.cancel()  # vLLM aborts a request whose generate() is cancelled
                await asyncio.gather(*cut, return_exceptions=True)
                running -= set(cut)
                self.service.counts["fallback_attempts_cut"] += len(cut)
        finally:
            for task in running:  # cancelled, or a request failed
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        return finals

    async def abandon(self, reason: BaseException) -> None:
        """Aborts the engine requests started and drops what was captured for them: the client went
        away (``reason`` a cancellation, or the close of a streamed answer), or the request failed."""
        await asyncio.gather(
            self.service.engine_client.abort(self.started),
            self.service.discard(self.keys),
            return_exceptions=True,
        )
        gone = isinstance(reason, (asyncio.CancelledError, GeneratorExit))
        logger.info(
            "%s: %s; aborted its %d engine requests and dropped their captures",
            self.request_id,
            "the client went away" if gone else f"it failed ({type(reason).__name__})",
            len(self.started),
        )
