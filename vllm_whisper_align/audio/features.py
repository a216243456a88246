"""What the audio itself says about word boundaries: frame levels and the noise floor, the speech mask
and the quieter sound of word tails, and the spectral flux (rises and falls) that word starts are
moved to. Computed per window on the API side, next to the alignment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_whisper_align.constants import HOP_LENGTH, N_FFT, SAMPLE_RATE


def true_runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends ([start, end)) of the runs of True in a boolean mask, in order."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], np.asarray(mask).astype(np.int8), [0]])))
    return edges[0::2], edges[1::2]


# ---------------------------------------------------------------------------- speech / silence

# One encoder frame: the resolution word times have anyway.
SPEECH_FRAME_SECONDS = 0.02
# A frame is speech when its level in the voice's band is this far above that band's noise floor and
# not far below its peak, and its level over the whole band at least SOUND_ABOVE_NOISE_DB above the
# whole band's floor.
SPEECH_ABOVE_NOISE_DB = 8.0
SPEECH_BELOW_PEAK_DB = 50.0
# The voice's band: its first formant and its strongest harmonics. Below it lie hum and rumble, above it
# the hiss of breaths, sniffs and fricatives that fill a real recording's pauses, which the whole band's
# level took for speech (docs/boundaries.md#spontaneous-speech-2026-12-05).
VOICE_BAND_HZ = (250.0, 1500.0)
# Where a recording's floor is rumble, the voice's band has a far lower floor than the whole band, and
# a bump of room tone stands out in it: a frame that does not rise over the whole band's floor at all
# is no speech.
SOUND_ABOVE_NOISE_DB = 2.0
# The spectrum of a 20 ms frame for the voice's band, zero-padded to this many samples (31 Hz bins).
VOICE_BAND_FFT = 512
# Quiet runs shorter than this (stop-consonant closures) stay speech.
MIN_SILENCE_SECONDS = 0.1


# A word's quiet tail (a fading vowel, a final fricative or nasal) is still sound above the noise floor
# where the speech mask (SPEECH_BELOW_PEAK_DB) has already called it silence.
TAIL_ABOVE_NOISE_DB = 6.0


def _frame_rows(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """``samples`` as rows of 20 ms (float64; the last frame zero-padded)."""
    frame_length = int(SPEECH_FRAME_SECONDS * sample_rate)
    num_frames = -(-len(samples) // frame_length)
    padded = np.zeros(num_frames * frame_length, dtype=np.float64)
    padded[: len(samples)] = samples
    return padded.reshape(num_frames, frame_length)


def frame_levels_db(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Mean power in dB per 20 ms frame (the last frame zero-padded)."""
    frames = _frame_rows(samples, sample_rate)
    # einsum: the same sums as np.mean(frames ** 2), 15x faster (no squared copy, 0.7 ms per 30 s)
    power = np.einsum("ij,ij->i", frames, frames) / frames.shape[1]
    return 10 * np.log10(power + 1e-12)


def band_levels_db(
    samples: np.ndarray, band_hz: tuple[float, float], sample_rate: int = SAMPLE_RATE
) -> np.ndarray:
    """Power in dB per 20 ms frame within ``band_hz`` [low, high) (Hann-windowed, the last frame
    zero-padded): the same frames as :func:`frame_levels_db`."""
    frames = _frame_rows(samples, sample_rate)
    frame_length = frames.shape[1]
    frames = frames * np.hanning(frame_length)
    power = np.abs(np.fft.rfft(frames, VOICE_BAND_FFT, axis=1)) ** 2
    frequencies = np.fft.rfftfreq(VOICE_BAND_FFT, 1 / sample_rate)
    band = (frequencies >= band_hz[0]) & (frequencies < band_hz[1])
    return 10 * np.log10(power[:, band].sum(axis=1) / frame_length + 1e-12)


def voice_band_levels_db(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Power in dB per 20 ms frame within VOICE_BAND_HZ."""
    return band_levels_db(samples, VOICE_BAND_HZ, sample_rate)


def noise_floor_db(levels_db: np.ndarray) -> float:
    """The level that a tenth of the frames stay under: the clip's noise, or its digital silence."""
    return float(np.percentile(levels_db, 10))


def speech_frames(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Boolean per 20 ms frame: True where there is sound in the voice's band (VOICE_BAND_HZ) above its
    noise floor, with a voice in it.

    Cross-attention DTW gives a silence before a word to that word (it has to go somewhere); this mask
    lets word boundaries be moved out of such silences, and out of what fills a real recording's
    pauses: room tone, breaths, sniffs, clicks.
    """
    band_db = voice_band_levels_db(samples, sample_rate)
    if len(band_db) == 0:
        return np.zeros(0, dtype=bool)
    level_db = frame_levels_db(samples, sample_rate)
    threshold = max(noise_floor_db(band_db) + SPEECH_ABOVE_NOISE_DB, band_db.max() - SPEECH_BELOW_PEAK_DB)
    speech = (band_db > threshold) & (level_db > noise_floor_db(level_db) + SOUND_ABOVE_NOISE_DB)
    speech = _fill_short_silences(speech, int(round(MIN_SILENCE_SECONDS / SPEECH_FRAME_SECONDS)))
    return _without_unvoiced_runs(speech, samples, sample_rate)


def speech_share(speech: np.ndarray, start: float, end: float) -> float:
    """Share of the 20 ms frames of [start, end) (seconds into the audio of ``speech``, a
    :func:`speech_frames` mask; a zero-length span: its frame) that the mask holds."""
    if len(speech) == 0:
        return 0.0
    first = int(np.clip(np.floor(start / SPEECH_FRAME_SECONDS), 0, len(speech) - 1))
    last = int(np.clip(np.ceil(end / SPEECH_FRAME_SECONDS), first + 1, len(speech)))
    return float(np.mean(speech[first:last]))


# Sound is speech only where a voice is in it: a breath, a click, a bump of room tone or a door is not,
# and every word holds a voiced sound (a vowel, a nasal, a voiced consonant). A run of sound shorter than
# MIN_SPEECH_SECONDS is no word at all; one up to VOICE_CHECK_MAX_SECONDS long needs MIN_VOICED_FRAMES
# voiced frames and MIN_VOICED_SHARE of its frames voiced (noise in the voice's band reads as voiced in a
# frame or two by chance); longer runs are speech without a look.
MIN_SPEECH_SECONDS = 0.06
VOICE_CHECK_MAX_SECONDS = 0.6
MIN_VOICED_FRAMES = 2
MIN_VOICED_SHARE = 0.2
# Voicing: the peak of a frame's normalised autocorrelation at the lags of a voice's pitch.
VOICE_MIN_HZ, VOICE_MAX_HZ = 60, 400
VOICED_CORRELATION = 0.5
# Frames either side of a run of the mask read with it (voiced_frames looks 1.5 frames ahead).
VOICE_CONTEXT_FRAMES = 2
# Voicing is read at a quarter of the rate: a voice's pitch and its first harmonics lie under 2 kHz.
VOICE_DECIMATION = 4


def _without_unvoiced_runs(speech: np.ndarray, samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """``speech`` without its short runs of sound that hold no voice.

    Each run's voicing is read with VOICE_CONTEXT_FRAMES of the audio about it, as over the whole input:
    a run cut out alone has zeros about it, and its edge frames read them as periodic (a 60 ms bump of
    room tone did)."""
    frame = int(SPEECH_FRAME_SECONDS * sample_rate)
    shortest = int(round(MIN_SPEECH_SECONDS / SPEECH_FRAME_SECONDS))
    checked = int(round(VOICE_CHECK_MAX_SECONDS / SPEECH_FRAME_SECONDS))
    out = speech.copy()
    for start, end in zip(*true_runs(speech), strict=True):
        if end - start > checked:
            continue
        if end - start < shortest:
            out[start:end] = False
            continue
        low = max(start - VOICE_CONTEXT_FRAMES, 0)
        voiced = voiced_frames(samples[low * frame : (end + VOICE_CONTEXT_FRAMES) * frame], sample_rate)
        if voiced[start - low : end - low].sum() < max(MIN_VOICED_FRAMES, MIN_VOICED_SHARE * (end - start)):
            out[start:end] = False
    return out


def voiced_frames(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Boolean per 20 ms frame of ``samples``: a voice's periodicity (the normalised autocorrelation over
    two frames peaks above VOICED_CORRELATION at a pitch lag)."""
    rate = sample_rate // VOICE_DECIMATION
    # A crude low-pass (the mean of each group of samples) before keeping one sample of each group.
    usable = len(samples) // VOICE_DECIMATION * VOICE_DECIMATION
    low = np.asarray(samples[:usable], dtype=np.float64).reshape(-1, VOICE_DECIMATION).mean(axis=1)
    frame = int(SPEECH_FRAME_SECONDS * rate)
    num_frames = len(low) // frame
    if num_frames == 0:
        return np.zeros(0, dtype=bool)
    window = 2 * frame
    padded = np.pad(low, (frame // 2, window))
    frames = np.lib.stride_tricks.sliding_window_view(padded, window)[: num_frames * frame : frame]
    frames = frames - frames.mean(axis=1, keepdims=True)
    spectrum = np.fft.rfft(frames, 2 * window)
    correlation = np.fft.irfft(np.abs(spectrum) ** 2)[:, :window]
    # Each lag's product sum over the energies of the two stretches it compares (n and n + lag), so
    # that a periodic frame scores near 1 at its period whatever the lag.
    energy = np.cumsum(frames**2, axis=1)
    lags = np.arange(rate // VOICE_MAX_HZ, min(window - 1, rate // VOICE_MIN_HZ) + 1)
    head = energy[:, window - 1 - lags]  # samples [0, window - lag)
    tail = energy[:, -1:] - energy[:, lags - 1]  # samples [lag, window)
    normalised = correlation[:, lags] / np.sqrt(np.maximum(head * tail, 1e-24))
    return normalised.max(axis=1) > VOICED_CORRELATION


def sound_frames(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Boolean per 20 ms frame: True where the level is ``TAIL_ABOVE_NOISE_DB`` over the noise floor,
    however far below the loudest frame (the quiet tails :func:`speech_frames` leaves out)."""
    level_db = frame_levels_db(samples, sample_rate)
    if len(level_db) == 0:
        return np.zeros(0, dtype=bool)
    return level_db > noise_floor_db(level_db) + TAIL_ABOVE_NOISE_DB


# A fricative (/s/, /z/, /sh/, /f/) or a stop's release has its power above the voice's band, where room
# tone and rumble have little: a frame is hiss where its level over HISS_BAND_HZ is this far above that
# band's noise floor. The speech mask leaves such sound out, and the whole band's level (sound_frames)
# misses it where the floor is rumble. The band: all above 3 kHz.
HISS_BAND_HZ = (3000.0, float("inf"))
HISS_ABOVE_NOISE_DB = 10.0


def hiss_frames(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Boolean per 20 ms frame: True where the level in HISS_BAND_HZ is HISS_ABOVE_NOISE_DB over that
    band's noise floor."""
    level_db = band_levels_db(samples, HISS_BAND_HZ, sample_rate)
    if len(level_db) == 0:
        return np.zeros(0, dtype=bool)
    return level_db > noise_floor_db(level_db) + HISS_ABOVE_NOISE_DB


def _fill_short_silences(speech: np.ndarray, min_frames: int) -> np.ndarray:
    speech = speech.copy()
    for start, end in zip(*true_runs(~speech), strict=True):  # runs of silence [start, end)
        if end - start < min_frames and start > 0 and end < len(speech):
            speech[start:end] = True
    return speech


# ---------------------------------------------------------------------------- any speech at all

# A window holds speech when this many frames of its speech mask carry a voice that is not one tone.
# Given digital silence, white or pink noise, or tones, Whisper still writes text ("you", a sentence over
# and over): such a window is not decoded. Every speech window of the synthetic and real sets holds 14
# such frames or more (benchmarks/RESULTS.md#no-speech); 100 ms is less than one stressed syllable.
MIN_VOICE_FRAMES = 5
# A frame is one tone (a beep, a whistle, a sweep, hum, the rumble of brown noise) when the band of
# +-SINGLE_TONE_HZ about its strongest frequency holds SINGLE_TONE_SHARE of its power: a voice spreads its
# power over harmonics and formants.
SINGLE_TONE_HZ = 100.0
SINGLE_TONE_SHARE = 0.9
# The spectrum of a 20 ms frame, zero-padded to this many samples (16 Hz bins at 16 kHz).
SINGLE_TONE_FFT = 1024


def holds_speech(
    samples: np.ndarray, sample_rate: int = SAMPLE_RATE, speech: np.ndarray | None = None
) -> bool:
    """Whether ``samples`` hold MIN_VOICE_FRAMES frames of speech: under the speech mask (``speech``,
    :func:`speech_frames` of ``samples``, where the caller has it already), voiced, and not one tone.
    Read run by run of the mask, stopping as soon as enough are found (a speech window is settled by its
    first words)."""
    samples = np.nan_to_num(np.asarray(samples, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    frame = int(SPEECH_FRAME_SECONDS * sample_rate)
    if speech is None:
        speech = speech_frames(samples, sample_rate)
    # Voicing of the first difference: pink and brown noise, strong at low frequencies, correlate over a
    # voice's pitch lags by chance (up to 15 frames a window of pink noise); the difference flattens
    # them, and a voice's harmonics stay periodic.
    flattened = np.diff(samples, prepend=samples[:1])
    found = 0
    for start, end in zip(*true_runs(speech), strict=True):
        # Voicing reads two frames about each one: the run is read with its neighbours, and a frame
        # without them (at the window's edge) is not counted, as the zeros padded there correlate.
        low, high = max(start - VOICE_CONTEXT_FRAMES, 0), min(end + VOICE_CONTEXT_FRAMES, len(speech))
        piece = slice(low * frame, high * frame)
        usable = np.zeros(high - low, dtype=bool)
        usable[start - low : end - low] = True
        usable[:VOICE_CONTEXT_FRAMES] = usable[high - low - VOICE_CONTEXT_FRAMES :] = False
        voiced = voiced_frames(flattened[piece], sample_rate)
        count = min(len(voiced), len(usable))
        tone = single_tone_frames(samples[piece], sample_rate)[:count]
        found += int((voiced[:count] & ~tone & usable[:count]).sum())
        if found >= MIN_VOICE_FRAMES:
            return True
    return False


def single_tone_frames(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Boolean per whole 20 ms frame: the band about the strongest frequency holds nearly all the power."""
    frame = int(SPEECH_FRAME_SECONDS * sample_rate)
    num_frames = len(samples) // frame
    if num_frames == 0:
        return np.zeros(0, dtype=bool)
    frames = np.asarray(samples[: num_frames * frame], dtype=np.float64).reshape(num_frames, frame)
    power = np.abs(np.fft.rfft(frames * np.hanning(frame), SINGLE_TONE_FFT, axis=1)) ** 2
    half_band = int(round(SINGLE_TONE_HZ * SINGLE_TONE_FFT / sample_rate))
    cumulative = np.concatenate([np.zeros((num_frames, 1)), np.cumsum(power, axis=1)], axis=1)
    peak = power.argmax(axis=1)
    low = np.maximum(peak - half_band, 0)
    high = np.minimum(peak + half_band + 1, power.shape[1])
    rows = np.arange(num_frames)
    in_band = cumulative[rows, high] - cumulative[rows, low]
    return in_band >= SINGLE_TONE_SHARE * np.maximum(cumulative[:, -1], 1e-30)


# ---------------------------------------------------------------------------- onsets

# Spectral flux on Whisper's own STFT geometry: 25 ms windows every 10 ms.
ONSET_FRAME_SECONDS = HOP_LENGTH / SAMPLE_RATE
ONSET_BANDS = 40


@dataclass(frozen=True)
class SpectralFlux:
    """Per 10 ms frame, how much the log-power spectrum rose and how much it fell from the frame before.

    A word that starts with a loud sound (a vowel, /s/) starts where new energy rises; one that starts
    quieter than the sound before it (a stop's closure, a nasal) starts where the sound falls
    (``align.boundaries.refine_starts`` reads both).
    """

    rises: np.ndarray
    falls: np.ndarray


def spectral_flux(samples: np.ndarray) -> SpectralFlux:
    """Rises and falls of the log-power spectrum per 10 ms frame.

    Frame k is centred on sample k * HOP_LENGTH (the STFT is padded by half a window, as Whisper's
    log-mel is). Power is summed into ``ONSET_BANDS`` equal bands before the log, so one noisy bin
    cannot make an onset; each band's rise (or fall) from the frame before is summed over the bands.
    """
    samples = np.asarray(samples, dtype=np.float32)
    padded = np.pad(samples, (N_FFT // 2, N_FFT // 2))
    if len(padded) < N_FFT:
        return SpectralFlux(np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.float32))
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP_LENGTH] * np.hanning(N_FFT)
    power = np.abs(np.fft.rfft(frames, axis=-1)[:, 1:]) ** 2
    bands = np.stack([band.sum(axis=-1) for band in np.array_split(power, ONSET_BANDS, axis=-1)], axis=-1)
    log_power = np.log10(bands + 1e-10)
    change = np.diff(log_power, axis=0, prepend=log_power[:1])
    return SpectralFlux(
        np.maximum(change, 0).sum(axis=-1).astype(np.float32),
        np.maximum(-change, 0).sum(axis=-1).astype(np.float32),
    )
