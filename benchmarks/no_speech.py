"""Which windows hold speech (``audio.features.holds_speech``), without the engine: speech that would be
lost, non-speech that would still be decoded, and what the decision costs.

    .venv/bin/python benchmarks/no_speech.py

For each of boundary_replay's sets (synthetic continuous speech and words with pauses, real speech and
real speech joined by pauses of room tone) every window of ``audio.windows.audible_windows`` is judged:
a spoken word whose start lies in a window judged speechless is lost (the other windows are decoded as
before, so no other word changes). Then the audio of ``tests/support/no_speech.py``: each window judged
speech there would still be decoded. Last, milliseconds per 30 s window (median of 5) on speech and on
noise.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import boundary_replay  # noqa: E402

from tests.support.no_speech import non_speech, white_noise  # noqa: E402
from vllm_whisper_align.audio.features import holds_speech  # noqa: E402
from vllm_whisper_align.audio.windows import audible_windows  # noqa: E402


def speech_sets() -> None:
    print(f"{'set':<12} {'clips':>5} {'windows':>7} {'speechless':>10} {'words':>6} {'lost':>5}")
    for name, clips in boundary_replay.clip_sets().items():
        windows = speechless = words = lost = 0
        for clip in clips:
            starts = np.asarray(clip.starts)
            words += len(starts)
            for window in audible_windows(clip.samples):
                windows += 1
                if not holds_speech(window.samples):
                    speechless += 1
                    inside = (starts >= window.offset) & (starts < window.offset + window.duration)
                    lost += int(inside.sum())
        print(f"{name:<12} {len(clips):>5} {windows:>7} {speechless:>10} {words:>6} {lost:>5}")


def non_speech_audio() -> None:
    print(f"\n{'audio':<20} {'windows':>7} {'decoded':>7}")
    for name, samples in non_speech().items():
        windows = audible_windows(samples)
        kept = sum(holds_speech(w.samples) for w in windows)
        print(f"{name:<20} {len(windows):>7} {kept:>7}")


def cost() -> None:
    speech = np.concatenate([c.samples for c in boundary_replay.clip_sets()["held"]])[: 30 * 16000]
    for name, samples in (("speech", speech), ("white noise", white_noise(30.0))):
        times = []
        for _ in range(5):
            begin = time.perf_counter()
            holds_speech(samples)
            times.append(time.perf_counter() - begin)
        print(f"{name}: {1000 * float(np.median(times)):.1f} ms per 30 s window")


if __name__ == "__main__":
    speech_sets()
    non_speech_audio()
    cost()
