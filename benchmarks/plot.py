"""throughput.png from results.json + errors.json (run by run.py in benchmarks/.venvs/report).

    benchmarks/.venvs/report/bin/python benchmarks/plot.py RESULTS_JSON ERRORS_JSON OUT_PNG

Left: audio seconds per wall second against concurrency, one line per system and precision (hollow
markers: word timestamps off). Right: cumulative share of spoken words whose start is within x ms of
the truth, per system and precision (its highest-concurrency run); misses never count.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main(results_path: str, errors_path: str, png_path: str) -> None:
    with open(results_path) as f:
        results = json.load(f)
    with open(errors_path) as f:
        errors = json.load(f)
    rows = results["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))

    series: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        if row.get("audio_s_per_wall_s") is None:
            continue
        series.setdefault((row["system"], row["precision"]), []).append(row)
    colors = {}
    cmap = plt.get_cmap("tab10")
    for index, key in enumerate(series):
        colors[key] = cmap(index % 10)
    for key, items in series.items():
        on = sorted((r for r in items if r.get("word_timestamps", True)), key=lambda r: r["concurrency"])
        off = [r for r in items if not r.get("word_timestamps", True)]
        label = f"{key[0]} {key[1]}"
        if on:
            left.plot(
                [r["concurrency"] for r in on],
                [r["audio_s_per_wall_s"] for r in on],
                "o-",
                color=colors[key],
                label=label,
            )
        if off:
            left.plot(
                [r["concurrency"] for r in off],
                [r["audio_s_per_wall_s"] for r in off],
                "o",
                mfc="none",
                color=colors[key],
                markersize=9,
                label=None if on else label + " (no word ts)",
            )
    left.set_xscale("log", base=2)
    ticks = sorted({r["concurrency"] for r in rows if r.get("audio_s_per_wall_s") is not None})
    left.set_xticks(ticks)
    left.set_xticklabels([str(t) for t in ticks])
    left.minorticks_off()
    left.set_ylim(bottom=0)
    left.set_xlabel("concurrency (requests in flight / threads / batch size)")
    left.set_ylabel("audio seconds per wall second")
    left.set_title("Throughput (word timestamps on; hollow = off)")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)

    best: dict[tuple[str, str], tuple[int, dict]] = {}
    for entry in errors.values():
        key = (entry["system"], entry["precision"])
        if key not in best or entry["concurrency"] > best[key][0]:
            best[key] = (entry["concurrency"], entry)
    xs = np.logspace(0, np.log10(3000), 400)
    for key, (_, entry) in best.items():
        values = np.sort(np.asarray(entry["abs_start_error_ms"], dtype=float))
        spoken = entry.get("words_spoken") or len(values) or 1
        share = np.searchsorted(values, xs, side="right") / spoken * 100
        style = ["-", "--", "-.", ":"][list(best).index(key) % 4]
        right.plot(xs, share, style, color=colors.get(key, "k"), label=f"{key[0]} {key[1]}")
    for ms in (50, 100, 200):
        right.axvline(ms, color="grey", linestyle=":", linewidth=1)
    right.set_xscale("log")
    right.set_xlabel("|heard start − true start| (ms)")
    right.set_ylabel("% of spoken words within x")
    right.set_ylim(0, 100)
    right.set_title("Word-start error (cumulative)")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8, loc="upper left")

    title = "tiny.en word timestamps — " + results.get("machine", "")
    if results.get("quick"):
        title = "QUICK SMOKE RUN (noise) — " + title
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:4])
