"""The first request a fresh server answers, against the ones after it.

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/first_request.py     # about 3 minutes

Starts `vllm-whisper-align serve` with its defaults ``--rounds`` times (3). In each: the seconds from
the command to its first healthy /health, then one 31 s espeak-ng recording (tests/support/speech.py's
long clip: two windows) transcribed with word timestamps ``--requests`` times (3), one after another,
each timed. Prints the medians over the rounds: start-up, the first request, and the requests after it.

``--cold``: the kernel's page cache dropped before each round (``/proc/sys/vm/drop_caches``; root), as
after a reboot or once other work has pushed the installed packages out of memory: whatever a request
imports or compiles first then reads its files from disk.

Against an older commit: check it out in a worktree and put it first on ``PYTHONPATH`` (the server's
processes inherit it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "runners"))
from streaming_bench import run_facts, server_in  # noqa: E402

from tests.support.servers import wav_bytes  # noqa: E402
from tests.support.speech import long_clip  # noqa: E402

FILE_S = 31.0


def one_round(audio: bytes, requests: int, serve_args: str, cold: bool) -> tuple[float, list[float], str]:
    """Start-up seconds, each request's seconds, the engine's dtype."""
    if cold:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    with contextlib.ExitStack() as stack:
        began = time.monotonic()
        server, dtype = server_in(stack, None, None, serve_args)
        start_up = time.monotonic() - began
        times = []
        for _ in range(requests):
            began = time.monotonic()
            response = httpx.post(
                f"{server}/v1/audio/transcriptions",
                files={"file": ("long.wav", audio, "audio/wav")},
                data={"response_format": "verbose_json", "timestamp_granularities[]": "word"},
                timeout=600,
            )
            response.raise_for_status()
            assert response.json()["words"], response.text
            times.append(time.monotonic() - began)
        return start_up, times, dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--serve-args", default="", help="flags added to `serve`")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each round")
    args = parser.parse_args()
    audio = wav_bytes(long_clip(FILE_S))
    rounds = [one_round(audio, args.requests, args.serve_args, args.cold) for _ in range(args.rounds)]
    facts = run_facts("first_request.py", rounds[0][2])
    start_up = statistics.median(r[0] for r in rounds)
    first = statistics.median(r[1][0] for r in rounds)
    after = statistics.median(t for r in rounds for t in r[1][1:])
    print(facts)
    for start, times, _ in rounds:
        print("start-up", f"{start:.1f} s;", "requests", ", ".join(f"{t:.2f}" for t in times), "s")
    print(f"medians: start-up {start_up:.1f} s, first request {first:.2f} s, the others {after:.2f} s")


if __name__ == "__main__":
    main()
