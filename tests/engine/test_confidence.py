"""`aligned: false` means text that is not in the audio, and each word's alignment confidence says how
far to trust its place (align.confidence). Forced on audio that does not hold it (a sentence on digital
silence, many words on noise, Lorem ipsum or French on English speech), the text used to come back
`aligned: true`, every word of it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.no_speech import white_noise
from vllm_whisper_align.constants import SAMPLE_RATE

LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et "
    "dolore magna aliqua ut enim ad minim veniam quis nostrud exercitation ullamco laboris nisi"
)
FRENCH = "le petit chat dort sur le canapé pendant que la pluie tombe doucement sur la ville endormie"
# Share of the words of text not in the audio that must come back aligned: false, and of speech's own
# words that must stay aligned: true.
NOT_IN_AUDIO_FALSE = 0.8
SPEECH_TRUE = 0.9


def many_words(count: int) -> str:
    return " ".join((LOREM.split() + FRENCH.split())[i % 40] for i in range(count))


@pytest.fixture(scope="module")
def not_in_audio(clips):
    speech = clips[1]
    return {
        "a sentence on 5 s of digital silence": (np.zeros(5 * SAMPLE_RATE, np.float32), speech.text),
        "126 words on 20 s of white noise": (white_noise(20.0, seed=11), many_words(126)),
        "Lorem ipsum on English speech": (speech.samples, LOREM),
        "French on English speech": (speech.samples, FRENCH),
    }


def test_text_not_in_the_audio_is_not_aligned(aligner, not_in_audio):
    results = aligner.align([a for a, _ in not_in_audio.values()], [t for _, t in not_in_audio.values()])
    for case, result in zip(not_in_audio, results, strict=True):
        flags = [w.aligned for w in result.words]
        false_share = 1 - np.mean(flags)
        assert false_share >= NOT_IN_AUDIO_FALSE, (case, flags)
        assert result.confidence is not None and result.confidence < 0.3, (case, result.confidence)


def test_speech_keeps_its_words_aligned_with_a_confidence_that_tells(aligner, clips, not_in_audio):
    """Speech's own text stays aligned: true; every word has a confidence in [0, 1], in the Python
    result and in verbose_json; words placed further from the truth score lower on average."""
    results = aligner.align([c.samples for c in clips], [c.text for c in clips])
    words = [w for r in results for w in r.words]
    assert np.mean([w.aligned for w in words]) >= SPEECH_TRUE
    assert all(0.0 <= w.confidence <= 1.0 for w in words)
    body = results[0].to_dict()
    assert all("confidence" in w for w in body["words"]) and 0 <= body["confidence"] <= 1
    speech_mean = float(np.mean([r.confidence for r in results]))
    [silence] = aligner.align([np.zeros(5 * SAMPLE_RATE, np.float32)], [clips[1].text])
    assert speech_mean > silence.confidence + 0.3, (speech_mean, silence.confidence)


def test_transcribed_words_have_a_confidence(aligner, clips):
    [result] = aligner.transcribe([clips[1].samples], word_timestamps=True)
    assert result.words and all(0.0 <= w.confidence <= 1.0 for w in result.words)
    assert "confidence" in result.to_dict()["words"][0]
