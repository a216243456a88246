r"""This project on long recordings: one WhisperAligner (float32, the engine options of
vllm_offline_run.py) aligns each recording with its text and transcribes it with word timestamps, one
recording at a time, the two alternating for `--rounds` (medians), after a warm-up of both on a short
clip. Runs in the project's .venv.

    .venv/bin/python benchmarks/runners/vllm_align_run.py --manifest ALIGN_MANIFEST --rounds 2 --out OUT.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import (  # noqa: E402
    RssSampler,
    engine_variant,
    load_wav,
    log,
    precision_label,
    run_record,
    runner_parser,
    write_output,
)

SYSTEM = "vllm-whisper-align (offline)"
WORD_KEYS = ("word", "start", "end", "probability", "aligned")


def tasks(aligner) -> dict:
    """Each task: (samples, text) -> one transcript. Transcription ignores the text."""
    return {
        "align": lambda samples, text: aligner.align([samples], [text], language="en")[0],
        "transcribe": lambda samples, text: aligner.transcribe(
            [samples], language="en", word_timestamps=True
        )[0],
    }


def timed_rounds(run_task: dict, samples, text: str, rounds: int) -> tuple[dict, dict]:
    """Wall times of every round per task, and each task's last body; tasks alternate so that a change
    in machine load hits both alike."""
    walls, bodies = {task: [] for task in run_task}, {}
    for _ in range(rounds):
        for task, run in run_task.items():
            t0 = time.perf_counter()
            bodies[task] = run(samples, text)
            walls[task].append(time.perf_counter() - t0)
    return walls, bodies


def main() -> None:
    parser = runner_parser("HF dir (default: the bundled tiny.en)", model_required=False, engine=True)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    sampler = RssSampler().start()
    from vllm_whisper_align.runners.offline import WhisperAligner

    dtype, additional_config = engine_variant(args.dtype)
    aligner = WhisperAligner(
        args.model, dtype=dtype, max_num_seqs=args.max_num_seqs, additional_config=additional_config or None
    )
    precision = precision_label(
        str(aligner.llm.llm_engine.model_config.dtype).replace("torch.", ""), additional_config
    )
    manifest = json.loads(Path(args.manifest).read_text())
    run_task = tasks(aligner)
    warm_up = manifest["warm_up"]
    timed_rounds(run_task, load_wav(warm_up["path"]), warm_up["text"], rounds=1)

    runs = []
    for item in manifest["recordings"]:
        walls, bodies = timed_rounds(run_task, load_wav(item["path"]), item["text"], args.rounds)
        for task, body in bodies.items():
            words = [{k: w.get(k) for k in WORD_KEYS if k in w} for w in body.to_dict().get("words") or []]
            runs.append(
                run_record(
                    system=SYSTEM,
                    model=args.model_name,
                    precision=precision,
                    concurrency=args.max_num_seqs,
                    mode=task,
                    recording=item["id"],
                    audio_s=item["duration"],
                    wall_s=round(statistics.median(walls[task]), 3),
                    round_walls_s=[round(w, 3) for w in walls[task]],
                    peak_rss_mib=sampler.peak(),
                    peak_pss_mib=sampler.peak("pss"),
                    files={item["id"]: {"text": body.get("text", ""), "words": words}},
                )
            )
            log(f"{task} {item['id']}: {runs[-1]['audio_s_per_wall_s']} audio s/wall s")
    sampler.stop()
    write_output(args.out, SYSTEM, runs)
    aligner.close()


if __name__ == "__main__":
    main()
