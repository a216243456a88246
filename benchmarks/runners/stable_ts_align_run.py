"""stable-ts (the peer for long-form forced alignment): ``model.align(audio, text, language=...)`` over the
openai-whisper backend, fp32 on CPU, one recording at a time (in its manifest
entry's language, English where none is given), its own defaults otherwise. Runs in
benchmarks/.venvs/stable-ts.

    python runners/stable_ts_align_run.py --manifest ALIGN_MANIFEST --model CKPT.pt --hf-dir HF --out OUT.json
"""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import openai_checkpoint  # noqa: E402
from common import (  # noqa: E402
    RssSampler,
    language_of,
    load_wav,
    log,
    run_record,
    runner_parser,
    self_maxrss_mib,
    word_dicts,
    write_output,
)

SYSTEM = "stable-ts"


def stand_in_torchaudio() -> None:
    """stable-ts imports torchaudio at the top, for resampling and saving audio; no torchaudio is built for
    the venv's torch (its pin would pull a second torch). Aligning 16 kHz arrays calls none of it, so a
    module that fails if anything is called stands in (a call would end the run, not change a figure)."""

    def missing(*_args, **_kwargs):
        raise RuntimeError("torchaudio is not installed in the stable-ts venv")

    def attribute(name: str):
        if name.startswith("__"):  # what the import system probes (__path__, ...) must stay absent
            raise AttributeError(name)
        return missing

    module = types.ModuleType("torchaudio")
    module.__getattr__ = attribute
    module.functional = types.SimpleNamespace(
        resample=missing, highpass_biquad=missing, lowpass_biquad=missing
    )
    sys.modules["torchaudio"] = module


def main() -> None:
    parser = runner_parser("openai-whisper checkpoint (.pt)")
    parser.add_argument(
        "--hf-dir", required=True, help="HF dir whose generation_config.json has alignment_heads"
    )
    args = parser.parse_args()

    sampler = RssSampler().start()
    stand_in_torchaudio()
    import stable_whisper
    import torch

    model = openai_checkpoint.load(args.model, args.hf_dir)
    stable_whisper.modify_model(model)
    manifest = json.loads(Path(args.manifest).read_text())

    def align(samples, text, language="en"):
        return model.align(samples, text, language=language, verbose=None)

    warm_up = manifest["warm_up"]
    align(load_wav(warm_up["path"]), warm_up["text"], language_of(warm_up))
    runs = []
    for item in manifest["recordings"]:
        samples = load_wav(item["path"])
        t0 = time.perf_counter()
        result = align(samples, item["text"], language_of(item))
        t1 = time.perf_counter()
        runs.append(
            run_record(
                system=SYSTEM,
                model=args.model_name,
                precision="float32",
                concurrency=1,
                mode="align",
                recording=item["id"],
                audio_s=item["duration"],
                wall_s=round(t1 - t0, 3),
                peak_rss_mib=sampler.peak_between(0, t1),
                peak_pss_mib=sampler.peak_between(0, t1, "pss"),
                maxrss_self_mib=self_maxrss_mib(),
                threads=torch.get_num_threads(),
                files={item["id"]: {"text": result.text, "words": word_dicts(result.all_words())}},
            )
        )
        log(f"stable-ts align {item['id']}: {runs[-1]['audio_s_per_wall_s']} audio s/wall s")
    sampler.stop()
    write_output(args.out, SYSTEM, runs, stable_ts=stable_whisper.__version__)


if __name__ == "__main__":
    main()
