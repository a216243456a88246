r"""faster-whisper (CTranslate2): WhisperModel.transcribe with word_timestamps=True, greedy.
One process per compute type. Each configuration TxW loads the model with cpu_threads=T and
num_workers=W and runs the files on W threads, as faster-whisper documents for parallel
transcriptions. Runs in benchmarks/.venvs/faster-whisper.

    python runners/faster_whisper_run.py --manifest M --model CT2_DIR --compute-type int8 \
        --configs 1x1,2x1,1x2 --out OUT.json
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
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
    parser = runner_parser("CTranslate2 Whisper dir")
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument(
        "--configs",
        default="1x1,2x1,1x2",
        help="cpu_threads x num_workers per configuration (files run on num_workers threads)",
    )
    args = parser.parse_args()
    configs = [tuple(int(n) for n in config.split("x")) for config in args.configs.split(",")]

    sampler = RssSampler().start()
    from faster_whisper import WhisperModel

    items = load_manifest(args.manifest)
    audio = {item["id"]: load_wav(item["path"]) for item in items}
    audio_s = round(sum(i["duration"] for i in items), 3)

    languages = {item["id"]: language_of(item) for item in items}

    def transcribe(model, clip_id):
        start = time.perf_counter()
        segments, _info = model.transcribe(
            audio[clip_id],
            language=languages[clip_id],
            word_timestamps=True,
            beam_size=1,
            vad_filter=False,
            condition_on_previous_text=False,
            temperature=0.0,
        )
        segments = list(segments)  # decoding happens while the generator is consumed
        words = [w for seg in segments for w in (seg.words or [])]
        return clip_id, {
            "text": "".join(s.text for s in segments),
            "words": word_dicts(words),
            "latency_s": round(time.perf_counter() - start, 4),
        }

    runs = []
    for threads, workers in configs:
        t_load = time.perf_counter()
        model = WhisperModel(
            args.model, device="cpu", compute_type=args.compute_type, cpu_threads=threads, num_workers=workers
        )
        transcribe(model, shortest(items))  # warm-up
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            files = dict(pool.map(partial(transcribe, model), [i["id"] for i in items]))
        t1 = time.perf_counter()
        del model
        runs.append(
            run_record(
                system="faster-whisper",
                model=args.model_name,
                precision=args.compute_type,
                concurrency=workers,
                config=f"{threads} thread{'s' * (threads > 1)} × {workers} worker{'s' * (workers > 1)}",
                mode=f"{workers} client threads, num_workers={workers}, cpu_threads={threads}",
                audio_s=audio_s,
                wall_s=round(t1 - t0, 3),
                latencies_s=[files[i["id"]]["latency_s"] for i in items],
                peak_rss_mib=sampler.peak_between(t_load, t1),
                peak_pss_mib=sampler.peak_between(t_load, t1, "pss"),
                maxrss_self_mib=self_maxrss_mib(),
                files={i["id"]: files[i["id"]] for i in items},
            )
        )
        log(
            f"faster-whisper {args.compute_type} {threads}x{workers}: "
            f"{runs[-1]['audio_s_per_wall_s']} audio s/wall s"
        )
    sampler.stop()
    write_output(args.out, "faster-whisper", runs)


if __name__ == "__main__":
    main()
