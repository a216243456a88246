"""Long-form forced alignment: figures per (system, task, recording) from the raw outputs of the
alignment systems (benchmarks/out/<system>.json) against align_truth.json, and the report's section."""

from __future__ import annotations

import json
from pathlib import Path

import metrics

SYSTEMS = ("stable-ts", "align")  # run.py's --systems names; their raw outputs are out/<name>.json
OURS = "vllm-whisper-align (offline)"  # the rows' "system" of this project's runner
FIELDS = [
    "system",
    "task",
    "recording",
    "precision",
    "audio_s",
    "wall_s",
    "audio_s_per_wall_s",
    "peak_rss_mib",
    "words_spoken",
    "words_matched_pct",
    "words_unaligned",
    "start_mae_ms",
    "start_median_ms",
    "start_within_50ms_pct",
    "start_within_100ms_pct",
    "start_within_200ms_pct",
    "first_minute_start_mae_ms",
    "last_minute_start_mae_ms",
]


def load_raws(out: Path) -> dict[str, dict]:
    return {
        system: json.loads((out / f"{system}.json").read_text())
        for system in SYSTEMS
        if (out / f"{system}.json").is_file()
    }


def rows(raws: dict[str, dict], truth: dict[str, dict]) -> list[dict]:
    """One row per run of each system over each recording it holds truth for."""
    out = []
    for raw in raws.values():
        for run in raw["runs"]:
            for recording, result in run["files"].items():
                if recording in truth:
                    out.append(row(run, recording, result["words"], truth[recording]))
    return out


def row(run: dict, recording: str, words: list[dict], truth: dict) -> dict:
    figures = {
        **run,
        "task": run["mode"],
        "recording": recording,
        "words_unaligned": (
            sum(1 for w in words if w.get("aligned") is False) if any("aligned" in w for w in words) else None
        ),  # ours flag them
        **metrics.longform_accuracy(truth, words),
    }
    return {key: figures.get(key) for key in FIELDS}


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(longform_rows: list[dict]) -> list[str]:
    head = [
        "recording",
        "system",
        "task",
        "audio s",
        "wall s",
        "audio s / wall s",
        "peak RSS MiB",
        "start MAE ms",
        "≤50 ms %",
        "≤100 ms %",
        "≤200 ms %",
        "first min MAE ms",
        "last min MAE ms",
        "words matched %",
        "unaligned",
    ]
    keys = [
        "recording",
        "system",
        "task",
        "audio_s",
        "wall_s",
        "audio_s_per_wall_s",
        "peak_rss_mib",
        "start_mae_ms",
        "start_within_50ms_pct",
        "start_within_100ms_pct",
        "start_within_200ms_pct",
        "first_minute_start_mae_ms",
        "last_minute_start_mae_ms",
        "words_matched_pct",
        "words_unaligned",
    ]
    digits = {"audio_s_per_wall_s": 2, "peak_rss_mib": 0}
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(longform_rows, key=lambda r: (r["recording"], r["system"], r["task"])):
        lines.append("| " + " | ".join(_fmt(r.get(k), digits.get(k, 1)) for k in keys) + " |")
    return lines


def throughput_line(
    recording: str, ours: dict | None, transcription: dict | None, peer: dict | None
) -> list[str]:
    """Our alignment's throughput against our transcription's (the issue's target: at least as fast) and
    against stable-ts's."""
    parts = []
    for name, other in (("our transcription", transcription), ("stable-ts align", peer)):
        if ours and other:
            ratio = ours["audio_s_per_wall_s"] / other["audio_s_per_wall_s"]
            target = f" (target ≥ 1×: {'met' if ratio >= 1 else 'NOT MET'})" if other is transcription else ""
            parts.append(f"{ratio:.2f}× {name}'s{target}")
    return [f"- {recording}: our alignment's throughput is " + ", ".join(parts) + "."] if parts else []


def drift_line(recording: str, alignments: dict[str, dict | None]) -> list[str]:
    """Each alignment's last-minute start MAE less its first-minute one (> 0: worse towards the end)."""
    first, last = "first_minute_start_mae_ms", "last_minute_start_mae_ms"
    parts = [
        f"{name} {r[last] - r[first]:+.0f} ms"
        for name, r in alignments.items()
        if r and r[first] is not None and r[last] is not None
    ]
    if not parts:
        return []
    return [
        f"- {recording}: drift of the alignment (last minute's start MAE − first's): "
        + ", ".join(parts)
        + "."
    ]


def verdicts(longform_rows: list[dict]) -> list[str]:
    by_key = {(r["recording"], r["system"], r["task"]): r for r in longform_rows}
    lines = []
    for recording in sorted({r["recording"] for r in longform_rows}):
        ours, peer = by_key.get((recording, OURS, "align")), by_key.get((recording, "stable-ts", "align"))
        lines += throughput_line(recording, ours, by_key.get((recording, OURS, "transcribe")), peer)
        lines += drift_line(recording, {"ours": ours, "stable-ts": peer})
    return lines


def section(longform_rows: list[dict]) -> list[str]:
    if not longform_rows:
        return []
    return [
        "## Long-form forced alignment",
        "",
        "Two recordings over 5 minutes (`benchmarks/audio.py` `build_alignment`): *align_pauses*, the short "
        "clips of words with pauses back to back; *align_continuous*, continuous-speech clips back to back "
        "(words whose start libespeak-ng does not give are left out). Each is aligned with its spoken text "
        'by stable-ts (`model.align(audio, text, language="en")`, openai-whisper backend, its defaults, '
        "fp32, the same tiny.en weights and alignment heads) and by this project (`WhisperAligner.align`), "
        "and transcribed with word timestamps by this project (`WhisperAligner.transcribe`), one recording "
        "at a time after a warm-up on a short clip; ours are medians of alternating rounds. *≤X ms %* over "
        "every word with a known start (a word not paired with a spoken one is a miss); *first/last min "
        "MAE*: start MAE of the words whose true start is in the recording's first / last 60 s (drift); "
        "*unaligned*: words our alignment could place in no window.",
        "",
        *table(longform_rows),
        "",
        *verdicts(longform_rows),
        "",
    ]
