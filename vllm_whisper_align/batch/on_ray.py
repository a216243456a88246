"""The corpus job on Ray Data: a pool of replicas, each holding one engine, fed by ``map_batches``.

Ray is an optional extra (``pip install 'vllm-whisper-align[batch]'``): it is imported when a job runs,
never when this module is. See ``batch`` for the manifest, the outputs and what a rerun does.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_whisper_align.batch.job import (
    STATUS_ERROR,
    STATUS_OK,
    Item,
    JobOptions,
    Progress,
    Summary,
    done_ids,
    new_run_id,
    process_batch,
    read_summary,
    recover_rows,
    remove_stale_temporaries,
)
from vllm_whisper_align.batch.lifetime import Driver, Lifeline, reaped_with_this_process

INSTALL_HINT = "the batch command needs Ray Data: pip install 'vllm-whisper-align[batch]'"
# Columns of a replica's output (and of the summary, which adds run and time).
ROW_COLUMNS = ("id", "status", "error", "audio_seconds", "words", "language")
# Batches a replica works on at once: the next one's items start while the last windows of the one
# before still run. Each holds its decoded audio until its results are written.
BATCHES_IN_FLIGHT = 2
# A replica's engine starts in about a minute on a small CPU machine, longer for a big model on a
# loaded node: Ray Data's default wait for its actors is too short for that.
REPLICA_START_TIMEOUT_S = 3600


def require_ray() -> None:
    """ValueError (one line, with the install command) when Ray Data is not installed."""
    try:
        import ray.data  # noqa: F401
    except ImportError as error:
        raise ValueError(f"{INSTALL_HINT} ({error})") from None


class Replica:
    """What one Ray actor runs: one engine, fed up to BATCHES_IN_FLIGHT batches at once.

    Ray Data calls it from that many threads; each hands its batch to the engine's event loop
    (:class:`ServingEngine`), where the items of every batch in flight share the engine's continuous
    batch. One batch at a time, the engine ran under-filled while each batch's last windows finished
    (at 64 items a batch, 15-21% behind the offline API on the same manifest).
    """

    def __init__(self, model: str | None, engine_args: dict[str, Any], options: JobOptions, driver: Driver):
        self.lifeline = Lifeline(driver)  # first: a job that ends while the engine starts takes it along
        _normal_priority()
        self.options = options
        self.engine = ServingEngine(model, engine_args)
        self.ready_at = time.time()

    def __call__(self, batch):
        import pyarrow as pa

        items = [Item(**row) for row in batch.to_pylist()]
        rows = self.engine.run(process_batch(self.engine.service, items, self.options, self.lifeline.holds))
        columns = {name: [row.get(name) for row in rows] for name in ROW_COLUMNS}
        columns["_ready_at"] = [self.ready_at] * len(rows)
        return pa.table(columns, schema=_row_schema())

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()


class ServingEngine:
    """vLLM's AsyncLLM with the server's AlignmentService, on an event loop of their own (a thread).

    The offline API's engine settings (``offline.prepare_engine``) and the server's requests
    (the same decoding and alignment modules as both).
    """

    def __init__(self, model: str | None, engine_args: dict[str, Any]):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="replica-engine", daemon=True)
        self.thread.start()
        self.engine = None
        self.engine, self.service = self.run(self._start(model, engine_args))
        backend = self.engine.vllm_config.parallel_config.distributed_executor_backend
        if backend == "ray":  # the replica is the unit of parallelism; the engine must not place workers
            self.close()
            raise RuntimeError(
                "the replica's engine chose Ray as its executor; pass --distributed-executor-backend mp"
            )

    def run(self, coroutine):
        """Run ``coroutine`` on the engine's loop; wait for its result here (any thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    async def _start(self, model: str | None, engine_args: dict[str, Any]):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from vllm_whisper_align.runners.offline import prepare_engine
        from vllm_whisper_align.runners.service import AlignmentService

        args = prepare_engine(model, **engine_args)
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        # No duration limit: a corpus holds whole recordings, and the offline API has none either.
        service = await AlignmentService.create(engine, max_audio_s=math.inf)
        return engine, service

    def close(self) -> None:
        """Stop the engine's processes and the loop; a second call does nothing."""
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        self.loop.call_soon_threadsafe(self.loop.stop)


def _normal_priority() -> None:
    """Ray starts its workers at niceness 15, to keep its own services responsive; the engine this
    replica starts (its processes inherit the niceness of the thread that spawns them) is the job's whole
    work, and would otherwise yield the cores to anything else running on the node. Back to 0 where
    allowed (lowering niceness needs privileges: otherwise left as it is)."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass


def _row_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("status", pa.string()),
            ("error", pa.string()),
            ("audio_seconds", pa.float64()),
            ("words", pa.int64()),
            ("language", pa.string()),
            ("_ready_at", pa.float64()),
        ]
    )


@dataclass
class JobReport:
    """What a run did, for the caller (exit status) and the benchmark (timings, wall clock)."""

    total: int
    done_before: int
    ok: int = 0
    errors: int = 0
    audio_seconds: float = 0.0
    started_at: float = 0.0  # time.time() when the run began
    ray_ready_at: float | None = None  # Ray started or connected
    replica_ready_at: float | None = None  # the first replica's engine ready
    last_row_at: float | None = None  # the last item's row back
    finished_at: float | None = None  # Ray stopped

    @property
    def exit_status(self) -> int:
        return 1 if self.errors else 0


def run_job(
    items: Sequence[Item],
    output_dir: Path,
    *,
    model: str | None = None,
    engine_args: dict[str, Any] | None = None,
    options: JobOptions | None = None,
    ray_address: str | None = None,
    replicas: int = 1,
    cpus_per_replica: float = 1.0,
    gpus_per_replica: float = 0.0,
    batch_size: int = 64,
    verbose: bool = False,
) -> JobReport:
    """Run every item of ``items`` not done yet in ``output_dir`` (see ``batch``); progress on stderr.

    Without ``ray_address`` a local Ray starts (and stops at the end) on this machine; with one, the
    job's replicas run on that cluster, whose nodes must see the audio and ``output_dir`` at the same
    paths (or the audio as URIs).
    """
    report = JobReport(total=len(items), done_before=0, started_at=time.time())
    output_dir = output_dir.absolute()
    output_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(output_dir)
    done = done_ids(output_dir, items)
    report.done_before = len(done)
    todo = [item for item in items if item.id not in done]
    options = options or JobOptions(str(output_dir))
    run = new_run_id()
    with Summary(output_dir, run) as summary:
        for row in recover_rows(output_dir, done, read_summary(summary.path)):
            summary.append(row)
        print(
            f"batch: run {run}: {len(items)} items, {len(done)} done before, {len(todo)} to do; "
            f"{replicas} replica(s); results in {output_dir}",
            file=sys.stderr,
            flush=True,
        )
        if not todo:
            report.finished_at = time.time()
            return report
        progress = Progress(len(todo), len(done))
        with reaped_with_this_process():  # however this process ends, nothing the job started outlives it
            ray = _start_ray(ray_address, verbose)
            report.ray_ready_at = time.time()
            replica = {"model": model, "engine_args": engine_args or {}, "options": options}
            try:
                dataset = _replicas(
                    ray, todo, replica, replicas, cpus_per_replica, gpus_per_replica, batch_size
                )
                for row in dataset.iter_rows():
                    ready = row.pop("_ready_at")
                    report.replica_ready_at = min(report.replica_ready_at or ready, ready)
                    if row["status"] not in (STATUS_OK, STATUS_ERROR):
                        continue  # done by an earlier attempt of this batch
                    summary.append(row)
                    progress.add(row)
                    report.last_row_at = time.time()
            finally:
                ray.shutdown()  # stops a local Ray; from a cluster, only disconnects
        progress.show()
    report.ok, report.errors, report.audio_seconds = progress.ok, progress.errors, progress.audio_seconds
    report.finished_at = time.time()
    return report


def _replicas(
    ray, todo: Sequence[Item], replica: dict[str, Any], size: int, cpus: float, gpus: float, batch_size: int
):
    """The dataset of every item's row, from a pool of ``size`` replicas working for this process."""
    return ray.data.from_items([item.as_row() for item in todo]).map_batches(
        Replica,
        fn_constructor_kwargs={**replica, "driver": Driver.of(os.getpid())},
        batch_size=batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(
            size=size,
            max_concurrent_calls_per_actor=BATCHES_IN_FLIGHT,
            enable_true_multi_threading=True,  # the threads only wait: the engine's loop works
        ),
        num_cpus=cpus,
        num_gpus=gpus or None,
    )


def _start_ray(address: str | None, verbose: bool):
    import ray
    import ray.data

    ray.init(
        address=address,
        include_dashboard=False,
        log_to_driver=verbose,
        logging_level=logging.INFO if verbose else logging.WARNING,
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = verbose
    context.wait_for_min_actors_s = REPLICA_START_TIMEOUT_S
    if not verbose:
        # Its notes (on the disabled progress bars...) and tracebacks: the CLI reports a failure in one line.
        logging.getLogger("ray.data").setLevel(logging.CRITICAL)
    return ray
