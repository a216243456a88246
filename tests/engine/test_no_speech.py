"""No text where there is no speech: Whisper writes "you" into digital silence, NaN and a 10 ms clip,
"I'm going to do that." over and over into white noise, a sentence into tones. Such windows are not
decoded (audio.features.holds_speech), while every word of speech is still heard."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.no_speech import non_speech, tones, white_noise
from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.options import TranscriptionOptions


@pytest.fixture(scope="module")
def transcribed(aligner):
    cases = non_speech(long_s=600.0)
    results = aligner.transcribe(list(cases.values()), word_timestamps=True)
    return dict(zip(cases, results, strict=True))


@pytest.mark.parametrize("case", list(non_speech(long_s=600.0)))
def test_no_words_without_speech(transcribed, case):
    result = transcribed[case]
    assert result.words == [] and result.segments == [] and result.text == "", (case, result.text)


def test_speech_between_noise_and_tones_is_heard(aligner, clips):
    """A sentence between 20 s of noise and 20 s of tones: its words, and nothing in the windows
    around it."""
    clip = clips[1]
    samples = np.concatenate([white_noise(20.0, seed=7), clip.samples, tones(20.0)])
    [result] = aligner.transcribe([samples], word_timestamps=True)
    spoken = {w.lower().strip(".,") for w in clip.words}
    heard = [w.word.lower().strip(" .,") for w in result.words]
    assert len(spoken & set(heard)) >= 0.75 * len(spoken), result.text
    lead, end = 20.0, 20.0 + len(clip.samples) / SAMPLE_RATE
    assert all(lead - 0.5 <= w.start and w.end <= end + 0.5 for w in result.words), result.words


def test_the_no_speech_rule_off_decodes_every_window(aligner):
    """no_speech_threshold None (openai-whisper's "off") decodes silence too, and its segment reports how
    likely silence is (30 s: a window that the model writes " you" into, as the server test's)."""
    off = TranscriptionOptions(no_speech_threshold=None, logprob_threshold=None)
    [result] = aligner.transcribe([np.zeros(30 * SAMPLE_RATE, dtype=np.float32)], options=off)
    assert result.segments and all(s.no_speech_prob > 0.6 for s in result.segments), result.text
