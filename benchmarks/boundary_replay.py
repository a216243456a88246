"""Word-boundary experiments without the engine in the loop: record once, replay the post-processing.

    .venv/bin/python benchmarks/boundary_replay.py record [--model tiny.en|base]
    .venv/bin/python benchmarks/boundary_replay.py replay [--model tiny.en|base] [--method auto|heads|fixed]

``record`` runs one float32 ``WhisperAligner`` over three clip sets and keeps what the engine hands
``align.results.window_results`` for every window (the captured cross-attention of the whole head pool,
the tokens and their log-probabilities, the samples): forced alignment of the spoken text, and
transcription. ``replay`` runs ``results.window_results`` again on the recording with the code as it is
now (head selection, DTW, snapping, onset refinement) and prints the share of word starts within
50 / 100 / 200 ms and the start MAE per set (``boundaries.shares``), and for speech with pauses (whose
ends are known) the same for ends; a change to that code is measured in seconds instead of an engine
run. Transcribed figures are over the words heard.

The sets: *dev*, 48 continuous clips (pairs of benchmarks/audio.py's ALL_SENTENCES, the dev voices and
rates named there, a third with noise), for choosing constants; *held*, the benchmark's 24 held-out
continuous clips (``make_continuous``), for checking them; *pauses*, the benchmark's 48 short clips of
words with pauses (in voices of the dev set: constants for speech with pauses were chosen on it);
*pauses-held*, 24 clips of the held-out sentences spoken word by word in the held-out voices and rates,
for checking those; *real*, the real recordings of tests/support/real_speech.py (docs/real-speech-set.md),
scored by real_speech_bench's rules (every truth word, starts and ends); *real-pauses*, those recordings
joined by pauses of their own room tone and a breath (``joined_with_pauses``); *spontaneous*, the
spontaneous set kept apart from them (docs/real-speech-set.md#the-spontaneous-set), scored the same way.
Every clip is aligned alone (no packing), as the rules see one input's windows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pickle
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.support: the speech helpers the tests use

from audio import (  # noqa: E402
    ALL_SENTENCES,
    CONTINUOUS_RATES,
    CONTINUOUS_SENTENCES,
    CONTINUOUS_VOICES,
    GAP_CYCLE,
    NUM_CONTINUOUS,
    make_continuous,
    make_short,
)
from boundaries import shares  # noqa: E402

from tests.support.speech import SpokenClip, end_errors, synthesize_sentence, synthesize_words  # noqa: E402

OUT = HERE / "out"
# Bump when what record() keeps changes: a recording of another version is refused, not misread.
RECORDING_VERSION = 4
# The voices and rates the boundary constants were chosen on (benchmarks/audio.py: never the held-out ones).
DEV_VOICES = ["en-us", "en", "en-us+f3", "en-gb-x-rp", "en-us+m3", "en-029"]
DEV_RATES = [140, 150, 160, 170, 180, 190]
NUM_DEV, NUM_PAUSES, NUM_PAUSES_HELD = 48, 48, 24
SETS = ("dev", "held", "pauses", "pauses-held", "real", "real-pauses", "spontaneous")
# Real human speech (tests/support/real_speech.py): scored by its own rules (real_speech_bench.score: every
# truth word counts, starts and ends, starts over 0.5 s off), beside the synthetic sets.
REAL_SETS = ("real", "real-pauses", "spontaneous")
MODES = ("forced", "transcribed")


def dev_clip(index: int) -> SpokenClip:
    n = len(ALL_SENTENCES)
    first, second = ALL_SENTENCES[index % n], ALL_SENTENCES[(7 * index + 5) % n]
    text = f"{first[0].upper()}{first[1:]}. {second[0].upper()}{second[1:]}."
    return synthesize_sentence(
        text,
        DEV_VOICES[index % 6],
        DEV_RATES[(index // 6 + index) % 6],
        lead_s=0.3 + 0.1 * (index % 4),
        tail_s=0.4,
        noise_db={1: -45.0, 2: -35.0}.get(index % 3),
        seed=500 + index,
    )


def held_pauses_clip(index: int) -> SpokenClip:
    words = CONTINUOUS_SENTENCES[index % len(CONTINUOUS_SENTENCES)].split()
    gaps = [GAP_CYCLE[(index + 2 * k) % len(GAP_CYCLE)] for k in range(len(words) - 1)]
    return synthesize_words(
        words,
        gap_s=gaps,
        voice=CONTINUOUS_VOICES[index % 4],
        rate=CONTINUOUS_RATES[(index // 4 + index) % 4],
        lead_s=0.3 + 0.1 * (index % 3),
        tail_s=0.4,
        noise_db={1: -45.0, 2: -35.0}.get(index % 3),
        seed=900 + index,
    )


def clip_sets() -> dict[str, list[SpokenClip]]:
    return {
        "dev": [dev_clip(i) for i in range(NUM_DEV)],
        "held": [make_continuous(i)[0] for i in range(NUM_CONTINUOUS)],
        "pauses": [make_short(i)[0] for i in range(NUM_PAUSES)],
        "pauses-held": [held_pauses_clip(i) for i in range(NUM_PAUSES_HELD)],
        **{
            name: [SpokenClip(c.samples, c.words, c.starts, c.ends, c.text) for c in clips]
            for name, clips in real_sets().items()
        },
    }


def real_sets() -> dict[str, list]:
    from tests.support import real_speech

    clips = real_speech.load_clips(log=lambda *_: None)
    spontaneous = real_speech.load_clips(log=lambda *_: None, sets=("spontaneous",))
    return {"real": clips, "real-pauses": real_speech.joined_with_pauses(clips), "spontaneous": spontaneous}


def recording_path(model: str) -> Path:
    return OUT / f"boundary-replay-{model}.pkl"


def record(out: Path, model: str) -> None:
    from vllm_whisper_align.checkpoints.bundled import resolve_model
    from vllm_whisper_align.runners.offline import WhisperAligner

    sets = clip_sets()
    recorded: dict = {
        "version": RECORDING_VERSION,
        "model": model,
        "clips": {name: [(c.words, c.starts, c.ends, c.text) for c in clips] for name, clips in sets.items()},
        "real": {
            name: {
                c.id: {"kind": c.kind, "words": c.words, "starts": c.starts, "ends": c.ends} for c in clips
            }
            for name, clips in real_sets().items()
        },
    }
    with WhisperAligner(resolve_model(model), dtype="float32") as aligner, kept_calls() as calls:
        for name, clips in sets.items():
            audio = [clip.samples for clip in clips]
            for mode in MODES:
                calls.clear()
                # Each clip alone: packed windows hold several clips, and a call per input is kept.
                if mode == "forced":
                    aligner.align(audio, [clip.text for clip in clips], language="en", packing=False)
                else:
                    aligner.transcribe(audio, language="en", packing=False)
                recorded[(name, mode)] = in_input_order(calls, audio)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as file:
        pickle.dump(recorded, file)
    print(f"recorded {sum(len(c) for c in sets.values())} clips to {out}")


@contextlib.contextmanager
def kept_calls() -> Iterator[list[dict]]:
    """While open, every call of ``align.results.window_results`` is kept in the list yielded: what the
    engine handed it for each window."""
    from vllm_whisper_align.align import results
    from vllm_whisper_align.audio.windows import AudioChunk

    calls: list[dict] = []
    window_results = results.window_results

    def keep(windows, fetched, tokens, info):
        # The windows' samples in memory (a long input's may be in a temporary file), positions kept.
        kept = [replace(w, audio=AudioChunk(w.audio.samples, 0, w.audio.num_samples)) for w in windows]
        offsets = [w.offset for w in windows]
        source = id(windows[0].audio.source) if windows else None  # which input: calls finish in any order
        calls.append(
            {"windows": kept, "offsets": offsets, "fetched": list(fetched), "info": info, "source": source}
        )
        return window_results(windows, fetched, tokens, info)

    results.window_results = keep
    try:
        yield calls
    finally:
        results.window_results = window_results


def in_input_order(calls: list[dict], audio: list[np.ndarray]) -> list[dict]:
    """One call per input, in the inputs' order (an input of which every window was silence has none:
    its words are none)."""
    by_source = {call["source"]: call for call in calls if call["source"] is not None}
    empty = {"windows": [], "offsets": [], "fetched": [], "info": calls[0]["info"] if calls else None}
    return [by_source.get(id(samples), empty) for samples in audio]


def load(path: Path) -> tuple[dict, object]:
    from transformers import AutoTokenizer

    from vllm_whisper_align.checkpoints.bundled import resolve_model
    from vllm_whisper_align.tokens import WhisperTokens

    with open(path, "rb") as file:
        recorded = pickle.load(file)
    if recorded.get("version") != RECORDING_VERSION:
        raise SystemExit(f"{path} was recorded by another version of this script: record it again")
    model = Path(resolve_model(recorded["model"]))
    vocab_size = json.loads((model / "config.json").read_text())["vocab_size"]
    return recorded, WhisperTokens.from_tokenizer(AutoTokenizer.from_pretrained(str(model)), vocab_size)


def replay_words(recorded: dict, tokens, name: str, mode: str, method: str | None = None) -> list[list[dict]]:
    """Every clip's words, from the recorded engine answers through today's post-processing; with
    ``method``, read by that alignment method instead of the recorded one (auto, heads and fixed read
    the same capture)."""
    from vllm_whisper_align.align import results

    words = []
    for call in recorded[(name, mode)]:
        # Each window back at its place in the input (its samples were recorded from 0).
        windows = [
            replace(w, audio=_at(w.audio, offset), alignment=_read_by(w.alignment, method))
            for w, offset in zip(call["windows"], call["offsets"], strict=True)
        ]
        answers = results.window_results(windows, call["fetched"], tokens, call["info"])
        words.append(
            [
                {"word": w.word, "start": w.start, "end": w.end}
                for r in answers
                if r is not None
                for w in r.words
            ]
        )
    return words


def _read_by(alignment, method: str | None):
    """A window's alignment parameters, read by ``method`` where one is given."""
    return replace(alignment, alignment_method=method) if method and alignment else alignment


def _at(audio, offset: float):
    """``audio``'s samples as a window starting ``offset`` seconds into its input."""
    from vllm_whisper_align.audio.windows import AudioChunk
    from vllm_whisper_align.constants import SAMPLE_RATE

    start = int(round(offset * SAMPLE_RATE))
    padded = np.concatenate([np.zeros(start, dtype=np.float32), audio.samples])
    return AudioChunk(padded, start, len(padded))


def end_shares(clips: list[SpokenClip], words: list[list[dict]]) -> dict[str, float]:
    """Shares of word ends within 50 / 100 / 200 ms and the end MAE, over the spoken words heard (all of
    them when forced) whose true end is known."""
    errors = np.concatenate([end_errors(clip, answer) for clip, answer in zip(clips, words, strict=True)])
    errors = errors[np.isfinite(errors)]
    out = {f"within_{ms}ms_pct": round(100 * float(np.mean(errors <= ms / 1000)), 1) for ms in (50, 100, 200)}
    return {**out, "end_mae_ms": round(1000 * float(np.mean(errors)), 1)}


def replay(path: Path, method: str | None = None) -> None:
    recorded, tokens = load(path)
    print(
        f"{recorded['model']}, recorded in {path.name}, alignment_method {method or 'as recorded'}; "
        "starts (ends) within 50 / 100 / 200 ms"
    )
    for name in SETS:
        clips = [SpokenClip(np.zeros(1), *clip) for clip in recorded["clips"][name]]
        for mode in MODES:
            words = replay_words(recorded, tokens, name, mode, method)
            if name in REAL_SETS:
                print(real_line(recorded["real"][name], words, name, mode))
                continue
            figures = shares(clips, words, heard_only=mode == "transcribed")
            line = (
                f"{name:11} {mode:11} starts {figures['within_50ms_pct']} / "
                f"{figures['within_100ms_pct']} / {figures['within_200ms_pct']}, "
                f"MAE {figures['start_mae_ms']} ms"
            )
            if name.startswith("pauses"):
                ends = end_shares(clips, words)
                line += (
                    f"; ends {ends['within_50ms_pct']} / {ends['within_100ms_pct']} / "
                    f"{ends['within_200ms_pct']}, MAE {ends['end_mae_ms']} ms"
                )
            print(line)


def real_line(truth: dict, words: list[list[dict]], name: str, mode: str) -> str:
    """The real set's figures as the real-speech benchmark scores them (every truth word counts)."""
    import real_speech_bench

    result = {"files": {clip_id: {"words": w} for clip_id, w in zip(truth, words, strict=True)}}
    figures, _ = real_speech_bench.score(truth, result)
    starts = " / ".join(str(figures[f"start_within_{ms}ms_pct"]) for ms in (20, 50, 100, 200))
    ends = " / ".join(str(figures[f"end_within_{ms}ms_pct"]) for ms in (20, 50, 100, 200))
    spontaneous = figures["by_kind"].get("spontaneous", {})
    return (
        f"{name:11} {mode:11} starts {starts} (20/50/100/200), MAE {figures['start_mae_ms']} ms, "
        f"{figures['starts_off_over_0.5s']} over 0.5 s; ends {ends}, MAE {figures['end_mae_ms']} ms"
        + (
            f"; spontaneous starts {spontaneous.get('start_within_50ms_pct')} / "
            f"{spontaneous.get('start_within_100ms_pct')}"
            if spontaneous
            else ""
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["record", "replay"])
    parser.add_argument("--model", default="tiny.en", choices=["tiny.en", "base"])
    parser.add_argument(
        "--out", type=Path, default=None, help="default: benchmarks/out/boundary-replay-MODEL.pkl"
    )
    parser.add_argument(
        "--method", default=None, choices=["auto", "heads", "fixed"], help="replay: read by this method"
    )
    args = parser.parse_args()
    path = args.out or recording_path(args.model)
    record(path, args.model) if args.action == "record" else replay(path, args.method)


if __name__ == "__main__":
    main()
