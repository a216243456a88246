"""The layouts a cluster uses, on one machine, through real server processes and real engines.

- data parallel 2 on one host, behind one API server;
- two "hosts" as two processes on localhost: the API with data-parallel rank 0, and a
  ``--headless`` process with rank 1, wired by ``--data-parallel-address/--data-parallel-rpc-port``
  as vLLM documents multi-node data parallelism. The API side runs vLLM's default of one API server
  per data-parallel rank: two API servers, each sending to both engines. (Two API servers in front
  of one engine were a layout of their own here, which this one covers: each layout's start costs
  about a minute of the suite.)

In each: 16 concurrent requests (8 transcriptions and 8 alignments, all with words), each
answer equal to its file served alone (text equal, word starts within 0.02 s; a transcription the
model only guesses, see test_server.GUESS_LOGPROB, is exempt), the capture
stats back to zero afterwards, and a client that goes away freeing its capture on whichever
engine held it. float32, as every server test here: its answers do not depend on the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support.servers import (
    MAX_GUESSES,
    SERVER_LOG,
    disconnect_mid_request,
    distinct_clips,
    engine_counts,
    free_port,
    is_guess,
    running_server,
    server_environment,
    stop_process,
    wav_bytes,
    whisper_align_args,
)
from tests.support.speech import long_clip

# Each sent twice in the burst: transcribed, and aligned to its text. Eight different sentences:
# an answer swapped between requests would fail the text comparison.
CLIPS = 8
WORD_START_TOLERANCE_S = 0.02
# Capture stats that count what is held for requests; the others (slots, slot_bytes) describe
# the store itself.
HELD_STATS = ("tracked", "parked", "parked_bytes", "no_speech_pending", "no_speech_parked")
# The "second host" binds its threads to the core the first one leaves it: on one machine the two
# processes would otherwise both take every core (each believes it is alone on its host).
FRONT_CORES, HEADLESS_CORES = "0", "1"

LAYOUTS = ("data-parallel-2", "two-hosts")
ENGINES = 2  # in each layout


@contextlib.contextmanager
def headless_engine(model: Path, log_path: Path, args: list[str], env: dict[str, str]):
    """`vllm-whisper-align serve MODEL --headless ...`: engines only, no API (the second host)."""
    command = [
        str(Path(sys.executable).parent / "vllm-whisper-align"),
        "serve",
        str(model),
        "--headless",
        "--dtype",
        "float32",
        "--max-num-seqs",
        "32",
        *args,
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=server_environment(env))
    try:
        yield process
    finally:
        stop_process(process)


@dataclass(frozen=True)
class Layout:
    base: str  # the API's URL
    log: Path  # the API process's log
    served_at_start: dict[str, float]  # requests_per_engine once the server answered, before any test


@pytest.fixture(scope="module", params=LAYOUTS)
def layout(request, model_dir, tmp_path_factory):
    """A server in the layout ``request.param``."""
    log_dir = tmp_path_factory.mktemp(request.param)
    with contextlib.ExitStack() as stack:
        if request.param == "data-parallel-2":
            args, env = ["--data-parallel-size", "2", "--api-server-count", "1"], {}
        else:
            wiring = [
                "--data-parallel-size",
                "2",
                "--data-parallel-size-local",
                "1",
                "--data-parallel-address",
                "127.0.0.1",
                "--data-parallel-rpc-port",
                str(free_port()),
            ]
            stack.enter_context(
                headless_engine(
                    model_dir,
                    log_dir / "headless.log",
                    [*wiring, "--data-parallel-start-rank", "1"],
                    {"VLLM_CPU_OMP_THREADS_BIND": HEADLESS_CORES},
                )
            )
            args, env = wiring, {"VLLM_CPU_OMP_THREADS_BIND": FRONT_CORES}
        # each request its own window, so that concurrent answers equal each file alone (packing would
        # give a clip its neighbours as context: tests/server/test_server.py tests that)
        args = [*args, *whisper_align_args(packing=False)]
        base = stack.enter_context(running_server(model_dir, log_dir, args=args, env=env))
        yield Layout(base, log_dir / SERVER_LOG, requests_per_engine(base))


async def _transcribe(http: httpx.AsyncClient, base: str, audio: bytes) -> dict:
    response = await http.post(
        f"{base}/v1/audio/transcriptions",
        files={"file": ("c.wav", audio, "audio/wav")},
        data={"response_format": "verbose_json", "timestamp_granularities[]": ["word", "segment"]},
    )
    assert response.status_code == 200, response.text
    return response.json()


async def _align(http: httpx.AsyncClient, base: str, audio: bytes, text: str) -> dict:
    response = await http.post(
        f"{base}/v1/audio/alignments",
        files={"file": ("c.wav", audio, "audio/wav")},
        data={"text": text, "response_format": "verbose_json"},
    )
    assert response.status_code == 200, response.text
    return response.json()


def requests_per_engine(base: str) -> dict[str, float]:
    """vLLM's own counter of finished requests, per engine index."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    served: dict[str, float] = {}
    for labels, value in re.findall(r"^vllm:request_success_total\{([^}]*)\} (\S+)$", text, re.MULTILINE):
        engine = re.search(r'engine="(\d+)"', labels).group(1)
        served[engine] = served.get(engine, 0.0) + float(value)
    return served


def held_stats(base: str) -> dict[str, int]:
    stats = httpx.get(f"{base}/v1/audio/alignments/stats", timeout=30).json()
    return {name: stats[name] for name in HELD_STATS}


def assert_same_answer(single: dict, batched: dict) -> None:
    assert batched["text"] == single["text"]
    assert [w["word"] for w in batched["words"]] == [w["word"] for w in single["words"]]
    np.testing.assert_allclose(
        [w["start"] for w in batched["words"]],
        [w["start"] for w in single["words"]],
        atol=WORD_START_TOLERANCE_S + 1e-6,
    )


def test_every_engine_is_warmed_up_before_the_server_answers(layout):
    """The server transcribes its bundled clip once for each engine before it answers
    (``AlignmentService.warm_up``): an engine compiles vLLM's logprob ranks at the first request that
    asks for logprobs, and a client's first request paid for it."""
    served = layout.served_at_start
    assert len(served) == ENGINES and min(served.values()) >= 1, served


def test_concurrent_answers_equal_each_file_alone(layout):
    base = layout.base
    served_before = requests_per_engine(base)
    clips = distinct_clips(CLIPS)
    audios = [wav_bytes(clip) for clip in clips]

    def requests(http):
        return [_transcribe(http, base, audio) for audio in audios] + [
            _align(http, base, audio, clip.text) for audio, clip in zip(audios, clips, strict=True)
        ]

    async def alone_then_together():
        async with httpx.AsyncClient(timeout=900) as http:
            alone = [await request for request in requests(http)]
            together = await asyncio.gather(*requests(http))
        return alone, together

    alone, together = asyncio.run(alone_then_together())
    guesses = 0
    for single, batched in zip(alone[:CLIPS], together[:CLIPS], strict=True):
        assert single["segments"] and batched["segments"]  # avg_logprob is there to be read
        if is_guess(*(segment["avg_logprob"] for segment in single["segments"] + batched["segments"])):
            guesses += 1
            assert batched["words"]  # answered all the same
            continue
        assert_same_answer(single, batched)
    for single, batched in zip(alone[CLIPS:], together[CLIPS:], strict=True):  # alignments: no guesses
        assert_same_answer(single, batched)
    assert guesses <= MAX_GUESSES, guesses
    assert held_stats(base) == dict.fromkeys(HELD_STATS, 0)
    # Every engine served some of them: the answers above came from each engine's own capture.
    served = {engine: n - served_before.get(engine, 0) for engine, n in requests_per_engine(base).items()}
    assert len(served) == ENGINES and all(count > 0 for count in served.values()), served


def test_disconnect_frees_the_capture_on_the_engine_that_held_it(layout):
    """Four 30 s windows go to the engines (with data parallelism, to both); the client leaves while
    they run: they are aborted, the engines empty, and every engine's capture is back to zero."""
    base, log = layout.base, layout.log
    audio = wav_bytes(long_clip(110.0))
    aborts_before = log.read_text().count("the client went away")
    disconnect_mid_request(base, audio)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        counts, held = engine_counts(base), held_stats(base)
        if counts["running"] + counts["waiting"] == 0 and not any(held.values()):
            break
        time.sleep(0.5)
    assert log.read_text().count("the client went away") == aborts_before + 1, log.read_text()[-3000:]
    assert counts["running"] + counts["waiting"] == 0, counts
    assert held == dict.fromkeys(HELD_STATS, 0)


@pytest.mark.parametrize(
    "flag, env", [("--grpc", {}), (None, {"VLLM_USE_RUST_FRONTEND": "1"})], ids=["grpc", "rust-front-end"]
)
def test_front_ends_without_endpoint_plugins_are_refused_at_start(flag, env):
    """They would serve transcriptions without word timestamps: one clear line, before any engine."""
    command = [str(Path(sys.executable).parent / "vllm-whisper-align"), "serve", *([flag] if flag else [])]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, **env), timeout=120)
    assert done.returncode == 2, done.stderr
    assert "does not load this plugin's endpoints" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "given",
    [
        ["--additional-config", '{"whisper_align": {"dereverberate": "yes"}}'],
        ['--additional-config={"whisper_align": {"packing": 1}}'],
        ["--additional-config", '{"whisper_align": {"pakcing": true}}'],
        ["--additional-config.whisper_align.dereverberate", "yes"],
        ["--additional-config.whisper_align.pakcing=true"],
    ],
    ids=["switch", "switch-with-equals", "unknown", "dotted", "dotted-unknown"],
)
def test_a_bad_plugin_option_is_refused_at_start_in_one_line(given):
    """Read before vLLM starts: one line and exit 2 in a moment, not an engine core failing with a
    traceback after tens of seconds."""
    command = [str(Path(sys.executable).parent / "vllm-whisper-align"), "serve", *given]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith("vllm-whisper-align: error: ") and "whisper_align" in line, line
