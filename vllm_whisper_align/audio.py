"""Audio loading and long-form chunking for Whisper.

Everything here works on float32 mono samples at 16 kHz, the only input
Whisper's feature extractor accepts.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

# Whisper's fixed audio geometry (as whisper/audio.py): every other module imports these.
SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160  # 10 ms mel hop: 100 frames per second of audio
CHUNK_SECONDS = 30  # one encoder window
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE  # 480000 samples in a window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in a window
N_SAMPLES_PER_TOKEN = HOP_LENGTH * 2  # the encoder's stride-2 convolution: one frame is 20 ms
TOKENS_PER_SECOND = SAMPLE_RATE // N_SAMPLES_PER_TOKEN  # 50 encoder frames per second
ENCODER_FRAMES = N_FRAMES // 2  # 1500 encoder frames in a window

# Cuts between chunks are searched for in this many seconds at the end of each window.
CUT_SEARCH_SECONDS = 5.0
# Energy is measured in 10 ms frames: shorter than any pause between words.
ENERGY_FRAME_SECONDS = 0.01
# Frames within this factor (3 dB) of the quietest frame count as the same pause,
# so background noise does not split one pause into many.
QUIET_ENERGY_FACTOR = 2.0

# Highest sample rate real recordings use (DXD and studio rates stop at 768 kHz).
MAX_SOURCE_RATE = 768_000

# The last window of a long input is never shorter than this: a sliver of a few milliseconds
# gives the model nothing to hear and the alignment no encoder frame to place words in
# (it made empty reductions and negative times). The cut before it moves earlier instead.
MIN_CHUNK_SECONDS = 1.0

# libsndfile reads this many frames at a time, averaging channels per block, so a file with
# many channels never holds more than one block of them interleaved.
READ_BLOCK_FRAMES = 1 << 18
# FFmpeg's decoders hand over frames of about 20 ms; they are gathered in an AudioFifo and resampled
# this many values (samples × channels) at a time: a resampling call and the NumPy work on its output
# per frame cost a 3-hour Opus file more than its decoding.
RESAMPLE_BLOCK_VALUES = 1 << 18
# libsndfile's SF_COUNT_MAX: the frame count of a FLAC whose header has no sample count.
_UNKNOWN_FRAMES = 2**63 - 1

# Decoded audio longer than this many windows goes to a temporary file when the caller asks
# (``decode_audio``'s ``spill``; the server does): 3 hours are 691 MB of float32, which it would
# otherwise hold per request while the windows run a few at a time.
SPILL_AFTER_WINDOWS = 4

# Containers that libsndfile decodes exactly; anything else goes through FFmpeg.
_SOUNDFILE_FORMATS = {"WAV", "WAVEX", "RF64", "FLAC"}

AudioSource = str | os.PathLike | bytes | bytearray | memoryview | BinaryIO


class AudioError(ValueError):
    """Input that cannot be turned into audio samples; the message is one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class AudioTooLongError(AudioError):
    """Audio longer than the caller's ``max_seconds``.

    ``seconds`` is the length the container states, or None when decoding stopped at the bound
    (the container states no length, or a shorter one than it holds).
    """

    def __init__(self, max_seconds: float, seconds: float | None = None):
        self.max_seconds = max_seconds
        self.seconds = seconds
        length = f"{seconds:.1f} s long" if seconds is not None else f"longer than {max_seconds:g} s"
        super().__init__(f"audio is {length}; at most {max_seconds:g} s is accepted")


def sample_path() -> Path:
    """The bundled test clip: espeak-ng reading a pangram word by word (see sample.json)."""
    return Path(__file__).parent / "assets" / "sample.flac"


def num_mel_frames(num_samples: int) -> int:
    """Number of mel frames Whisper computes for `num_samples` of content.

    Both openai-whisper (`transcribe`: padded mel length minus N_FRAMES) and the HF
    WhisperFeatureExtractor drop the last STFT frame of a centered STFT, which leaves
    floor(num_samples / HOP_LENGTH) frames, not ceil: a trailing partial hop has no frame.
    """
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    return num_samples // HOP_LENGTH


def decode_audio(
    source: AudioSource, sample_rate: int = SAMPLE_RATE, max_seconds: float | None = None, spill: bool = False
) -> np.ndarray | SpilledSamples:
    """Decode a file path, encoded bytes or binary stream to float32 mono samples in [-1, 1].

    Any container/codec FFmpeg knows works (wav, flac, mp3, ogg, m4a/aac, webm/opus...).
    Bad input of any kind raises AudioError; audio with no samples returns an empty array.
    Audio longer than ``max_seconds`` raises AudioTooLongError: at once when the container's
    header says so, else as soon as decoding passes the bound, so time and memory stay about
    the bound's worth of samples whatever the file holds or claims.
    With ``spill``, audio longer than SPILL_AFTER_WINDOWS windows comes back as SpilledSamples:
    written to a temporary file as it is decoded, never whole in memory.
    """
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    if max_seconds is not None and max_seconds <= 0:
        raise ValueError(f"max_seconds must be positive, got {max_seconds}")
    bound = _Bound(max_seconds, sample_rate)
    spill_after = SPILL_AFTER_WINDOWS * CHUNK_SECONDS * sample_rate if spill else None
    name, opened = _open_source(source)
    decoded = _decode_with_soundfile(opened, sample_rate, _Decoded(bound, spill_after))
    if decoded is None:
        decoded = _decode_with_pyav(opened, name, sample_rate, _Decoded(bound, spill_after))
    return decoded.samples()


class SpilledSamples:
    """Float32 samples in an unlinked temporary file (tempfile's directory, where Starlette spools
    uploads too). Slicing reads a copy of the slice back, so only what is in use is in memory;
    ``AudioChunk`` keeps windows as positions. Reads are positional (``os.preadv``): threads may
    share one."""

    def __init__(self):
        # Open for the object's life; unlinked already, so it leaves the disk when this is collected.
        self._file = tempfile.TemporaryFile(prefix="vllm-whisper-align-audio-")  # noqa: SIM115
        self._length = 0

    def append(self, piece: np.ndarray) -> None:
        self._file.write(memoryview(np.ascontiguousarray(piece, dtype=np.float32)).cast("B"))
        self._length += len(piece)

    def finish(self) -> SpilledSamples:
        self._file.flush()
        return self

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError("SpilledSamples are read by slices")
        start, stop, step = key.indices(self._length)
        if step != 1:
            raise ValueError("SpilledSamples are read by contiguous slices")
        samples = np.empty(max(0, stop - start), dtype=np.float32)
        view, position = memoryview(samples).cast("B"), start * samples.itemsize
        while len(view):
            count = os.preadv(self._file.fileno(), [view], position)
            if count <= 0:
                raise OSError(f"temporary audio file ended at byte {position}")
            view, position = view[count:], position + count
        return samples


@dataclass(frozen=True)
class _Bound:
    """The caller's duration limit, checked against headers and against samples decoded so far."""

    max_seconds: float | None
    sample_rate: int

    def check_header(self, seconds: float | None) -> None:
        if self.max_seconds is not None and seconds is not None and seconds > self.max_seconds:
            raise AudioTooLongError(self.max_seconds, seconds)

    def check_decoded(self, num_samples: int) -> None:
        if self.max_seconds is not None and num_samples > self.max_seconds * self.sample_rate:
            raise AudioTooLongError(self.max_seconds)


class _Decoded:
    """Mono pieces as they are decoded, counted so that decoding stops at the bound, and written to
    SpilledSamples once there are more than ``spill_after`` (None: kept in memory)."""

    def __init__(self, bound: _Bound, spill_after: int | None = None):
        self.bound = bound
        self.spill_after = spill_after
        self.pieces: list[np.ndarray] = []
        self.spilled: SpilledSamples | None = None
        self.num_samples = 0

    def add(self, pieces: Iterable[np.ndarray]) -> None:
        for piece in pieces:
            self.num_samples += len(piece)
            self.bound.check_decoded(self.num_samples)
            # Lossy decoders overshoot full scale slightly, and float files can hold NaN/inf,
            # which would poison every mel frame they touch.
            piece = piece.astype(np.float32, copy=not piece.flags.writeable)
            np.nan_to_num(piece, copy=False, nan=0.0, posinf=1.0, neginf=-1.0)
            self.pieces.append(np.clip(piece, -1.0, 1.0, out=piece))
            if self.spill_after is not None and self.num_samples > self.spill_after:
                self.spilled = self.spilled or SpilledSamples()
                for held in self.pieces:
                    self.spilled.append(held)
                self.pieces = []

    def samples(self) -> np.ndarray | SpilledSamples:
        if self.spilled is not None:
            return self.spilled.finish()
        return np.concatenate(self.pieces) if self.pieces else np.zeros(0, dtype=np.float32)


def _open_source(source: AudioSource) -> tuple[str, str | io.BytesIO]:
    """Validate `source` and return (name for messages, a path or in-memory stream)."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not os.path.exists(path):
            raise AudioError(f"no such file: {path}")
        if not os.path.isfile(path):
            raise AudioError(f"not a regular file: {path}")
        if os.path.getsize(path) == 0:
            raise AudioError(f"empty file: {path}")
        return path, path

    if isinstance(source, (bytes, bytearray, memoryview)):
        name, data = "<bytes>", bytes(source)
    elif hasattr(source, "read"):
        name = str(getattr(source, "name", "<stream>"))
        try:
            data = source.read()
        except Exception as error:  # a broken stream is bad input, whatever it raises
            raise AudioError(f"could not read {name}: {error}") from error
        if not isinstance(data, (bytes, bytearray)):
            raise AudioError(f"{name} is not a binary stream")
        data = bytes(data)
    else:
        raise AudioError(f"unsupported audio source type: {type(source).__name__}")

    if not data:
        raise AudioError(f"empty audio input: {name}")
    # Both decoders need to seek, which upload streams often cannot.
    return name, io.BytesIO(data)


def _decode_with_soundfile(opened, sample_rate: int, decoded: _Decoded) -> _Decoded | None:
    """Exact fast path for wav/flac already at `sample_rate`; None means use FFmpeg.

    The duration bound is checked on the header of any wav/flac, whatever its rate: their
    headers state the exact number of frames.
    """
    import soundfile

    # Let libsndfile see only what it will be asked to decode: it also parses mp3/ogg,
    # printing libmpg123 warnings for damaged files, to no use here.
    if not _has_wav_or_flac_header(opened):
        return None
    try:
        with soundfile.SoundFile(opened) as audio:
            if audio.format not in _SOUNDFILE_FORMATS:
                return None
            if 0 <= audio.frames < _UNKNOWN_FRAMES:
                decoded.bound.check_header(audio.frames / audio.samplerate)
            if audio.samplerate != sample_rate:
                return None
            return _read_mono(audio, decoded)
    except AudioError:
        raise
    except Exception:  # anything libsndfile rejects may still be FFmpeg-readable
        return None
    finally:
        if isinstance(opened, io.BytesIO):
            opened.seek(0)


def _read_mono(audio, decoded: _Decoded) -> _Decoded:
    while len(block := audio.read(READ_BLOCK_FRAMES, dtype="float32", always_2d=True)):
        decoded.add([block.mean(axis=1, dtype=np.float32)])
    return decoded


def _has_wav_or_flac_header(opened) -> bool:
    if isinstance(opened, io.BytesIO):
        header = opened.getbuffer()[:12].tobytes()
    else:
        try:
            with open(opened, "rb") as file:
                header = file.read(12)
        except OSError:  # unreadable: let FFmpeg fail on it with its own message
            return False
    is_wav = header[:4] in (b"RIFF", b"RIFX", b"RF64") and header[8:12] == b"WAVE"
    return is_wav or header[:4] == b"fLaC"


def _decode_with_pyav(opened, name: str, sample_rate: int, decoded: _Decoded) -> _Decoded:
    import av

    try:
        with av.open(opened, mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise AudioError(f"could not decode {name} as audio: no audio stream")
            stream = container.streams.audio[0]
            # A damaged header can claim megahertz rates, which take the resampler
            # seconds to set up for nothing.
            if (stream.rate or 0) > MAX_SOURCE_RATE:
                raise AudioError(
                    f"could not decode {name} as audio: implausible sample rate {stream.rate} Hz"
                )
            decoded.bound.check_header(_stated_seconds(container, stream))
            return _decode_stream(container, stream, name, sample_rate, decoded)
    except AudioError:
        raise
    except Exception as error:  # FFmpeg reports junk input through many exception types
        raise AudioError(f"could not decode {name} as audio: {_describe(error)}") from error


def _stated_seconds(container, stream) -> float | None:
    """The duration the container states, or None.

    FFmpeg estimates one from the bit rate where the container has none (an mp3 without a
    Xing header, ADTS AAC): exact at a constant bit rate. Decoding also stops at the bound,
    for containers that state no duration or a wrong one.
    """
    import av

    if stream.duration is not None and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def _decode_stream(container, stream, name: str, sample_rate: int, decoded: _Decoded) -> _Decoded:
    import av

    # Keep the channels and average them ourselves: FFmpeg's float downmix weights each
    # stereo channel by 0.707 (louder than either, may clip), while the ffmpeg CLI used
    # by openai-whisper (s16 output) and our soundfile path both take the plain mean.
    # Packed, not planar: PyAV crashes reading planar frames with more than 8 channels.
    resampler, fifo, input_shape = None, None, None
    first_error = None
    for packet in container.demux(stream):
        try:
            frames = packet.decode()
        except av.error.FFmpegError as error:
            # Like the ffmpeg CLI, skip a corrupt packet (e.g. a truncated last frame)
            # rather than lose the whole file.
            first_error = first_error or error
            continue
        for frame in frames:
            # Joined files (chained ogg, spliced mp3) can change rate or channels midway,
            # which one PyAV resampler refuses: finish it and start another.
            frame_shape = (frame.format.name, frame.layout.name, frame.sample_rate)
            if frame_shape != input_shape:
                decoded.add(_drain(resampler, fifo))
                resampler, fifo = av.AudioResampler(format="flt", rate=sample_rate), av.AudioFifo()
                input_shape = frame_shape
            # The fifo refuses a frame whose timestamp does not follow on, as after a skipped packet.
            frame.pts = None
            fifo.write(frame)
            if fifo.samples * frame.layout.nb_channels >= RESAMPLE_BLOCK_VALUES:
                decoded.add(_frame_samples(resampled) for resampled in resampler.resample(fifo.read()))
    decoded.add(_drain(resampler, fifo))

    if not decoded.num_samples and first_error is not None:
        raise AudioError(f"could not decode {name} as audio: {_describe(first_error)}")
    return decoded


def _drain(resampler, fifo) -> list[np.ndarray]:
    """What ``fifo`` holds and ``resampler`` keeps back, resampled."""
    if resampler is None:
        return []
    frames = [fifo.read(), None] if fifo.samples else [None]
    return [_frame_samples(resampled) for frame in frames for resampled in resampler.resample(frame)]


def _describe(error: Exception) -> str:
    # FFmpeg errors stringify as "[Errno N] reason: 'filename'"; the reason alone reads better.
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


def _frame_samples(frame) -> np.ndarray:
    channels = frame.layout.nb_channels
    # Packed float: one plane of samples × channels values (its buffer may be padded beyond them).
    interleaved = np.frombuffer(frame.planes[0], dtype=np.float32, count=frame.samples * channels)
    interleaved = interleaved.reshape(-1, channels)
    return interleaved.mean(axis=1, dtype=np.float32) if channels > 1 else interleaved[:, 0]


@dataclass(frozen=True)
class AudioChunk:
    """Samples [start, stop) of ``source``: a view of an array, or read back from SpilledSamples
    on each access (so a list of windows holds positions, not audio)."""

    source: np.ndarray | SpilledSamples
    start: int
    stop: int
    sample_rate: int = SAMPLE_RATE

    @classmethod
    def whole(cls, samples: np.ndarray | SpilledSamples | AudioChunk) -> AudioChunk:
        return samples if isinstance(samples, AudioChunk) else cls(samples, 0, len(samples))

    @property
    def samples(self) -> np.ndarray:
        return self.source[self.start : self.stop]

    @property
    def num_samples(self) -> int:
        return self.stop - self.start

    @property
    def offset(self) -> float:
        """Seconds from the start of the full audio to the first sample."""
        return self.start / self.sample_rate

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate


def chunk_audio(
    samples: np.ndarray | SpilledSamples, chunk_seconds: float = CHUNK_SECONDS, sample_rate: int = SAMPLE_RATE
) -> list[AudioChunk]:
    """Split audio into consecutive windows of at most `chunk_seconds`.

    Each cut is placed in the middle of the longest quiet stretch within the last
    CUT_SEARCH_SECONDS of the window, so it falls in a pause rather than inside a word; a stretch
    that reaches the end of the search is cut at its end.
    No chunk is shorter than MIN_CHUNK_SECONDS (at most half a window) unless the whole input
    is: near the end the search moves earlier so that enough is left for the last chunk.
    Chunks are positions that together cover every sample exactly once.
    """
    max_length = int(chunk_seconds * sample_rate)
    if max_length < 1:
        raise ValueError(f"chunk_seconds * sample_rate must be >= 1 sample, got {chunk_seconds=}")
    search_length = min(int(CUT_SEARCH_SECONDS * sample_rate), max_length // 2)
    min_length = min(int(MIN_CHUNK_SECONDS * sample_rate), max_length // 2)
    frame_length = max(1, int(ENERGY_FRAME_SECONDS * sample_rate))

    chunks = []
    start = 0
    while len(samples) - start > max_length:
        # More than a window is left, and a window is at least two minimum lengths: both
        # bounds leave min_length on either side of the cut.
        search_end = min(start + max_length, len(samples) - min_length)
        search_start = max(start + min_length, search_end - search_length)
        cut = search_start + _quietest_point(samples[search_start:search_end], frame_length)
        # A cut at the very start would make an empty chunk; never stall.
        cut = max(cut, start + 1)
        chunks.append(AudioChunk(samples, start, cut, sample_rate))
        start = cut
    chunks.append(AudioChunk(samples, start, len(samples), sample_rate))
    return chunks


def _quietest_point(region: np.ndarray, frame_length: int) -> int:
    """Index in `region` at the middle of its longest run of near-minimum-energy frames."""
    num_frames = len(region) // frame_length
    if num_frames == 0:
        return len(region)
    frames = region[: num_frames * frame_length].astype(np.float64).reshape(num_frames, frame_length)
    energy = np.mean(frames * frames, axis=1)
    quiet = energy <= energy.min() * QUIET_ENERGY_FACTOR + 1e-12

    run_start, run_end = _longest_run(quiet)
    if run_end == num_frames:
        # The pause runs on past the window's end: cut there, so that the window stays full (long
        # silence in windows of 27.5 s made more windows, each a chance to invent a word).
        return len(region)
    middle_frame = (run_start + run_end) / 2
    return int(round(middle_frame * frame_length))


def true_runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends ([start, end)) of the runs of True in a boolean mask, in order."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], np.asarray(mask).astype(np.int8), [0]])))
    return edges[0::2], edges[1::2]


def _longest_run(mask: np.ndarray) -> tuple[int, int]:
    """[start, end) of the longest run of True in a non-empty mask with at least one True;
    ties go to the latest run so chunks stay as long as allowed."""
    starts, ends = true_runs(mask)
    lengths = ends - starts
    best = len(lengths) - 1 - int(np.argmax(lengths[::-1]))
    return int(starts[best]), int(ends[best])


# ---------------------------------------------------------------------------- speech / silence

# One encoder frame: the resolution word times have anyway.
SPEECH_FRAME_SECONDS = 0.02
# A frame is speech when it is this far above the clip's noise floor and not far below its peak.
SPEECH_ABOVE_NOISE_DB = 8.0
SPEECH_BELOW_PEAK_DB = 50.0
# Quiet runs shorter than this (stop-consonant closures) stay speech.
MIN_SILENCE_SECONDS = 0.1


# A word's quiet tail (a fading vowel, a final fricative or nasal) is still sound above the noise floor
# where the speech mask (SPEECH_BELOW_PEAK_DB) has already called it silence.
TAIL_ABOVE_NOISE_DB = 6.0


def frame_levels_db(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Mean power in dB per 20 ms frame (the last frame zero-padded)."""
    frame_length = int(SPEECH_FRAME_SECONDS * sample_rate)
    num_frames = -(-len(samples) // frame_length)
    padded = np.zeros(num_frames * frame_length, dtype=np.float64)
    padded[: len(samples)] = samples
    frames = padded.reshape(num_frames, frame_length)
    # einsum: the same sums as np.mean(frames ** 2), 15x faster (no squared copy, 0.7 ms per 30 s)
    power = np.einsum("ij,ij->i", frames, frames) / frame_length
    return 10 * np.log10(power + 1e-12)


def noise_floor_db(levels_db: np.ndarray) -> float:
    """The level that a tenth of the frames stay under: the clip's noise, or its digital silence."""
    return float(np.percentile(levels_db, 10))


def speech_frames(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Boolean per 20 ms frame: True where there is sound above the noise floor.

    Cross-attention DTW gives a silence before a word to that word (it has to go somewhere);
    this mask lets word boundaries be moved out of such silences.
    """
    level_db = frame_levels_db(samples, sample_rate)
    if len(level_db) == 0:
        return np.zeros(0, dtype=bool)
    threshold = max(noise_floor_db(level_db) + SPEECH_ABOVE_NOISE_DB, level_db.max() - SPEECH_BELOW_PEAK_DB)
    speech = level_db > threshold
    return _fill_short_silences(speech, int(round(MIN_SILENCE_SECONDS / SPEECH_FRAME_SECONDS)))


def sound_frames(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Boolean per 20 ms frame: True where the level is ``TAIL_ABOVE_NOISE_DB`` over the noise floor,
    however far below the loudest frame (the quiet tails :func:`speech_frames` leaves out)."""
    level_db = frame_levels_db(samples, sample_rate)
    if len(level_db) == 0:
        return np.zeros(0, dtype=bool)
    return level_db > noise_floor_db(level_db) + TAIL_ABOVE_NOISE_DB


def _fill_short_silences(speech: np.ndarray, min_frames: int) -> np.ndarray:
    speech = speech.copy()
    for start, end in zip(*true_runs(~speech), strict=True):  # runs of silence [start, end)
        if end - start < min_frames and start > 0 and end < len(speech):
            speech[start:end] = True
    return speech


# ---------------------------------------------------------------------------- onsets

# Spectral flux on Whisper's own STFT geometry: 25 ms windows every 10 ms.
ONSET_FRAME_SECONDS = HOP_LENGTH / SAMPLE_RATE
ONSET_BANDS = 40


@dataclass(frozen=True)
class SpectralFlux:
    """Per 10 ms frame, how much the log-power spectrum rose and how much it fell from the frame before.

    A word that starts with a loud sound (a vowel, /s/) starts where new energy rises; one that starts
    quieter than the sound before it (a stop's closure, a nasal) starts where the sound falls
    (``word_timing.refine_starts`` reads both).
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
