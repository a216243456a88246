"""Audio that holds no speech, in which Whisper writes text anyway ("you", a sentence over and over):
digital silence, NaN, a clip too short to hold a word, white and pink noise, pure tones."""

from __future__ import annotations

import numpy as np

from vllm_whisper_align.constants import SAMPLE_RATE

# Noise at this RMS level: a quiet room's hiss turned up, well above 16-bit dither.
NOISE_RMS = 0.03


def white_noise(seconds: float, seed: int = 0) -> np.ndarray:
    return (NOISE_RMS * np.random.default_rng(seed).normal(0.0, 1.0, int(seconds * SAMPLE_RATE))).astype(
        np.float32
    )


def pink_noise(seconds: float, seed: int = 0) -> np.ndarray:
    """Noise whose power falls as 1/f (white noise's spectrum over the square root of frequency)."""
    white = np.random.default_rng(seed).normal(0.0, 1.0, int(seconds * SAMPLE_RATE))
    spectrum = np.fft.rfft(white)
    spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1))
    pink = np.fft.irfft(spectrum, len(white))
    return (NOISE_RMS * pink / max(float(pink.std()), 1e-12)).astype(np.float32)


NOISES = {"white": white_noise, "pink": pink_noise}


def speech_level(samples: np.ndarray) -> float:
    """RMS of the louder half of the 20 ms frames (a recording's speech, not its pauses)."""
    from vllm_whisper_align.audio.features import frame_levels_db

    power = 10 ** (frame_levels_db(samples) / 10)
    return float(np.sqrt(np.mean(power[power >= np.median(power)])))


def with_noise(samples: np.ndarray, noise: str, snr_db: float, seed: int) -> np.ndarray:
    """``samples`` with ``noise`` ("white", "pink") mixed in ``snr_db`` under their speech_level."""
    raw = NOISES[noise](len(samples) / SAMPLE_RATE + 1.0, seed=seed)[: len(samples)]
    scaled = raw / max(float(raw.std()), 1e-12) * speech_level(samples) * 10 ** (-snr_db / 20)
    return np.clip(samples + scaled, -1.0, 1.0).astype(np.float32)


def tone(frequency_hz: float, seconds: float, amplitude: float = 0.3) -> np.ndarray:
    return (
        amplitude * np.sin(2 * np.pi * frequency_hz * np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE)
    ).astype(np.float32)


# One second of each, in turn: the pitch of voices and the frequencies of beeps and test tones.
TONE_FREQUENCIES_HZ = (220, 440, 660, 880, 1000, 300, 150, 2000, 3000, 100)


def tones(seconds: float = 20.0) -> np.ndarray:
    """A pure tone a second, each at the next of TONE_FREQUENCIES_HZ, for ``seconds``."""
    count = int(np.ceil(seconds))
    return np.concatenate(
        [tone(TONE_FREQUENCIES_HZ[i % len(TONE_FREQUENCIES_HZ)], 1.0) for i in range(count)]
    )[: int(seconds * SAMPLE_RATE)]


def beeps(seconds: float = 20.0, frequency_hz: float = 1000.0) -> np.ndarray:
    """0.2 s beeps with 0.2 s of digital silence between them: sound that stands out of its floor."""
    period = np.concatenate([tone(frequency_hz, 0.2), np.zeros(int(0.2 * SAMPLE_RATE), dtype=np.float32)])
    return np.tile(period, int(np.ceil(seconds / 0.4)))[: int(seconds * SAMPLE_RATE)]


def non_speech(long_s: float = 600.0) -> dict[str, np.ndarray]:
    """Every kind, by name; the noises ``long_s`` long (white and pink, 20 s of each as well)."""
    return {
        "silence 5 s": np.zeros(5 * SAMPLE_RATE, dtype=np.float32),
        "NaN 5 s": np.full(5 * SAMPLE_RATE, np.nan, dtype=np.float32),
        "10 ms of noise": white_noise(0.01, seed=3),
        "white noise 20 s": white_noise(20.0, seed=1),
        "pink noise 20 s": pink_noise(20.0, seed=2),
        f"white noise {long_s:g} s": white_noise(long_s, seed=4),
        f"pink noise {long_s:g} s": pink_noise(long_s, seed=5),
        "tones 20 s": tones(20.0),
        "beeps 20 s": beeps(20.0),
    }
