"""Cutting a recording into the ≤30 s windows Whisper's encoder takes, each cut placed in a pause."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_whisper_align.audio.decode import SpilledSamples
from vllm_whisper_align.audio.features import holds_speech, true_runs
from vllm_whisper_align.constants import CHUNK_SECONDS, SAMPLE_RATE, num_mel_frames

# Cuts between chunks are searched for in this many seconds at the end of each window.
CUT_SEARCH_SECONDS = 5.0
# Energy is measured in 10 ms frames: shorter than any pause between words.
ENERGY_FRAME_SECONDS = 0.01
# Frames within this factor (3 dB) of the quietest frame count as the same pause,
# so background noise does not split one pause into many.
QUIET_ENERGY_FACTOR = 2.0

# The last window of a long input is never shorter than this: a sliver of a few milliseconds
# gives the model nothing to hear and the alignment no encoder frame to place words in
# (it made empty reductions and negative times). The cut before it moves earlier instead.
MIN_CHUNK_SECONDS = 1.0


@dataclass(frozen=True)
class AudioChunk:
    """Samples [start, stop) of ``source``: a view of an array, or read back from SpilledSamples
    on each access (so a list of windows holds positions, not audio)."""

    source: np.ndarray | SpilledSamples
    start: int
    stop: int
    sample_rate: int = SAMPLE_RATE

    @classmethod
    def whole(cls, samples: np.ndarray | SpilledSamples | AudioChunk) -> AudioChunk:
        return samples if isinstance(samples, AudioChunk) else cls(samples, 0, len(samples))

    @property
    def samples(self) -> np.ndarray:
        return self.source[self.start : self.stop]

    @property
    def num_samples(self) -> int:
        return self.stop - self.start

    @property
    def offset(self) -> float:
        """Seconds from the start of the full audio to the first sample."""
        return self.start / self.sample_rate

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate


def chunk_audio(
    samples: np.ndarray | SpilledSamples, chunk_seconds: float = CHUNK_SECONDS, sample_rate: int = SAMPLE_RATE
) -> list[AudioChunk]:
    """Split audio into consecutive windows of at most `chunk_seconds`.

    Each cut is placed in the middle of the longest quiet stretch within the last
    CUT_SEARCH_SECONDS of the window, so it falls in a pause rather than inside a word; a stretch
    that reaches the end of the search is cut at its end.
    No chunk is shorter than MIN_CHUNK_SECONDS (at most half a window) unless the whole input
    is: near the end the search moves earlier so that enough is left for the last chunk.
    Chunks are positions that together cover every sample exactly once.
    """
    max_length = int(chunk_seconds * sample_rate)
    if max_length < 1:
        raise ValueError(f"chunk_seconds * sample_rate must be >= 1 sample, got {chunk_seconds=}")
    search_length = min(int(CUT_SEARCH_SECONDS * sample_rate), max_length // 2)
    min_length = min(int(MIN_CHUNK_SECONDS * sample_rate), max_length // 2)
    frame_length = max(1, int(ENERGY_FRAME_SECONDS * sample_rate))

    chunks = []
    start = 0
    while len(samples) - start > max_length:
        # More than a window is left, and a window is at least two minimum lengths: both
        # bounds leave min_length on either side of the cut.
        search_end = min(start + max_length, len(samples) - min_length)
        search_start = max(start + min_length, search_end - search_length)
        cut = search_start + _quietest_point(samples[search_start:search_end], frame_length)
        # A cut at the very start would make an empty chunk; never stall.
        cut = max(cut, start + 1)
        chunks.append(AudioChunk(samples, start, cut, sample_rate))
        start = cut
    chunks.append(AudioChunk(samples, start, len(samples), sample_rate))
    return chunks


def audible_windows(samples: np.ndarray | SpilledSamples) -> list[AudioChunk]:
    """The windows of ``chunk_audio`` that hold a mel frame: the ones a model can hear anything in."""
    return [chunk for chunk in chunk_audio(samples) if num_mel_frames(chunk.num_samples) > 0]


def speech_windows(samples: np.ndarray | SpilledSamples) -> list[AudioChunk]:
    """The audible windows that hold speech (``features.holds_speech``): the ones worth transcribing."""
    return [chunk for chunk in audible_windows(samples) if holds_speech(chunk.samples)]


def _quietest_point(region: np.ndarray, frame_length: int) -> int:
    """Index in `region` at the middle of its longest run of near-minimum-energy frames."""
    num_frames = len(region) // frame_length
    if num_frames == 0:
        return len(region)
    frames = region[: num_frames * frame_length].astype(np.float64).reshape(num_frames, frame_length)
    energy = np.mean(frames * frames, axis=1)
    quiet = energy <= energy.min() * QUIET_ENERGY_FACTOR + 1e-12

    run_start, run_end = _longest_run(quiet)
    if run_end == num_frames:
        # The pause runs on past the window's end: cut there, so that the window stays full (long
        # silence in windows of 27.5 s made more windows, each a chance to invent a word).
        return len(region)
    middle_frame = (run_start + run_end) / 2
    return int(round(middle_frame * frame_length))


def _longest_run(mask: np.ndarray) -> tuple[int, int]:
    """[start, end) of the longest run of True in a non-empty mask with at least one True;
    ties go to the latest run so chunks stay as long as allowed."""
    starts, ends = true_runs(mask)
    lengths = ends - starts
    best = len(lengths) - 1 - int(np.argmax(lengths[::-1]))
    return int(starts[best]), int(ends[best])
