"""Word boundaries on real speech with noise added: the real sets' recordings (tests/support/real_speech.py,
the main and the spontaneous set), their truth unchanged, white or pink noise mixed in at a given
signal-to-noise ratio, each clip forced to its text (or, ``--task transcribe``, transcribed) with this
project's alignment methods.

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/noisy_speech.py [--model base]
    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/noisy_speech.py --task transcribe

The speech level a ratio is taken against is the RMS of the louder half of the clip's 20 ms frames (its
speech, not its pauses); the noise is tests/support/no_speech.py's, seeded per clip. Printed, and written
to benchmarks/out/noisy_speech/results[-transcribe].json, per condition and method: the truth words heard
(paired with a result word; forced: all of them), starts and ends within 50 / 100 ms of the truth and
the starts more than 0.5 s off, over every truth word (one not heard counts as off). This project only:
the peers' runs are benchmarks/real_speech_bench.py's, on clean audio.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import cpu_description  # noqa: E402

from tests.support import real_speech  # noqa: E402
from tests.support.no_speech import pink_noise, white_noise  # noqa: E402
from tests.support.speech import end_errors, start_errors  # noqa: E402
from vllm_whisper_align.audio.features import frame_levels_db  # noqa: E402
from vllm_whisper_align.constants import SAMPLE_RATE  # noqa: E402

OUT = HERE / "out" / "noisy_speech"
# (noise, signal-to-noise ratio in dB); None: the recording as it is.
CONDITIONS = [(None, None), ("white", 20), ("white", 10), ("pink", 10), ("pink", 5)]
METHODS = ("fixed", "heads", "auto")
NOISES = {"white": white_noise, "pink": pink_noise}


def speech_level(samples: np.ndarray) -> float:
    """RMS of the louder half of the 20 ms frames (the speech mask's frames)."""
    power = 10 ** (frame_levels_db(samples) / 10)
    return float(np.sqrt(np.mean(power[power >= np.median(power)])))


def with_noise(samples: np.ndarray, noise: str, snr_db: float, seed: int) -> np.ndarray:
    raw = NOISES[noise](len(samples) / SAMPLE_RATE + 1.0, seed=seed)[: len(samples)]
    scaled = raw / max(float(raw.std()), 1e-12) * speech_level(samples) * 10 ** (-snr_db / 20)
    return np.clip(samples + scaled, -1.0, 1.0).astype(np.float32)


def figures(starts: np.ndarray, ends: np.ndarray) -> dict:
    return {
        "words": int(len(starts)),
        "heard_pct": round(100 * float(np.mean(np.isfinite(starts))), 1),
        "starts_within_50ms_pct": round(100 * float(np.mean(starts <= 0.05)), 1),
        "starts_within_100ms_pct": round(100 * float(np.mean(starts <= 0.1)), 1),
        "ends_within_50ms_pct": round(100 * float(np.mean(ends <= 0.05)), 1),
        "starts_off_over_0.5s": int(np.sum(np.isfinite(starts) & (starts > 0.5))),  # heard words
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=("tiny.en", "base"), default="tiny.en")
    parser.add_argument("--task", choices=("align", "transcribe"), default="align")
    args = parser.parse_args()
    from vllm_whisper_align.checkpoints.bundled import base_model_path, default_model_path
    from vllm_whisper_align.runners.offline import WhisperAligner

    clips = real_speech.load_clips(log=lambda *_: None, sets=("main", "spontaneous"))
    path = default_model_path() if args.model == "tiny.en" else base_model_path()
    aligner = WhisperAligner(str(path), dtype="float32")
    rows = []
    try:
        for noise, snr in CONDITIONS:
            audio = [
                c.samples if noise is None else with_noise(c.samples, noise, snr, seed=i)
                for i, c in enumerate(clips)
            ]
            for method in METHODS:
                if args.task == "align":
                    results = aligner.align(
                        audio, [c.text for c in clips], language="en", alignment_method=method
                    )
                else:
                    results = aligner.transcribe(audio, language="en", alignment_method=method)
                starts = np.concatenate(
                    [start_errors(c, r.words) for c, r in zip(clips, results, strict=True)]
                )
                ends = np.concatenate([end_errors(c, r.words) for c, r in zip(clips, results, strict=True)])
                row = {"noise": noise or "none", "snr_db": snr, "method": method, **figures(starts, ends)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        aligner.close()
    OUT.mkdir(parents=True, exist_ok=True)
    machine = f"{cpu_description()}, model {args.model}, float32, {args.task}, {len(clips)} clips"
    name = "results.json" if args.task == "align" else f"results-{args.task}.json"
    (OUT / name).write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    print(f"\n{machine}\n")
    print(
        "| noise, SNR | method | heard | starts within 50 / 100 ms | ends within 50 ms | starts off > 0.5 s |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        condition = "none" if r["noise"] == "none" else f"{r['noise']}, {r['snr_db']} dB"
        print(
            f"| {condition} | {r['method']} | {r['heard_pct']}% "
            f"| {r['starts_within_50ms_pct']} / {r['starts_within_100ms_pct']}% "
            f"| {r['ends_within_50ms_pct']}% | {r['starts_off_over_0.5s']} |"
        )


if __name__ == "__main__":
    main()
