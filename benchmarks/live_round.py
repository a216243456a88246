"""What one round of live decodes costs, and where: the engine's part and the finishing (DTW, boundary
rules, the acoustic model of phones), for `--streams` streams whose buffers hold `--seconds` of real
speech each.

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/live_round.py     # about 3 minutes

In-process on an offline engine with serve's dtype for this CPU (`--dtype` names another), as a server
round runs (runners/live.py: every stream's decode in one `driver.together`). Each buffer is the first
`--seconds` of a joined real-speech recording (tests/support/real_speech.py); a first decode of it
gives its words, and the round decodes it again with all but its last `--unconfirmed` words as the
confirmed prefix (live.buffer.Decode), as a stream's buffer stands between two decodes. Per alignment
method (auto: with the acoustic model; heads: without), `--rounds` rounds: the round's wall time and
the time spent in the engine (Generate, NoSpeech, Fetch) and in the finishing (Compute); medians.

Writes benchmarks/out/live_round.json and prints a table for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "runners"))
from streaming_bench import run_facts  # noqa: E402

from tests.support import real_speech  # noqa: E402
from vllm_whisper_align.constants import SAMPLE_RATE  # noqa: E402
from vllm_whisper_align.engine.settings import cpu_flags, fast_dtype  # noqa: E402
from vllm_whisper_align.live.buffer import Decode  # noqa: E402
from vllm_whisper_align.options import TranscriptionOptions  # noqa: E402
from vllm_whisper_align.runners import driver, live  # noqa: E402
from vllm_whisper_align.runners.offline import WhisperAligner  # noqa: E402

OUT = HERE / "out" / "live_round.json"
METHODS = ("auto", "heads")


def timed_round(aligner: WhisperAligner, decodes: list[Decode], options: TranscriptionOptions) -> dict:
    """One round of ``decodes``: its wall time and the time of each kind of command in it."""
    spent: dict[str, float] = collections.defaultdict(float)
    answer = aligner._answer

    def timed_answer(command, use_tqdm):
        started = time.perf_counter()
        try:
            return answer(command, use_tqdm)
        finally:
            spent[type(command).__name__] += time.perf_counter() - started

    aligner._answer = timed_answer
    try:
        started = time.perf_counter()
        aligner.run(
            driver.together([live.decode_work(d, aligner.facts, "en", None, options) for d in decodes])
        )
        wall = time.perf_counter() - started
    finally:
        aligner._answer = answer
    finishing = spent.pop("Compute", 0.0)
    return {"wall_s": wall, "engine_s": sum(spent.values()), "finishing_s": finishing}


def buffers(count: int, seconds: float) -> list:
    clips = real_speech.joined_with_pauses(real_speech.load_clips(log=lambda *_: None))
    return [clips[i % len(clips)].samples[: int(seconds * SAMPLE_RATE)] for i in range(count)]


def measure(args: argparse.Namespace, dtype: str) -> dict:
    aligner = WhisperAligner(dtype=dtype, max_num_seqs=32)
    samples = buffers(args.streams, args.seconds)
    rows = {}
    for method in METHODS:
        options = TranscriptionOptions(alignment_method=method)
        first = [live.decode_work(Decode(s, 0.0, None), aligner.facts, "en", None, options) for s in samples]
        heard = aligner.run(driver.together(first))
        decodes = [
            Decode(s, 0.0, None, tuple(t.words[: max(len(t.words) - args.unconfirmed, 0)]))
            for s, t in zip(samples, heard, strict=True)
        ]
        timed_round(aligner, decodes, options)  # warm
        rounds = [timed_round(aligner, decodes, options) for _ in range(args.rounds)]
        rows[method] = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        rows[method]["prefix_words"] = sum(len(d.prefix) for d in decodes)
        print(f"live_round: {method}: {rows[method]}", flush=True)
    return rows


def report(result: dict) -> str:
    lines = [
        f"Taken {result['taken']} by `{result['command']}`; {result['cpu']}, {result['cores']} cores, "
        f"tiny.en {result['dtype']}, in-process. {result['streams']} streams, {result['seconds']} s of "
        f"real speech each, all but the last {result['unconfirmed']} words confirmed; medians of "
        f"{result['rounds']} rounds.",
        "",
        "| method | round | engine | finishing |",
        "|---|---|---|---|",
    ]
    for method, row in result["methods"].items():
        lines.append(
            f"| {method} | {row['wall_s']:.2f} s | {row['engine_s']:.2f} s | {row['finishing_s']:.2f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--unconfirmed", type=int, default=4, help="words of each buffer not yet confirmed")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default=None, help="the engine's dtype (default: serve's pick)")
    args = parser.parse_args()
    dtype = args.dtype or fast_dtype(True, cpu_flags()) or "float32"
    result = {
        **run_facts("live_round.py", dtype),
        **{key: getattr(args, key) for key in ("streams", "seconds", "unconfirmed", "rounds")},
        "methods": measure(args, dtype),
    }
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2))
    print(report(result))


if __name__ == "__main__":
    main()
