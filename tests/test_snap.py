"""Moving word boundaries out of silence: the speech mask and the snapping rule."""

import numpy as np

from speech import synthesize_words
from vllm_whisper_align.audio import speech_frames
from vllm_whisper_align.word_timing import WordTiming, snap_to_speech


def test_speech_mask_marks_words_and_gaps():
    clip = synthesize_words(["hello", "world"], gap_s=0.5, lead_s=0.5)
    speech = speech_frames(clip.samples)
    for start, end in zip(clip.starts, clip.ends, strict=True):
        inside = speech[int(start / 0.02) + 1 : int(end / 0.02) - 1]
        assert inside.mean() > 0.9
    gap = speech[int(clip.ends[0] / 0.02) + 2 : int(clip.starts[1] / 0.02) - 1]
    assert not gap.any()
    assert not speech[: int(0.5 / 0.02) - 1].any()


def test_speech_mask_with_noise_still_finds_the_gap():
    clip = synthesize_words(["hello", "world"], gap_s=0.5, noise_db=-45, seed=1)
    speech = speech_frames(clip.samples)
    gap = speech[int(clip.ends[0] / 0.02) + 2 : int(clip.starts[1] / 0.02) - 1]
    assert gap.mean() < 0.2


def test_snap_moves_boundaries_out_of_silence_only():
    speech = np.array([0] * 25 + [1] * 20 + [0] * 10 + [1] * 20, dtype=bool)  # 20 ms frames
    words = [
        WordTiming(" a", [1], 0.0, 0.9, 1.0),  # silent 0.0-0.5, sound 0.5-0.9
        WordTiming(" b", [2], 0.9, 1.5, 1.0),  # silent 0.9-1.1, sound 1.1-1.5
        WordTiming(" c", [3], 1.2, 1.3, 1.0),  # all sound: unchanged
    ]
    snap_to_speech(words, speech, offset=10.0 - 10.0)
    assert (words[0].start, words[0].end) == (0.5, 0.9)
    assert (words[1].start, words[1].end) == (1.1, 1.5)
    assert (words[2].start, words[2].end) == (1.2, 1.3)


def test_snap_leaves_words_over_pure_silence_and_respects_offset():
    speech = np.array([0] * 10 + [1] * 10, dtype=bool)
    silent = WordTiming(" x", [1], 30.0, 30.1, 1.0)
    late = WordTiming(" y", [2], 30.1, 30.4, 1.0)
    snap_to_speech([silent, late], speech, offset=30.0)
    assert (silent.start, silent.end) == (30.0, 30.1)
    assert (late.start, late.end) == (30.2, 30.4)
