"""transformers: the ASR pipeline with return_timestamps="word" (cross-attention + DTW in
generate), fp32 on CPU, chunk_length_s=30, greedy (num_beams=1; the pipeline's default is 5 beams).
Concurrency c = the pipeline's batch_size: files are handed over c at a time and each file's latency
is its group's wall time.
Runs in benchmarks/.venvs/transformers.

    python runners/transformers_run.py --manifest M --model HF_DIR --batch-sizes 1,8 --out OUT.json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import (  # noqa: E402
    RssSampler,
    load_manifest,
    load_wav,
    log,
    run_record,
    runner_parser,
    self_maxrss_mib,
    shortest,
    write_output,
)


def main() -> None:
    parser = runner_parser("HF Whisper dir")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="cap per 30 s window (default: the ASR pipeline's own, 256 new tokens)",
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.batch_sizes.split(",")]

    sampler = RssSampler().start()
    import torch
    import transformers
    from transformers import pipeline

    pipe = pipeline(
        "automatic-speech-recognition", model=args.model, dtype=torch.float32, device="cpu", chunk_length_s=30
    )
    items = load_manifest(args.manifest)
    audio = {item["id"]: load_wav(item["path"]) for item in items}
    audio_s = round(sum(i["duration"] for i in items), 3)

    def run_group(ids, batch_size):
        inputs = [{"raw": audio[i].copy(), "sampling_rate": 16000} for i in ids]  # the pipeline pops keys
        # Greedy like every other system here: the ASR pipeline's own default is num_beams=5.
        generate_kwargs = {"num_beams": 1, "do_sample": False}
        if args.max_new_tokens:
            generate_kwargs["max_new_tokens"] = args.max_new_tokens
        outputs = pipe(
            inputs, batch_size=batch_size, return_timestamps="word", generate_kwargs=generate_kwargs
        )
        out = {}
        for clip_id, result in zip(ids, outputs, strict=True):
            words = []
            for chunk in result.get("chunks") or []:
                start, end = chunk["timestamp"]
                words.append({"word": chunk["text"], "start": start, "end": end, "probability": None})
            out[clip_id] = {"text": result["text"], "words": words}
        return out

    run_group([shortest(items)], 1)  # warm-up
    runs = []
    for level in levels:
        files, latencies = {}, []
        ids = [i["id"] for i in items]
        t0 = time.perf_counter()
        for k in range(0, len(ids), level):
            group = ids[k : k + level]
            start = time.perf_counter()
            files.update(run_group(group, level))
            latencies += [time.perf_counter() - start] * len(group)
        t1 = time.perf_counter()
        runs.append(
            run_record(
                system="transformers",
                model=args.model_name,
                precision="float32",
                concurrency=level,
                mode=f"pipeline batch_size={level}, chunk_length_s=30, greedy, "
                f"max_new_tokens={args.max_new_tokens or 'pipeline default (256)'}",
                audio_s=audio_s,
                wall_s=round(t1 - t0, 3),
                latencies_s=[round(x, 4) for x in latencies],
                peak_rss_mib=sampler.peak_between(0, t1),
                peak_pss_mib=sampler.peak_between(0, t1, "pss"),
                maxrss_self_mib=self_maxrss_mib(),
                threads=torch.get_num_threads(),
                transformers=transformers.__version__,
                files=files,
            )
        )
        log(f"transformers batch={level}: {runs[-1]['audio_s_per_wall_s']} audio s/wall s")
    sampler.stop()
    write_output(args.out, "transformers", runs)


if __name__ == "__main__":
    main()
