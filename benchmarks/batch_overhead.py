r"""The corpus job (``vllm-whisper-align batch``, Ray Data, 1 replica) against the offline API on the same
manifest: throughput, Ray's overhead, and the memory of a replica. Needs the ``batch`` extra (Ray Data).

    .venv/bin/python benchmarks/batch_overhead.py [--audio-dir benchmarks/out/audio] [--repeats 2] \
        [--rounds 2] [--batch-size 64] [--out benchmarks/out/batch_overhead.json]

The manifest: every clip of the transcription benchmark (benchmarks/audio.py makes them), ``--repeats``
times under distinct ids, as files (both sides decode them). Each round runs, in this order:

1. offline: ``WhisperAligner.transcribe(paths, word_timestamps=True)``, every clip in one call, on an
   engine started once before the rounds (after a one-clip warm-up); then, as separate rounds, the same
   in calls of ``--batch-size`` items one after another (the job's shape without Ray);
2. batch: ``batch.on_ray.run_job`` into a fresh output directory, as the CLI runs it: a local Ray starts,
   one replica starts its engine, the items go through ``map_batches`` in batches of ``--batch-size``,
   each result is written to ``<id>.json`` and its row to ``summary.jsonl``, Ray stops.

Throughput is audio seconds per wall second, medians over the rounds. The batch job's processing time runs
from its replica's engine being ready to the last row back, so engine start-up is out of both; the
job's whole wall time (Ray start, engine start, processing, Ray stop) is reported beside it. Memory: peak
PSS of the replica's process tree (the Ray actor, the engine core) sampled every 5 s, beside the peak PSS
of the offline process tree and of everything the job ran (driver, Ray's services, replica).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from common import log, write_output  # noqa: E402

ENGINE_ARGS = {"dtype": "float32", "max_num_seqs": 32}
# The Ray actor's process title: "ray::MapWorker(MapBatches(Replica))".
REPLICA_TITLE = "MapBatches(Replica)"
PSS_INTERVAL_S = 5.0


def tree_pss_mib(pid: int) -> float:
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0.0
    total = 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except psutil.Error:
            pass
    return total / 2**20


class PeakPss:
    """Peak PSS (MiB) of a process tree, read every PSS_INTERVAL_S in a thread; ``find`` gives the root's
    pid (or None while it does not exist)."""

    def __init__(self, find):
        self.find, self.peak, self.pids = find, 0.0, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self):
        while not self._stop.is_set():
            pid = self.find()
            if pid is not None:
                self.pids.add(pid)
                self.peak = max(self.peak, tree_pss_mib(pid))
            self._stop.wait(PSS_INTERVAL_S)


def find_replica() -> int | None:
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        if REPLICA_TITLE in " ".join(process.info["cmdline"] or []):
            return process.pid
    return None


def corpus(audio_dir: Path, repeats: int) -> list:
    from vllm_whisper_align.batch.job import Item

    truth = json.loads((audio_dir / "truth.json").read_text())
    return [
        Item(f"r{k}-{clip_id}", str((audio_dir / f"{clip_id}.wav").absolute()))
        for k in range(repeats)
        for clip_id in sorted(truth)
    ]


def offline_rounds(items, rounds: int, batch_size: int) -> dict:
    from vllm_whisper_align.runners.offline import WhisperAligner

    paths = [item.audio for item in items]
    with PeakPss(os.getpid) as memory:
        started = time.perf_counter()
        aligner = WhisperAligner(None, **ENGINE_ARGS)
        startup_s = time.perf_counter() - started
        aligner.transcribe(paths[:1], word_timestamps=True)  # warm-up
        walls = []
        for round_ in range(rounds):
            started = time.perf_counter()
            results = aligner.transcribe(paths, word_timestamps=True)
            walls.append(time.perf_counter() - started)
            words = sum(len(r.words) for r in results)
            log(f"offline round {round_ + 1}: {walls[-1]:.1f} s, {words} words")
        chunked = []  # the job's shape without Ray: one call per batch, one after another
        for round_ in range(rounds):
            started = time.perf_counter()
            for start in range(0, len(paths), batch_size):
                aligner.transcribe(paths[start : start + batch_size], word_timestamps=True)
            chunked.append(time.perf_counter() - started)
            log(f"offline in calls of {batch_size}, round {round_ + 1}: {chunked[-1]:.1f} s")
        aligner.close()
    return {
        "engine_start_s": round(startup_s, 1),
        "walls_s": [round(w, 2) for w in walls],
        "chunked_walls_s": [round(w, 2) for w in chunked],
        "peak_pss_mib": round(memory.peak),
    }


def interleaved_rounds(items, rounds: int, batch_size: int) -> tuple[dict, dict]:
    """Offline pass, then a job, per round, the offline engine kept (idle) through the jobs: a drift of the
    machine's speed lands on both sides alike."""
    from vllm_whisper_align.runners.offline import WhisperAligner

    paths = [item.audio for item in items]
    started = time.perf_counter()
    aligner = WhisperAligner(None, **ENGINE_ARGS)
    startup_s = time.perf_counter() - started
    aligner.transcribe(paths[:1], word_timestamps=True)  # warm-up
    walls, peak, jobs = [], 0.0, []
    for round_ in range(rounds):
        with PeakPss(os.getpid) as memory:
            started = time.perf_counter()
            aligner.transcribe(paths, word_timestamps=True)
            walls.append(time.perf_counter() - started)
        peak = max(peak, memory.peak)
        log(f"offline round {round_ + 1}: {walls[-1]:.1f} s")
        jobs.append(batch_rounds(items, 1, batch_size, job_tree=False))
    aligner.close()
    offline = {
        "engine_start_s": round(startup_s, 1),
        "walls_s": [round(w, 2) for w in walls],
        "chunked_walls_s": [float("nan")],
        "peak_pss_mib": round(peak),
    }
    merged = {key: [value for job in jobs for value in job[key]] for key in jobs[0]}
    merged["job_tree_peak_pss_mib"] = [None]  # it held the idle offline engine too
    return offline, merged


def batch_rounds(items, rounds: int, batch_size: int, job_tree: bool = True) -> dict:
    """``job_tree``: also sample the PSS of everything the job runs (driver, Ray, replica). Off when the
    driver holds the offline engine too: its value would count that engine, and walking its page tables
    every 5 s took CPU from the job being timed (the offline passes sample their own tree only)."""
    from vllm_whisper_align.batch.job import JobOptions
    from vllm_whisper_align.batch.on_ray import run_job

    processing, totals, ray_starts, replica_starts, replica_pss, job_pss = [], [], [], [], [], []
    stops = []
    for round_ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="batch-overhead-") as folder:
            out = Path(folder)
            with PeakPss(find_replica) as replica, PeakPss(os.getpid if job_tree else lambda: None) as job:
                report = run_job(
                    items,
                    out,
                    engine_args=dict(ENGINE_ARGS),
                    options=JobOptions(str(out)),
                    replicas=1,
                    batch_size=batch_size,
                )
            assert report.ok == len(items) and report.errors == 0, report
            assert len(list(out.glob("*.json"))) == len(items)
        processing.append(report.last_row_at - report.replica_ready_at)
        totals.append(report.finished_at - report.started_at)
        ray_starts.append(report.ray_ready_at - report.started_at)
        replica_starts.append(report.replica_ready_at - report.ray_ready_at)
        replica_pss.append(replica.peak)
        job_pss.append(job.peak)
        stops.append(report.finished_at - report.last_row_at)
        log(
            f"batch round {round_ + 1}: processing {processing[-1]:.1f} s, whole job {totals[-1]:.1f} s "
            f"(Ray {ray_starts[-1]:.1f} s, replica start {replica_starts[-1]:.1f} s), replica PSS "
            f"{replica.peak:.0f} MiB"
        )
    return {
        "processing_walls_s": [round(w, 2) for w in processing],
        "job_walls_s": [round(w, 2) for w in totals],
        "ray_start_s": [round(w, 1) for w in ray_starts],
        "replica_start_s": [round(w, 1) for w in replica_starts],
        "ray_stop_s": [round(w, 1) for w in stops],
        "replica_peak_pss_mib": [round(m) for m in replica_pss],
        "job_tree_peak_pss_mib": [round(m) for m in job_pss],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--audio-dir", type=Path, default=HERE / "out" / "audio")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="alternate offline passes and jobs, the offline engine kept (no calls-of-N)",
    )
    parser.add_argument(
        "--offline-only",
        action="store_true",
        help="only the offline passes (whole, and in calls of --batch-size)",
    )
    parser.add_argument("--out", type=Path, default=HERE / "out" / "batch_overhead.json")
    args = parser.parse_args()
    if not (args.audio_dir / "truth.json").exists():
        print(f"no {args.audio_dir}/truth.json: make the clips with benchmarks/audio.py", file=sys.stderr)
        return 2
    from vllm_whisper_align.audio.decode import decode_audio

    items = corpus(args.audio_dir, args.repeats)
    audio_s = sum(len(decode_audio(item.audio)) for item in items) / 16000
    log(f"{len(items)} items, {audio_s:.0f} s of audio")
    if args.interleave:
        offline, ray_job = interleaved_rounds(items, args.rounds, args.batch_size)
    else:
        offline = offline_rounds(items, args.rounds, args.batch_size)
    if args.interleave:
        pass
    elif args.offline_only:
        ray_job = {
            "processing_walls_s": [float("nan")],
            "job_walls_s": [float("nan")],
            "replica_peak_pss_mib": [None],
        }
    else:
        ray_job = batch_rounds(items, args.rounds, args.batch_size)
    offline_speed = audio_s / statistics.median(offline["walls_s"])
    chunked_speed = audio_s / statistics.median(offline["chunked_walls_s"])
    batch_speed = audio_s / statistics.median(ray_job["processing_walls_s"])
    job_speed = audio_s / statistics.median(ray_job["job_walls_s"])
    summary = {
        "items": len(items),
        "audio_s": round(audio_s, 1),
        "batch_size": args.batch_size,
        "engine_args": ENGINE_ARGS,
        "rounds": args.rounds,
        "offline_audio_s_per_s": round(offline_speed, 2),
        "offline_in_calls_of_batch_size_audio_s_per_s": round(chunked_speed, 2),
        "batch_audio_s_per_s": round(batch_speed, 2),
        "batch_whole_job_audio_s_per_s": round(job_speed, 2),
        "ray_overhead_pct": round(100 * (1 - batch_speed / offline_speed), 1),
        "replica_peak_pss_mib": ray_job["replica_peak_pss_mib"][0]
        if args.offline_only
        else max(ray_job["replica_peak_pss_mib"]),
        "offline_peak_pss_mib": offline["peak_pss_mib"],
        "offline": offline,
        "batch": ray_job,
    }
    write_output(args.out, "batch-overhead", [summary])
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
