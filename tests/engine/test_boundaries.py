"""Word-start accuracy through a real engine: continuous speech (no pauses to snap to) and speech with
pauses, for the default per-window head selection against the fixed alignment heads."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.speech import SENTENCES, sentence_clips, start_errors, synthesize_sentence
from vllm_whisper_align.audio.features import sound_frames

VOICES = ["en-us", "en", "en-us+f3", "en-gb-x-rp"]
RATES = [150, 170, 185, 160]


@pytest.fixture(scope="module")
def continuous_clips():
    """The eight test sentences spoken without pauses, four voices, four rates, two with noise."""
    return [
        synthesize_sentence(
            sentence[0].upper() + sentence[1:] + ".",
            VOICES[i % 4],
            RATES[(i // 2) % 4],
            lead_s=0.3 + 0.1 * (i % 3),
            noise_db=-40.0 if i % 4 == 3 else None,
            seed=i,
        )
        for i, sentence in enumerate(SENTENCES)
    ]


def within(clips, results, seconds: float) -> float:
    """Share of the words with a known start that the result has within ``seconds`` of it."""
    errors = np.concatenate([start_errors(clip, r.words) for clip, r in zip(clips, results, strict=True)])
    errors = errors[~np.isnan(errors)]
    return float(np.mean(errors <= seconds))


def heard_within(clips, results, seconds: float) -> float:
    """As ``within``, over the words the transcript has (a misheard word has no start to judge)."""
    errors = np.concatenate([start_errors(clip, r.words) for clip, r in zip(clips, results, strict=True)])
    errors = errors[np.isfinite(errors)]
    return float(np.mean(errors <= seconds))


def test_continuous_speech_has_exact_word_starts(continuous_clips):
    for clip in continuous_clips:
        known = np.asarray(clip.starts)[~np.isnan(clip.starts)]
        assert len(known) >= 0.7 * len(clip.starts)
        assert np.all(np.diff(known) > 0)
        # no pauses between the words (the clips with pauses are 15-60% silence between their words): sound
        # all along, at the whole band's level (the speech mask leaves out the hiss of fricatives)
        sound = sound_frames(clip.samples)
        inside = sound[int(clip.starts[0] / 0.02) + 1 : int(clip.ends[-1] / 0.02) - 1]
        assert inside.mean() >= 0.9


def test_forced_alignment_of_continuous_speech(aligner, continuous_clips):
    audio = [clip.samples for clip in continuous_clips]
    texts = [clip.text for clip in continuous_clips]
    auto = aligner.align(audio, texts)
    fixed = aligner.align(audio, texts, alignment_method="fixed")
    print(
        f"\ncontinuous, forced: auto {within(continuous_clips, auto, 0.05):.0%} / "
        f"{within(continuous_clips, auto, 0.10):.0%} within 50 / 100 ms; fixed "
        f"{within(continuous_clips, fixed, 0.05):.0%} / {within(continuous_clips, fixed, 0.10):.0%}"
    )
    assert within(continuous_clips, auto, 0.05) >= 0.45
    assert within(continuous_clips, auto, 0.10) >= 0.80
    # the fixed heads (openai-whisper's way) are far behind on speech without pauses
    assert within(continuous_clips, auto, 0.05) >= within(continuous_clips, fixed, 0.05) + 0.15


def test_transcription_of_continuous_speech(aligner, continuous_clips):
    results = aligner.transcribe([clip.samples for clip in continuous_clips], language="en")
    print(
        f"\ncontinuous, transcribed: {heard_within(continuous_clips, results, 0.05):.0%} / "
        f"{heard_within(continuous_clips, results, 0.10):.0%} of heard words within 50 / 100 ms"
    )
    assert heard_within(continuous_clips, results, 0.05) >= 0.40
    assert heard_within(continuous_clips, results, 0.10) >= 0.75


def test_speech_with_pauses_is_not_worse(aligner):
    clips = sentence_clips()
    audio, texts = [clip.samples for clip in clips], [clip.text for clip in clips]
    auto = aligner.align(audio, texts)
    fixed = aligner.align(audio, texts, alignment_method="fixed")
    print(
        f"\npauses, forced: auto {within(clips, auto, 0.05):.0%} / {within(clips, auto, 0.2):.0%} within "
        f"50 / 200 ms; fixed {within(clips, fixed, 0.05):.0%} / {within(clips, fixed, 0.2):.0%}"
    )
    assert within(clips, auto, 0.2) >= 0.88
    assert within(clips, auto, 0.05) >= within(clips, fixed, 0.05) - 0.02


def test_alignment_method_is_checked(aligner, continuous_clips):
    with pytest.raises(ValueError, match="alignment_method"):
        aligner.align([continuous_clips[0].samples], [continuous_clips[0].text], alignment_method="best")
