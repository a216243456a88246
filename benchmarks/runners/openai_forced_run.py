"""openai-whisper forced alignment: `whisper.timing.find_alignment` on a given text (the tuned heads, DTW),
then its `merge_punctuations`, one clip (at most 30 s) at a time, fp32 on CPU. What `transcribe`'s
add_word_timestamps does before its segment heuristics (which need decoded segment times this has not).
Runs in benchmarks/.venvs/openai-whisper.

    python runners/openai_forced_run.py --manifest ALIGN_MANIFEST --model CKPT.pt --hf-dir HF --out OUT.json

ALIGN_MANIFEST: {"recordings": [{"id", "path", "duration", "text"}], "warm_up": {"path", "text"}}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import openai_checkpoint  # noqa: E402
from common import language_of, load_wav, log, run_record, runner_parser, word_dicts, write_output  # noqa: E402

SYSTEM = "openai-whisper-forced"


def aligner(model):
    """align(samples, text) -> [{"word", "start", "end", "probability"}]."""
    import whisper
    from whisper.audio import HOP_LENGTH, N_FRAMES, N_SAMPLES, log_mel_spectrogram
    from whisper.timing import find_alignment, merge_punctuations

    def align(samples, text, language="en"):
        if len(samples) > N_SAMPLES:
            raise ValueError("find_alignment takes one 30 s window")
        # As transcribe does: the mel of the whole clip padded by 30 s, then its first window.
        mel = log_mel_spectrogram(samples, model.dims.n_mels, padding=N_SAMPLES)[:, :N_FRAMES]
        tokenizer = whisper.tokenizer.get_tokenizer(
            model.is_multilingual, num_languages=model.num_languages, language=language, task="transcribe"
        )
        tokens = tokenizer.encode(" " + text.strip())
        timings = find_alignment(model, tokenizer, tokens, mel, len(samples) // HOP_LENGTH)
        merge_punctuations(timings, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
        return word_dicts(t for t in timings if t.word)

    return align


def main() -> None:
    parser = runner_parser("openai-whisper checkpoint (.pt)")
    parser.add_argument(
        "--hf-dir", required=True, help="HF dir whose generation_config.json has alignment_heads"
    )
    args = parser.parse_args()
    model = openai_checkpoint.load(args.model, args.hf_dir)
    manifest = json.loads(Path(args.manifest).read_text())
    align = aligner(model)
    warm_up = manifest["warm_up"]
    align(load_wav(warm_up["path"]), warm_up["text"], language_of(warm_up))
    files, t0 = {}, time.perf_counter()
    for item in manifest["recordings"]:
        words = align(load_wav(item["path"]), item["text"], language_of(item))
        files[item["id"]] = {"text": item["text"], "words": words}
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
                mode="align",
                audio_s=round(sum(i["duration"] for i in manifest["recordings"]), 3),
                wall_s=round(wall, 3),
                files=files,
            )
        ],
    )


if __name__ == "__main__":
    main()
