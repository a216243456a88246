"""Late reverberation taken out of a recording: single-channel weighted prediction error (WPE).

In a room, what a microphone hears after a word's direct sound is the room's tail: the word's own
sound, delayed and fading by 60 dB in the reverberation time. An acoustic model of phones reads that
tail as more of the word, and it smears into the next word's onset. WPE (Nakatani et al., "Speech
dereverberation based on variance-normalized delayed linear prediction", IEEE TASLP 2010, as nara_wpe
implements it) predicts each short-time Fourier coefficient from the same frequency's coefficients
``DELAY`` frames and more before it, and keeps what that prediction misses: the late tail is
predictable from the sound before it, the direct sound and its first reflections are not. The
prediction is weighted by the inverse of the estimated clean power, so that quiet frames count as much
as loud ones. Dry speech has little tail to predict, and the filter then takes little out.

Whether a window has a tail worth the filter's time is read first, from the filter itself: one
iteration on every GATE_STEP-th frequency (a twentieth of the time) estimates the late reverberation,
and the whole filter runs only where that estimate is over GATE_DB of the window's energy
(:func:`late_reverberation_db`). Below it the filter moved few words (a point or two of starts on dry
and lightly noisy speech), at twice the acoustic model's CPU: skipping it keeps the default's cost.
"""

from __future__ import annotations

from typing import Final, Literal

import numpy as np

# ``whisper_align.dereverberate``: True (every window of MIN_SECONDS or more), False (none), or AUTO
# (those the gate finds a tail in; the default).
AUTO: Final = "auto"
Mode = bool | Literal["auto"]
DEFAULT_MODE: Mode = AUTO

# Short-time Fourier transform of 16 kHz audio: 32 ms windows, 8 ms apart (nara_wpe's 16 kHz setting).
FFT_SIZE = 512
HOP = 128
# The prediction starts DELAY frames back (24 ms: the direct sound and its first reflections are kept)
# and reads TAPS frames (80 ms); the clean power it is weighted by is estimated ITERATIONS times.
DELAY = 3
TAPS = 10
ITERATIONS = 3
# Audio shorter than this is left as it is: its frames are too few for TAPS coefficients a frequency
# (on dry clips of 1-3 s the filter took some of the speech itself, and word starts moved by 10-20 ms).
MIN_SECONDS = 5.0
# The gate (late_reverberation_db): every GATE_STEP-th frequency of the band, one iteration. Close-miked
# speech gives -36 dB and less; real speech in rooms whose tail falls by 60 dB in 0.6 s or more, -26 to
# -17 dB (docs/boundaries.md#reverberation-2026-12-06).
GATE_STEP = 16
GATE_DB = -27.0
# Frequencies solved together (bounds the memory of the frames x taps arrays: 10 MB).
BAND_CHUNK = 32
EPS = 1e-10
WINDOW = np.hanning(FFT_SIZE + 1)[:FFT_SIZE]  # periodic: its squares overlap-add to a constant
OVERLAP = FFT_SIZE // HOP


def windowed_frames(samples: np.ndarray) -> np.ndarray:
    """(frames, FFT_SIZE): Hann-windowed frames of ``samples``, HOP apart, padded at both ends by a
    window."""
    padded = np.pad(samples.astype(np.float32), (FFT_SIZE, FFT_SIZE + HOP))
    return np.lib.stride_tricks.sliding_window_view(padded, FFT_SIZE)[::HOP] * WINDOW


def stft(samples: np.ndarray) -> np.ndarray:
    """(frequencies, frames): the short-time Fourier transform of ``samples``."""
    return np.fft.rfft(windowed_frames(samples), axis=1).T.astype(np.complex64)


def stft_rows(samples: np.ndarray, bins: np.ndarray) -> np.ndarray:
    """The rows ``bins`` of :func:`stft` alone, as one real matrix product (for a few of its 257
    frequencies, under a third of the whole transform's time)."""
    phase = 2 * np.pi * np.outer(np.arange(FFT_SIZE), bins) / FFT_SIZE
    basis = np.concatenate([np.cos(phase), -np.sin(phase)], axis=1).astype(np.float32)
    parts = windowed_frames(samples).astype(np.float32) @ basis
    return (parts[:, : len(bins)] + 1j * parts[:, len(bins) :]).T.astype(np.complex64)


def istft(spectrum: np.ndarray, length: int) -> np.ndarray:
    """``length`` samples from :func:`stft`'s output (weighted overlap-add)."""
    frames = np.fft.irfft(spectrum.T, FFT_SIZE, axis=1) * WINDOW
    count = len(frames)
    out = np.zeros((count + OVERLAP - 1) * HOP)
    for part in range(OVERLAP):  # each frame's part-th hop of samples lands part hops after its start
        out[part * HOP : (part + count) * HOP] += frames[:, part * HOP : (part + 1) * HOP].reshape(-1)
    norm = np.sum(WINDOW.reshape(OVERLAP, HOP) ** 2, axis=0)
    return (out.reshape(-1, HOP) / norm).reshape(-1)[FFT_SIZE : FFT_SIZE + length]


def delayed_taps(spectrum: np.ndarray) -> np.ndarray:
    """(frequencies, frames, TAPS): for each frame, the frames DELAY .. DELAY + TAPS - 1 before it."""
    freqs, frames = spectrum.shape
    padded = np.concatenate([np.zeros((freqs, DELAY + TAPS - 1), spectrum.dtype), spectrum], axis=1)
    return np.stack([padded[:, TAPS - 1 - k : TAPS - 1 - k + frames] for k in range(TAPS)], axis=2)


def wpe(spectrum: np.ndarray, iterations: int = ITERATIONS) -> np.ndarray:
    """``spectrum`` (frequencies, frames) less its prediction from the frames DELAY and more before:
    per frequency, the filter g minimising sum_t |y(t) - g^H past(t)|^2 / clean_power(t), then the clean
    power read again from what is left."""
    out = np.empty_like(spectrum)
    ridge = np.float32(EPS) * np.eye(TAPS, dtype=np.float32)
    for lo in range(0, spectrum.shape[0], BAND_CHUNK):
        y = spectrum[lo : lo + BAND_CHUNK]
        past = delayed_taps(y)
        past_t, past_conj = np.swapaxes(past, 1, 2), past.conj()
        clean = y
        for _ in range(iterations):
            weighted = past_t / np.maximum(np.abs(clean) ** 2, np.float32(EPS))[:, None, :]
            filters = np.linalg.solve(weighted @ past_conj + ridge, weighted @ y.conj()[:, :, None])
            clean = y - (past @ filters.conj())[:, :, 0]
        out[lo : lo + BAND_CHUNK] = clean
    return out


def band_bins(band_hz: tuple[float, float], sample_rate: int) -> slice:
    """The rows of :func:`stft` from ``band_hz``'s low frequency to its high one."""
    lo, hi = (int(round(f * FFT_SIZE / sample_rate)) for f in band_hz)
    return slice(lo, hi + 1)


def late_reverberation_db(samples: np.ndarray, band_hz: tuple[float, float], sample_rate: int) -> float:
    """The energy of a first estimate of the late reverberation in ``samples`` (one iteration of
    :func:`wpe` on every GATE_STEP-th frequency of ``band_hz``), in dB against theirs: what is
    predictable from DELAY frames and more before. -inf for digital silence."""
    band = band_bins(band_hz, sample_rate)
    sample = stft_rows(samples, np.arange(band.start, band.stop, GATE_STEP))
    total = float(np.sum(np.abs(sample) ** 2))
    if total == 0.0:
        return float("-inf")
    # In double precision: in single, the filters' normal equations are nearly singular where a steady
    # noise fills the band, and the estimate jumped by 6-11 dB with the samples scaled by 1 - 2**-15
    # (pink noise 10 dB under real speech read -34, -28 or -22 dB: a tail, or none).
    late = float(np.sum(np.abs(sample - wpe(sample.astype(np.complex128), iterations=1)) ** 2))
    return 10 * float(np.log10(max(late, EPS * total) / total))


def dereverberated(
    samples: np.ndarray, band_hz: tuple[float, float], sample_rate: int, always: bool = False
) -> np.ndarray:
    """``samples`` with their late reverberation taken out between ``band_hz``'s frequencies (the rest
    as it was: what a model that reads only that band never sees is not worth the work); as they are
    where they are shorter than MIN_SECONDS, and, unless ``always``, where the gate finds no tail
    (:func:`late_reverberation_db` under GATE_DB)."""
    if len(samples) < MIN_SECONDS * sample_rate:
        return samples
    if not always and late_reverberation_db(samples, band_hz, sample_rate) < GATE_DB:
        return samples
    spectrum, band = stft(samples), band_bins(band_hz, sample_rate)
    spectrum[band] = wpe(spectrum[band])
    return istft(spectrum, len(samples)).astype(samples.dtype)
