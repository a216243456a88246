"""Live word timestamps on /v1/realtime: how late the words come, how they compare with the offline
transcription of the same audio, and how many real-time streams one server holds.

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/streaming_bench.py     # a few minutes
    .venv/bin/python benchmarks/streaming_bench.py --server http://127.0.0.1:8000 --max-streams 2  # a smoke

It starts `vllm-whisper-align serve` with its defaults (tiny.en; the dtype serve picks for this CPU:
bfloat16 with AVX512-BF16, float32 without; `--dtype` names another) unless --server names one, and
streams with the `websockets` client, 100 ms of PCM16 a message, at real time:

- one stream at a time: espeak-ng sentences (exact word starts, tests/support/speech.py) and real speech
  (tests/support/real_speech.py, joined with their own pauses), each recording its own stream. Per
  confirmed word, its delay: when its transcription.word arrived, less when the audio of the word's end
  (its own `end`) was sent. The words against the offline transcription of the same audio (one plain
  request: word error rate, the offline words as reference), and both against the truth: the share of
  truth words whose start is within 50 ms (a word neither heard is a miss).
- N streams at once (different sentences, each at real time) for N = 1, 2, 4, ... until the median delay
  of a level passes 2 s, then the levels between the last held and it: the most streams whose median
  stays within it.

- one stream beside bulk HTTP load (`--bulk 0,8,32`): N clients each post a long recording of real
  speech (word timestamps, one request after another) while a real-speech recording streams at real
  time; per level the stream's delays, and the audio seconds the bulk clients got transcribed per
  wall second (from their first request to the end of the last, which they finish after the stream);
  and meanwhile one more client posts a 6 s clip (one espeak sentence) a second after each answer: how
  long it waits.
  `--bulk-only` runs this part alone; `--serve-args` passes flags to serve (e.g. vLLM's
  `--scheduling-policy fcfs`, to compare with serve's default).

The word error rate is also given per kind of speech: the synthetic sentences' and the real speech's.

Writes benchmarks/out/streaming.json and prints a section for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(HERE / "runners"))
from common import DEFAULT_VARIANT, cpu_description  # noqa: E402
from vllm_http_run import engine_dtype, free_port, start_server, stop_server, wait_healthy  # noqa: E402

from tests.support import real_speech  # noqa: E402
from tests.support.servers import wav_bytes  # noqa: E402
from tests.support.speech import concatenate_clips, sentence_clips, start_errors, word_errors  # noqa: E402
from vllm_whisper_align.constants import SAMPLE_RATE  # noqa: E402

OUT = HERE / "out" / "streaming.json"
CHUNK_S = 0.1
MAX_MEDIAN_DELAY_S = 2.0
WITHIN_S = 0.05
# The real-speech recordings streamed one at a time (joined clips: real pauses between sentences).
REAL_RECORDINGS = 3


def plain(word: str) -> str:
    return word.strip(" .,!?;:\"'").lower()


async def stream(url: str, samples: np.ndarray) -> list[dict]:
    """``samples`` at real time; each confirmed word with ``delay`` (s after its end was sent)."""
    import websockets

    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    step = int(CHUNK_S * SAMPLE_RATE)
    words: list[dict] = []
    async with websockets.connect(url, max_size=2**26) as socket:
        await socket.recv()  # session.created
        started = time.monotonic()

        async def send() -> None:
            for index, begin in enumerate(range(0, len(pcm), step)):
                await asyncio.sleep(max(0.0, started + index * CHUNK_S - time.monotonic()))
                audio = base64.b64encode(pcm[begin : begin + step].tobytes()).decode()
                await socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            await socket.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))

        sender = asyncio.create_task(send())
        while True:
            event = json.loads(await socket.recv())
            if event["type"] == "transcription.word":
                arrived = time.monotonic() - started
                # The audio up to the word's end was sent with the chunk that holds it.
                end_sent = np.ceil(event["end"] / CHUNK_S) * CHUNK_S
                words.append({**event, "delay": arrived - min(end_sent, len(samples) / SAMPLE_RATE)})
            elif event["type"] in ("transcription.done", "error"):
                assert event["type"] == "transcription.done", event
                break
        await sender
    return words


def offline_words(server: str, samples: np.ndarray) -> list[dict]:
    response = httpx.post(
        f"{server}/v1/audio/transcriptions",
        files={"file": ("clip.wav", wav_bytes(samples), "audio/wav")},
        data={"response_format": "verbose_json", "timestamp_granularities[]": "word"},
        timeout=600,
    )
    response.raise_for_status()
    return response.json()["words"]


def within(clip, words: list[dict]) -> tuple[int, int]:
    """Truth words (with a known start) whose start is within WITHIN_S, and how many there are."""
    errors = start_errors(clip, words)
    known = ~np.isnan(errors)
    return int((errors[known] <= WITHIN_S).sum()), int(known.sum())


def recordings(num_real: int = REAL_RECORDINGS) -> list[tuple[str, object]]:
    sentences = sentence_clips()
    synthetic = [("synthetic", concatenate_clips(sentences[i : i + 4])) for i in (0, 4)]
    joined = real_speech.joined_with_pauses(real_speech.load_clips(log=lambda *_: None))
    return synthetic + [("real", clip) for clip in joined[:num_real]]


def one_at_a_time(server: str, url: str) -> dict:
    rows = []
    for kind, clip in recordings():
        streamed = asyncio.run(stream(url, clip.samples))
        offline = offline_words(server, clip.samples)
        reference, heard = [plain(w["word"]) for w in offline], [plain(w["word"]) for w in streamed]
        rows.append(
            {
                "kind": kind,
                "seconds": round(len(clip.samples) / SAMPLE_RATE, 2),
                "delays": [round(w["delay"], 3) for w in streamed],
                "word_errors": word_errors(reference, heard),
                "offline_words": len(reference),
                "streamed_within": within(clip, streamed),
                "offline_within": within(clip, offline),
            }
        )
        print(
            f"  {kind} {rows[-1]['seconds']} s: median delay {np.median(rows[-1]['delays']):.2f} s",
            flush=True,
        )
    return {"recordings": rows, **summary(rows)}


def summary(rows: list[dict]) -> dict:
    delays = [d for row in rows for d in row["delays"]]
    out = {"median_delay_s": float(np.median(delays)), "p90_delay_s": float(np.percentile(delays, 90))}
    out["wer_vs_offline"] = wer(rows)
    for kind in ("synthetic", "real"):
        chosen = [r for r in rows if r["kind"] == kind]
        out[f"{kind}_wer_vs_offline"] = wer(chosen) if chosen else None
        for side in ("streamed", "offline"):
            hits, total = (sum(r[f"{side}_within"][k] for r in chosen) for k in (0, 1))
            out[f"{kind}_{side}_within_50ms"] = hits / total if total else None
    return out


def wer(rows: list[dict]) -> float:
    return sum(r["word_errors"] for r in rows) / sum(r["offline_words"] for r in rows)


async def at_once(url: str, clips: list) -> list[float]:
    words = await asyncio.gather(*(stream(url, clip.samples) for clip in clips))
    return [w["delay"] for stream_words in words for w in stream_words]


def concurrency(url: str, max_streams: int) -> dict:
    """Levels of 1, 2, 4, ... streams until one's median delay passes MAX_MEDIAN_DELAY_S, then the
    levels between the last one held and it, one by one: the most streams held."""
    sentences = sentence_clips()
    levels: list[dict] = []

    def level(count: int) -> bool:
        clips = [
            concatenate_clips([sentences[(i + k) % len(sentences)] for k in range(3)]) for i in range(count)
        ]
        delays = asyncio.run(at_once(url, clips))
        median = float(np.median(delays))
        levels.append(
            {"streams": count, "median_delay_s": median, "p90_delay_s": float(np.percentile(delays, 90))}
        )
        print(f"  {count} streams: median delay {median:.2f} s", flush=True)
        return median <= MAX_MEDIAN_DELAY_S

    held, count = 0, 1
    while count <= max_streams and level(count):
        held, count = count, count * 2
    for between in range(held + 1, min(count, max_streams + 1)):
        if not level(between):
            break
        held = between
    levels.sort(key=lambda lv: lv["streams"])
    return {"levels": levels, "streams_held": held}


def beside_bulk(server: str, url: str, levels: list[int]) -> list[dict]:
    """For each N of ``levels``: one real-speech stream at real time while N clients post long files."""
    joined = real_speech.joined_with_pauses(real_speech.load_clips(log=lambda *_: None))
    live = np.concatenate([clip.samples for clip in joined[:4]])
    body = wav_bytes(np.concatenate([clip.samples for clip in joined[4:]]))
    bulk_seconds = sum(len(clip.samples) for clip in joined[4:]) / SAMPLE_RATE
    rows = []
    for count in levels:
        delays, shorts, done, bulk_wall = asyncio.run(_stream_beside(server, url, live, body, count))
        rows.append(
            {
                "bulk_clients": count,
                "median_delay_s": float(np.median(delays)),
                "p90_delay_s": float(np.percentile(delays, 90)),
                "max_delay_s": float(np.max(delays)),
                "bulk_audio_s_per_s": done * bulk_seconds / bulk_wall if count else None,
                "short_clips": len(shorts),
                "short_median_s": float(np.median(shorts)),
                "short_p90_s": float(np.percentile(shorts, 90)),
            }
        )
        print(f"  {count} bulk clients: {rows[-1]}", flush=True)
    return rows


async def _transcribed(http: httpx.AsyncClient, server: str, audio: bytes) -> None:
    """``audio`` transcribed with word timestamps, as the bench's other clients ask."""
    response = await http.post(
        f"{server}/v1/audio/transcriptions",
        files={"file": ("audio.wav", audio, "audio/wav")},
        data={"response_format": "verbose_json", "timestamp_granularities[]": "word"},
    )
    response.raise_for_status()


async def _stream_beside(
    server: str, url: str, live: np.ndarray, body: bytes, count: int
) -> tuple[list[float], list[float], int, float]:
    """The live stream's delays, the short clip's answer times, the bulk files done, and the bulk
    clients' wall time: each posts its file again and again until the stream has ended, then finishes
    the request it is in."""
    stop, done, short_latencies = asyncio.Event(), [0], []
    short = wav_bytes(sentence_clips()[2].samples)

    async def short_client() -> None:
        """A 6 s clip posted, answered, then posted again a second later, while the stream runs."""
        async with httpx.AsyncClient(timeout=3600) as http:
            while not stop.is_set():
                posted = time.monotonic()
                await _transcribed(http, server, short)
                short_latencies.append(time.monotonic() - posted)
                await asyncio.sleep(1)

    async def client() -> None:
        async with httpx.AsyncClient(timeout=3600) as http:
            while not stop.is_set():
                await _transcribed(http, server, body)
                done[0] += 1

    started = time.monotonic()
    clients = [asyncio.create_task(client()) for _ in range(count)]
    await asyncio.sleep(10 if count else 0)  # the engines busy with bulk windows before the stream
    shorts = asyncio.create_task(short_client())
    words = await stream(url, live)
    stop.set()
    await asyncio.gather(*clients, shorts)
    return [w["delay"] for w in words], short_latencies, done[0], time.monotonic() - started


@contextlib.contextmanager
def default_server(log_path: Path, dtype: str | None, extra_args: list[str]):
    """`vllm-whisper-align serve` as a user starts it (``dtype`` None: its own pick); yields its URL."""
    port = free_port()
    proc = start_server(None, dtype or DEFAULT_VARIANT, 32, port, log_path, extra_args)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(proc)


def server_in(
    stack: contextlib.ExitStack, server: str | None, dtype: str | None, serve_args: str
) -> tuple[str, str]:
    """``server``, or `serve` started with its defaults (``dtype`` None: its own pick; ``serve_args``
    added) for the life of ``stack``; and the dtype it runs."""
    if server is not None:
        return server, "serve's own"
    log_path = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "server.log"
    server = stack.enter_context(default_server(log_path, dtype, shlex.split(serve_args)))
    return server, engine_dtype(log_path)


def run_facts(script: str, dtype: str) -> dict:
    """When, by which command, on which machine a run of ``script`` (benchmarks/NAME) was taken."""
    return {
        "taken": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join(
            ["flock", "-x", "/tmp/vwa-bench.lock", ".venv/bin/python", f"benchmarks/{script}", *sys.argv[1:]]
        ),
        "cpu": cpu_description(),
        "cores": len(os.sched_getaffinity(0)),
        "dtype": dtype,
        "python": platform.python_version(),
    }


def report(result: dict) -> str:
    lines = [
        "## Live word timestamps (/v1/realtime)",
        "",
        f"Taken {result['taken']} under `flock -x /tmp/vwa-bench.lock` by:",
        "",
        "```",
        result["command"],
        "```",
        "",
        f"- Machine: {result['cpu']}, {result['cores']} cores; tiny.en {result.get('dtype', 'float32')} on "
        "`vllm-whisper-align serve`",
    ]
    if "one_stream" in result:
        lines += _report_streams(result)
    if result.get("beside_bulk"):
        lines += [
            "",
            "| bulk HTTP clients | live delay, median | p90 | max | short clip answered in, median / p90 "
            "| bulk audio-s / wall-s |",
            "|---|---|---|---|---|---|",
            *(
                f"| {row['bulk_clients']} | {row['median_delay_s']:.2f} s | {row['p90_delay_s']:.2f} s | "
                f"{row['max_delay_s']:.2f} s | {row['short_median_s']:.2f} / {row['short_p90_s']:.2f} s "
                f"({row['short_clips']}) | {row['bulk_audio_s_per_s'] or 0:.1f} |"
                for row in result["beside_bulk"]
            ),
            "",
        ]
    return "\n".join(lines)


def _report_streams(result: dict) -> list[str]:
    one, many = result["one_stream"], result["concurrency"]

    def pct(value):
        return "–" if value is None else f"{100 * value:.1f}%"

    lines = [
        f"- Audio, one stream at a time at real time: {len(one['recordings'])} recordings, "
        f"{sum(r['seconds'] for r in one['recordings']):.0f} s (espeak-ng sentences and joined real speech)",
        "",
        "| one stream | figure | target |",
        "|---|---|---|",
        f"| delay, word end to its arrival, median | {one['median_delay_s']:.2f} s | <= 2 s |",
        f"| delay, p90 | {one['p90_delay_s']:.2f} s | <= 3.5 s |",
        f"| WER of the streamed words against offline | {pct(one['wer_vs_offline'])} | <= 5% |",
        f"| WER against offline, synthetic / real | {pct(one.get('synthetic_wer_vs_offline'))} / "
        f"{pct(one.get('real_wer_vs_offline'))} | |",
        *(
            f"| starts within 50 ms, {kind}: streamed / offline | {pct(one[f'{kind}_streamed_within_50ms'])}"
            f" / {pct(one[f'{kind}_offline_within_50ms'])} | offline - 10 points at most |"
            for kind in ("synthetic", "real")
        ),
        "",
        "| streams at once | median delay | p90 delay |",
        "|---|---|---|",
        *(
            f"| {lv['streams']} | {lv['median_delay_s']:.2f} s | {lv['p90_delay_s']:.2f} s |"
            for lv in many["levels"]
        ),
        "",
        f"Streams held with the median delay within 2 s: {many['streams_held']}.",
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server", default=None, help="a running server (default: start one)")
    parser.add_argument("--max-streams", type=int, default=16)
    parser.add_argument("--dtype", default=None, help="the server's dtype (default: serve's own pick)")
    parser.add_argument("--bulk", default="", help="bulk HTTP clients beside one stream, e.g. 0,8,32")
    parser.add_argument("--bulk-only", action="store_true", help="only the --bulk levels")
    parser.add_argument("--serve-args", default="", help="flags for serve: '--scheduling-policy fcfs'")
    args = parser.parse_args()
    levels = [int(n) for n in args.bulk.split(",") if n]
    result: dict = {}
    with contextlib.ExitStack() as stack:
        server, dtype = server_in(stack, args.server, args.dtype, args.serve_args)
        url = server.replace("http://", "ws://") + "/v1/realtime"
        if not args.bulk_only:
            print("one stream at a time", flush=True)
            result["one_stream"] = one_at_a_time(server, url)
            print("streams at once", flush=True)
            result["concurrency"] = concurrency(url, args.max_streams)
        if levels:
            print("one stream beside bulk HTTP clients", flush=True)
            result["beside_bulk"] = beside_bulk(server, url, levels)
    result |= run_facts("streaming_bench.py", dtype)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    print(report(result))


if __name__ == "__main__":
    main()
