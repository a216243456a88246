"""stable-ts transcription: `model.transcribe(audio, language=...)` (the manifest
entry's language, English where none is given) over the openai-whisper backend (its
word timestamps, then its own silence suppression and regrouping: its defaults), greedy, fp32 on CPU, one
clip at a time. Runs in benchmarks/.venvs/stable-ts.

    python runners/stable_ts_transcribe_run.py --manifest M --model CKPT.pt --hf-dir HF --out OUT.json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import openai_checkpoint  # noqa: E402
from common import (  # noqa: E402
    language_of,
    load_manifest,
    load_wav,
    log,
    run_record,
    runner_parser,
    word_dicts,
    write_output,
)
from stable_ts_align_run import stand_in_torchaudio  # noqa: E402

SYSTEM = "stable-ts-transcribe"


def main() -> None:
    parser = runner_parser("openai-whisper checkpoint (.pt)")
    parser.add_argument(
        "--hf-dir", required=True, help="HF dir whose generation_config.json has alignment_heads"
    )
    args = parser.parse_args()
    stand_in_torchaudio()
    import stable_whisper

    model = openai_checkpoint.load(args.model, args.hf_dir)
    stable_whisper.modify_model(model)
    items = load_manifest(args.manifest)

    def transcribe(samples, language="en"):
        # The options openai_whisper_run.py gives whisper.transcribe; stable-ts's own defaults otherwise.
        return model.transcribe(
            samples,
            language=language,
            temperature=0.0,
            condition_on_previous_text=False,
            fp16=False,
            verbose=None,
        )

    transcribe(load_wav(min(items, key=lambda i: i["duration"])["path"]))  # warm-up
    files, t0 = {}, time.perf_counter()
    for item in items:
        result = transcribe(load_wav(item["path"]), language_of(item))
        files[item["id"]] = {"text": result.text, "words": word_dicts(result.all_words())}
    wall = time.perf_counter() - t0
    log(f"{SYSTEM}: {len(files)} clips in {wall:.1f} s")
    write_output(
        args.out,
        SYSTEM,
        [
            run_record(
                system=SYSTEM,
                model=args.model_name,
                precision="float32",
                concurrency=1,
                mode="sequential",
                audio_s=round(sum(i["duration"] for i in items), 3),
                wall_s=round(wall, 3),
                files=files,
            )
        ],
        stable_ts=stable_whisper.__version__,
    )


if __name__ == "__main__":
    main()
