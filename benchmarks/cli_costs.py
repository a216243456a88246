"""What the CLI costs around its work: a command that ends before any engine, and an engine's stop.

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/cli_costs.py     # about 3 minutes

Each of ``--rounds`` rounds (3) runs, as ``python -m vllm_whisper_align.cli``:

- ``stream SAMPLE --server http://127.0.0.1:PORT`` with nothing on PORT: a client of a server that is
  not there, its one-line error (seconds in all);
- ``transcribe MISSING.wav``: one line, exit 1 (seconds in all);
- ``transcribe CLIP --word-timestamps --verbose --dtype float32 --max-num-seqs 4`` (an espeak-ng
  sentence): seconds in all; the engine's stop, from vLLM's "EngineCore: exiting busy loop" line to its
  "MPClient: complete" (what the front end waits for); and the exit, from that line to the process's end.

Prints the medians. Against an older commit: check it out in a worktree and put it first on
``PYTHONPATH`` (``python -m`` runs its CLI; the engine's processes inherit the path).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.support.servers import free_port  # noqa: E402
from tests.support.speech import sentence_clips, write_wav  # noqa: E402

CLI = [sys.executable, "-m", "vllm_whisper_align.cli"]
# Run from here, not from a checkout: ``-m`` puts the working directory first on the path.
NEUTRAL_CWD = tempfile.gettempdir()
ENGINE_OPTIONS = ["--dtype", "float32", "--max-num-seqs", "4"]
BUSY_LOOP_LEFT = "EngineCore: exiting busy loop"
FRONT_END_DONE = "MPClient: complete"


def seconds_of(args: list[str]) -> float:
    started = time.monotonic()
    subprocess.run([*CLI, *args], capture_output=True, timeout=300, cwd=NEUTRAL_CWD)
    return time.monotonic() - started


def transcription_times(clip: Path) -> tuple[float, float, float]:
    """(in all, the engine's stop, the exit after it) of one transcription, from its log lines' arrival."""
    command = [*CLI, "transcribe", str(clip), "--word-timestamps", "--verbose", *ENGINE_OPTIONS]
    started = time.monotonic()
    seen: dict[str, float] = {}
    with subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=NEUTRAL_CWD
    ) as process:
        assert process.stderr is not None
        for line in process.stderr:
            for mark in (BUSY_LOOP_LEFT, FRONT_END_DONE):
                if mark in line:
                    seen.setdefault(mark, time.monotonic())
    ended = time.monotonic()
    if process.returncode != 0 or len(seen) < 2:
        raise SystemExit(f"the transcription failed or logged no shutdown (exit {process.returncode})")
    return ended - started, seen[FRONT_END_DONE] - seen[BUSY_LOOP_LEFT], ended - seen[FRONT_END_DONE]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from vllm_whisper_align.checkpoints.bundled import sample_path

    with tempfile.TemporaryDirectory() as folder:
        clip = Path(folder) / "clip.wav"
        write_wav(clip, sentence_clips()[1].samples)
        rows: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            client = seconds_of(["stream", str(sample_path()), "--server", f"http://127.0.0.1:{free_port()}"])
            missing = seconds_of(["transcribe", str(Path(folder) / "missing.wav")])
            total, stop, exit_after = transcription_times(clip)
            for name, value in [
                ("stream --server, no server there: in all", client),
                ("transcribe a missing file: in all", missing),
                ("transcribe one clip: in all", total),
                ("  the engine's stop", stop),
                ("  the exit after it", exit_after),
            ]:
                rows.setdefault(name, []).append(value)
    print(f"PYTHONPATH={os.environ.get('PYTHONPATH', '')!r}, medians of {args.rounds} rounds (s):")
    for name, values in rows.items():
        print(f"  {name:44s} {statistics.median(values):6.2f}   ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
