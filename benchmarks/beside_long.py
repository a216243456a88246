"""A short request beside a long forced alignment: how long does it wait for its words?

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/beside_long.py     # about 8 minutes

It starts `vllm-whisper-align serve` with its defaults (`--serve-args` adds flags). One client posts
a short espeak-ng sentence (tests/support/speech.py) with word timestamps, one request after another,
half a second apart: first on the idle server, then while one long forced alignment runs beside it,
for each of `--long`:

- *speech*: benchmarks/audio.py's continuous recording (5 min, every word's start known) twice, with
  its text: an ordinary long alignment;
- *noise*: 10 minutes of white noise given 9 words a second of that text: hostile (every window's words
  forced onto noise, the acoustic model's costliest search).

Prints and writes (benchmarks/out/beside_long.json) the short requests' times (median, p90, max) and
the long request's, alone (before the short requests) and beside them, with a table for
benchmarks/RESULTS.md.

``--at 0.5,2,4``: the short requests are sent at those seconds after the long alignment, each on its own
(not one after another), so that the first seconds of the long alignment, when it hands the engine a
step of windows at once, get as many short requests as its later ones; each one's time is printed.

``--short N``: which of tests/support/speech.py's sentences the short request posts. 0 (the default,
the figures before 2026-12-07): one tiny.en mishears at every temperature, so each request runs the
whole fallback, six decodes one after another, each waiting its turn beside the long alignment; 2:
one it hears at the first, one decode.

``--stream``: the short request asks for a streamed answer (``stream=true``, server-sent events), timed
to its last event. ``--long ''``: the short requests alone.

``--fields name=value,...``: form fields added to the short request. ``--short 0 --fields
seed=4,compression_ratio_threshold=0.87,logprob_threshold=none`` is one that passes at a later
temperature (tests/server/test_server.py's: greedy fails, 0.2 passes, 0.4 loops to 82 tokens).
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
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "runners"))
from audio import alignment_truth  # noqa: E402
from common import load_wav  # noqa: E402
from streaming_bench import run_facts, server_in  # noqa: E402

from tests.support.servers import wav_bytes  # noqa: E402
from tests.support.speech import sentence_clips  # noqa: E402
from vllm_whisper_align.constants import SAMPLE_RATE  # noqa: E402

OUT = HERE / "out" / "beside_long.json"
RECORDING_ID = "align_continuous"
COPIES = 2
NOISE_WORDS_PER_S = 9
ALONE_REQUESTS = 5
PAUSE_S = 0.5


def long_inputs(kind: str) -> tuple[bytes, str]:
    """The long alignment's audio (wav) and text."""
    one = alignment_truth(HERE / "out" / "audio")[RECORDING_ID]
    samples = np.tile(load_wav(one["path"]), COPIES)
    text = " ".join([one["text"]] * COPIES)
    if kind == "noise":
        samples = (np.random.default_rng(0).standard_normal(len(samples)) * 0.05).astype(np.float32)
        words = text.split()
        count = int(len(samples) / SAMPLE_RATE * NOISE_WORDS_PER_S)
        text = " ".join((words * (count // len(words) + 1))[:count])
    return wav_bytes(samples), text


# Form fields added to every short request (--fields).
EXTRA_FIELDS: dict[str, str] = {}


async def short_request(http: httpx.AsyncClient, server: str, audio: bytes, streamed: bool) -> float:
    """Seconds until the short request's whole answer is read (streamed: its last event)."""
    started = time.perf_counter()
    data = {"response_format": "verbose_json", "timestamp_granularities[]": "word", **EXTRA_FIELDS}
    if streamed:
        data["stream"] = "true"
    async with http.stream(
        "POST",
        f"{server}/v1/audio/transcriptions",
        files={"file": ("short.wav", audio, "audio/wav")},
        data=data,
    ) as response:
        response.raise_for_status()
        body = await response.aread()
    if streamed and b"transcript.text.done" not in body:
        raise RuntimeError(f"a streamed answer without its last event: {body[-300:]!r}")
    return time.perf_counter() - started


async def long_alone(server: str, long: tuple[bytes, str]) -> float:
    """The long alignment's time with nothing beside it."""
    async with httpx.AsyncClient(timeout=3600) as http:
        started = time.perf_counter()
        await align(http, server, long)
        return round(time.perf_counter() - started, 1)


async def align(http: httpx.AsyncClient, server: str, long: tuple[bytes, str]) -> None:
    audio, text = long
    response = await http.post(
        f"{server}/v1/audio/alignments",
        files={"file": ("long.wav", audio, "audio/wav")},
        data={"text": text, "response_format": "verbose_json"},
    )
    response.raise_for_status()


async def beside(
    server: str, short: bytes, long: tuple[bytes, str], at: list[float] | None, streamed: bool
) -> dict:
    """Short requests while the long alignment runs, one after another (or sent at the seconds ``at``):
    their times and its."""
    async with httpx.AsyncClient(timeout=3600) as http:
        started = time.perf_counter()
        task = asyncio.create_task(align(http, server, long))
        ended: list[float] = []  # when the long alignment ended (the short requests may go on after it)
        task.add_done_callback(lambda _: ended.append(time.perf_counter()))
        if at:

            async def sent_at(seconds: float) -> float:
                await asyncio.sleep(seconds)
                return await short_request(http, server, short, streamed)

            times = list(await asyncio.gather(*(sent_at(seconds) for seconds in at)))
            pairs = [(seconds, round(took, 2)) for seconds, took in zip(at, times, strict=True)]
            print("beside_long: (sent at s, took s):", pairs)
        else:
            times = []
            while not task.done():
                times.append(await short_request(http, server, short, streamed))
                await asyncio.sleep(PAUSE_S)
        await task
        sent = {"sent_at_s": at, "times_s": [round(took, 2) for took in times]} if at else {}
        return {"long_s": round(ended[0] - started, 1), **summary(times), **sent}


def summary(times: list[float]) -> dict:
    return {
        "requests": len(times),
        "median_s": round(float(np.median(times)), 2),
        "p90_s": round(float(np.percentile(times, 90)), 2),
        "max_s": round(max(times), 2),
    }


async def measure(
    server: str, kinds: list[str], at: list[float] | None, sentence: int, streamed: bool
) -> dict:
    short = wav_bytes(sentence_clips()[sentence].samples)
    async with httpx.AsyncClient(timeout=600) as http:
        for _ in range(3):  # warm-up
            await short_request(http, server, short, streamed)
        alone = [await short_request(http, server, short, streamed) for _ in range(ALONE_REQUESTS)]
    rows = {"alone": summary(alone)}
    for kind in kinds:
        long = long_inputs(kind)
        rows[kind] = {
            "long_alone_s": await long_alone(server, long),
            **await beside(server, short, long, at, streamed),
        }
        print(f"beside_long: {kind}: {rows[kind]}", flush=True)
    return rows


def report(result: dict) -> str:
    lines = [
        f"Taken {result['taken']} under `flock -x /tmp/vwa-bench.lock` by `{result['command']}`; "
        f"{result['cpu']}, {result['cores']} cores, tiny.en {result['dtype']}; "
        f"the short request: sentence {result['short_sentence']}"
        f"{', streamed' if result.get('short_streamed') else ''}"
        f"{''.join(f', {k}={v}' for k, v in result.get('short_fields', {}).items())}.",
        "",
        "| beside | short requests | short: median / p90 / max s | the long alignment, s: alone / beside |",
        "|---|---|---|---|",
    ]
    for kind, row in result["rows"].items():
        lines.append(
            f"| {kind} | {row['requests']} | {row['median_s']} / {row['p90_s']} / {row['max_s']} "
            f"| {row.get('long_alone_s', '–')} / {row.get('long_s', '–')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", default="speech,noise", help="comma-separated: speech, noise")
    parser.add_argument("--server", default=None, help="a running server's URL (default: start serve)")
    parser.add_argument("--serve-args", default="", help="flags added to serve's command line")
    parser.add_argument("--at", default="", help="seconds after the long alignment to send each short one")
    parser.add_argument(
        "--short", type=int, default=0, help="which sentence the short request posts (see the docstring)"
    )
    parser.add_argument("--stream", action="store_true", help="the short request streamed (SSE)")
    parser.add_argument("--fields", default="", help="name=value,... form fields of the short request")
    args = parser.parse_args()
    EXTRA_FIELDS.update(field.split("=", 1) for field in args.fields.split(",") if field)
    at = [float(seconds) for seconds in args.at.split(",")] if args.at else None
    with contextlib.ExitStack() as stack:
        server, dtype = server_in(stack, args.server, None, args.serve_args)
        result = {
            **run_facts("beside_long.py", dtype),
            "short_sentence": args.short,
            "short_streamed": args.stream,
            "short_fields": EXTRA_FIELDS,
            "rows": asyncio.run(
                measure(server, [k for k in args.long.split(",") if k], at, args.short, args.stream)
            ),
        }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2))
    print(report(result))


if __name__ == "__main__":
    main()
