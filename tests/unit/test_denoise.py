"""A steady noise floor taken out before the acoustic model of phones reads a window
(``audio.denoise``: minimum statistics and a Wiener filter); what it does to word boundaries is checked
in test_phones.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import real_speech
from tests.support.no_speech import pink_noise, white_noise, with_noise
from tests.support.speech import sentence_clips
from vllm_whisper_align.audio import denoise
from vllm_whisper_align.audio.dereverb import band_bins, stft
from vllm_whisper_align.audio.phones import MODEL_BAND_HZ
from vllm_whisper_align.constants import SAMPLE_RATE


def band_power(samples: np.ndarray) -> np.ndarray:
    spectrum = stft(samples)[band_bins(MODEL_BAND_HZ, SAMPLE_RATE)]
    return denoise.whole_frames(samples, np.abs(spectrum) ** 2)


def snr_db(samples: np.ndarray) -> float:
    power = band_power(samples)
    return denoise.snr_db(power, denoise.noise_power(power))


@pytest.fixture(scope="module")
def close_miked():
    """A LibriVox reader's sentence of 19 words (the main set's ps_0920), its pauses quiet."""
    [clip] = [c for c in real_speech.load_clips(log=lambda *_: None, sets=("main",)) if c.id == "ps_0920"]
    return clip


@pytest.mark.parametrize("noise", [white_noise, pink_noise])
def test_a_steady_noise_is_read_at_its_mean_power(noise):
    """The smoothed power's low percentile, times PERCENTILE_BIAS, is the noise's mean power: what the
    gate compares the speech with, and what the filter takes out a share of."""
    power = band_power(noise(10.0, seed=3))
    ratio = float(denoise.noise_power(power).sum() / power.mean(axis=1).sum())
    assert 0.9 < ratio < 1.1, ratio


def test_speech_without_pauses_is_not_read_as_noise(close_miked):
    """The noise is read between the speech's sounds, not in its pauses: the same sentence cut to its
    first and last word's edges reads as far over its noise (without its pauses, a quietest-frames
    estimate, the mean of the quietest fifth of the frames, read its own quiet sounds as noise 19 dB
    under it)."""
    start, end = (int(t * SAMPLE_RATE) for t in (close_miked.starts[0], close_miked.ends[-1]))
    assert snr_db(close_miked.samples) >= denoise.GATE_SNR_DB
    assert snr_db(close_miked.samples[start:end]) >= denoise.GATE_SNR_DB


def test_the_gate_passes_a_heavy_noise_floor_and_leaves_the_rest_as_it_is(close_miked):
    samples = close_miked.samples
    assert denoise.denoised(samples, MODEL_BAND_HZ, SAMPLE_RATE) is samples
    synthetic = sentence_clips()[0].samples  # digital silence between its words: no noise at all
    assert snr_db(synthetic) == float("inf")
    assert denoise.denoised(synthetic, MODEL_BAND_HZ, SAMPLE_RATE) is synthetic
    silence = np.zeros(2 * SAMPLE_RATE, dtype=np.float32)
    assert denoise.denoised(silence, MODEL_BAND_HZ, SAMPLE_RATE) is silence
    short = samples[: SAMPLE_RATE // 5]
    assert denoise.denoised(short, MODEL_BAND_HZ, SAMPLE_RATE) is short
    lighter = with_noise(samples, "white", 20, seed=0)
    assert snr_db(lighter) == pytest.approx(20, abs=3)
    assert denoise.denoised(lighter, MODEL_BAND_HZ, SAMPLE_RATE) is lighter
    noisy = with_noise(samples, "white", 10, seed=0)
    assert snr_db(noisy) == pytest.approx(10, abs=3)
    cleaned = denoise.denoised(noisy, MODEL_BAND_HZ, SAMPLE_RATE)
    assert cleaned is not noisy and cleaned.shape == noisy.shape and cleaned.dtype == noisy.dtype


def test_the_filter_takes_the_noise_out_and_keeps_the_speech(close_miked):
    """In the band, what is left of a noisy recording is nearer the clean one than the noisy one was,
    by several dB."""
    clean = close_miked.samples
    noisy = with_noise(clean, "white", 10, seed=1)
    cleaned = denoise.denoised(noisy, MODEL_BAND_HZ, SAMPLE_RATE)
    band = band_bins(MODEL_BAND_HZ, SAMPLE_RATE)

    def error_db(samples: np.ndarray) -> float:
        error = np.abs(stft(samples)[band] - stft(clean)[band]) ** 2
        return 10 * float(np.log10(error.sum() / (np.abs(stft(clean)[band]) ** 2).sum()))

    assert error_db(cleaned) <= error_db(noisy) - 4, (error_db(cleaned), error_db(noisy))
