import numpy as np
import pytest
import soundfile

from tests.support.speech import (
    SAMPLE_RATE,
    align_words,
    long_clip,
    sentence_clips,
    speak_word,
    synthesize_words,
    write_wav,
)

SILENCE_RMS = 1e-4
SPEECH_RMS = 1e-2


def _rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if len(samples) else 0.0


def _index(seconds: float) -> int:
    index = round(seconds * SAMPLE_RATE)
    assert abs(index - seconds * SAMPLE_RATE) < 1e-6, "boundaries must fall on exact samples"
    return index


def assert_exact_boundaries(clip):
    assert clip.samples.dtype == np.float32 and clip.samples.ndim == 1
    assert len(clip.words) == len(clip.starts) == len(clip.ends)
    assert all(end > start for start, end in zip(clip.starts, clip.ends, strict=True))
    assert all(later > earlier for earlier, later in zip(clip.ends, clip.starts[1:], strict=False))
    assert clip.ends[-1] < clip.duration

    edges = (
        [0]
        + [_index(t) for pair in zip(clip.starts, clip.ends, strict=True) for t in pair]
        + [len(clip.samples)]
    )
    for index in range(0, len(edges), 2):
        assert _rms(clip.samples[edges[index] : edges[index + 1]]) < SILENCE_RMS, "sound outside a word"
    for word, start, end in zip(clip.words, clip.starts, clip.ends, strict=True):
        inside = clip.samples[_index(start) : _index(end)]
        assert _rms(inside) > SPEECH_RMS, f"{word!r} is silent"
        # Trimmed to its sound: the word's first and last 5 ms are not silence.
        edge = SAMPLE_RATE // 200
        assert np.abs(inside[:edge]).max() > 1e-4 and np.abs(inside[-edge:]).max() > 1e-4


def test_synthesize_words_boundaries():
    clip = synthesize_words(["hello", "big", "world"], gap_s=[0.2, 0.45], lead_s=0.3, tail_s=0.4)
    assert_exact_boundaries(clip)
    assert clip.text == "Hello big world."
    assert clip.starts[0] == pytest.approx(0.3)
    assert clip.starts[1] - clip.ends[0] == pytest.approx(0.2)
    assert clip.starts[2] - clip.ends[1] == pytest.approx(0.45)
    assert clip.duration - clip.ends[-1] == pytest.approx(0.4)


def test_words_are_cached_and_deterministic():
    first = speak_word("window")
    assert np.array_equal(first, speak_word("window"))
    assert len(first) > SAMPLE_RATE // 10


def test_gap_count_is_checked():
    with pytest.raises(ValueError):
        synthesize_words(["one", "two", "three"], gap_s=[0.2])


def test_noise_keeps_boundaries():
    clean = synthesize_words(["red", "apple"])
    noisy = synthesize_words(["red", "apple"], noise_db=-40, seed=3)
    assert noisy.starts == clean.starts and noisy.ends == clean.ends
    gap = noisy.samples[_index(noisy.ends[0]) : _index(noisy.starts[1])]
    assert _rms(gap) == pytest.approx(10 ** (-40 / 20), rel=0.1)


def test_sentence_clips():
    clips = sentence_clips()
    assert len(clips) == 8
    assert len({clip.text for clip in clips}) == 8
    gaps = []
    for clip in clips:
        assert 4 <= len(clip.words) <= 12
        assert clip.text[0].isupper() and clip.text.endswith(".")
        assert_exact_boundaries(clip)
        gaps += [start - end for end, start in zip(clip.ends, clip.starts[1:], strict=False)]
    assert min(gaps) == pytest.approx(0.15) and max(gaps) == pytest.approx(0.6)


def test_long_clip():
    clip = long_clip(65)
    assert clip.duration > 65
    assert_exact_boundaries(clip)
    assert len(clip.words) == len(clip.text.replace(".", "").split())


def test_write_wav_round_trip(tmp_path):
    clip = sentence_clips()[0]
    path = tmp_path / "clip.wav"
    write_wav(path, clip.samples)
    samples, rate = soundfile.read(path, dtype="float32")
    assert rate == SAMPLE_RATE
    np.testing.assert_allclose(samples, clip.samples, atol=1 / 32768)


def test_a_word_said_more_often_than_heard_pairs_with_the_nearest_occurrence():
    """Four "words" said, three heard at the first three's times: with times the first three pair
    (the scoring would otherwise count three right times as 0.3-0.8 s off); without, the last three."""
    spoken = "more words words words words um".split()
    heard = "more words words words".split()
    spoken_starts = [20.13, 20.41, 21.21, 21.48, 21.78, 22.87]
    heard_starts = [20.12, 20.39, 21.19, 21.48]
    assert align_words(spoken, heard, spoken_starts, heard_starts) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert align_words(spoken, heard) == [(0, 0), (2, 1), (3, 2), (4, 3)]
    # Times break ties only: they never trade a pair of equal words for fewer.
    assert align_words(["a", "b"], ["a", "b"], [0.0, 1.0], [5.0, 9.0]) == [(0, 0), (1, 1)]
