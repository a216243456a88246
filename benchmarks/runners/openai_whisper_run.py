"""openai-whisper (the reference): whisper.transcribe with word_timestamps=True, fp32 on CPU, one file
at a time (it has no batching). Runs in benchmarks/.venvs/openai-whisper.

    python runners/openai_whisper_run.py --manifest M --model CKPT.pt --hf-dir HF --out OUT.json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import openai_checkpoint  # noqa: E402
from common import (  # noqa: E402
    RssSampler,
    language_of,
    load_manifest,
    load_wav,
    log,
    run_record,
    runner_parser,
    self_maxrss_mib,
    shortest,
    word_dicts,
    write_output,
)


def main() -> None:
    parser = runner_parser("openai-whisper checkpoint (.pt)")
    parser.add_argument(
        "--hf-dir", required=True, help="HF dir whose generation_config.json has alignment_heads"
    )
    args = parser.parse_args()

    sampler = RssSampler().start()
    import torch
    import whisper

    torch.set_num_threads(torch.get_num_threads())
    model = openai_checkpoint.load(args.model, args.hf_dir)

    items = load_manifest(args.manifest)
    audio = {item["id"]: load_wav(item["path"]) for item in items}

    def transcribe(samples, language="en"):
        return whisper.transcribe(
            model,
            samples,
            word_timestamps=True,
            language=language,
            temperature=0.0,
            condition_on_previous_text=False,
            fp16=False,
            verbose=None,
        )

    transcribe(audio[shortest(items)])  # warm-up
    files, latencies = {}, []
    t0 = time.perf_counter()
    for item in items:
        start = time.perf_counter()
        result = transcribe(audio[item["id"]], language_of(item))
        latencies.append(time.perf_counter() - start)
        words = [w for seg in result["segments"] for w in seg.get("words", [])]
        files[item["id"]] = {
            "text": result["text"],
            "words": word_dicts(words),
            "latency_s": round(latencies[-1], 4),
        }
    t1 = time.perf_counter()
    sampler.stop()
    run = run_record(
        system="openai-whisper",
        model=args.model_name,
        precision="float32",
        concurrency=1,
        mode="sequential",
        audio_s=round(sum(i["duration"] for i in items), 3),
        wall_s=round(t1 - t0, 3),
        latencies_s=[round(x, 4) for x in latencies],
        peak_rss_mib=sampler.peak_between(0, t1),
        peak_pss_mib=sampler.peak_between(0, t1, "pss"),
        maxrss_self_mib=self_maxrss_mib(),
        threads=torch.get_num_threads(),
        files=files,
    )
    log(f"openai-whisper: {run['audio_s_per_wall_s']} audio s/wall s, peak {run['peak_rss_mib']} MiB")
    write_output(args.out, "openai-whisper", [run])


if __name__ == "__main__":
    main()
