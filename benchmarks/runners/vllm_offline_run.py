r"""This project, offline: WhisperAligner (vllm.LLM) given every clip at once, max_num_seqs requests in
flight. Same engine, same clips, word timestamps off and on in alternating rounds (so drift in machine
load hits both alike); the medians give the throughput of each and the overhead of turning them on.
Runs in the project's .venv.

    .venv/bin/python benchmarks/runners/vllm_offline_run.py --manifest M --dtype float32 --rounds 3 \
        --out OUT.json
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import (  # noqa: E402
    RssSampler,
    engine_variant,
    load_manifest,
    load_wav,
    log,
    precision_label,
    run_record,
    runner_parser,
    write_output,
)  # noqa: E402


def main() -> None:
    parser = runner_parser("HF dir (default: the bundled tiny.en)", model_required=False, engine=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    sampler = RssSampler().start()
    from vllm_whisper_align.runners.offline import WhisperAligner

    t_start = time.perf_counter()
    dtype, additional_config = engine_variant(args.dtype)
    aligner = WhisperAligner(
        args.model, dtype=dtype, max_num_seqs=args.max_num_seqs, additional_config=additional_config or None
    )
    startup_s = time.perf_counter() - t_start
    items = load_manifest(args.manifest)
    samples = [load_wav(item["path"]) for item in items]
    audio_s = round(sum(i["duration"] for i in items), 3)

    def run(mode: str):
        t0 = time.perf_counter()
        results = aligner.transcribe(
            samples,
            language="en",
            word_timestamps=mode != "off",
            alignment_method="fixed" if mode == "fixed" else "auto",
        )
        return time.perf_counter() - t0, results

    order = sorted(range(len(items)), key=lambda k: items[k]["duration"])
    warm = [samples[k] for k in order[:4]]  # warm-up (the engine compiled at start): first requests, caches
    aligner.transcribe(warm, language="en", word_timestamps=True)
    aligner.transcribe(warm, language="en", word_timestamps=False)

    # Timestamps off, on (the default: per-window heads), on with the fixed heads (openai-whisper's way,
    # this project's default until head selection), alternating so drift hits all three alike.
    modes = ("off", "auto", "fixed")
    walls = {mode: [] for mode in modes}
    last = {}
    for _ in range(args.rounds):
        for mode in modes:
            wall, results = run(mode)
            walls[mode].append(wall)
            last[mode] = [result.to_dict() for result in results]
            log(f"offline {args.dtype} timestamps={mode}: {audio_s / wall:.2f} audio s/wall s")
    sampler.stop()
    dtype = precision_label(
        str(aligner.llm.llm_engine.model_config.dtype).replace("torch.", ""), additional_config
    )
    runs = []
    for mode in ("auto", "off", "fixed"):
        files = {
            item["id"]: {
                "text": r.get("text", ""),
                "words": [
                    {k: w.get(k) for k in ("word", "start", "end", "probability")}
                    for w in r.get("words") or []
                ],
            }
            for item, r in zip(items, last[mode], strict=True)
        }
        median = statistics.median(walls[mode])
        runs.append(
            run_record(
                system="vllm-whisper-align (offline)",
                model=args.model_name,
                precision=dtype,
                config="fixed heads" if mode == "fixed" else None,
                concurrency=args.max_num_seqs,
                mode=f"WhisperAligner, all clips at once, max_num_seqs={args.max_num_seqs}",
                word_timestamps=mode != "off",
                audio_s=audio_s,
                wall_s=round(median, 3),
                round_walls_s=[round(w, 3) for w in walls[mode]],
                peak_rss_mib=sampler.peak(),
                peak_pss_mib=sampler.peak("pss"),
                startup_s=round(startup_s, 1),
                files=files,
            )
        )
    on, off, fixed = (statistics.median(walls[mode]) for mode in ("auto", "off", "fixed"))
    overhead = round(100 * ((audio_s / off) - (audio_s / on)) / (audio_s / off), 2)
    selection_cost = round(100 * ((audio_s / fixed) - (audio_s / on)) / (audio_s / fixed), 2)
    log(f"offline {dtype}: overhead of word timestamps {overhead}%; of head selection {selection_cost}%")
    write_output(
        args.out,
        "vllm-whisper-align (offline)",
        runs,
        overhead_pct=overhead,
        alignment_method_cost_pct=selection_cost,
        capture_stats=aligner.capture_stats(),
    )
    aligner.close()


if __name__ == "__main__":
    main()
