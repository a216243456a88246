"""What the acoustic model of phones costs `serve`: the benchmark's clips through `serve`'s defaults
(32 clients, the official `openai` client, verbose_json with word granularity), alternating passes with
``alignment_method=heads`` (no acoustic model) and ``auto`` (the default, with it), medians of the
rounds; and the CPU time the phone aligner's processes took in each ``auto`` pass.

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/phones_cost.py [--rounds 3] [--clients 32]
        [--dereverberate auto|true|false]

``--dereverberate`` sets ``whisper_align.dereverberate`` (not given: `serve`'s default).

The clips are benchmarks/out/manifest.json (``benchmarks/run.py`` writes it: 75 espeak-ng clips, 633 s,
English). Every pass starts on an idle server whose encoder cache is empty, as in vllm_http_run.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "runners"))

from common import DEFAULT_VARIANT, DEREVERBERATE_MODES, cpu_description, load_manifest  # noqa: E402
from vllm_http_run import capture_stats, free_port, idle_server, start_server, stop_server, wait_healthy  # noqa: E402

METHODS = ("heads", "auto")


def phone_worker_cpu_s(server_pid: int) -> float:
    """CPU seconds so far of the server's phone aligner processes (0 before they have started)."""
    total = 0.0
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            if "vllm_whisper_align.audio.phones" in " ".join(child.cmdline()):
                times = child.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


async def one_pass(client, model_id: str, items, blobs, clients: int, method: str) -> float:
    slots = asyncio.Semaphore(clients)

    async def send(item):
        async with slots:
            await client.audio.transcriptions.create(
                model=model_id,
                file=(f"{item['id']}.wav", blobs[item["id"]]),
                response_format="verbose_json",
                timestamp_granularities=["word"],
                language="en",
                extra_body={"alignment_method": method},
            )

    started = time.perf_counter()
    await asyncio.gather(*(send(item) for item in items))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--manifest", type=Path, default=HERE / "out" / "manifest.json")
    parser.add_argument("--dereverberate", choices=DEREVERBERATE_MODES)
    args = parser.parse_args()
    extra_args = []
    if args.dereverberate:
        settings = {"whisper_align": {"dereverberate": DEREVERBERATE_MODES[args.dereverberate]}}
        extra_args = ["--additional-config", json.dumps(settings)]
    import openai

    items = load_manifest(args.manifest)
    blobs = {item["id"]: Path(item["path"]).read_bytes() for item in items}
    audio_s = sum(item["duration"] for item in items)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = HERE / "out" / "phones_cost_serve.log"
    server = start_server(None, DEFAULT_VARIANT, 32, port, log_path, extra_args)
    rates: dict[str, list[float]] = {method: [] for method in METHODS}
    worker_cpu: list[float] = []
    try:
        wait_healthy(base, server)

        async def session() -> None:
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", timeout=1800, max_retries=0)
            model_id = (await client.models.list()).data[0].id
            warm = sorted(items, key=lambda item: item["duration"])[:8]
            for method in METHODS:
                await one_pass(client, model_id, warm, blobs, 8, method)
            for _ in range(args.rounds):
                for method in METHODS:
                    await idle_server(base, (await capture_stats(base)).get("heap_returns", 0))
                    cpu_before = phone_worker_cpu_s(server.pid)
                    wall = await one_pass(client, model_id, items, blobs, args.clients, method)
                    rates[method].append(audio_s / wall)
                    if method == "auto":
                        worker_cpu.append(phone_worker_cpu_s(server.pid) - cpu_before)
                    print(f"{method}: {audio_s / wall:.2f} audio s / wall s ({wall:.1f} s)", flush=True)
            await client.close()

        asyncio.run(session())
    finally:
        stop_server(server)
    heads, auto = (statistics.median(rates[method]) for method in METHODS)
    setting = f"dereverberate {args.dereverberate}" if args.dereverberate else "serve's defaults"
    print(f"\nMachine: {cpu_description()}; {len(items)} clips, {audio_s:.0f} s; {args.clients} clients")
    print(f"Setting: {setting}")
    print(f"| alignment_method | audio s / wall s (median of {args.rounds}) | rounds |")
    print("|---|---|---|")
    for method in METHODS:
        shown = ", ".join(f"{rate:.2f}" for rate in rates[method])
        print(f"| {method} | {statistics.median(rates[method]):.2f} | {shown} |")
    per_second_ms = statistics.median(worker_cpu) / audio_s * 1000
    passes = ", ".join(f"{seconds:.1f}" for seconds in worker_cpu)
    print(f"\nauto / heads: {auto / heads:.3f}; the phone aligners' CPU per auto pass: {passes} s")
    print(f"({per_second_ms:.1f} ms per second of audio)")


if __name__ == "__main__":
    main()
