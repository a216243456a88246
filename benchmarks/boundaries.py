"""Forced alignment of the benchmark's clips (benchmarks/audio.py) with each alignment method.

    .venv/bin/python benchmarks/boundaries.py [--model base] [--methods auto,fixed,characters]

The transcription benchmark (run.py) can only judge the words a system heard; forcing the spoken text
judges every word. Prints, per kind of speech (pauses, continuous) and method, the share of word starts
within 50 / 100 / 200 ms and the start MAE, over the words whose true start is known, and writes them to
benchmarks/out/boundaries-<model>.json. Run `benchmarks/run.py` (or `benchmarks/audio.py`) first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.support: the speech helpers the tests use

from common import load_wav  # noqa: E402

from tests.support.speech import SpokenClip, start_errors  # noqa: E402

KINDS = ("continuous", "pauses")


def clips_by_kind(truth: dict) -> dict[str, list[SpokenClip]]:
    return {
        kind: [
            SpokenClip(load_wav(t["path"]), t["words"], t["starts"], t["ends"], t["text"])
            for t in truth.values()
            if t.get("speech") == kind and t["duration"] <= 30
        ]
        for kind in KINDS
    }


def shares(clips: list[SpokenClip], words: list[list], heard_only: bool = False) -> dict[str, float]:
    """Shares within 50 / 100 / 200 ms and the start MAE over the words with a known start, from each
    clip's words; with ``heard_only``, over the words heard (a transcription's)."""
    errors = np.concatenate([start_errors(c, w) for c, w in zip(clips, words, strict=True)])
    errors = errors[np.isfinite(errors)] if heard_only else errors[~np.isnan(errors)]
    out = {f"within_{ms}ms_pct": round(100 * float(np.mean(errors <= ms / 1000)), 1) for ms in (50, 100, 200)}
    return {**out, "start_mae_ms": round(1000 * float(np.mean(errors)), 1), "words": int(errors.size)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny.en", choices=["tiny.en", "base"])
    parser.add_argument("--methods", default="auto,fixed")
    args = parser.parse_args()
    from vllm_whisper_align.checkpoints.bundled import base_model_path, default_model_path
    from vllm_whisper_align.runners.offline import WhisperAligner

    truth = json.loads((HERE / "out" / "audio" / "truth.json").read_text())
    by_kind = clips_by_kind(truth)
    model = base_model_path() if args.model == "base" else default_model_path()
    rows = []
    with WhisperAligner(str(model), dtype="float32") as aligner:
        for method in args.methods.split(","):
            for kind, clips in by_kind.items():
                results = aligner.align(
                    [c.samples for c in clips],
                    [c.text for c in clips],
                    language="en",
                    alignment_method=method,
                )
                rows.append(
                    {
                        "model": args.model,
                        "method": method,
                        "speech": kind,
                        **shares(clips, [r.words for r in results]),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    (HERE / "out" / f"boundaries-{args.model}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
