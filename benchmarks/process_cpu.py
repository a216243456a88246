"""Where a pass of short clips spends the CPU of `serve`: each process of the server's tree (the engine
core, the API process, the phone workers), and the stats route's counters, around each pass.

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/process_cpu.py [--server packed|unpacked] \
        [--length 2] [--passes 3]

`serve` with its defaults (packed) or with packing off, the benchmark's continuous recording cut into
clips as `clip_lengths.py` cuts it, 32 clients with the official `openai` client (verbose_json, word
timestamps); a warm-up of the first 32 clips, then each pass on an idle server. Per pass: wall time,
audio seconds per wall second, the user and system CPU seconds of each kind of process, and the
counters of the stats route that moved. A worktree's code is measured by running this with
``PYTHONPATH`` set to it (the server inherits it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "runners"))
from audio import ALIGN_MIN_SECONDS, make_continuous, recording  # noqa: E402
from clip_lengths import OUT, SERVERS, cut  # noqa: E402
from common import cpu_description  # noqa: E402
from vllm_http_run import (  # noqa: E402
    capture_stats,
    free_port,
    idle_server,
    one_pass,
    start_server,
    stop_server,
    wait_healthy,
)

from tests.support.servers import wav_bytes  # noqa: E402
from vllm_whisper_align.constants import SAMPLE_RATE  # noqa: E402

CLIENTS = 32


def kind(process: psutil.Process) -> str:
    """Which part of the server a process is."""
    command = " ".join(process.cmdline())
    if "EngineCore" in process.name() or "EngineCore" in command:
        return "engine"
    if "phones" in command:
        return "phones"
    return "api" if "server.launch" in command or "vllm-whisper-align" in command else process.name()


def cpu_seconds(root: psutil.Process) -> dict[str, float]:
    """User and system CPU seconds so far of each kind of process in ``root``'s tree."""
    seconds: dict[str, float] = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            times, name = process.cpu_times(), kind(process)
        except psutil.Error:  # gone meanwhile
            continue
        seconds[name] = seconds.get(name, 0.0) + times.user + times.system
    return seconds


async def passes(base: str, clips, root: psutil.Process, count: int) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", timeout=1800, max_retries=0)
    model_id = (await client.models.list()).data[0].id
    items = [{"id": f"c{i}", "duration": len(c.samples) / SAMPLE_RATE} for i, c in enumerate(clips)]
    blobs = {f"c{i}": wav_bytes(c.samples) for i, c in enumerate(clips)}
    audio_s = sum(item["duration"] for item in items)
    await one_pass(client, model_id, items[:CLIENTS], blobs, CLIENTS, True)
    for index in range(count):
        await idle_server(base, (await capture_stats(base)).get("heap_returns", 0))
        stats_before, cpu_before = await capture_stats(base), cpu_seconds(root)
        wall, _ = await one_pass(client, model_id, items, blobs, CLIENTS, True)
        cpu_after, stats_after = cpu_seconds(root), await capture_stats(base)
        cpu = {name: round(value - cpu_before.get(name, 0.0), 1) for name, value in cpu_after.items()}
        moved = {
            name: value - stats_before.get(name, 0)
            for name, value in stats_after.items()
            if isinstance(value, int | float) and value != stats_before.get(name)
        }
        print(
            f"pass {index + 1}: wall {wall:.1f} s, {audio_s / wall:.2f} audio-s/wall-s, "
            f"CPU-s {cpu}, stats {moved}",
            flush=True,
        )
    await client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", choices=sorted(SERVERS), default="packed")
    parser.add_argument("--length", type=float, default=2.0, help="clip length in seconds")
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    clips = cut(recording(make_continuous, ALIGN_MIN_SECONDS), args.length)
    print(f"{cpu_description()}; {args.server} server, {len(clips)} clips of {args.length:g} s", flush=True)
    port = free_port()
    log = OUT / "logs" / f"process_cpu.{args.server}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = start_server(None, "default", CLIENTS, port, log, SERVERS[args.server])
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        asyncio.run(passes(f"http://127.0.0.1:{port}", clips, psutil.Process(proc.pid), args.passes))
    finally:
        stop_server(proc)


if __name__ == "__main__":
    main()
