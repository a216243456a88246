"""Long-form alignment with the short first pass (the default) against the full first pass, and
transcription with word timestamps, on the same recordings (issue #10's throughput).

    .venv/bin/python benchmarks/longform_first_pass.py [--dtype bfloat16] [--rounds 2]

Recordings built by the tests' speech helpers (espeak-ng, every word's start known): 3 minutes of words
with pauses and about 4.4 minutes of nearly continuous speech (40 ms between words). Each round aligns
each recording with the short first pass, then with the full one (``longform.steps.short_pass``
made to decline, as when a window's share would overflow the decoder), then transcribes it; one
recording at a time, after a warm-up. Prints wall times, start MAE and the share of starts within
50 / 100 ms, and how many windows failed the check (``longform.check.unheard_windows``) and were aligned
again, with their neighbours, from a full first pass.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

from tests.support.speech import SENTENCES, long_clip, synthesize_words  # noqa: E402
from vllm_whisper_align.longform import steps  # noqa: E402


def continuous_clip(num_words: int):
    words, index = [], 0
    while len(words) < num_words:
        words += SENTENCES[index % len(SENTENCES)].split()
        index += 1
    return synthesize_words(words, gap_s=0.04)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from vllm_whisper_align.runners.offline import WhisperAligner

    short_pass, check = steps.short_pass, steps.unheard_windows
    state = {"short": True, "fallbacks": 0}

    def prefix_plans(*a, **k):
        return (yield from short_pass(*a, **k)) if state["short"] else None

    def checked(*a, **k):
        failed = check(*a, **k)
        state["fallbacks"] = int(failed.sum())  # the last check of an alignment: the windows redone
        return failed

    steps.short_pass, steps.unheard_windows = prefix_plans, checked
    clips = {"pauses": long_clip(180), "continuous": continuous_clip(600)}
    with WhisperAligner(dtype=args.dtype) as aligner:
        warm = clips["pauses"]
        aligner.align([warm.samples[: 16000 * 40]], [" ".join(warm.words[:40])])
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for name, clip in clips.items():
                for label in ("align, short first pass", "align, full first pass"):
                    state["short"], state["fallbacks"] = label.endswith("short first pass"), 0
                    began = time.perf_counter()
                    result = aligner.align([clip.samples], [clip.text])[0]
                    times.setdefault((name, label), []).append(time.perf_counter() - began)
                    errors = np.abs(np.array([w.start for w in result.words]) - np.array(clip.starts))
                    wall = times[name, label][-1]
                    print(
                        f"{name} {label}: {wall:.2f} s, start MAE {errors.mean() * 1000:.1f} ms, "
                        f"within 50 / 100 ms {np.mean(errors <= 0.05):.1%} / {np.mean(errors <= 0.1):.1%}, "
                        f"windows failing the check {state['fallbacks']}",
                        flush=True,
                    )
                began = time.perf_counter()
                aligner.transcribe([clip.samples], word_timestamps=True)
                times.setdefault((name, "transcribe"), []).append(time.perf_counter() - began)
        print(f"\nmedians over {args.rounds} rounds, {args.dtype}:")
        for name, clip in clips.items():
            duration = len(clip.samples) / 16000
            transcribe = float(np.median(times[name, "transcribe"]))
            for label in ("align, short first pass", "align, full first pass", "transcribe"):
                wall = float(np.median(times[name, label]))
                print(
                    f"  {name} ({duration:.0f} s) {label}: {wall:.2f} s, {duration / wall:.1f} audio-s/s, "
                    f"{transcribe / wall:.2f}x transcription's throughput"
                )


if __name__ == "__main__":
    main()
