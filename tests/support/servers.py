"""Servers started for tests and benchmarks, and what their tests share."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.speech import SpokenClip, sentence_clips, synthesize_words, write_wav

SERVER_START_TIMEOUT_S = 900


# running_server writes the server's stdout and stderr to this file in its log_dir.
SERVER_LOG = "server.log"

# The settings of the default server the server tests share (tests/server/conftest.py): how much audio
# it takes waiting, how many live streams it holds at once, and how long one at rest (or an upload) may
# send nothing. Small enough to be reached in a test: two streams of one test, and a third still
# closing from the test before.
MAX_AUDIO_S = 120
MAX_LIVE_STREAMS = 3
IDLE_S = 10
SHARED_SERVER_ENV = {
    "VLLM_WHISPER_ALIGN_MAX_AUDIO_S": str(MAX_AUDIO_S),
    "VLLM_WHISPER_ALIGN_MAX_LIVE_STREAMS": str(MAX_LIVE_STREAMS),
    "VLLM_WHISPER_ALIGN_BODY_IDLE_S": str(IDLE_S),
}
# The narrow server's engines run this many requests at once: a few windows already make a long
# recording wait.
TWO_AT_A_TIME = 2
# The guarded server (tests/server/conftest.py) answers only this API key, and cuts off an upload that
# sends nothing for BODY_IDLE_S.
API_KEY = "hardening-test-key"
BODY_IDLE_S = 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Engine settings a server must decide for itself: the offline engine of this test process (the
# ``aligner`` fixture) sets them in os.environ for its own processes, and a server started later would
# inherit them as the user's (a one-engine thread binding breaks data parallelism).
ENGINE_ENVIRONMENT = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND")


def server_environment(env: dict | None = None) -> dict[str, str]:
    """This process's environment without ENGINE_ENVIRONMENT, then ``env`` (the test's own)."""
    clean = {name: value for name, value in os.environ.items() if name not in ENGINE_ENVIRONMENT}
    return {**clean, **(env or {})}


@contextlib.contextmanager
def running_server(
    model: str | Path, log_dir: Path, served_name: str | None = None, env: dict | None = None, args=()
):
    """`vllm-whisper-align serve MODEL` in a subprocess; yields its base URL once /health answers.

    Without ``served_name`` the server picks its own (a name, not MODEL's path); the KV cache is
    serve's own default, sized to the model.
    """
    import httpx

    port = free_port()
    log_path = log_dir / SERVER_LOG
    command = [
        str(Path(sys.executable).parent / "vllm-whisper-align"),
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-num-seqs",
        "32",
        *(["--served-model-name", served_name] if served_name else []),
        *args,
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=server_environment(env))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"server exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"server did not start:\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        yield base
    finally:
        stop_process(process)


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 30 s."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


def whisper_align_args(**options) -> list[str]:
    """``serve`` arguments setting the plugin's own options (``--additional-config``)."""
    return ["--additional-config", json.dumps({"whisper_align": options})]


def wav_bytes(clip_or_samples) -> bytes:
    """A clip's samples (any clip: synthetic or a real recording) or bare samples as WAV bytes."""
    samples = getattr(clip_or_samples, "samples", clip_or_samples)
    buffer = io.BytesIO()
    write_wav(buffer, samples)
    return buffer.getvalue()


def send_alignments(server: str, clips, audio=None, **fields: str) -> list[httpx.Response]:
    """Every clip's forced alignment with its text (of ``audio``'s samples where given) through
    ``server``'s /v1/audio/alignments, all sent at once, with the form's other ``fields``."""

    async def send_all():
        async with httpx.AsyncClient(timeout=600) as http:
            return await asyncio.gather(
                *(
                    http.post(
                        f"{server}/v1/audio/alignments",
                        files={
                            "file": ("c.wav", wav_bytes(clip if audio is None else audio[i]), "audio/wav")
                        },
                        data={"text": clip.text, **fields},
                    )
                    for i, clip in enumerate(clips)
                )
            )

    return asyncio.run(send_all())


def forced_at_once(server: str, clips, audio=None, **fields: str) -> list[dict]:
    """:func:`send_alignments`, every answer asserted a 200: their bodies."""
    responses = send_alignments(server, clips, audio, **fields)
    assert all(response.status_code == 200 for response in responses), [r.text for r in responses]
    return [response.json() for response in responses]


# A transcription whose windows fail openai-whisper's thresholds at every temperature keeps its most
# likely attempt, often the greedy one, at an avg_logprob below -1: a guess. vLLM's float32 kernels
# sum in another order for another batch, and such a guess can flip a word ("water" / "worm" in
# clips 0 and 8 of distinct_clips). Tests that compare a clip alone with the same clip in a batch
# exempt a transcription that is a guess on either side (which side flips to the other is chance);
# confident answers are not exempt, and at most MAX_GUESSES of 16 clips may be guesses, so the
# comparison keeps its teeth. avg_logprob comes in the segments, which come back only when asked for
# (OpenAI's rule): such tests ask for both granularities.
GUESS_LOGPROB = -1.0


MAX_GUESSES = 3


def is_guess(*avg_logprobs: float) -> bool:
    return any(logprob < GUESS_LOGPROB for logprob in avg_logprobs)


def distinct_clips(count: int) -> list[SpokenClip]:
    """Different sentences with different gap patterns: every clip's audio is unique."""
    sentences = [c.words for c in sentence_clips()]
    return [
        synthesize_words(sentences[i % len(sentences)], gap_s=0.15 + 0.1 * (i // len(sentences)))
        for i in range(count)
    ]


def engine_counts(server: str) -> dict[str, float]:
    """vLLM's own Prometheus gauges: requests in the engine (running and waiting)."""
    text = httpx.get(f"{server}/metrics", timeout=30).text
    counts = {}
    for name in ("running", "waiting"):
        values = re.findall(rf"^vllm:num_requests_{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
        counts[name] = sum(float(value) for value in values)
    return counts


def disconnect_mid_request(base: str, audio: bytes) -> None:
    """Posts ``audio`` for word timestamps and closes the connection once its windows are in the
    engines (vLLM's running/waiting gauges), before the answer."""

    async def post_then_disconnect() -> None:
        async with httpx.AsyncClient(timeout=600) as http:
            request = asyncio.ensure_future(
                http.post(
                    f"{base}/v1/audio/transcriptions",
                    files={"file": ("long.wav", audio, "audio/wav")},
                    data={"response_format": "verbose_json", "timestamp_granularities[]": "word"},
                )
            )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until the windows are in the engines
                counts = await asyncio.to_thread(engine_counts, base)
                if counts["running"] + counts["waiting"] > 0:
                    break
                await asyncio.sleep(0.05)
            assert not request.done(), "the request finished before the client could leave"
            request.cancel()  # closes the connection

    asyncio.run(post_then_disconnect())


def transcribe_raw(server: str, audio: bytes, headers: dict | None = None, **fields) -> httpx.Response:
    """POST ``audio`` to /v1/audio/transcriptions with form ``fields`` (a list: the field repeated)."""
    data = {
        name: [str(v) for v in value] if isinstance(value, list) else str(value)
        for name, value in fields.items()
    }
    return httpx.post(
        f"{server}/v1/audio/transcriptions",
        files={"file": ("clip.wav", audio, "audio/wav")},
        data=data,
        headers=headers,
        timeout=600,
    )


def assert_openai_error(response: httpx.Response, param_or_text: str, status: int = 400) -> None:
    """``response`` is a ``status`` with OpenAI's error body naming ``param_or_text``."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert param_or_text in (error.get("param") or "") + error["message"]
