"""The speech decision (audio.features.speech_frames) on real recordings: room tone, breath and clicks are
not speech; a voice is. The room tone is LibriVox's (tests/support/real_speech.py), not white noise."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import real_speech
from tests.support.no_speech import non_speech, pink_noise
from vllm_whisper_align.audio import features
from vllm_whisper_align.audio.windows import audible_windows
from vllm_whisper_align.constants import SAMPLE_RATE

FRAME = features.SPEECH_FRAME_SECONDS


# ps_0930's head and tail hold a voice at about -41 dBFS (its last word runs on past the truth's end):
# no room tone to build a pause of.
NOT_ROOM_TONE = {"ps_0930"}


@pytest.fixture(scope="module")
def reader(real_clips):
    """The LibriVox sentences: one reader and one microphone, with their room tone."""
    return [
        clip for clip in real_clips if real_speech.is_librivox_sentence(clip) and clip.id not in NOT_ROOM_TONE
    ]


def led_in(clip, tone_s: float, breath_s: float | None, seed: int = 0):
    """``clip`` after ``tone_s`` of its own room tone, with a breath ending 0.2 s before its first word."""
    rng = np.random.default_rng(seed)
    lead = real_speech.looped(real_speech.room_tone(clip), tone_s, rng)
    samples = np.concatenate([lead, clip.samples])
    first_word = tone_s + clip.starts[0]
    if breath_s is not None:
        speech = clip.samples[int(clip.starts[0] * SAMPLE_RATE) : int(clip.ends[-1] * SAMPLE_RATE)]
        rms = float(np.sqrt(np.mean(speech**2))) * 10 ** (-real_speech.BREATH_BELOW_SPEECH_DB / 20)
        burst = real_speech.breath(breath_s, rms, rng)
        at = int((first_word - 0.2 - breath_s) * SAMPLE_RATE)
        samples[at : at + len(burst)] += burst
    return samples, first_word


@pytest.mark.parametrize("breath_s", [None, 0.4])
def test_room_tone_and_a_breath_before_speech_are_not_speech(reader, breath_s):
    """What fills a real pause (the recording's room tone, a breath) is silence to the word rules: the
    first word's start is snapped past it, not into it. (The level alone called room tone's bumps in one
    of these four and every breath speech.)"""
    flagged = []
    for k, clip in enumerate(reader):
        samples, first_word = led_in(clip, 1.5, breath_s, seed=k)
        speech = features.speech_frames(samples)
        flagged.append(speech[: int((first_word - 0.1) / FRAME)].mean())
        words = [
            speech[int(round((s + 1.5) / FRAME)) : int(round((e + 1.5) / FRAME))]
            for s, e in zip(clip.starts, clip.ends, strict=True)
        ]
        assert np.mean([w.any() for w in words]) >= 0.95, clip.id  # and the words are speech
    assert max(flagged) == 0.0, flagged


def test_sniffs_and_breaths_in_free_speech_are_not_speech():
    """The spontaneous set's pauses hold sniffs and breaths as loud as its quieter words (a talker with a
    cold, a noisy room): the whole band's level called a third of their frames speech; the voice's band
    calls few of them speech, and still finds most words."""
    clips = real_speech.load_clips(log=lambda *_: None, sets=("spontaneous",))
    pauses, words = [], []
    for clip in clips:
        speech = features.speech_frames(clip.samples)
        for i, (start, end) in enumerate(zip(clip.starts, clip.ends, strict=True)):
            words.append(speech[int(round(start / FRAME)) : int(round(end / FRAME))].any())
            if i and start - clip.ends[i - 1] >= 0.1:  # a pause, less a frame at either edge
                pauses.append(
                    speech[int(round(clip.ends[i - 1] / FRAME)) + 1 : int(round(start / FRAME)) - 1]
                )
    assert len(pauses) >= 30
    assert np.concatenate(pauses).mean() <= 0.15  # 7.5% on 2026-12-05; the whole band's level: 35.8%
    assert np.mean(words) >= 0.7  # 75.5%


def test_a_voice_is_told_from_noise():
    rng = np.random.default_rng(0)
    t = np.arange(int(0.4 * SAMPLE_RATE)) / SAMPLE_RATE
    voice = sum(np.sin(2 * np.pi * 120 * h * t) / h for h in range(1, 8)) * 0.1
    assert features.voiced_frames(voice.astype(np.float32)).all()
    noise = (rng.standard_normal(len(t)) * 0.1).astype(np.float32)
    assert not features.voiced_frames(noise).any()


def test_a_click_or_a_short_burst_is_no_word():
    """A run of sound shorter than MIN_SPEECH_SECONDS is no word, voiced or not."""
    samples = np.zeros(SAMPLE_RATE, dtype=np.float32)
    t = np.arange(int(0.04 * SAMPLE_RATE)) / SAMPLE_RATE
    samples[8000 : 8000 + len(t)] = 0.3 * np.sin(2 * np.pi * 150 * t)  # 40 ms of a voice
    assert not features.speech_frames(samples).any()


@pytest.mark.parametrize("case", list(non_speech(long_s=120.0)))
def test_audio_without_speech_holds_none(case):
    """Digital silence, NaN, 10 ms, white and pink noise, tones and beeps: no window holds speech (each
    of them made Whisper write text)."""
    samples = non_speech(long_s=120.0)[case]
    assert not any(features.holds_speech(w.samples) for w in audible_windows(samples)), case


def test_every_window_of_speech_holds_speech(clips, real_clips):
    """Synthetic sentences and real recordings, and each after 20 s of pink noise in its window."""
    for clip in [*clips, *real_clips]:
        assert features.holds_speech(clip.samples)
        assert features.holds_speech(
            np.concatenate([pink_noise(20.0, seed=1), clip.samples])[-30 * SAMPLE_RATE :]
        )
