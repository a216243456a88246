r"""This project over HTTP: `vllm-whisper-align serve` in a subprocess, every clip sent with the
official `openai` AsyncOpenAI client at each concurrency (a semaphore), verbose_json with word
timestamps; then one pass with word timestamps off (response_format=json). Latency is per request,
from send to response. Peak memory is the RSS of the server's process tree (API server + engine
core), sampled every 0.2 s from its start to the end of each pass. Runs in the project's .venv.

    .venv/bin/python benchmarks/runners/vllm_http_run.py --manifest M --dtype float32 \
        --concurrency 1,8,32 --out OUT.json
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import (  # noqa: E402
    DEFAULT_VARIANT,
    RssSampler,
    engine_variant,
    load_manifest,
    log,
    precision_label,
    run_record,
    runner_parser,
    tree_memory,
    word_dicts,
    write_output,
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(
    model: str | None, variant: str, max_num_seqs: int, port: int, log_path: Path, extra_args=()
) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "vllm-whisper-align"
    dtype, additional_config = engine_variant(variant)
    # Everything else (KV cache size, served name, thread binding) is serve's own default.
    command = [
        str(exe),
        "serve",
        *([model] if model else []),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-num-seqs",
        str(max_num_seqs),
        *extra_args,
    ]
    if dtype != DEFAULT_VARIANT:
        command += ["--dtype", dtype]
    if additional_config:
        command += ["--additional-config", json.dumps(additional_config)]
    env = dict(os.environ)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log(f"http: starting {' '.join(command)} (log: {log_path})")
    return subprocess.Popen(
        command, stdout=log_path.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def engine_dtype(log_path: Path) -> str:
    """The dtype the engine runs, from vLLM's own config line in the server log."""
    match = re.search(r"dtype=torch\.(\w+)", log_path.read_text(errors="replace"))
    return match.group(1) if match else "unknown"


def wait_healthy(base: str, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was healthy")
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError("server not healthy in time")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)  # the session we started for it: server + engine core
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


async def one_pass(client, model_id: str, items, blobs, concurrency: int, word_timestamps: bool):
    semaphore = asyncio.Semaphore(concurrency)

    async def send(item):
        async with semaphore:
            start = time.perf_counter()
            if word_timestamps:
                result = await client.audio.transcriptions.create(
                    model=model_id,
                    file=(f"{item['id']}.wav", blobs[item["id"]]),
                    response_format="verbose_json",
                    timestamp_granularities=["word"],
                    language="en",
                )
                body = result.model_dump()
                words = word_dicts(body.get("words") or [])
            else:
                result = await client.audio.transcriptions.create(
                    model=model_id,
                    file=(f"{item['id']}.wav", blobs[item["id"]]),
                    response_format="json",
                    language="en",
                )
                body, words = result.model_dump(), []
            latency = time.perf_counter() - start
            return item["id"], {"text": body.get("text", ""), "words": words, "latency_s": round(latency, 4)}

    t0 = time.perf_counter()
    results = await asyncio.gather(*(send(item) for item in items))
    return time.perf_counter() - t0, dict(results)


async def capture_stats(base: str) -> dict:
    import httpx

    async with httpx.AsyncClient() as client:
        return (await client.get(f"{base}/v1/audio/alignments/stats", timeout=60)).json()


async def idle_server(base: str, returns_before: int, timeout_s: float = 15.0) -> None:
    """Wait until the server, idle, has handed memory back (its stats count it), as a server
    between requests does; a server without that (an older build) is measured after the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (await capture_stats(base)).get("heap_returns", 0) > returns_before:
            return
        await asyncio.sleep(0.5)


def main() -> None:
    parser = runner_parser("HF dir (default: the bundled tiny.en)", model_required=False, engine=True)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument(
        "--off-concurrency", type=int, default=None, help="default: the highest --concurrency"
    )
    parser.add_argument("--log", default=None)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    off_level = args.off_concurrency or max(levels)

    import openai

    items = load_manifest(args.manifest)
    blobs = {item["id"]: Path(item["path"]).read_bytes() for item in items}
    audio_s = round(sum(i["duration"] for i in items), 3)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = Path(args.log or Path(args.out).with_suffix(f".{args.dtype}.server.log"))
    t_launch = time.perf_counter()
    proc = start_server(args.model, args.dtype, args.max_num_seqs, port, log_path)
    sampler = RssSampler(proc.pid).start()
    runs = []
    idle = {}  # per process memory and capture pool after the warm-up requests
    try:
        wait_healthy(base, proc)
        precision = precision_label(engine_dtype(log_path), engine_variant(args.dtype)[1])
        if args.dtype == DEFAULT_VARIANT:
            precision += " (serve's default)"
        startup_s = time.perf_counter() - t_launch
        log(f"http: server healthy after {startup_s:.0f} s")

        async def session():
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", timeout=1800, max_retries=0)
            model_id = (await client.models.list()).data[0].id
            warm = sorted(items, key=lambda i: i["duration"])[:8]  # shortest clips
            returns_before = (await capture_stats(base)).get("heap_returns", 0)
            await one_pass(client, model_id, warm, blobs, 8, True)  # warm-up
            await one_pass(client, model_id, warm, blobs, 8, False)
            await idle_server(base, returns_before)
            idle.update(processes=tree_memory(proc.pid), capture=await capture_stats(base))
            log(f"http: after warm-up: {idle}")
            plan = [(c, True) for c in levels] + [(off_level, False)]
            for level, flag in plan:
                # Every pass starts as new audio would: the server, idle, has emptied its encoder
                # cache, so no clip takes its encoder output from the pass before.
                await idle_server(base, (await capture_stats(base)).get("heap_returns", 0))
                cached = (await capture_stats(base)).get("encoder_cache_entries", 0)
                if cached:
                    raise RuntimeError(f"the encoder cache still holds {cached} windows before a pass")
                wall, files = await one_pass(client, model_id, items, blobs, level, flag)
                t_end = time.perf_counter()
                runs.append(
                    run_record(
                        system="vllm-whisper-align (HTTP)",
                        model=args.model_name,
                        precision=precision,
                        concurrency=level,
                        mode=f"vllm-whisper-align serve, openai client, max_num_seqs={args.max_num_seqs}",
                        word_timestamps=flag,
                        audio_s=audio_s,
                        wall_s=round(wall, 3),
                        latencies_s=[files[i["id"]]["latency_s"] for i in items],
                        peak_rss_mib=sampler.peak_between(0, t_end),
                        peak_pss_mib=sampler.peak_between(0, t_end, "pss"),
                        startup_s=round(startup_s, 1),
                        files={i["id"]: files[i["id"]] for i in items},
                    )
                )
                log(
                    f"http {args.dtype} c={level} timestamps={'on' if flag else 'off'}: "
                    f"{runs[-1]['audio_s_per_wall_s']} audio s/wall s, p50 {runs[-1]['p50_latency_s']} s"
                )
            await client.close()

        asyncio.run(session())
    finally:
        sampler.stop()
        stop_server(proc)
    on = (
        next(r for r in runs if r["word_timestamps"] and r["concurrency"] == off_level)
        if off_level in levels
        else None
    )
    off = next(r for r in runs if not r["word_timestamps"])
    overhead = None
    if on:
        overhead = round(
            100 * (off["audio_s_per_wall_s"] - on["audio_s_per_wall_s"]) / off["audio_s_per_wall_s"], 2
        )
    write_output(args.out, "vllm-whisper-align (HTTP)", runs, overhead_pct=overhead, after_warm_up=idle)


if __name__ == "__main__":
    main()
