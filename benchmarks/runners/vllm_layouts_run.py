r"""One engine against data parallelism, over HTTP: `vllm-whisper-align serve` started in each layout
(LAYOUTS), every clip sent at one concurrency with word timestamps (verbose_json, the openai
client), ``--rounds`` passes; the figure is the median pass. Peak PSS is summed over the server's
process tree (API servers, engine cores, workers) from its start to the end of the last pass.

    .venv/bin/python benchmarks/runners/vllm_layouts_run.py --manifest benchmarks/out/manifest.json \
        --dtype default --out benchmarks/out/layouts.json   # one-engine, data-parallel-2; c=32; 2 rounds

The manifest is the one benchmarks/run.py writes (75 clips, 633 s of speech); ``--dtype default``
passes none (serve's own choice). benchmarks/run.py's report includes the output as a section.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RssSampler, load_manifest, log, runner_parser, tree_memory, write_output  # noqa: E402
from vllm_http_run import free_port, one_pass, start_server, stop_server, wait_healthy  # noqa: E402

# Each layout's flags on top of the runner's (--dtype, --max-num-seqs). data-parallel-2 is what a
# user gets from --data-parallel-size 2: vLLM then also starts one API server per engine.
LAYOUTS = {
    "one-engine": [],
    "data-parallel-2": ["--data-parallel-size", "2"],
    "data-parallel-2-one-api": ["--data-parallel-size", "2", "--api-server-count", "1"],
}
WARM_UP_CLIPS = 8


def run_layout(name: str, args, items, blobs, audio_s: float) -> dict:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = Path(args.log_dir) / f"layout-{name}.server.log"
    started = time.perf_counter()
    proc = start_server(args.model, args.dtype, args.max_num_seqs, port, log_path, LAYOUTS[name])
    sampler = RssSampler(proc.pid).start()
    try:
        wait_healthy(base, proc)
        startup_s = time.perf_counter() - started

        async def session():
            import httpx
            import openai

            def new_client():
                # A new connection per request: under data parallel 2 on 2 cores (two API servers,
                # starved of CPU) a pass failed twice on a connection the server was closing
                # as the client reused it (ReadError before the response headers; max_retries=0).
                http = openai.DefaultAsyncHttpxClient(
                    limits=httpx.Limits(max_connections=1000, max_keepalive_connections=0)
                )
                return openai.AsyncOpenAI(
                    base_url=f"{base}/v1", api_key="unused", timeout=1800, max_retries=0, http_client=http
                )

            async with new_client() as client:
                model_id = (await client.models.list()).data[0].id
                warm = sorted(items, key=lambda i: i["duration"])[:WARM_UP_CLIPS]
                await one_pass(client, model_id, warm, blobs, WARM_UP_CLIPS, True)
            idle = tree_memory(proc.pid)
            walls = []
            for round_ in range(args.rounds):
                async with new_client() as client:
                    wall, _ = await one_pass(client, model_id, items, blobs, args.concurrency, True)
                walls.append(wall)
                log(f"layouts {name} round {round_ + 1}: {audio_s / wall:.2f} audio s/wall s")
            return walls, idle

        walls, idle = asyncio.run(session())
        ended = time.perf_counter()
    finally:
        sampler.stop()
        stop_server(proc)
    wall = statistics.median(walls)
    return {
        "layout": name,
        "flags": LAYOUTS[name],
        "dtype": args.dtype,
        "concurrency": args.concurrency,
        "max_num_seqs": args.max_num_seqs,
        "audio_s": audio_s,
        "rounds_wall_s": [round(w, 3) for w in walls],
        "audio_s_per_wall_s": round(audio_s / wall, 2),
        "startup_s": round(startup_s, 1),
        "peak_pss_mib": sampler.peak_between(0, ended, "pss"),
        "processes_after_warm_up": idle,
    }


def section(layouts: dict) -> list[str]:
    """RESULTS.md's section for this runner's output (``layouts``: the JSON it writes)."""
    runs = layouts["runs"]
    lines = [
        "## One engine against data parallelism",
        "",
        f"`{layouts['command']}` ({layouts['machine']}; {runs[0]['audio_s']} s of audio, "
        f"concurrency {runs[0]['concurrency']}, word timestamps on, median of "
        f"{len(runs[0]['rounds_wall_s'])} passes; dtype {runs[0]['dtype']}):",
        "",
        "| layout | flags | audio s / wall s | passes (wall s) | peak PSS MiB | start s |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        flags = " ".join(run["flags"]) or "–"
        passes = ", ".join(map(str, run["rounds_wall_s"]))
        lines.append(
            f"| {run['layout']} | `{flags}` | {run['audio_s_per_wall_s']} | {passes} | "
            f"{run['peak_pss_mib']} | {run['startup_s']} |"
        )
    return lines + [""]


def main() -> None:
    parser = runner_parser("HF dir (default: the bundled tiny.en)", model_required=False, engine=True)
    parser.add_argument(
        "--layouts", default="one-engine,data-parallel-2", help=f"comma list of {list(LAYOUTS)}"
    )
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--log-dir", default=None, help="server logs (default: next to --out)")
    args = parser.parse_args()
    args.log_dir = args.log_dir or str(Path(args.out).parent / "logs")
    items = load_manifest(args.manifest)
    blobs = {item["id"]: Path(item["path"]).read_bytes() for item in items}
    audio_s = round(sum(item["duration"] for item in items), 3)
    runs = [run_layout(name, args, items, blobs, audio_s) for name in args.layouts.split(",")]
    write_output(args.out, "vllm-whisper-align (HTTP layouts)", runs, command=shlex.join(sys.argv))
    print("\n".join(section(json.loads(Path(args.out).read_text()))))


if __name__ == "__main__":
    main()
