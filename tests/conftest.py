"""Shared fixtures: one real vLLM engine per test session (starting one takes about a minute)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from vllm_whisper_align.checkpoints.bundled import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def aligner(model_dir):
    """The offline API over a real engine; float32 so parity with openai-whisper (float32) is fair."""
    from vllm_whisper_align.runners.offline import WhisperAligner

    engine = WhisperAligner(str(model_dir), dtype="float32", max_num_seqs=16)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def clips():
    from speech import sentence_clips

    return sentence_clips()


@pytest.fixture(scope="session")
def reference(model_dir):
    from reference import load_reference_model, reference_tokenizer

    model = load_reference_model(model_dir)
    return model, reference_tokenizer(model)


SERVER_START_TIMEOUT_S = 900
# running_server writes the server's stdout and stderr to this file in its log_dir.
SERVER_LOG = "server.log"


def _free_port() -> int:
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

    port = _free_port()
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
