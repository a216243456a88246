"""Helpers every runner shares; needs only the standard library, numpy and psutil (in every venv)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time
import wave
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_RATE = 16000


# The instruction-set extensions that decide which dtype is fast on a CPU (bfloat16 wants avx512_bf16,
# and runs fastest with amx_bf16); every figure names its CPU by them.
SIMD_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_description() -> str:
    """The CPU as /proc/cpuinfo names it, and which of SIMD_FLAGS it lists ("AMD EPYC ..., SIMD:
    avx2/avx512f/avx512_bf16"): CPUs with the same flags differ (an AMD Zen 4 and an Intel Xeon with
    AMX both list avx512_bf16)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.processor() or 'unknown CPU'}, SIMD: unknown"
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    simd = [flag for flag in SIMD_FLAGS if flag in flags]
    return f"{model or 'unknown CPU'}, SIMD: {'/'.join(simd) or 'none listed'}"


def load_wav(path: str | os.PathLike) -> np.ndarray:
    """16 kHz mono PCM16 wav (what audio.py writes) -> float32 in [-1, 1]."""
    with wave.open(str(path), "rb") as f:
        if f.getframerate() != SAMPLE_RATE or f.getnchannels() != 1 or f.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16 kHz mono PCM16")
        data = f.readframes(f.getnframes())
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def load_manifest(path: str | os.PathLike) -> list[dict[str, Any]]:
    """[{"id", "path", "duration"}, optionally "language" (:func:`language_of`)] in the order the run
    should use."""
    return json.loads(Path(path).read_text())


def language_of(entry: dict[str, Any]) -> str:
    """A manifest entry's language (its clip's, its warm-up's): English where it names none, as every
    manifest but the languages set's."""
    return entry.get("language", "en")


def shortest(items: list[dict[str, Any]]) -> str:
    """Id of the shortest clip: the warm-up input (cheap, and the least likely to make a model loop)."""
    return min(items, key=lambda item: item["duration"])["id"]


class RssSampler:
    """Samples the summed RSS (and PSS) of a process and all its descendants.

    `peak_between(t0, t1)` gives the peak (MiB) of the samples taken in a time window, so one
    process can report a peak per pass. Summing RSS counts pages shared between processes once per
    process (vLLM runs an API server and an engine core): an upper bound on what the tree uses.
    PSS splits each shared page between the processes that map it, so its sum does not double count.

    RSS is read every `interval` s (statm: microseconds). PSS only every `pss_interval` s: it walks
    the page tables (smaps_rollup), which took 115 ms per call on a vLLM worker, so sampling it every
    0.2 s stole about a third of a core from the system being measured.
    """

    def __init__(self, pid: int | None = None, interval: float = 0.2, pss_interval: float = 10.0):
        import psutil

        self._psutil = psutil
        self.pid = os.getpid() if pid is None else pid
        self.interval = interval
        self.pss_interval = pss_interval
        self.samples: list[tuple[float, float, float | None]] = []  # (time, rss MiB, pss MiB or None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        rss, pss = self.sample(with_pss=True)  # one PSS reading at the end of every window
        self.samples.append((time.perf_counter(), rss, pss))

    def _tree(self) -> list:
        psutil = self._psutil
        try:
            root = psutil.Process(self.pid)
            return [root] + root.children(recursive=True)
        except psutil.Error:
            return []

    def sample(self, with_pss: bool) -> tuple[float, float | None]:
        psutil = self._psutil
        rss = pss = 0
        for proc in self._tree():
            try:
                info = proc.memory_full_info() if with_pss else proc.memory_info()
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
            except psutil.AccessDenied:
                try:
                    info = proc.memory_info()
                    rss += info.rss
                    pss += info.rss
                except psutil.Error:
                    pass
            except psutil.Error:
                pass
        return rss / 2**20, (pss / 2**20 if with_pss else None)

    def _loop(self) -> None:
        last_pss = float("-inf")
        while not self._stop.is_set():
            now = time.perf_counter()
            with_pss = now - last_pss >= self.pss_interval
            if with_pss:
                last_pss = now
            rss, pss = self.sample(with_pss)
            self.samples.append((time.perf_counter(), rss, pss))
            self._stop.wait(self.interval)

    def peak_between(self, t0: float, t1: float, kind: str = "rss") -> float | None:
        column = 1 if kind == "rss" else 2
        values = [s[column] for s in self.samples if t0 <= s[0] <= t1 and s[column] is not None]
        return round(max(values), 1) if values else None

    def peak(self, kind: str = "rss") -> float | None:
        return self.peak_between(float("-inf"), float("inf"), kind)


def tree_memory(pid: int) -> list[dict[str, Any]]:
    """RSS and PSS (MiB) of each process in ``pid``'s tree, named as ps shows them (vLLM titles its own)."""
    import psutil

    root = psutil.Process(pid)
    rows = []
    for proc in [root] + root.children(recursive=True):
        try:
            info = proc.memory_full_info()
            title = " ".join(proc.cmdline()).strip()[:80] or proc.name()
            rows.append(
                {
                    "pid": proc.pid,
                    "process": title,
                    "rss_mib": round(info.rss / 2**20, 1),
                    "pss_mib": round(info.pss / 2**20, 1),
                }
            )
        except psutil.Error:
            pass
    return rows


def self_maxrss_mib() -> float:
    """ru_maxrss of this process (KiB on Linux) in MiB; a cross-check for the sampler."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def percentile(values: Iterable[float], q: float) -> float | None:
    values = sorted(values)
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return float(np.percentile(values, q))


def word_dicts(words: Iterable[Any]) -> list[dict[str, Any]]:
    """Normalise word objects/dicts of any system to {"word", "start", "end", "probability"}."""
    out = []
    for w in words:
        get = (lambda k, w=w: w.get(k)) if isinstance(w, dict) else (lambda k, w=w: getattr(w, k, None))
        start, end = get("start"), get("end")
        out.append(
            {
                "word": str(get("word")),
                "start": None if start is None else round(float(start), 4),
                "end": None if end is None else round(float(end), 4),
                "probability": None if get("probability") is None else round(float(get("probability")), 4),
            }
        )
    return out


def run_record(**fields: Any) -> dict[str, Any]:
    """One pass of a system over the clips, in the shape run.py reads."""
    latencies = fields.get("latencies_s") or []
    record = {
        "system": None,
        "model": None,
        "precision": None,
        "concurrency": None,
        "mode": None,
        "word_timestamps": True,
        "audio_s": None,
        "wall_s": None,
        "peak_rss_mib": None,
        "p50_latency_s": round(statistics.median(latencies), 4) if latencies else None,
        "p95_latency_s": round(percentile(latencies, 95), 4) if latencies else None,
        "files": {},
    }
    record.update(fields)
    if record["audio_s"] and record["wall_s"]:
        record["audio_s_per_wall_s"] = round(record["audio_s"] / record["wall_s"], 3)
    return record


def write_output(path: str | os.PathLike, system: str, runs: list[dict[str, Any]], **extra: Any) -> None:
    out = {
        "system": system,
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "runs": runs,
        **extra,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1))
    os.replace(tmp, path)


def log(*parts: Any) -> None:
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


# Variants of this project's engine, named like dtypes in --dtypes: "<dtype>" followed by any of these
# suffixes, each a `whisper_align` setting (--additional-config) and what the precision column says of it:
# "+int8enc" the encoder's linear layers in int8 (vllm_whisper_align.engine.int8); "+unpacked" every short
# input in a window of its own (packing off: docs/packing.md).
VARIANT_SUFFIXES = {
    "+int8enc": ({"encoder_int8": True}, "encoder linears int8"),
    "+unpacked": ({"packing": False}, "unpacked"),
}


# ``--dereverberate`` of the benchmarks that take it: its words, and whisper_align.dereverberate's value
# for each (audio.dereverb.Mode).
DEREVERBERATE_MODES = {"auto": "auto", "true": True, "false": False}


# The variant that passes no --dtype: what a user gets from plain `vllm-whisper-align serve`.
DEFAULT_VARIANT = "default"


def engine_variant(name: str) -> tuple[str, dict]:
    """'float32+int8enc' -> ('float32', {'whisper_align': {'encoder_int8': True}}) for --additional-config.

    The dtype of DEFAULT_VARIANT is "default": the runner passes none and reports the engine's choice.
    """
    dtype, *suffixes = name.split("+")
    settings = {}
    for suffix in suffixes:
        if f"+{suffix}" not in VARIANT_SUFFIXES:
            known = ", ".join(VARIANT_SUFFIXES)
            raise SystemExit(f"unknown engine variant suffix +{suffix} in {name!r}; known: {known}")
        settings.update(VARIANT_SUFFIXES[f"+{suffix}"][0])
    return dtype, ({"whisper_align": settings} if settings else {})


def precision_label(dtype: str, additional_config: dict) -> str:
    settings = additional_config.get("whisper_align", {})
    labels = [label for setting, label in VARIANT_SUFFIXES.values() if setting.items() <= settings.items()]
    return ", ".join([dtype, *labels])


def runner_parser(
    model_help: str, model_required: bool = True, engine: bool = False
) -> argparse.ArgumentParser:
    """The options every runner takes; ``engine`` adds this project's engine variant and batch size."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--model", required=model_required, default=None, help=model_help)
    parser.add_argument("--out", required=True)
    parser.add_argument("--model-name", default="tiny.en")
    if engine:
        parser.add_argument(
            "--dtype", default="float32", help="a dtype, or dtype+int8enc (int8 encoder linears)"
        )
        parser.add_argument("--max-num-seqs", type=int, default=32)
    return parser
