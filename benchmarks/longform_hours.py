"""Hours of audio through `serve`'s defaults: forced alignment of one whole recording against its
transcription with word timestamps (issue #10's 3-hour case).

    .venv/bin/python benchmarks/longform_hours.py [--hours 0.05 0.2 3] [--rounds 1]

Each recording is benchmarks/audio.py's continuous alignment recording (about 5 minutes, every word's
start known) repeated to one of ``--hours`` (one server for all) and encoded as 16 kbps Opus in Ogg,
the compressed file a user would send (about 7 MB an hour). Each round posts it to /v1/audio/alignments
with its text, then to /v1/audio/transcriptions with word timestamps, one request at a time. Before each
request the server is left idle until it has emptied its encoder cache
(``memory.IDLE_BEFORE_RETURNING_MEMORY_S``), so neither request reuses the other's encoder outputs.
Prints wall times (medians over rounds), words returned and aligned, the alignment's start MAE against
the known starts in the first and the last hour, and the server's encoder-cache counters; writes
benchmarks/out/longform-hours.json. The one setting changed is the per-request limit on duration
(``VLLM_WHISPER_ALIGN_MAX_AUDIO_S``, an hour by default), raised to the longest recording's length.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "runners"))

from audio import alignment_truth  # noqa: E402
from common import load_wav, log  # noqa: E402
from vllm_http_run import capture_stats, free_port, idle_server, start_server, stop_server, wait_healthy  # noqa: E402

from vllm_whisper_align.constants import SAMPLE_RATE  # noqa: E402

OUT = HERE / "out"
RECORDING_ID = "align_continuous"
OPUS_BIT_RATE = 16_000
REQUEST_TIMEOUT_S = 3 * 3600


def encode_opus(samples: np.ndarray, path: Path) -> None:
    """Mono float samples at SAMPLE_RATE to Ogg/Opus at OPUS_BIT_RATE, with PyAV (vLLM's audio decoder)."""
    import av

    with av.open(str(path), "w", format="ogg") as container:
        stream = container.add_stream("libopus", rate=SAMPLE_RATE)
        stream.bit_rate = OPUS_BIT_RATE
        stream.layout = "mono"
        block = SAMPLE_RATE * 60
        for start in range(0, len(samples), block):
            piece = np.ascontiguousarray(samples[start : start + block], dtype=np.float32)[None, :]
            frame = av.AudioFrame.from_ndarray(piece, format="flt", layout="mono")
            frame.sample_rate = SAMPLE_RATE
            frame.pts = start
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


def wav_bytes(samples: np.ndarray) -> bytes:
    import io

    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, samples, SAMPLE_RATE, format="WAV")
    return buffer.getvalue()


async def warm_up(base: str, samples: np.ndarray) -> None:
    """One short request per door (the first 20 s of the recording) before the timed ones."""
    audio = wav_bytes(samples[: 20 * SAMPLE_RATE])
    _, body = await post(base, "/v1/audio/transcriptions", audio, {"response_format": "json"}, "warm.wav")
    await post(base, "/v1/audio/alignments", audio, {"text": body["text"]}, "warm.wav")


def build_recording(hours: float) -> tuple[Path, str, np.ndarray, float, np.ndarray]:
    """The repeated recording as Opus, its text, every word's true start, its duration, and the samples
    of one copy."""
    one = alignment_truth(OUT / "audio")[RECORDING_ID]
    samples = load_wav(one["path"])
    repeats = max(1, int(np.ceil(hours * 3600 / one["duration"])))
    copy_s = len(samples) / SAMPLE_RATE
    path = OUT / "audio" / f"{RECORDING_ID}-x{repeats}.ogg"
    if not path.exists():
        log(f"hours: encoding {repeats} copies ({repeats * copy_s / 3600:.2f} h) to {path}")
        encode_opus(np.tile(samples, repeats), path)
    starts = np.concatenate([np.asarray(one["starts"], dtype=float) + k * copy_s for k in range(repeats)])
    return path, " ".join([one["text"]] * repeats), starts, repeats * copy_s, samples


async def post(
    base: str, route: str, audio: bytes, fields: dict, name: str = "long.ogg"
) -> tuple[float, dict]:
    import httpx

    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http:
        started = time.perf_counter()
        response = await http.post(f"{base}{route}", files={"file": (name, audio)}, data=fields)
        elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed, response.json()


def start_errors_by_hour(words: list[dict], starts: np.ndarray) -> dict[str, float]:
    """Start MAE (ms) of the aligned words in the first and in the last hour: every word of the given
    text comes back in order, so word k is the text's word k."""
    if len(words) != len(starts):
        return {}
    got = np.array([w["start"] for w in words])
    ok = np.array([bool(w.get("aligned", True)) for w in words]) & ~np.isnan(starts)
    errors = np.abs(got - starts)
    first, last = ok & (starts < 3600), ok & (starts >= np.nanmax(starts) - 3600)
    return {
        "first_hour_mae_ms": round(1000 * float(errors[first].mean()), 1),
        "last_hour_mae_ms": round(1000 * float(errors[last].mean()), 1),
    }


async def one_round(base: str, audio: bytes, text: str, starts: np.ndarray) -> dict:
    row = {}
    await idle_server(base, (await capture_stats(base)).get("heap_returns", 0), timeout_s=120)
    seconds, body = await post(
        base, "/v1/audio/alignments", audio, {"text": text, "response_format": "verbose_json"}
    )
    words = body["words"]
    row["align_s"] = round(seconds, 1)
    row["align_words"] = len(words)
    row["align_words_aligned"] = sum(bool(w.get("aligned", True)) for w in words)
    row.update(start_errors_by_hour(words, starts))
    row["stats_after_align"] = await capture_stats(base)
    await idle_server(base, (await capture_stats(base)).get("heap_returns", 0), timeout_s=120)
    seconds, body = await post(
        base,
        "/v1/audio/transcriptions",
        audio,
        {"response_format": "verbose_json", "timestamp_granularities[]": "word", "language": "en"},
    )
    row["transcribe_s"] = round(seconds, 1)
    row["transcribe_words"] = len(body.get("words") or [])
    row["stats_after_transcribe"] = await capture_stats(base)
    return row


def section(summary: dict) -> list[str]:
    """RESULTS.md's section for this script's output (``summary``: the JSON it writes)."""
    lines = [
        "## Hours of audio through serve",
        "",
        f"`{summary['command']}` ({summary.get('date', '')}): `serve` with its defaults, the benchmark's "
        "continuous recording repeated to each length and sent as 16 kbps Opus, aligned to its text, then "
        "transcribed with word timestamps, one request at a time, the encoder cache emptied before each "
        "(*start MAE*: of the aligned words whose true start is in the recording's first / last hour):",
        "",
        "| recording | words | round | alignment s | transcription s | words aligned "
        "| start MAE, first hour ms | last hour ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for recording in summary["recordings"]:
        name = f"{_length(recording['duration_s'])}, {recording['file_mib']} MiB"
        for index, row in enumerate(recording["rounds"], 1):
            lines.append(
                f"| {name} | {recording['words']} | {index} | {row['align_s']} "
                f"| {row['transcribe_s']} | {row['align_words_aligned']} of {row['align_words']} "
                f"| {row.get('first_hour_mae_ms', '–')} | {row.get('last_hour_mae_ms', '–')} |"
            )
    lines.append("")
    for recording in summary["recordings"]:
        lines.append(
            f"- {_length(recording['duration_s'])}: alignment runs at "
            f"{recording['alignment_speed_vs_transcription']:.2f}× transcription's speed "
            "(medians; target ≥ 1×)."
        )
    return lines + [""]


def _length(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def measure(base: str, recording: tuple, rounds: int) -> dict:
    """One recording (:func:`build_recording`'s), aligned and transcribed ``rounds`` times (the
    server's duration limit must allow it): its figures."""
    path, text, starts, duration, _ = recording
    audio = path.read_bytes()
    rows = []
    for index in range(rounds):
        row = asyncio.run(one_round(base, audio, text, starts))
        log(
            f"hours: {duration / 3600:.2f} h, round {index + 1}: alignment {row['align_s']} s, transcription "
            f"{row['transcribe_s']} s, {row['align_words_aligned']}/{row['align_words']} words aligned"
        )
        rows.append(row)
    align = statistics.median(r["align_s"] for r in rows)
    transcribe = statistics.median(r["transcribe_s"] for r in rows)
    print(
        f"{duration / 3600:.2f} h ({len(starts)} words, {len(audio) / 2**20:.1f} MiB Opus): alignment "
        f"{align:.1f} s, transcription {transcribe:.1f} s (medians of {len(rows)}): alignment runs "
        f"{transcribe / align:.2f}x transcription's speed"
    )
    return {
        "recording": str(path.relative_to(HERE.parent)),
        "duration_s": round(duration, 1),
        "file_mib": round(len(audio) / 2**20, 1),
        "words": len(starts),
        "rounds": rows,
        "median_align_s": align,
        "median_transcribe_s": transcribe,
        "alignment_speed_vs_transcription": round(transcribe / align, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hours", type=float, nargs="+", default=[3.0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    from vllm_whisper_align.runners.service import MAX_AUDIO_ENV

    recordings = [build_recording(hours) for hours in args.hours]
    longest = max(duration for _, _, _, duration, _ in recordings)
    os.environ[MAX_AUDIO_ENV] = str(int(longest) + 60)  # the server inherits it
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(None, "default", 32, port, OUT / "logs" / "longform-hours-server.log")
    try:
        wait_healthy(base, server)
        asyncio.run(warm_up(base, recordings[0][4]))  # every recording repeats the same copy
        figures = [measure(base, recording, args.rounds) for recording in recordings]
    finally:
        stop_server(server)
    summary = {
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join([".venv/bin/python", "benchmarks/longform_hours.py", *sys.argv[1:]]),
        "recordings": figures,
    }
    (OUT / "longform-hours.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
