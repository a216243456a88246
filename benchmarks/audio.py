"""The benchmark's audio: espeak-ng speech with known word boundaries (tests/speech.py).

    .venv/bin/python benchmarks/audio.py [--out benchmarks/out/audio]

48 short clips with pauses between words (3-10 s: 30 sentences, 4 voices, rates 140-190 wpm,
varied word gaps, a third with white noise at -45 or -35 dBFS), 24 clips of continuous speech (two
held-out sentences in one breath, 4 other voices, 145-195 wpm, a third with noise; starts from
libespeak-ng's word events, NaN where a word has none, ends unknown but the last) and 3 clips over
30 s (long_clip(40), long_clip(65), and a 50 s mix of voices with noise). Writes <id>.wav (16 kHz
PCM16) and truth.json ({id: {path, duration, words, starts, ends, voice, rate, noise_db, speech}});
manifest.json lists them.

Long-form alignment has two recordings of its own, over 5 minutes each, in align_truth.json (kept out of
truth.json, so the transcription benchmark never sees them): align_pauses (the short clips back to back)
and align_continuous (continuous-speech clips back to back, NaN starts kept). Their texts are the
spoken texts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the speech helpers the tests use

from tests.support.speech import (  # noqa: E402
    SENTENCES,
    SpokenClip,
    concatenate_clips,
    long_clip,
    synthesize_sentence,
    synthesize_words,
    write_wav,
)

SAMPLE_RATE = 16000

# More vocabulary than tests/speech.py's eight sentences. Plain words only: no numbers (Whisper
# writes digits), no names, no hyphens or contractions, so the transcript can match the truth.
EXTRA_SENTENCES = [
    "the children laughed as the puppy chased its tail",
    "she bought fresh bread and cheese at the market",
    "a strong wind blew the leaves across the road",
    "the doctor asked him to rest for a few days",
    "we should finish the report before the meeting",
    "the little boat drifted slowly to the shore",
    "turn left at the corner and walk past the bank",
    "my grandfather tells stories about the old farm",
    "the library closes early on holidays",
    "they planted tomatoes and beans in the garden",
    "the museum has a large collection of ancient coins",
    "please write your name at the top of the page",
    "the baker wakes up before the sun rises",
    "our teacher explained the lesson very clearly",
    "the thunder was so loud that the dog hid under the bed",
    "he forgot his umbrella and got wet in the rain",
    "the mountain road was narrow and full of sharp turns",
    "she wrote a long letter to her best friend",
    "the engineer checked every bridge along the river",
    "fresh snow covered the quiet village",
    "the orange cat sleeps on the sofa all afternoon",
    "we watched the stars from the roof of the house",
]
ALL_SENTENCES = list(SENTENCES) + EXTRA_SENTENCES

# Continuous speech (no pauses between words; tests/speech.py synthesize_sentence). Held out: the
# boundary method's constants (timing.select_heads, align.boundaries.ONSET_SEARCH_S) were chosen on other
# sentences, voices and rates (pairs of ALL_SENTENCES; en-us, en, en-us+f3, en-gb-x-rp, en-us+m3,
# en-029 at 140-190 wpm), never on these.
CONTINUOUS_SENTENCES = [
    "the farmer carried a basket of apples down the hill",
    "a cold breeze came through the open door",
    "my brother fixed the broken chair with glue",
    "the students listened quietly to the old professor",
    "we cooked soup with carrots and onions for dinner",
    "the bright moon rose slowly over the lake",
    "she painted a small picture of the harbour",
    "the bus was late because of the heavy traffic",
    "he planted a row of roses beside the fence",
    "the kitten climbed onto the kitchen table",
    "our neighbours sold their house last spring",
    "the pilot greeted every passenger with a smile",
    "heavy clouds gathered above the quiet town",
    "the waiter brought us bread and warm butter",
    "they walked along the beach until sunset",
    "the old clock in the hall stopped at noon",
]
CONTINUOUS_VOICES = ["en-gb-scotland", "en+f2", "en-us+f4", "en-us+m1"]
CONTINUOUS_RATES = [145, 165, 180, 195]
NUM_CONTINUOUS = 24

VOICES = ["en-us", "en-gb", "en-us+f3", "en-us+m3"]
RATES = [140, 155, 170, 190]
GAP_CYCLE = [0.15, 0.25, 0.4, 0.6, 0.2, 0.35, 0.5, 0.3, 0.1]
NUM_SHORT = 48
QUICK_IDS = ["s00", "s05", "c00", "c01", "long40"]
# Long-form alignment: each recording at least this long, and the clip that warms a system up.
ALIGN_MIN_SECONDS = 300.0
ALIGN_WARM_UP_ID = "s00"


def short_clip_spec(index: int) -> dict:
    sentence = ALL_SENTENCES[index % len(ALL_SENTENCES)]
    noise = {4: -45.0, 5: -35.0}.get(index % 6)
    return {
        "words": sentence.split(),
        "voice": VOICES[index % len(VOICES)],
        "rate": RATES[(index // len(VOICES)) % len(RATES)],
        "gap_scale": 0.7 + 0.15 * (index % 5),
        "noise_db": noise,
        "seed": index,
    }


def make_short(index: int) -> tuple[SpokenClip, dict]:
    spec = short_clip_spec(index)
    words = spec["words"]
    gaps = [
        round(GAP_CYCLE[(index + k) % len(GAP_CYCLE)] * spec["gap_scale"], 3) for k in range(len(words) - 1)
    ]
    clip = synthesize_words(
        words,
        gap_s=gaps,
        voice=spec["voice"],
        rate=spec["rate"],
        lead_s=0.3 + 0.1 * (index % 4),
        tail_s=0.4,
        noise_db=spec["noise_db"],
        seed=spec["seed"],
    )
    return clip, {"voice": spec["voice"], "rate": spec["rate"], "noise_db": spec["noise_db"]}


def make_continuous(index: int) -> tuple[SpokenClip, dict]:
    """Two held-out sentences in one breath; a third of the clips with noise."""
    n = len(CONTINUOUS_SENTENCES)
    first, second = CONTINUOUS_SENTENCES[index % n], CONTINUOUS_SENTENCES[(5 * index + 3) % n]
    text = f"{first[0].upper()}{first[1:]}. {second[0].upper()}{second[1:]}."
    voice = CONTINUOUS_VOICES[index % len(CONTINUOUS_VOICES)]
    rate = CONTINUOUS_RATES[(index // len(CONTINUOUS_VOICES)) % len(CONTINUOUS_RATES)]
    noise = {1: -45.0, 2: -35.0}.get(index % 3)
    clip = synthesize_sentence(
        text, voice, rate, lead_s=0.3 + 0.1 * (index % 4), tail_s=0.4, noise_db=noise, seed=100 + index
    )
    return clip, {"voice": voice, "rate": rate, "noise_db": noise, "speech": "continuous"}


def mixed_long(min_seconds: float, noise_db: float = -45.0) -> SpokenClip:
    """Short clips of every voice back to back until `min_seconds`, then white noise over it all."""
    clips, total, index = [], 0.0, 0
    while total < min_seconds:
        sentence = ALL_SENTENCES[(7 * index + 3) % len(ALL_SENTENCES)].split()
        clips.append(
            synthesize_words(
                sentence,
                gap_s=0.25,
                voice=VOICES[index % len(VOICES)],
                rate=RATES[(index + 1) % len(RATES)],
                lead_s=0.3,
                tail_s=0.5,
            )
        )
        total += clips[-1].duration
        index += 1
    joined = concatenate_clips(clips)
    noise = np.random.default_rng(1234).standard_normal(len(joined.samples)) * 10 ** (noise_db / 20)
    joined.samples = np.clip(joined.samples + noise, -1.0, 1.0).astype(np.float32)
    return joined


def recording(make_clip, min_seconds: float) -> SpokenClip:
    """``make_clip(0)``, ``make_clip(1)``, ... back to back until `min_seconds`; each clip's own lead and
    tail silence is the pause between them."""
    clips, total = [], 0.0
    while total < min_seconds:
        clip, _ = make_clip(len(clips))
        clips.append(clip)
        total += clip.duration
    return concatenate_clips(clips)


def write_clip(out_dir: Path, clip_id: str, clip: SpokenClip, meta: dict) -> dict:
    """Writes <clip_id>.wav; returns its truth entry."""
    path = out_dir / f"{clip_id}.wav"
    write_wav(path, clip.samples)
    return {
        "path": str(path),
        "duration": round(clip.duration, 4),
        "words": clip.words,
        "starts": [round(s, 6) for s in clip.starts],
        "ends": [round(e, 6) for e in clip.ends],
        "text": clip.text,
        **meta,
    }


def alignment_truth(out_dir: Path) -> dict:
    """The long recordings' truth (align_truth.json in ``out_dir``), built first where it is missing."""
    path = out_dir / "align_truth.json"
    return json.loads(path.read_text()) if path.exists() else build_alignment(out_dir)


def build_alignment(out_dir: Path, log=print) -> dict:
    """The two long recordings for forced alignment; wavs + align_truth.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    truth = {
        "align_pauses": write_clip(
            out_dir,
            "align_pauses",
            recording(make_short, ALIGN_MIN_SECONDS),
            {"voice": "mixed", "rate": None, "noise_db": "mixed", "speech": "pauses"},
        ),
        "align_continuous": write_clip(
            out_dir,
            "align_continuous",
            recording(make_continuous, ALIGN_MIN_SECONDS),
            {"voice": "mixed", "rate": None, "noise_db": "mixed", "speech": "continuous"},
        ),
    }
    (out_dir / "align_truth.json").write_text(json.dumps(truth, indent=1))
    log(
        "[audio] alignment: "
        + ", ".join(f"{i} {t['duration']:.0f} s, {len(t['words'])} words" for i, t in truth.items())
    )
    return truth


def build(out_dir: Path, log=print) -> dict:
    """Synthesize every clip (espeak-ng results are cached) and write wavs + truth.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    truth: dict[str, dict] = {}

    def add(clip_id: str, clip: SpokenClip, meta: dict) -> None:
        truth[clip_id] = write_clip(out_dir, clip_id, clip, meta)

    for index in range(NUM_SHORT):
        clip, meta = make_short(index)
        add(f"s{index:02d}", clip, {**meta, "speech": "pauses"})
    for index in range(NUM_CONTINUOUS):
        clip, meta = make_continuous(index)
        add(f"c{index:02d}", clip, meta)
    add("long40", long_clip(40), {"voice": "en-us", "rate": 160, "noise_db": None, "speech": "pauses"})
    add("long65", long_clip(65), {"voice": "en-us", "rate": 160, "noise_db": None, "speech": "pauses"})
    add("mixed50", mixed_long(50), {"voice": "mixed", "rate": None, "noise_db": -45.0, "speech": "pauses"})
    (out_dir / "truth.json").write_text(json.dumps(truth, indent=1))
    total = sum(t["duration"] for t in truth.values())
    log(f"[audio] {len(truth)} clips, {total:.1f} s of audio in {out_dir}")
    return truth


def manifest(truth: dict, ids: list[str] | None = None) -> list[dict]:
    ids = list(truth) if ids is None else ids
    return [{"id": i, "path": truth[i]["path"], "duration": truth[i]["duration"]} for i in ids]


def alignment_manifest(truth: dict, warm_up: dict) -> dict:
    """The long recordings with the text to align, and a short clip (with its text) to warm up on."""
    return {
        "recordings": [{**entry, "text": truth[entry["id"]]["text"]} for entry in manifest(truth)],
        "warm_up": {"path": warm_up["path"], "text": warm_up["text"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "audio")
    args = parser.parse_args()
    truth = build(args.out)
    build_alignment(args.out)
    durations = [t["duration"] for t in truth.values()]
    print(
        json.dumps(
            {
                "clips": len(durations),
                "total_s": round(sum(durations), 1),
                "min_s": min(durations),
                "max_s": max(durations),
            }
        )
    )


if __name__ == "__main__":
    main()
