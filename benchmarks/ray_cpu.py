r"""CPU that Ray itself takes while a corpus job's pipeline runs, without an engine: the same local Ray and
``map_batches`` over an actor pool of 1 as ``vllm-whisper-align batch``, with a replica that sleeps instead of
transcribing. What the driver, Ray's services and the actor's own threads use then is what the job's
engine does not get.

    .venv/bin/python benchmarks/ray_cpu.py [--seconds 60] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import psutil

ITEM_SECONDS = 0.5  # what one item "takes" in the sleeping replica


class Sleeper:
    def __call__(self, batch):
        time.sleep(ITEM_SECONDS * batch.num_rows)
        return batch


def cpu_seconds(pids: set[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def tree(pid: int) -> set[int]:
    root = psutil.Process(pid)
    return {root.pid} | {p.pid for p in root.children(recursive=True)}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    import ray
    import ray.data

    ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    items = int(args.seconds / ITEM_SECONDS)
    pids = tree(os.getpid())
    before = cpu_seconds(pids)
    started = time.perf_counter()
    dataset = ray.data.from_items([{"id": str(n)} for n in range(items)]).map_batches(
        Sleeper,
        batch_size=args.batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=1,
    )
    seen = 0
    for _ in dataset.iter_rows():
        seen += 1
        pids |= tree(os.getpid())
    wall = time.perf_counter() - started
    used = cpu_seconds(pids) - before  # processes that ended before the end are missed: a lower bound
    ray.shutdown()
    result = {
        "items": seen,
        "wall_s": round(wall, 1),
        "ray_cpu_s": round(used, 1),
        "cores_used": round(used / wall, 3),
        "share_of_machine": round(used / wall / os.cpu_count(), 3),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
