"""Any audio container to float32 mono samples at 16 kHz, the only input Whisper's feature extractor
accepts: libsndfile for wav at the right rate, FFmpeg (PyAV) for everything else, bounded by the
caller's duration limit, and spilled to a temporary file when long.
"""

from __future__ import annotations

import io
import os
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from vllm_whisper_align.constants import CHUNK_SECONDS, SAMPLE_RATE
from vllm_whisper_align.errors import InputError

# Highest sample rate real recordings use (DXD and studio rates stop at 768 kHz).
MAX_SOURCE_RATE = 768_000

# libsndfile reads this many frames at a time, averaging channels per block, so a file with
# many channels never holds more than one block of them interleaved.
READ_BLOCK_FRAMES = 1 << 18
# FFmpeg's decoders hand over frames of about 20 ms; they are gathered in an AudioFifo and resampled
# this many values (samples × channels) at a time: a resampling call and the NumPy work on its output
# per frame cost a 3-hour Opus file more than its decoding.
RESAMPLE_BLOCK_VALUES = 1 << 18
# libsndfile's SF_COUNT_MAX: the frame count of a FLAC whose header has no sample count.
_UNKNOWN_FRAMES = 2**63 - 1
# Under a duration limit, decoding work is bounded by the input: values read (samples x channels, at the
# file's own rate, before resampling) at most MAX_VALUES_PER_BYTE per byte of file, or as many as the
# limit's length of one channel at FREE_VALUES_PER_SECOND, whichever is more. Real codecs stay under half
# the first (Opus at its lowest 6 kbps: 64 values a byte mono, 128 stereo; WAV under 1), and the second
# lets through files of mostly digital silence (FLAC, Opus with DTX) of a common rate up to the limit. A
# decompression bomb (hours of many-channel 96 kHz digital silence in a FLAC of a few hundred KB) is
# refused after about a second of work, not after decoding up to the duration limit.
MAX_VALUES_PER_BYTE = 256
FREE_VALUES_PER_SECOND = 48_000

# Decoded audio longer than this many windows goes to a temporary file when the caller asks
# (``decode_audio``'s ``spill``; the server does): 3 hours are 691 MB of float32, which it would
# otherwise hold per request while the windows run a few at a time.
SPILL_AFTER_WINDOWS = 4

# Containers whose header libsndfile reads for the stated length (exact in both).
_SOUNDFILE_FORMATS = {"WAV", "WAVEX", "RF64", "FLAC"}
# Of those, what libsndfile decodes (exactly); anything else goes through FFmpeg. Not FLAC: its frames,
# not its header's count, are its audio, and libsndfile stops at the count, where FFmpeg decodes every
# frame (a header understating the length lost the rest without a word), as exactly and as fast.
_SOUNDFILE_DECODES = {"WAV", "WAVEX", "RF64"}

AudioSource = str | os.PathLike | bytes | bytearray | memoryview | BinaryIO


class AudioError(InputError):
    """Input that cannot be turned into audio samples; the message is one line."""

    default_param = "file"


class DecodeStopped(Exception):
    """Decoding was stopped by its caller (``decode_audio``'s ``stop``): nobody waits for it any more."""


class DecodeGaveUp(Exception):
    """Decoding passed the caller's ``give_up_seconds`` (``decode_audio``): the audio is longer than the
    caller meant to decode there (its header understated it), and is to be decoded again without that bound.
    Not an AudioError: it says nothing about the input that a client should hear."""


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


def decode_audio(
    source: AudioSource,
    sample_rate: int = SAMPLE_RATE,
    max_seconds: float | None = None,
    spill: bool = False,
    stop: threading.Event | None = None,
    give_up_seconds: float | None = None,
) -> np.ndarray | SpilledSamples:
    """Decode a file path, encoded bytes or binary stream to float32 mono samples in [-1, 1].

    Any container/codec FFmpeg knows works (wav, flac, mp3, ogg, m4a/aac, webm/opus...).
    Bad input of any kind raises AudioError; audio with no samples returns an empty array.
    Audio longer than ``max_seconds`` raises AudioTooLongError: at once when the container's
    header says so, else as soon as decoding passes the bound, so time and memory stay about
    the bound's worth of samples whatever the file holds or claims.
    With ``spill``, audio longer than SPILL_AFTER_WINDOWS windows comes back as SpilledSamples:
    written to a temporary file as it is decoded, never whole in memory. A file that decodes to more than
    MAX_VALUES_PER_BYTE values per byte raises AudioError. Once ``stop`` is set, decoding raises
    DecodeStopped at its next block. Past ``give_up_seconds`` of decoded audio (a bound of the caller's
    own, on where it decodes: the server's quick lane), decoding raises DecodeGaveUp; unlike
    ``max_seconds``, it leaves the header check and the work bound as they are, so that decoding again
    without it gives the answer decoding once would have.
    """
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    if max_seconds is not None and max_seconds <= 0:
        raise ValueError(f"max_seconds must be positive, got {max_seconds}")
    bound = _Bound(max_seconds, sample_rate, give_up_seconds)
    spill_after = SPILL_AFTER_WINDOWS * CHUNK_SECONDS * sample_rate if spill else None
    name, opened = _open_source(source)
    work = _Work(name, _max_work(_size_of(opened), max_seconds), stop)
    decoded = _decode_with_soundfile(opened, sample_rate, _Decoded(bound, work, spill_after))
    if decoded is None:
        decoded = _decode_with_pyav(opened, name, sample_rate, _Decoded(bound, work, spill_after))
    return decoded.samples()


def stated_seconds(source: bytes) -> float | None:
    """The duration the container of encoded ``source`` states in its header, or None (it states none,
    or it is no audio the decoders know); reads the header only."""
    import av
    import soundfile

    opened = io.BytesIO(source)
    try:
        if _has_wav_or_flac_header(opened):
            info = soundfile.info(opened)
            return info.frames / info.samplerate if 0 <= info.frames < _UNKNOWN_FRAMES else None
        with av.open(opened, mode="r", metadata_errors="ignore") as container:
            return _stated_seconds(container, container.streams.audio[0]) if container.streams.audio else None
    except Exception:  # junk: decoding will say what is wrong with it
        return None


def _max_work(size: int, max_seconds: float | None) -> int | None:
    """The values a file of ``size`` bytes may decode to under ``max_seconds`` (None: no bound)."""
    if max_seconds is None:
        return None
    return max(MAX_VALUES_PER_BYTE * size, int(max_seconds * FREE_VALUES_PER_SECOND))


def _size_of(opened: str | io.BytesIO) -> int:
    return len(opened.getbuffer()) if isinstance(opened, io.BytesIO) else os.path.getsize(opened)


@dataclass
class _Work:
    """The decoding work done so far (values read at the file's own rate), against its bound."""

    name: str
    max_values: int | None
    stop: threading.Event | None
    values: int = 0

    def add(self, values: int) -> None:
        self.values += values
        if self.max_values is not None and self.values > self.max_values:
            raise AudioError(
                f"could not decode {self.name}: it decodes to over {MAX_VALUES_PER_BYTE} samples per byte "
                f"of file, more than the length limit's worth of {FREE_VALUES_PER_SECOND // 1000} kHz "
                "audio (a decompression bomb)"
            )
        if self.stop is not None and self.stop.is_set():
            raise DecodeStopped()


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
        self._file.write(np.ascontiguousarray(piece, dtype=np.float32).tobytes())
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
        view, position = samples.data.cast("B"), start * samples.itemsize
        while len(view):
            count = os.preadv(self._file.fileno(), [view], position)
            if count <= 0:
                raise OSError(f"temporary audio file ended at byte {position}")
            view, position = view[count:], position + count
        return samples


@dataclass(frozen=True)
class _Bound:
    """The caller's duration limit, checked against headers and against samples decoded so far, and the
    length past which the caller gives a decode up."""

    max_seconds: float | None
    sample_rate: int
    give_up_seconds: float | None = None

    def check_header(self, seconds: float | None) -> None:
        if self.max_seconds is not None and seconds is not None and seconds > self.max_seconds:
            raise AudioTooLongError(self.max_seconds, seconds)

    def check_decoded(self, num_samples: int) -> None:
        if self.max_seconds is not None and num_samples > self.max_seconds * self.sample_rate:
            raise AudioTooLongError(self.max_seconds)  # first: past both, the caller's limit answers
        if self.give_up_seconds is not None and num_samples > self.give_up_seconds * self.sample_rate:
            raise DecodeGaveUp()


class _Decoded:
    """Mono pieces as they are decoded, counted so that decoding stops at the bound, and written to
    SpilledSamples once there are more than ``spill_after`` (None: kept in memory); ``work`` counts what
    the decoders read to make them."""

    def __init__(self, bound: _Bound, work: _Work, spill_after: int | None = None):
        self.bound = bound
        self.work = work
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
    """Exact fast path for wav already at `sample_rate`; None means use FFmpeg.

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
            if audio.samplerate != sample_rate or audio.format not in _SOUNDFILE_DECODES:
                return None
            return _read_mono(audio, decoded)
    except (AudioError, DecodeStopped, DecodeGaveUp):
        raise
    except Exception:  # anything libsndfile rejects may still be FFmpeg-readable
        return None
    finally:
        if isinstance(opened, io.BytesIO):
            opened.seek(0)


def _read_mono(audio, decoded: _Decoded) -> _Decoded:
    while len(block := audio.read(READ_BLOCK_FRAMES, dtype="float32", always_2d=True)):
        decoded.work.add(block.size)
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
    except (AudioError, DecodeStopped, DecodeGaveUp):
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
            decoded.work.add(frame.samples * frame.layout.nb_channels)
            # The fifo refuses a frame whose timestamp does not follow on, as after a skipped packet.
            frame.pts = None
            assert fifo is not None and resampler is not None  # made with the first frame
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
