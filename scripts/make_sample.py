"""Regenerate vllm_whisper_align/assets/sample.{flac,json}.

espeak-ng speaks a pangram one word at a time, so the true start and end of every
word are known exactly; sample.json records them for tests and demos.

    .venv/bin/python scripts/make_sample.py
"""

import json
import sys
from pathlib import Path

import soundfile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the speech helpers the tests use

from tests.support.speech import SAMPLE_RATE, synthesize_words  # noqa: E402

WORDS = "the quick brown fox jumps over the lazy dog".split()
GAPS = [0.2, 0.3, 0.45, 0.25, 0.35, 0.2, 0.3, 0.4]
ASSETS = ROOT / "vllm_whisper_align" / "assets"


def main() -> None:
    clip = synthesize_words(WORDS, gap_s=GAPS, voice="en-us", rate=160, lead_s=0.5, tail_s=0.5)
    ASSETS.mkdir(parents=True, exist_ok=True)
    audio_path = ASSETS / "sample.flac"
    soundfile.write(audio_path, clip.samples, SAMPLE_RATE, format="FLAC", subtype="PCM_16")

    truth = {
        "text": clip.text,
        "sample_rate": SAMPLE_RATE,
        "duration": len(clip.samples) / SAMPLE_RATE,
        "source": "espeak-ng -v en-us -s 160, one word at a time, silence trimmed (scripts/make_sample.py)",
        "words": [
            {"word": word, "start": start, "end": end}
            for word, start, end in zip(clip.words, clip.starts, clip.ends, strict=True)
        ],
    }
    (ASSETS / "sample.json").write_text(json.dumps(truth, indent=2) + "\n")
    print(f"wrote {audio_path} ({audio_path.stat().st_size} bytes, {truth['duration']:.2f} s)")


if __name__ == "__main__":
    main()
