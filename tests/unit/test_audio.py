import io
import json
import shutil
import subprocess
import threading
import time
import tracemalloc
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import soundfile
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.silence import state_total_samples, write_constant_flac, write_silent_flac
from tests.support.speech import long_clip, sentence_clips, write_wav
from vllm_whisper_align.audio.decode import (
    MAX_VALUES_PER_BYTE,
    SPILL_AFTER_WINDOWS,
    AudioError,
    AudioTooLongError,
    DecodeGaveUp,
    DecodeStopped,
    SpilledSamples,
    decode_audio,
    stated_seconds,
)
from vllm_whisper_align.audio.windows import MIN_CHUNK_SECONDS, AudioChunk, chunk_audio
from vllm_whisper_align.checkpoints.bundled import sample_path
from vllm_whisper_align.constants import CHUNK_SECONDS, HOP_LENGTH, N_SAMPLES, SAMPLE_RATE, num_mel_frames


@pytest.fixture(scope="module")
def clip():
    return sentence_clips()[1]


# --- decoding ------------------------------------------------------------------------


def encode_with_pyav(path, samples, container_format, codec, rate, channels=1):
    av = pytest.importorskip("av")
    layout = "stereo" if channels == 2 else "mono"
    try:
        with av.open(str(path), "w", format=container_format) as output:
            stream = output.add_stream(codec, rate=rate)
            stream.layout = layout
            resampler = av.AudioResampler(format=stream.codec_context.format.name, layout=layout, rate=rate)
            # Duplicate channels ourselves: FFmpeg's mono-to-stereo upmix scales by 0.707.
            planes = np.repeat(samples[None, :].astype(np.float32), channels, axis=0)
            frame = av.AudioFrame.from_ndarray(planes, format="fltp", layout=layout)
            frame.sample_rate = SAMPLE_RATE
            # Real timestamps let the muxer record encoder priming (AAC's edit list).
            frame.pts, frame.time_base = 0, Fraction(1, SAMPLE_RATE)
            for resampled in resampler.resample(frame) + resampler.resample(None):
                for packet in stream.encode(resampled):
                    output.mux(packet)
            for packet in stream.encode(None):
                output.mux(packet)
    except (av.error.FFmpegError, ValueError) as error:
        pytest.skip(f"no {codec} encoder in this PyAV build: {error}")


def encode_with_sox(path, samples, rate):
    if shutil.which("sox") is None:
        pytest.skip("sox not installed")
    source = Path(path).with_suffix(".source.wav")
    write_wav(source, samples)
    result = subprocess.run(["sox", str(source), "-r", str(rate), str(path)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"sox cannot write {Path(path).suffix}: {result.stderr.decode().strip()}")


def encode(path, samples, kind):
    """Write `samples` (16 kHz mono) as `kind`, one of ENCODINGS."""
    if kind == "wav":
        write_wav(path, samples)
    elif kind == "wav-44k-stereo":
        stereo = np.stack([samples, samples], axis=1)
        soundfile.write(path, _resample_reference(stereo, 44100), 44100, subtype="PCM_16")
    elif kind == "flac":
        soundfile.write(path, samples, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
    elif kind == "mp3":
        encode_with_pyav(path, samples, "mp3", "libmp3lame", 44100)
    elif kind == "ogg-vorbis":
        encode_with_sox(path, samples, 44100)
    elif kind == "ogg-opus":
        encode_with_pyav(path, samples, "ogg", "libopus", 48000)
    elif kind == "m4a":
        encode_with_pyav(path, samples, "ipod", "aac", 44100)
    elif kind == "webm":
        encode_with_pyav(path, samples, "webm", "libopus", 48000, channels=2)
    else:
        raise ValueError(kind)


def _resample_reference(samples, rate):
    # Linear interpolation is plenty for a decode test: the decoder resamples it back.
    old_times = np.arange(len(samples)) / SAMPLE_RATE
    new_times = np.arange(int(len(samples) * rate / SAMPLE_RATE)) / rate
    return np.stack([np.interp(new_times, old_times, channel) for channel in samples.T], axis=1)


ENCODINGS = {
    # kind: (file suffix, lossless)
    "wav": (".wav", True),
    "wav-44k-stereo": (".wav", False),
    "flac": (".flac", True),
    "mp3": (".mp3", False),
    "ogg-vorbis": (".ogg", False),
    "ogg-opus": (".ogg", False),
    "m4a": (".m4a", False),
    "webm": (".webm", False),
}


def alignment(reference, decoded):
    """(lag in samples of `decoded` behind `reference`, normalised correlation)."""
    size = 1 << (len(reference) + len(decoded)).bit_length()
    correlation = np.fft.irfft(np.fft.rfft(decoded, size) * np.conj(np.fft.rfft(reference, size)), size)
    lag = int(np.argmax(correlation))
    lag = lag if lag < size // 2 else lag - size
    scale = np.sqrt(np.dot(reference, reference) * np.dot(decoded, decoded))
    return lag, float(correlation.max() / scale)


@pytest.mark.parametrize("kind", ENCODINGS)
def test_decode_formats(tmp_path, clip, kind):
    suffix, lossless = ENCODINGS[kind]
    path = tmp_path / f"clip{suffix}"
    encode(path, clip.samples, kind)

    decoded = decode_audio(path)
    assert decoded.dtype == np.float32 and decoded.ndim == 1
    assert np.abs(decoded).max() <= 1.0
    # Lossy codecs pad the end to whole frames; the start must not move.
    assert abs(len(decoded) - len(clip.samples)) <= 0.1 * SAMPLE_RATE
    lag, correlation = alignment(clip.samples, decoded)
    assert abs(lag) <= SAMPLE_RATE // 1000, f"{kind} decoded {lag} samples late"
    assert correlation > (0.9999 if lossless else 0.9)
    assert abs(np.abs(decoded).max() - np.abs(clip.samples).max()) < 0.15, "level changed"


@pytest.mark.parametrize("kind", ["wav", "mp3", "m4a"])
def test_path_bytes_and_stream_agree(tmp_path, clip, kind):
    path = tmp_path / f"clip{ENCODINGS[kind][0]}"
    encode(path, clip.samples, kind)
    from_path = decode_audio(path)
    np.testing.assert_array_equal(decode_audio(str(path)), from_path)
    np.testing.assert_array_equal(decode_audio(path.read_bytes()), from_path)
    with open(path, "rb") as stream:
        np.testing.assert_array_equal(decode_audio(stream), from_path)
    np.testing.assert_array_equal(decode_audio(io.BytesIO(path.read_bytes())), from_path)


def test_lossless_16k_is_exact(tmp_path, clip):
    path = tmp_path / "clip.flac"
    encode(path, clip.samples, "flac")
    np.testing.assert_allclose(decode_audio(path), clip.samples, atol=1 / 32768)


def test_stereo_is_averaged(tmp_path):
    tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(44100) / 44100)
    silence = np.zeros_like(tone)
    for rate in (16000, 44100):  # soundfile fast path and FFmpeg path
        path = tmp_path / f"left_only_{rate}.wav"
        soundfile.write(path, np.stack([tone, silence], axis=1)[:rate], rate, subtype="FLOAT")
        assert np.abs(decode_audio(path)).max() == pytest.approx(0.25, abs=0.01)


def test_resampled_length(tmp_path):
    path = tmp_path / "tone.wav"
    soundfile.write(path, np.full(22050 * 3, 0.1), 22050)
    assert len(decode_audio(path)) == pytest.approx(3 * SAMPLE_RATE, abs=2)


def test_many_channels(tmp_path, clip):
    # Over 8 channels once crashed PyAV's planar frame reader.
    path = tmp_path / "ten.wav"
    soundfile.write(
        path, _resample_reference(np.stack([clip.samples] * 10, axis=1), 44100), 44100, subtype="FLOAT"
    )
    lag, correlation = alignment(clip.samples, decode_audio(path))
    assert lag == 0 and correlation > 0.99


def test_rate_change_midway(tmp_path, clip):
    first, second = tmp_path / "first.mp3", tmp_path / "second.mp3"
    encode_with_pyav(first, clip.samples, "mp3", "libmp3lame", 44100)
    encode_with_pyav(second, clip.samples, "mp3", "libmp3lame", 22050, channels=2)
    decoded = decode_audio(first.read_bytes() + second.read_bytes())
    assert len(decoded) / SAMPLE_RATE == pytest.approx(2 * clip.duration, abs=0.2)
    assert alignment(clip.samples, decoded[: len(clip.samples)])[1] > 0.95
    assert alignment(clip.samples, decoded[len(clip.samples) :])[1] > 0.95


@pytest.mark.parametrize("rate", [16000, 44100])
def test_non_finite_samples_are_zeroed(tmp_path, rate):
    path = tmp_path / "nan.wav"
    soundfile.write(path, np.array([0.5, np.nan, np.inf, -np.inf, -0.5] * 100), rate, subtype="FLOAT")
    samples = decode_audio(path)
    assert np.isfinite(samples).all() and np.abs(samples).max() <= 1.0


def test_implausible_sample_rate():
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(1000), 44100, format="WAV", subtype="PCM_16")
    header = bytearray(buffer.getvalue())
    header[24:28] = (83_000_000).to_bytes(4, "little")  # fmt chunk's sample rate
    with pytest.raises(AudioError) as error:
        decode_audio(bytes(header))
    _assert_one_line(error, "sample rate")


@pytest.mark.parametrize("rate", [16000, 44100])
def test_zero_length_audio_is_empty(tmp_path, rate):
    path = tmp_path / "empty.wav"
    soundfile.write(path, np.zeros(0), rate)
    for source in (path, path.read_bytes()):
        samples = decode_audio(source)
        assert samples.dtype == np.float32 and samples.shape == (0,)


def _assert_one_line(error, *fragments):
    message = str(error.value)
    assert "\n" not in message and message
    for fragment in fragments:
        assert fragment in message


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.wav"
    with pytest.raises(AudioError) as error:
        decode_audio(missing)
    assert str(error.value) == f"no such file: {missing}"


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.mp3"
    empty.touch()
    with pytest.raises(AudioError) as error:
        decode_audio(empty)
    _assert_one_line(error, "empty", str(empty))
    with pytest.raises(AudioError):
        decode_audio(b"")


def test_directory(tmp_path):
    with pytest.raises(AudioError) as error:
        decode_audio(tmp_path)
    _assert_one_line(error, str(tmp_path))


NOT_AUDIO = {
    "text": b"this is a plain text file, not audio\n" * 20,
    "zeros": bytes(4096),
    "random": np.random.default_rng(0).bytes(8192),
    "png": b"\x89PNG\r\n\x1a\n" + bytes(200),
    "json": json.dumps({"text": "hello"}).encode(),
}


@pytest.mark.parametrize("name", NOT_AUDIO)
def test_not_audio(tmp_path, name):
    path = tmp_path / f"{name}.wav"
    path.write_bytes(NOT_AUDIO[name])
    with pytest.raises(AudioError) as error:
        decode_audio(path)
    _assert_one_line(error, f"could not decode {path} as audio: ")
    with pytest.raises(AudioError) as error:
        decode_audio(NOT_AUDIO[name])
    _assert_one_line(error, "could not decode <bytes> as audio: ")


def test_unsupported_source_type():
    with pytest.raises(AudioError):
        decode_audio(12345)


@pytest.fixture(scope="module")
def encoded_files(tmp_path_factory, clip):
    folder = tmp_path_factory.mktemp("encoded")
    files = {}
    for kind in ("wav", "flac", "mp3", "m4a", "ogg-opus"):
        path = folder / f"clip{ENCODINGS[kind][0]}"
        try:
            encode(path, clip.samples[:SAMPLE_RATE], kind)
        except pytest.skip.Exception:
            continue
        files[kind] = path.read_bytes()
    return files


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_damaged_files_raise_only_audio_error(encoded_files, data):
    """Truncated or corrupted uploads either decode or raise AudioError, nothing else."""
    kind = data.draw(st.sampled_from(sorted(encoded_files)))
    damaged = bytearray(encoded_files[kind])
    damaged = damaged[: data.draw(st.integers(0, len(damaged)))]
    for _ in range(data.draw(st.integers(0, 20))):
        if damaged:
            damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    try:
        samples = decode_audio(bytes(damaged))
    except AudioError as error:
        assert "\n" not in str(error)
    else:
        assert samples.dtype == np.float32 and samples.ndim == 1
        assert not np.isnan(samples).any() and np.abs(samples).max(initial=0) <= 1.0


def test_bundled_sample():
    path = sample_path()
    assert path.suffix == ".flac" and path.stat().st_size < 200_000
    truth = json.loads(path.with_suffix(".json").read_text())
    samples = decode_audio(path)
    assert soundfile.info(path).samplerate == SAMPLE_RATE and soundfile.info(path).channels == 1
    assert len(samples) / SAMPLE_RATE == pytest.approx(truth["duration"])
    assert [word["word"] for word in truth["words"]] == "the quick brown fox jumps over the lazy dog".split()
    for word in truth["words"]:
        inside = samples[round(word["start"] * SAMPLE_RATE) : round(word["end"] * SAMPLE_RATE)]
        assert np.sqrt(np.mean(inside**2)) > 0.01
    for before, after in zip(truth["words"], truth["words"][1:], strict=False):
        gap = samples[round(before["end"] * SAMPLE_RATE) : round(after["start"] * SAMPLE_RATE)]
        assert np.abs(gap).max() == 0


# --- duration bound --------------------------------------------------------------------

HOURS_4 = 4 * 3600
BOUND_S = 60


@pytest.fixture(scope="module")
def four_hour_flacs(tmp_path_factory):
    """4 h of silence (921 MB decoded, under 1 MB on disk): the header states its length, or
    states none (FLAC's 0, as streaming encoders write), or claims a single second."""
    folder = tmp_path_factory.mktemp("long")
    files = {}
    for rate in (16000, 8000):
        files[rate, "exact"] = folder / f"exact-{rate}.flac"
        write_silent_flac(files[rate, "exact"], HOURS_4, rate)
    for rate, header, stated in [
        (16000, "unknown", 0),
        (16000, "one-second", 16000),
        (8000, "unknown", 0),
        (8000, "one-second", 8000),
    ]:
        files[rate, header] = folder / f"{header}-{rate}.flac"
        shutil.copyfile(files[rate, "exact"], files[rate, header])
        state_total_samples(files[rate, header], stated)
    return files


def _decode_traced(source, max_seconds, spill=False):
    """(decoded samples or the AudioError raised, seconds taken, peak bytes numpy allocated)."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        outcome = decode_audio(source, max_seconds=max_seconds, spill=spill)
    except AudioError as error:
        outcome = error
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return outcome, elapsed, peak


@pytest.mark.parametrize("rate", [16000, 8000])
def test_over_limit_is_refused_from_the_header(four_hour_flacs, rate):
    """Refused before decoding: at once, and holding next to nothing of the 921 MB it decodes to
    (16 kHz through FFmpeg as it is, 8 kHz through FFmpeg's resampling path)."""
    path = four_hour_flacs[rate, "exact"]
    for source in (path, path.read_bytes()):
        error, elapsed, peak = _decode_traced(source, max_seconds=3600)
        assert isinstance(error, AudioTooLongError), error
        assert error.seconds == pytest.approx(HOURS_4) and error.max_seconds == 3600
        assert "14400.0 s" in str(error) and "3600 s" in str(error)
        assert elapsed < 1.0  # the target
        assert peak < 2**20 + len(path.read_bytes())  # the input's copy, and 1 MB to spare


# A header claiming one second is not believed at 16 kHz either: libsndfile, which decoded 16 kHz FLAC,
# read that second and dropped the rest without a word.
@pytest.mark.parametrize(
    "rate, header", [(16000, "unknown"), (16000, "one-second"), (8000, "unknown"), (8000, "one-second")]
)
def test_decoding_stops_at_the_limit_when_the_header_does_not_tell(four_hour_flacs, rate, header):
    error, _, peak = _decode_traced(four_hour_flacs[rate, header], max_seconds=BOUND_S)
    assert isinstance(error, AudioTooLongError), error
    assert error.seconds is None and f"longer than {BOUND_S} s" in str(error)
    bound_bytes = BOUND_S * SAMPLE_RATE * 4
    # About the bound's worth of float32 samples (blocks and resampler frames on top), not 921 MB.
    assert peak < 3 * bound_bytes


def test_audio_within_the_limit_is_decoded_whole(tmp_path, clip):
    path = tmp_path / "clip.flac"
    encode(path, clip.samples, "flac")
    unbounded = decode_audio(path)
    np.testing.assert_array_equal(decode_audio(path, max_seconds=clip.duration), unbounded)
    with pytest.raises(AudioTooLongError):
        decode_audio(path, max_seconds=clip.duration - 0.01)
    with pytest.raises(ValueError):
        decode_audio(path, max_seconds=0)


# --- long recordings in a temporary file ----------------------------------------------------

WINDOW_BYTES = N_SAMPLES * 4  # one 30 s window of float32 samples


@pytest.mark.parametrize("kind", ["wav", "mp3"])  # libsndfile's path and FFmpeg's
def test_a_long_recording_spills_to_a_file_and_reads_back_the_same(tmp_path, kind):
    long = long_clip(SPILL_AFTER_WINDOWS * CHUNK_SECONDS + 20)
    path = tmp_path / f"long.{kind}"
    encode(path, long.samples, kind)
    in_memory, spilled = decode_audio(path), decode_audio(path, spill=True)
    assert isinstance(spilled, SpilledSamples) and len(spilled) == len(in_memory)
    np.testing.assert_array_equal(spilled[:], in_memory)
    np.testing.assert_array_equal(spilled[1234 : N_SAMPLES + 99], in_memory[1234 : N_SAMPLES + 99])
    assert len(spilled[len(spilled) - 5 : len(spilled) + 5]) == 5
    windows, spilled_windows = chunk_audio(in_memory), chunk_audio(spilled)
    assert [(c.start, c.stop) for c in spilled_windows] == [(c.start, c.stop) for c in windows]
    for window, spilled_window in zip(windows, spilled_windows, strict=True):
        np.testing.assert_array_equal(spilled_window.samples, window.samples)
    short = tmp_path / f"short.{kind}"
    encode(short, long.samples[: SPILL_AFTER_WINDOWS * N_SAMPLES - SAMPLE_RATE], kind)
    assert isinstance(decode_audio(short, spill=True), np.ndarray)  # no file for what fits a few windows


@pytest.fixture(scope="module")
def one_hour_flacs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hour")
    files = {rate: folder / f"hour-{rate}.flac" for rate in (16000, 8000)}
    for rate, path in files.items():
        write_silent_flac(path, 3600, rate)
    return files


@pytest.mark.parametrize("rate", [16000, 8000])
def test_a_spilled_recording_never_holds_more_than_a_few_windows(one_hour_flacs, rate):
    """An hour decodes to 230 MB of float32; spilled, decoding holds a few windows' worth at most
    (FFmpeg's frames, resampled or not) besides the input's copy."""
    path = one_hour_flacs[rate]
    spilled, _, peak = _decode_traced(path, max_seconds=None, spill=True)
    assert isinstance(spilled, SpilledSamples) and len(spilled) == 3600 * SAMPLE_RATE
    assert peak < 8 * WINDOW_BYTES, peak / WINDOW_BYTES  # 4 held before the file opens, blocks
    assert not spilled[len(spilled) - N_SAMPLES :].any()


# --- mel frames ------------------------------------------------------------------------


def test_num_mel_frames_matches_openai_whisper():
    whisper_audio = pytest.importorskip("whisper.audio")
    for num_samples in [0, 1, 159, 160, 161, 16000, 16159, 16160, 30 * SAMPLE_RATE + 80]:
        mel = whisper_audio.log_mel_spectrogram(
            np.zeros(num_samples, dtype=np.float32), padding=whisper_audio.N_SAMPLES
        )
        # As in whisper.transcribe: content frames = padded mel length - N_FRAMES.
        assert num_mel_frames(num_samples) == mel.shape[-1] - whisper_audio.N_FRAMES
    assert num_mel_frames(CHUNK_SECONDS * SAMPLE_RATE) == 3000
    assert HOP_LENGTH == 160


# --- chunking ------------------------------------------------------------------------


def _make_signal(kind, length, seed):
    rng = np.random.default_rng(seed)
    if kind == "silence":
        return np.zeros(length, dtype=np.float32)
    if kind == "noise":
        return (0.1 * rng.standard_normal(length)).astype(np.float32)
    # Bursts of noise separated by silences, like words.
    envelope = np.repeat(rng.random(length // 50 + 1) > 0.4, 50)[:length]
    return (0.3 * rng.standard_normal(length) * envelope).astype(np.float32)


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(["silence", "noise", "bursts"]),
    length=st.integers(0, 20_000),
    seed=st.integers(0, 2**16),
    sample_rate=st.sampled_from([100, 1000, 16000]),
    chunk_seconds=st.floats(0.001, 40.0),
)
def test_chunking_properties(kind, length, seed, sample_rate, chunk_seconds):
    max_length = int(chunk_seconds * sample_rate)
    if max_length < 1:
        with pytest.raises(ValueError):
            chunk_audio(np.zeros(length, dtype=np.float32), chunk_seconds, sample_rate)
        return
    samples = _make_signal(kind, length, seed)
    chunks = chunk_audio(samples, chunk_seconds, sample_rate)

    assert all(isinstance(chunk, AudioChunk) for chunk in chunks)
    np.testing.assert_array_equal(np.concatenate([chunk.samples for chunk in chunks]), samples)
    assert all(len(chunk.samples) <= max_length for chunk in chunks)
    position = 0
    for chunk in chunks:
        assert chunk.offset == position / sample_rate
        assert chunk.duration == len(chunk.samples) / sample_rate
        position += len(chunk.samples)
    offsets = [chunk.offset for chunk in chunks]
    assert offsets == sorted(set(offsets)), "offsets must strictly increase"
    if length <= max_length:
        assert len(chunks) == 1
    else:
        min_length = max(1, min(int(MIN_CHUNK_SECONDS * sample_rate), max_length // 2))
        assert all(len(chunk.samples) >= min_length for chunk in chunks)


def test_short_audio_is_one_chunk():
    for seconds in (0, 1, 30):
        samples = np.ones(seconds * SAMPLE_RATE, dtype=np.float32)
        [chunk] = chunk_audio(samples)
        assert chunk.offset == 0.0 and len(chunk.samples) == len(samples)


@pytest.mark.parametrize("tail", [1, 160, 200, 319, 479, 1000])
def test_no_sliver_after_a_pause_at_the_window_end(tail):
    """Noise with a pause at the end of the first window, then `tail` samples: the pause is where
    a cut goes, which used to leave the tail alone (30.0125 s gave a 200-sample window)."""
    max_length = CHUNK_SECONDS * SAMPLE_RATE
    length = max_length + tail
    samples = (0.2 * np.random.default_rng(0).standard_normal(length)).astype(np.float32)
    samples[max_length - 2000 :] = 0.0
    chunks = chunk_audio(samples)
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), samples)
    assert len(chunks) == 2 and all(len(c.samples) <= max_length for c in chunks)
    assert len(chunks[1].samples) >= MIN_CHUNK_SECONDS * SAMPLE_RATE


def test_cut_lands_in_the_quiet_gap():
    samples = (0.2 * np.random.default_rng(0).standard_normal(40 * SAMPLE_RATE)).astype(np.float32)
    samples[27 * SAMPLE_RATE : int(27.4 * SAMPLE_RATE)] *= 0.001
    first, second = chunk_audio(samples)
    assert second.offset == pytest.approx(27.2, abs=0.011)


@pytest.mark.parametrize("noise_db", [None, -40, -30])
def test_long_speech_is_cut_between_words(noise_db):
    speech = long_clip(min_seconds=65)
    samples = speech.samples
    if noise_db is not None:
        noise = 10 ** (noise_db / 20) * np.random.default_rng(1).standard_normal(len(samples))
        samples = (samples + noise).astype(np.float32)
    chunks = chunk_audio(samples)
    assert len(chunks) >= 3
    assert all(len(chunk.samples) <= CHUNK_SECONDS * SAMPLE_RATE for chunk in chunks)
    for chunk in chunks[1:]:
        cut = chunk.offset
        assert not any(
            start - 0.02 <= cut <= end + 0.02 for start, end in zip(speech.starts, speech.ends, strict=True)
        ), f"cut at {cut:.3f}s falls inside a word"


def test_long_silence_is_cut_into_full_windows():
    """A pause that runs past the window's end is cut at the end: 60 s of silence is two 30 s windows,
    as openai-whisper's are (27.5 s windows made three, each a chance to invent a word)."""
    chunks = chunk_audio(np.zeros(60 * SAMPLE_RATE, dtype=np.float32))
    assert [len(c.samples) for c in chunks] == [30 * SAMPLE_RATE, 30 * SAMPLE_RATE]


def test_sound_frames_keep_the_quiet_tail_that_the_speech_mask_leaves_out():
    from vllm_whisper_align.audio.features import sound_frames, speech_frames

    t = np.arange(8000) / 16000
    tone = np.sin(2 * np.pi * 300 * t)
    samples = np.concatenate(
        [
            np.zeros(8000),
            0.5 * tone,
            0.5 * 10 ** (-60 / 20) * tone[:1600],
            np.zeros(8000),  # tail 60 dB down
        ]
    ).astype(np.float32)
    speech, sound = speech_frames(samples), sound_frames(samples)
    assert speech[25:50].all() and not speech[50:].any()  # the mask ends with the loud tone at 1.0 s
    assert sound[25:55].all() and not sound[55:].any()  # sound runs on through the 100 ms tail
    assert not sound[:25].any()


def test_spectral_flux_rises_where_a_sound_begins_and_falls_where_it_ends():
    from vllm_whisper_align.audio.features import ONSET_FRAME_SECONDS, spectral_flux

    rng = np.random.default_rng(0)
    tone = 0.3 * np.sin(2 * np.pi * 440 * np.arange(8000) / 16000)
    samples = np.concatenate(
        [
            rng.normal(0, 1e-4, 8000),  # 0.5 s of near-silence
            tone,  # a tone from 0.5 s
            tone + 0.3 * rng.normal(0, 1, 8000),  # the tone goes on and noise joins it at 1 s
            tone,  # the noise stops at 1.5 s
        ]
    ).astype(np.float32)
    flux = spectral_flux(samples)
    assert len(flux.rises) == len(flux.falls) == len(samples) // 160 + 1
    half = int(0.75 / ONSET_FRAME_SECONDS)
    assert np.argmax(flux.rises[:half]) * ONSET_FRAME_SECONDS == pytest.approx(0.5, abs=0.02)
    assert (half + np.argmax(flux.rises[half:])) * ONSET_FRAME_SECONDS == pytest.approx(1.0, abs=0.02)
    # a fall shows fully once the 25 ms window has left the noise: up to half a window late
    assert np.argmax(flux.falls) * ONSET_FRAME_SECONDS == pytest.approx(1.5, abs=0.025)
    assert spectral_flux(np.zeros(10, dtype=np.float32)).rises.shape == (1,)


# --- decoding work bounded by the input ------------------------------------------------------


@pytest.fixture(scope="module")
def flac_bomb(tmp_path_factory):
    """1.5 h of 96 kHz 8-channel digital silence in about 570 KB, no length in the header."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.flac"
    write_constant_flac(path, 1.5 * 3600, 96000, 8)
    return path


def test_a_decompression_bomb_is_refused_after_little_work(flac_bomb):
    """Under a duration limit, decoding stops at MAX_VALUES_PER_BYTE values per byte of file (or the
    limit's length of one 48 kHz channel): before the bound it decoded the limit's full hour, 18 s of
    CPU; here about 3 minutes of it."""
    assert soundfile.info(str(flac_bomb)).channels == 8 and flac_bomb.stat().st_size < 600_000
    with pytest.raises(AudioError, match=f"over {MAX_VALUES_PER_BYTE} samples per byte"):
        decode_audio(flac_bomb, max_seconds=3600)
    assert stated_seconds(flac_bomb.read_bytes()) is None  # nothing in its header to refuse it by


def test_a_decode_stops_when_told(flac_bomb):
    stop = threading.Event()
    stop.set()
    with pytest.raises(DecodeStopped):
        decode_audio(flac_bomb.read_bytes(), max_seconds=3600, stop=stop)


def test_stated_seconds_reads_the_header_only(tmp_path):
    clip = sentence_clips()[0]
    path = tmp_path / "c.wav"
    write_wav(path, clip.samples)
    assert stated_seconds(path.read_bytes()) == pytest.approx(len(clip.samples) / SAMPLE_RATE)
    assert stated_seconds(b"not audio at all") is None


# --- decoding lanes (server.uploads.Decoders) ------------------------------------------------


def lying_flac(path, seconds: float, stated: float, sample_rate: int = 48000) -> bytes:
    """``seconds`` of silence in a FLAC whose header states ``stated``."""
    write_silent_flac(path, seconds, sample_rate)
    state_total_samples(path, int(stated * sample_rate))
    return path.read_bytes()


def decode_in_lanes(monkeypatch, data: bytes, max_seconds: float) -> tuple[object, list[tuple[str, str]]]:
    """What ``Decoders.decode`` answers for ``data``, and each decode_audio it ran: (thread, outcome)."""
    import asyncio

    from vllm_whisper_align.server import uploads

    runs = []

    def recorded(*args, **kwargs):
        thread = threading.current_thread().name.split("_")[0]
        try:
            samples = decode_audio(*args, **kwargs)
        except Exception as error:
            runs.append((thread, type(error).__name__))
            raise
        runs.append((thread, "decoded"))
        return samples

    monkeypatch.setattr(uploads, "decode_audio", recorded)
    decoders = uploads.Decoders()
    try:
        return asyncio.run(decoders.decode(data, max_seconds)), runs
    except Exception as error:
        return error, runs
    finally:
        decoders.quick.shutdown()
        decoders.slow.shutdown()


def test_a_header_that_understates_the_length_costs_the_quick_lane_a_quick_decode(tmp_path, monkeypatch):
    """A file whose header states a quick-lane length is given up in the quick lane once it decodes past
    the lane's bound, and decoded again in the slow lane, to the answer it always had (before, 59 min
    stated as 10 s took 1.5 s of a quick-lane thread each, and 32 such uploads starved the clips)."""
    from vllm_whisper_align.server.uploads import QUICK_LANE_SECONDS

    honest = lying_flac(tmp_path / "honest.flac", 5, stated=5)
    samples, runs = decode_in_lanes(monkeypatch, honest, max_seconds=3600)
    assert len(samples) == 5 * SAMPLE_RATE and runs == [("decode-quick", "decoded")]  # once, as ever

    liar = lying_flac(tmp_path / "liar.flac", 2 * QUICK_LANE_SECONDS, stated=10)
    samples, runs = decode_in_lanes(monkeypatch, liar, max_seconds=3600)
    assert len(samples) == 2 * QUICK_LANE_SECONDS * SAMPLE_RATE
    assert runs == [("decode-quick", "DecodeGaveUp"), ("decode-slow", "decoded")]

    # Refused by the duration limit as before: in the slow lane past the quick lane's bound, else at once.
    refused, runs = decode_in_lanes(monkeypatch, liar, max_seconds=1.5 * QUICK_LANE_SECONDS)
    assert isinstance(refused, AudioTooLongError) and refused.max_seconds == 1.5 * QUICK_LANE_SECONDS
    assert runs == [("decode-quick", "DecodeGaveUp"), ("decode-slow", "AudioTooLongError")]
    refused, runs = decode_in_lanes(monkeypatch, liar, max_seconds=60)
    assert isinstance(refused, AudioTooLongError) and runs == [("decode-quick", "AudioTooLongError")]


def test_giving_up_leaves_the_duration_limit_and_the_work_bound_as_they_are(tmp_path):
    liar = lying_flac(tmp_path / "liar.flac", 60, stated=10)  # 48 kHz: FFmpeg reads past the header
    with pytest.raises(DecodeGaveUp):
        decode_audio(liar, max_seconds=3600, give_up_seconds=30)
    with pytest.raises(AudioTooLongError):  # past both: the caller's limit answers
        decode_audio(liar, max_seconds=20, give_up_seconds=30)
    assert len(decode_audio(liar, max_seconds=3600, give_up_seconds=60)) == 60 * SAMPLE_RATE
    # 100 s of 8 channels in a few KB: under the work bound of a one-hour limit, not of a 120 s one
    many_channels = tmp_path / "many.flac"
    write_constant_flac(many_channels, 100, 48000, 8)
    with pytest.raises(AudioError, match="samples per byte"):
        decode_audio(many_channels, max_seconds=120)
    samples = decode_audio(many_channels, max_seconds=3600, give_up_seconds=120)
    assert len(samples) == len(decode_audio(many_channels, max_seconds=3600)) > 99 * SAMPLE_RATE
