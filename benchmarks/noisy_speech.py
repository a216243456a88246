"""Word boundaries on real speech with noise or reverberation added: the real sets' recordings
(tests/support/real_speech.py, the main and the spontaneous set), their truth unchanged, white or pink
noise mixed in at a given signal-to-noise ratio, or the recording played in a simulated room, each clip
forced to its text (or, ``--task transcribe``, transcribed) with this project's alignment methods.

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/noisy_speech.py [--model base]
    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/noisy_speech.py --task transcribe
    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/noisy_speech.py --conditions none,reverb0.6
    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/noisy_speech.py --dereverberate true
    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/noisy_speech.py --denoise false

The room is tests/support/rooms.py's (its RT60 is the condition's number); the direct sound keeps the
recording's times, so the truth holds. ``--dereverberate``: whether the engine takes a room's late
reverberation out before the acoustic model reads a window (``whisper_align.dereverberate``: ``auto``,
the default, where the window has a tail; ``true``, every window; ``false``, none).
``--denoise``: whether the engine takes a steady noise floor out of a window where it took no
reverberation out (``whisper_align.denoise``, true by default). ``--dereverberate-input``: an
experiment, not what the engine does: each recording of 5 s or more is also dereverberated where the
gate passes it (audio.dereverb, 60-7900 Hz) before Whisper hears it.

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

from common import DEREVERBERATE_MODES, cpu_description  # noqa: E402

from tests.support import real_speech  # noqa: E402
from tests.support.no_speech import with_noise  # noqa: E402
from tests.support.rooms import in_room  # noqa: E402
from tests.support.speech import end_errors, start_errors  # noqa: E402
from vllm_whisper_align.audio.dereverb import dereverberated  # noqa: E402
from vllm_whisper_align.constants import SAMPLE_RATE  # noqa: E402

OUT = HERE / "out" / "noisy_speech"
# (noise, signal-to-noise ratio in dB) or ("reverb", RT60 in s); None: the recording as it is.
CONDITIONS = [
    (None, None),
    ("white", 20),
    ("white", 10),
    ("pink", 10),
    ("pink", 5),
    ("reverb", 0.3),
    ("reverb", 0.6),
    ("reverb", 1.0),
]
METHODS = ("fixed", "heads", "auto")
INPUT_BAND_HZ = (60.0, 7900.0)  # --dereverberate-input: what Whisper's mel filters read


def with_condition(samples: np.ndarray, kind: str | None, amount: float | None, seed: int) -> np.ndarray:
    if kind is None or amount is None:
        return samples
    if kind == "reverb":
        return in_room(samples, amount, seed)
    return with_noise(samples, kind, amount, seed)


def condition_name(kind: str | None, amount: float | None) -> str:
    """``none``, ``white20``, ``reverb0.6``...: what ``--conditions`` takes."""
    return "none" if kind is None else f"{kind}{amount:g}"


def condition_label(kind: str | None, amount: float | None) -> str:
    if kind is None:
        return "none"
    return f"reverb, RT60 {amount:g} s" if kind == "reverb" else f"{kind}, {amount:g} dB"


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
    parser.add_argument(
        "--dereverberate", choices=DEREVERBERATE_MODES, default="auto", help="whisper_align's"
    )
    parser.add_argument(
        "--denoise", choices=("true", "false"), default="true", help="whisper_align's (default true)"
    )
    parser.add_argument("--dereverberate-input", action="store_true", help="Whisper's input too")
    names = [condition_name(*condition) for condition in CONDITIONS]
    parser.add_argument(
        "--conditions", default=",".join(names), help=f"comma-separated, of: {', '.join(names)}"
    )
    args = parser.parse_args()
    chosen = args.conditions.split(",")
    if unknown := sorted(set(chosen) - set(names)):
        parser.error(f"unknown conditions {unknown}; known: {names}")
    from vllm_whisper_align.checkpoints.bundled import base_model_path, default_model_path
    from vllm_whisper_align.runners.offline import WhisperAligner

    clips = real_speech.load_clips(log=lambda *_: None, sets=("main", "spontaneous"))
    path = default_model_path() if args.model == "tiny.en" else base_model_path()
    denoise = args.denoise == "true"
    settings = {
        "whisper_align": {"dereverberate": DEREVERBERATE_MODES[args.dereverberate], "denoise": denoise}
    }
    aligner = WhisperAligner(str(path), dtype="float32", additional_config=settings)
    rows = []
    try:
        for kind, amount in (c for c in CONDITIONS if condition_name(*c) in chosen):
            audio = [with_condition(c.samples, kind, amount, seed=i) for i, c in enumerate(clips)]
            if args.dereverberate_input:
                audio = [dereverberated(samples, INPUT_BAND_HZ, SAMPLE_RATE) for samples in audio]
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
                row = {
                    "condition": condition_name(kind, amount),
                    "label": condition_label(kind, amount),
                    "method": method,
                    **figures(starts, ends),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        aligner.close()
    OUT.mkdir(parents=True, exist_ok=True)
    machine = f"{cpu_description()}, model {args.model}, float32, {args.task}, {len(clips)} clips"
    machine += f", dereverberate {args.dereverberate}"
    if args.dereverberate_input:
        machine += ", Whisper's input dereverberated"
    name = "results.json" if args.task == "align" else f"results-{args.task}.json"
    if set(chosen) != set(names):
        name = name.replace(".json", f"-{'-'.join(chosen)}.json")
    if args.dereverberate != "auto":
        name = name.replace(".json", f"-dereverberate-{args.dereverberate}.json")
    if not denoise:
        machine += ", not denoised"
        name = name.replace(".json", "-denoise-false.json")
    if args.dereverberate_input:
        name = name.replace(".json", "-input-dereverberated.json")
    (OUT / name).write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    print(f"\n{machine}\n")
    print(
        "| condition | method | heard | starts within 50 / 100 ms | ends within 50 ms | starts off > 0.5 s |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['label']} | {r['method']} | {r['heard_pct']}% "
            f"| {r['starts_within_50ms_pct']} / {r['starts_within_100ms_pct']}% "
            f"| {r['ends_within_50ms_pct']}% | {r['starts_off_over_0.5s']} |"
        )


if __name__ == "__main__":
    main()
