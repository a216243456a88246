"""An engine core whose front end is killed shuts itself down (engine/lifetime.py)."""

from __future__ import annotations

import subprocess
import sys

import psutil

from vllm_whisper_align.engine import vllm_internals

# A script of a user's: the offline API's engine up, then nothing (the test kills it).
FRONT_END = """
import time
from vllm_whisper_align import WhisperAligner
from vllm_whisper_align.checkpoints.bundled import default_model_path

if __name__ == "__main__":
    aligner = WhisperAligner(str(default_model_path()), max_num_seqs=2)
    aligner.__enter__()
    print("ready", flush=True)
    time.sleep(600)
"""


def engine_cores(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children(recursive=True) if "EngineCore" in " ".join(p.cmdline())]


def test_an_engine_whose_front_end_is_killed_stops(tmp_path):
    """SIGKILL leaves the front end no chance to stop its engine (so does SIGTERM to a script's Python):
    before engine.lifetime, the engine core ran on with no parent, 800 MB or more held, until killed by
    hand."""
    script = tmp_path / "front_end.py"
    script.write_text(FRONT_END)
    front_end = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    engines: list[psutil.Process] = []
    try:
        assert front_end.stdout is not None
        lines = iter(front_end.stdout.readline, "")  # vLLM logs to stdout too
        assert any(line.strip() == "ready" for line in lines), "the front end's engine did not start"
        engines = engine_cores(front_end.pid)
        assert len(engines) == 1
        front_end.kill()
        front_end.wait()
        _, alive = psutil.wait_procs(engines, timeout=60)
        assert not alive, "the engine core outlived its front end"
    finally:
        front_end.kill()
        for engine in engines:
            if engine.is_running():
                engine.kill()


def test_a_process_vllm_did_not_start_is_no_engine_core():
    """This test's process (a main process, as a user's script or the API server) is not taken for an
    engine core, so register() in it starts no watch of its parent."""
    assert not vllm_internals.in_engine_core_process()
