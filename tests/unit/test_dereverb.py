"""The late reverberation taken out before the acoustic model of phones reads a window
(``audio.dereverb``: weighted prediction error); what it does to word boundaries is checked in
test_phones.py and, through a server started with its defaults, tests/server/test_server.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import real_speech
from tests.support.no_speech import with_noise
from tests.support.rooms import in_room
from vllm_whisper_align.audio import dereverb
from vllm_whisper_align.audio.phones import MODEL_BAND_HZ, pcm16
from vllm_whisper_align.constants import SAMPLE_RATE


@pytest.fixture(scope="module")
def talker():
    """PolyglotDB's recording of one talker speaking freely (27 s, quiet, close to the microphone)."""
    [clip] = [
        c for c in real_speech.load_clips(log=lambda *_: None, sets=("spontaneous",)) if "polyglot" in c.id
    ]
    return clip


def test_the_transform_gives_back_the_samples():
    samples = np.random.default_rng(0).normal(0.0, 0.1, 12345).astype(np.float32)
    again = dereverb.istft(dereverb.stft(samples), len(samples))
    assert np.max(np.abs(again - samples)) < 1e-6


def test_short_audio_and_digital_silence_are_left_as_they_are():
    short = np.random.default_rng(0).normal(0.0, 0.1, int(4.9 * SAMPLE_RATE)).astype(np.float32)
    assert dereverb.dereverberated(short, MODEL_BAND_HZ, SAMPLE_RATE) is short
    silence = np.zeros(6 * SAMPLE_RATE, dtype=np.float32)
    assert not np.any(dereverb.dereverberated(silence, MODEL_BAND_HZ, SAMPLE_RATE))


def test_dry_speech_is_changed_little(talker):
    """A recording with little room in it has little tail to predict: what the filter takes out is
    over 20 dB below the speech (23 dB on this one; MFA's two recordings of a talker with a cold, 44
    and 57 dB)."""
    out = dereverb.dereverberated(talker.samples, MODEL_BAND_HZ, SAMPLE_RATE, always=True)
    speech = talker.samples.astype(np.float64)
    assert 10 * np.log10(np.sum((out - speech) ** 2) / np.sum(speech**2)) < -20


def test_frequencies_outside_the_band_are_kept(talker):
    out = dereverb.dereverberated(talker.samples, (1000.0, 2000.0), SAMPLE_RATE, always=True)
    before, after = dereverb.stft(talker.samples), dereverb.stft(out)
    low = slice(0, int(900 * dereverb.FFT_SIZE / SAMPLE_RATE))
    assert np.allclose(after[low], before[low], atol=1e-3 * np.abs(before).max())


def late_db(samples: np.ndarray) -> float:
    return dereverb.late_reverberation_db(samples, MODEL_BAND_HZ, SAMPLE_RATE)


def test_the_gates_rows_are_the_transforms():
    samples = np.random.default_rng(0).normal(0.0, 0.1, 3 * SAMPLE_RATE).astype(np.float32)
    band = dereverb.band_bins(MODEL_BAND_HZ, SAMPLE_RATE)
    bins = np.arange(band.start, band.stop, dereverb.GATE_STEP)
    whole = dereverb.stft(samples)
    assert np.max(np.abs(dereverb.stft_rows(samples, bins) - whole[bins])) < 1e-5 * np.abs(whole).max()


def test_the_gate_skips_dry_speech_and_finds_a_rooms_tail():
    """MFA's two recordings of a talker with a cold, close to the microphone: the first estimate of
    their late reverberation is under the gate (-41 and -37 dB), and by default they are left as they
    are; played in a room whose tail falls by 60 dB in 0.6 s (and 1 s), it is over it (-24 to -26 dB),
    and they are dereverberated."""
    clips = [c for c in real_speech.load_clips(log=lambda *_: None, sets=("spontaneous",)) if "mfa" in c.id]
    assert len(clips) == 2
    for i, clip in enumerate(clips):
        dry = clip.samples
        assert late_db(dry) < dereverb.GATE_DB - 5
        assert dereverb.dereverberated(dry, MODEL_BAND_HZ, SAMPLE_RATE) is dry
        for rt60_s in (0.6, 1.0):
            room = in_room(dry, rt60_s, seed=i)
            assert late_db(room) > dereverb.GATE_DB
            out = dereverb.dereverberated(room, MODEL_BAND_HZ, SAMPLE_RATE)
            assert out is not room
            assert np.array_equal(out, dereverb.dereverberated(room, MODEL_BAND_HZ, SAMPLE_RATE, always=True))


def test_the_gate_reads_digital_silence_as_no_tail():
    assert late_db(np.zeros(6 * SAMPLE_RATE, dtype=np.float32)) == float("-inf")


def test_the_gate_reads_a_noisy_recording_alike_at_any_scale():
    """MFA's first recording of the talker with a cold with pink noise 10 dB under its speech: the gate
    reads the same (no tail) from the samples, the same scaled by 1 - 2**-15, and their PCM16, as the
    phone aligner's workers get them. In single precision it read -34, -28 and -22 dB: the third over
    GATE_DB, so a window's cleaning hung on its last bit."""
    [clip] = [
        c
        for c in real_speech.load_clips(log=lambda *_: None, sets=("spontaneous",))
        if c.id == "mfa_cold_corpus"
    ]
    samples = with_noise(clip.samples, "pink", 10, seed=0)
    quantized = pcm16(samples).astype(np.float32) / 32768
    readings = [
        dereverb.late_reverberation_db(s, MODEL_BAND_HZ, SAMPLE_RATE)
        for s in (samples, samples * np.float32(1 - 2**-15), quantized)
    ]
    assert max(readings) - min(readings) < 1.0, readings
    assert max(readings) < dereverb.GATE_DB, readings
