"""A steady noise floor taken out of a recording before the acoustic model of phones reads it.

PocketSphinx's features are cepstra of the whole band: under hiss, hum or fan noise 10-20 dB below the
speech, a word's quiet onset and its fading end are noise to them, and the model's silence and noise
fillers take those frames. A Wiener filter (Ephraim and Malah's decision-directed estimate of each
coefficient's speech-to-noise ratio, "Speech enhancement using a minimum mean-square error short-time
spectral amplitude estimator", IEEE TASSP 1984) lowers each short-time Fourier coefficient by how much
of it the noise explains, and leaves the speech's own rise and fall.

The noise is read without a voice detector (Martin's minimum statistics, "Noise power spectral density
estimation based on optimal smoothing and minimum statistics", IEEE TSAP 2001, for a whole window at
once): each frequency's power, smoothed over SMOOTH_FRAMES, at a low percentile over the window, is
what that frequency holds between the speech's sounds even where the talker never pauses. The filter
runs only where that noise is within GATE_SNR_DB of the speech: close-miked recordings, and speech whose
only quiet is between its words, are left as they are.
"""

from __future__ import annotations

import numpy as np

from vllm_whisper_align.audio.dereverb import HOP, OVERLAP, band_bins, istft, stft, stft_rows

# ``whisper_align.denoise``: where the gate passes a window (True, the default), or never (False).
DEFAULT_ON = True

# Each frequency's power smoothed over this many frames (64 ms), then its NOISE_PERCENTILE-th percentile
# over the window, times PERCENTILE_BIAS: the mean of a steady noise (white noise's mean power over that
# percentile of its smoothed power; tests/unit/test_denoise.py checks it).
SMOOTH_FRAMES = 8
NOISE_PERCENTILE = 5.0
PERCENTILE_BIAS = 2.57
# The filter runs where the speech (the mean band power of the louder half of the frames) is less than
# this over the noise: where the noise is heavy. White noise 10 dB under real speech reads 7-11 dB, 20
# dB under it 14-20 dB; the real sets' read clips 17-44 dB, their spontaneous recordings (a room's own
# noise floor) 10-18 dB. At 22 dB, one of those (MFA's third) was filtered too, and the words after its
# filled pauses took their sound again (tests/unit/test_phones.py).
GATE_SNR_DB = 13.0
# The filter takes out this share of the noise estimate (a gentler filter than the whole: at 1, and
# more, word edges in noise were placed less well), no coefficient below GAIN_FLOOR of itself
# (deeper, the leftover noise turns to bursts), and each coefficient's speech-to-noise ratio carries
# PRIOR_WEIGHT of the frame before (the decision-directed estimate's smoothing).
SUBTRACTED = 0.5
GAIN_FLOOR = 0.15
PRIOR_WEIGHT = 0.98
# The gate, which runs on every window the model reads, reads every GATE_STEP-th frequency of the band
# alone (:func:`dereverb.stft_rows`): 7 against 12 ms for 8 s of audio, and on the real sets' clips in
# every noise of noisy_speech.py it decides as the whole band does (every 4th: 3 of 105 the other way,
# near the gate; every 8th: 9).
GATE_STEP = 2
# Audio with fewer whole frames than a few smoothings is left as it is.
MIN_FRAMES = 4 * SMOOTH_FRAMES
EPS = 1e-12


def whole_frames(samples: np.ndarray, power: np.ndarray) -> np.ndarray:
    """The columns of ``power`` (:func:`dereverb.stft`'s, squared) whose window lies wholly within
    ``samples``: the edges' frames are part padding, quieter than any noise."""
    return power[:, OVERLAP : len(samples) // HOP + 1]


def noise_power(power: np.ndarray) -> np.ndarray:
    """(frequencies,): each frequency's noise power, from ``power`` (frequencies, frames): its
    SMOOTH_FRAMES moving average at NOISE_PERCENTILE over the frames, times PERCENTILE_BIAS."""
    sums = np.cumsum(np.pad(power, ((0, 0), (1, 0))), axis=1)
    smoothed = (sums[:, SMOOTH_FRAMES:] - sums[:, :-SMOOTH_FRAMES]) / SMOOTH_FRAMES
    return np.percentile(smoothed, NOISE_PERCENTILE, axis=1) * PERCENTILE_BIAS


def snr_db(power: np.ndarray, noise: np.ndarray) -> float:
    """The speech's power (the mean of the louder half of the frames) over the noise's, in dB; inf where
    there is no noise (digital silence between sounds, as synthesized audio has)."""
    energy = power.sum(axis=0)
    speech, floor = float(energy[energy >= np.median(energy)].mean()), float(noise.sum())
    return float("inf") if floor <= EPS * max(speech, EPS) else 10 * float(np.log10(speech / floor))


def wiener_gains(power: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """(frequencies, frames) gains of the decision-directed Wiener filter: per frame, the a priori
    speech-to-noise ratio from the last frame's cleaned power and this frame's excess over the noise,
    then gain = ratio / (1 + ratio), no lower than GAIN_FLOOR."""
    posterior = power / np.maximum(noise, EPS)[:, None]
    gains = np.empty(power.shape, np.float32)
    last_gain = np.ones(power.shape[0], np.float32)
    last_posterior = np.ones(power.shape[0], np.float32)
    for t in range(power.shape[1]):
        prior = PRIOR_WEIGHT * last_gain**2 * last_posterior + (1 - PRIOR_WEIGHT) * np.maximum(
            posterior[:, t] - 1, 0
        )
        gains[:, t] = np.maximum(prior / (1 + prior), GAIN_FLOOR)
        last_gain, last_posterior = gains[:, t], posterior[:, t]
    return gains


def denoised(samples: np.ndarray, band_hz: tuple[float, float], sample_rate: int) -> np.ndarray:
    """``samples`` with their steady noise taken out between ``band_hz``'s frequencies (the rest as it
    was); ``samples`` themselves where they are too short or the noise is GATE_SNR_DB or more under
    the speech (read on every GATE_STEP-th frequency)."""
    band = band_bins(band_hz, sample_rate)
    sampled = whole_frames(
        samples, np.abs(stft_rows(samples, np.arange(band.start, band.stop, GATE_STEP))) ** 2
    )
    if sampled.shape[1] < MIN_FRAMES or snr_db(sampled, noise_power(sampled)) >= GATE_SNR_DB:
        return samples
    spectrum = stft(samples)
    power = np.abs(spectrum[band]) ** 2
    spectrum[band] *= wiener_gains(power, SUBTRACTED * noise_power(whole_frames(samples, power)))
    return istft(spectrum, len(samples)).astype(samples.dtype)
