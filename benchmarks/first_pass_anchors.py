"""How well a short first pass would place long-form alignment's windows (issue #10's throughput).

    .venv/bin/python benchmarks/first_pass_anchors.py [--tokens 16]

Long-form alignment transcribes every window in full (the first pass) only to find where each window's
share of the text begins. This measures a cheaper alternative without changing the package: decode only
each window's first ``--tokens`` tokens, and place the window's first word where those words best match
the text (longest common subsequence, the prefix laid on the text word for word) within ±BAND_WORDS of
where the speaking rate so far expects it. Prints, per recording of benchmarks/out/audio/align_truth.json,
each boundary's distance in words from the full first pass's estimate, and both passes' times from a cold
encoder cache. Run `benchmarks/run.py` (or `benchmarks/audio.py`) first.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BAND_WORDS = 40


def common_words(prefix: list[str], text: list[str]) -> int:
    """Length of the longest common subsequence of two word lists."""
    table = np.zeros((len(prefix) + 1, len(text) + 1), dtype=np.int64)
    for i, word in enumerate(prefix):
        for j, other in enumerate(text):
            table[i + 1, j + 1] = table[i, j] + 1 if word == other else max(table[i, j + 1], table[i + 1, j])
    return int(table[-1, -1])


def place(prefix: list[str], text: list[str], expected: int, earliest: int) -> int:
    """The text position where ``prefix`` matches best, nearest ``expected`` among equals."""
    lo, hi = max(earliest, expected - BAND_WORDS), min(len(text), expected + BAND_WORDS + 1)
    scored = [(common_words(prefix, text[p : p + len(prefix)]), -abs(p - expected), p) for p in range(lo, hi)]
    return max(scored)[2] if scored else expected


def anchors(prefixes: list[list[str]], durations: np.ndarray, text: list[str]) -> list[int]:
    """First text word of each window: window 0 at 0, then each placed from the rate so far."""
    starts = [0]
    for window in range(1, len(prefixes)):
        elapsed = durations[: window - 1].sum()
        rate = starts[-1] / elapsed if starts[-1] and elapsed else len(text) / durations.sum()
        expected = int(round(starts[-1] + rate * durations[window - 1]))
        starts.append(place(prefixes[window], text, expected, starts[-1]))
    return starts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    from vllm_whisper_align import decoding, longform
    from vllm_whisper_align.audio import decode_audio
    from vllm_whisper_align.offline import WhisperAligner

    truth = json.loads((HERE / "out" / "audio" / "align_truth.json").read_text())
    with WhisperAligner() as aligner:
        tokens = aligner.tokens
        for name, recording in truth.items():
            samples = decode_audio(HERE / "out" / "audio" / f"{name}.wav")
            given_ids = decoding.text_to_tokens(" ".join(recording["words"]), None, tokens)
            full = longform.transcription_plans(samples, tokens, "en", aligner.suppress_tokens)
            short = [decoding.Plan([w], w.duration, p.language, p.task, False, p.fallback) for p in full
                     for w in decoding.plan_transcription(
                         p.windows[0].samples, tokens, language="en", word_timestamps=False,
                         suppress_tokens=aligner.suppress_tokens, fallback=longform.GREEDY_ONLY,
                         sampling={"max_tokens": args.tokens}).windows]
            timings = {}
            for label, plans in (("full", full), ("short", short)):
                with aligner._one_call():  # each pass from a cold encoder cache
                    began = time.perf_counter()
                    bodies = aligner._run(plans, use_tqdm=False)
                    timings[label] = time.perf_counter() - began
                if label == "full":
                    split, _ = longform.alignment_plans(full, bodies, tokens, given_ids, "en")
                else:
                    # A prefix's last word may be cut by the token limit.
                    heard = [longform.heard_words(b["text"], tokens, "en") for b in bodies]
                    prefixes = [[w.key for w in words][:-1] for words in heard]
            durations = np.array([p.windows[0].duration for p in full])
            placed = anchors(prefixes, durations, [w.key for w in split.words])
            off = np.abs(np.array(placed[1:]) - split.estimates)
            print(json.dumps({
                "recording": name, "windows": len(full), "tokens": args.tokens,
                "full_pass_s": round(timings["full"], 2), "short_pass_s": round(timings["short"], 2),
                "words_off_per_boundary": off.tolist(), "max_words_off": int(off.max(initial=0)),
            }), flush=True)


if __name__ == "__main__":
    main()
