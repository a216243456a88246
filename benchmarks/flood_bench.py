"""A long file beside a flood of short requests: is it held back, and how long?

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/flood_bench.py        # about 10 minutes

It starts `vllm-whisper-align serve` with its defaults (tiny.en, serve's dtype for this CPU;
`--serve-args` adds flags, e.g. `--scheduling-policy fcfs` or `--additional-config
'{"whisper_align": {"urgent_head_start_s": 10}}'`) and, for each N of `--clients` (default 0,32,64),
lets N clients post the 4-8 s espeak-ng sentences of tests/support/speech.py one after another (plain
`json`: no word timestamps, so not packed, one engine request each; 8 sentences, so repeats hit the
encoder cache: a flood cheaper than real traffic), then, once they have run for a few seconds, posts
a 3-minute recording of real speech (tests/support/real_speech.py, joined with its own pauses) with
word timestamps (`--method`: its `alignment_method`, serve's default `auto`): how long it takes,
against the same file alone (N = 0), and how many clips a second the flood got answered meanwhile. A
file not done within `--limit` seconds is reported as such.

Writes benchmarks/out/flood.json and prints a section for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE / "runners"))
from streaming_bench import run_facts, server_in  # noqa: E402

from tests.support import real_speech  # noqa: E402
from tests.support.servers import wav_bytes  # noqa: E402
from tests.support.speech import sentence_clips  # noqa: E402
from vllm_whisper_align.constants import SAMPLE_RATE  # noqa: E402

OUT = HERE / "out" / "flood.json"
# The flood runs this long before the file is posted: the engines are full of clips by then.
FLOOD_FIRST_S = 8


async def post(http: httpx.AsyncClient, server: str, audio: bytes, words: str | None) -> None:
    """``audio`` transcribed: with word timestamps by the alignment method ``words``, or without."""
    data = (
        {"response_format": "verbose_json", "timestamp_granularities[]": "word", "alignment_method": words}
        if words
        else {"response_format": "json"}
    )
    response = await http.post(
        f"{server}/v1/audio/transcriptions", files={"file": ("a.wav", audio, "audio/wav")}, data=data
    )
    response.raise_for_status()


async def file_beside_flood(
    server: str, file: bytes, clips: list[bytes], clients: int, limit_s: float, method: str
) -> dict:
    """The file's answer time (None: not within ``limit_s``, words by ``method``) while ``clients``
    post clips."""
    stop, answered = asyncio.Event(), []

    async def clip_client(first: int) -> None:
        async with httpx.AsyncClient(timeout=3600) as http:
            for k in range(first, 10**9):
                if stop.is_set():
                    return
                posted = time.monotonic()
                await post(http, server, clips[k % len(clips)], words=None)
                answered.append((time.monotonic(), time.monotonic() - posted))

    flood = [asyncio.create_task(clip_client(k)) for k in range(clients)]
    await asyncio.sleep(FLOOD_FIRST_S if clients else 0)
    posted = time.monotonic()
    async with httpx.AsyncClient(timeout=3600) as http:
        try:
            await asyncio.wait_for(post(http, server, file, words=method), limit_s)
            file_s: float | None = time.monotonic() - posted
        except TimeoutError:
            file_s = None
    ended = time.monotonic()
    stop.set()
    await asyncio.gather(*flood)
    during = [latency for at, latency in answered if posted <= at <= ended]
    return {
        "clients": clients,
        "file_s": file_s,
        "clips_per_s": len(during) / (ended - posted),
        "clip_median_s": float(np.median(during)) if during else None,
    }


def report(result: dict) -> str:
    def seconds(value: float | None) -> str:
        return f"{value:.1f} s" if value is not None else f"not done in {result['limit_s']:.0f} s"

    lines = [
        "## A long file beside a flood of short requests",
        "",
        f"Taken {result['taken']} under `flock -x /tmp/vwa-bench.lock` by:",
        "",
        "```",
        result["command"],
        "```",
        "",
        f"- Machine: {result['cpu']}, {result['cores']} cores; tiny.en {result['dtype']} on "
        "`vllm-whisper-align serve`",
        f"- The file: {result['file_audio_s']:.0f} s of real speech, word timestamps "
        f"(`alignment_method={result['method']}`); the clips: 4-8 s "
        "sentences, `json`, one after another per client",
        "",
        "| clients posting clips | the file answered in | clips answered meanwhile, per s "
        "| a clip's answer, median |",
        "|---|---|---|---|",
        *(
            f"| {row['clients']} | {seconds(row['file_s'])} | {row['clips_per_s']:.1f} | "
            + (f"{row['clip_median_s']:.2f} s |" if row["clip_median_s"] is not None else "- |")
            for row in result["levels"]
        ),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server", default=None, help="a running server (default: start one)")
    parser.add_argument("--clients", default="0,32,64", help="clients posting clips, a level each")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds the file may take")
    parser.add_argument("--serve-args", default="", help="flags for serve: '--scheduling-policy fcfs'")
    parser.add_argument("--method", default="auto", help="the file's alignment_method (auto, heads, ...)")
    args = parser.parse_args()
    joined = real_speech.joined_with_pauses(real_speech.load_clips(log=lambda *_: None))
    samples = np.concatenate([clip.samples for clip in joined[4:]])
    file = wav_bytes(samples)
    clips = [wav_bytes(clip) for clip in sentence_clips()]
    result: dict = {
        "file_audio_s": len(samples) / SAMPLE_RATE,
        "limit_s": args.limit,
        "method": args.method,
        "levels": [],
    }
    with contextlib.ExitStack() as stack:
        server, dtype = server_in(stack, args.server, None, args.serve_args)
        asyncio.run(file_beside_flood(server, clips[0], clips, 0, args.limit, args.method))  # warm
        for clients in (int(n) for n in args.clients.split(",")):
            row = asyncio.run(file_beside_flood(server, file, clips, clients, args.limit, args.method))
            print(f"  {row}", flush=True)
            result["levels"].append(row)
    result |= run_facts("flood_bench.py", dtype)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    print(report(result))


if __name__ == "__main__":
    main()
