"""Synthetic speech with known word boundaries, for timestamp tests.

Two kinds. Words with pauses (:func:`synthesize_words`): each word is spoken on its own by
espeak-ng, trimmed to where its sound starts and ends, and joined with exact silences, so the true
start/end of every word is known to the sample. Continuous speech (:func:`synthesize_sentence`):
a whole sentence in one breath from libespeak-ng, whose WORD events give each word's start sample
(no pauses to snap to: the harder case). Synthesized audio is cached on disk because espeak-ng is
the slow part.
"""

import functools
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vllm_whisper_align.audio.decode import decode_audio
from vllm_whisper_align.constants import SAMPLE_RATE

# A word's sound starts/ends at the first/last sample this far below its peak (-60 dB).
# espeak-ng's own silence is exact zeros, so this only has to clear resampler ringing.
TRIM_THRESHOLD = 1e-3
# Bump when synthesis or trimming changes, so stale cache entries are ignored.
CACHE_VERSION = 1
SENTENCE_CACHE_VERSION = 2


@dataclass
class SpokenClip:
    samples: np.ndarray  # float32 mono at SAMPLE_RATE
    words: list[str]
    starts: list[float]  # seconds; starts[i] * SAMPLE_RATE is an exact sample index
    ends: list[float]
    text: str

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def synthesize_words(
    words: Sequence[str],
    gap_s: float | Sequence[float] = 0.3,
    voice: str = "en-us",
    rate: int = 160,
    lead_s: float = 0.5,
    tail_s: float = 0.5,
    noise_db: float | None = None,
    seed: int = 0,
) -> SpokenClip:
    """Speak `words` one at a time with silences of `gap_s` between them.

    `gap_s` is one gap for all, or one per pair of neighbouring words. `noise_db` adds
    white noise at that RMS level in dBFS (e.g. -40) over the whole clip; boundaries
    still describe the clean speech.
    """
    words = list(words)
    if not words:
        raise ValueError("need at least one word")
    gaps = _gap_list(gap_s, len(words))

    pieces = [_silence(lead_s)]
    starts, ends = [], []
    position = len(pieces[0])
    for index, word in enumerate(words):
        sound = speak_word(word, voice, rate)
        starts.append(position / SAMPLE_RATE)
        position += len(sound)
        ends.append(position / SAMPLE_RATE)
        pieces.append(sound)
        pause = _silence(gaps[index] if index < len(gaps) else tail_s)
        position += len(pause)
        pieces.append(pause)

    samples = np.concatenate(pieces)
    if noise_db is not None:
        samples = _add_noise(samples, noise_db, seed)
    return SpokenClip(samples, words, starts, ends, _sentence_text(words))


def speak_word(word: str, voice: str = "en-us", rate: int = 160) -> np.ndarray:
    """One word from espeak-ng at SAMPLE_RATE, trimmed to its sound (cached on disk)."""
    cache_file = _cache_dir() / f"{_cache_key(word, voice, rate)}.npy"
    if cache_file.exists():
        return np.load(cache_file)
    sound = _trim_silence(_run_espeak(word, voice, rate))
    _save_atomically(cache_file, sound)
    return sound


def synthesize_sentence(
    text: str,
    voice: str = "en-us",
    rate: int = 160,
    lead_s: float = 0.5,
    tail_s: float = 0.5,
    noise_db: float | None = None,
    seed: int = 0,
) -> SpokenClip:
    """``text`` spoken continuously (no pauses between words), with each word's true start.

    Starts come from libespeak-ng's WORD events (a stop's closure counts as part of its word, as
    in TIMIT); a word espeak-ng speaks together with its neighbour has a NaN start. Only the last
    word's end is known (where the sound stops); the other ends are NaN.
    """
    samples, starts = speak_sentence(text, voice, rate)
    lead = _silence(lead_s)
    starts = [start + len(lead) / SAMPLE_RATE for start in starts]
    ends = [float("nan")] * (len(starts) - 1) + [(len(lead) + len(samples)) / SAMPLE_RATE]
    samples = np.concatenate([lead, samples, _silence(tail_s)])
    if noise_db is not None:
        samples = _add_noise(samples, noise_db, seed)
    return SpokenClip(samples, text.split(), starts, ends, text)


def speak_sentence(text: str, voice: str = "en-us", rate: int = 160) -> tuple[np.ndarray, list[float]]:
    """A sentence from libespeak-ng at SAMPLE_RATE, trimmed to its sound, and each word's start in
    seconds from the first sample (NaN where espeak-ng gave no event); cached on disk."""
    cache_file = _cache_dir() / f"{_cache_key(('sentence', SENTENCE_CACHE_VERSION, text), voice, rate)}.npz"
    if cache_file.exists():
        with np.load(cache_file) as cached:
            return cached["samples"], cached["starts"].tolist()
    from tests.support.espeak_events import speak_sentence as speak
    from tests.support.espeak_events import word_starts

    wav, source_rate, events = speak(text, voice, rate)
    loud = np.flatnonzero(np.abs(wav) > TRIM_THRESHOLD * np.abs(wav).max(initial=0))
    if len(loud) == 0:
        raise ValueError("espeak-ng produced silence")
    first, last = loud[0], loud[-1] + 1
    samples = _resample(wav[first:last], source_rate)
    # np.maximum keeps NaN (the builtin max would turn it into 0.0)
    starts = np.maximum(np.asarray(word_starts(text, events, source_rate)) - first / source_rate, 0.0)
    _save_atomically(cache_file, samples, starts=starts)
    return samples, starts.tolist()


def _resample(wav: np.ndarray, source_rate: int) -> np.ndarray:
    # Through a WAV and decode_audio, so both kinds of speech use the same resampler.
    import io

    buffer = io.BytesIO()
    write_wav(buffer, wav.astype(np.float32) / 32768, source_rate)
    return decode_audio(buffer.getvalue(), SAMPLE_RATE)


def write_wav(path, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """16-bit WAV to a path or a writable binary file object."""
    import soundfile

    target = path if hasattr(path, "write") else os.fspath(path)
    soundfile.write(target, samples, sample_rate, subtype="PCM_16", format="WAV")


SENTENCES = [
    "the cat sat on the warm mat",
    "please bring me a glass of cold water",
    "we walked to the park after lunch",
    "the train leaves at seven in the morning",
    "my sister plays the piano every day",
    "please open the kitchen window",
    "he painted the old fence green and white last summer",
    "birds sing in the tall trees near the river",
]
_GAP_CYCLE = [0.15, 0.25, 0.4, 0.6, 0.2, 0.35, 0.5, 0.3]


def sentence_clips() -> list[SpokenClip]:
    """Eight short plain-English sentences with word gaps varying from 0.15 s to 0.6 s.

    The clips are built once per process and shared: copy samples before changing them.
    """
    return list(_sentence_clips())


@functools.cache
def _sentence_clips() -> tuple[SpokenClip, ...]:
    clips = []
    for index, sentence in enumerate(SENTENCES):
        words = sentence.split()
        gaps = [_GAP_CYCLE[(index + k) % len(_GAP_CYCLE)] for k in range(len(words) - 1)]
        clips.append(synthesize_words(words, gap_s=gaps))
    return tuple(clips)


def long_clip(min_seconds: float = 65.0) -> SpokenClip:
    """Sentence clips back to back (repeating as needed) until at least `min_seconds` long."""
    clips, total = [], 0.0
    while total < min_seconds:
        clips.append(sentence_clips()[len(clips) % len(SENTENCES)])
        total += clips[-1].duration
    return concatenate_clips(clips)


def concatenate_clips(clips: Sequence[SpokenClip]) -> SpokenClip:
    """One clip of several back to back, with every word boundary shifted to its new offset."""
    words, starts, ends, offset = [], [], [], 0.0
    for clip in clips:
        words += clip.words
        starts += [offset + start for start in clip.starts]
        ends += [offset + end for end in clip.ends]
        offset += len(clip.samples) / SAMPLE_RATE
    samples = np.concatenate([clip.samples for clip in clips])
    return SpokenClip(samples, words, starts, ends, " ".join(clip.text for clip in clips))


def _gap_list(gap_s: float | Sequence[float], num_words: int) -> list[float]:
    if isinstance(gap_s, (int, float)):
        return [float(gap_s)] * (num_words - 1)
    gaps = [float(gap) for gap in gap_s]
    if len(gaps) != num_words - 1:
        raise ValueError(f"need {num_words - 1} gaps for {num_words} words, got {len(gaps)}")
    return gaps


def _silence(seconds: float) -> np.ndarray:
    return np.zeros(int(round(seconds * SAMPLE_RATE)), dtype=np.float32)


def _sentence_text(words: list[str]) -> str:
    text = " ".join(words)
    return text[:1].upper() + text[1:] + "."


def _add_noise(samples: np.ndarray, noise_db: float, seed: int) -> np.ndarray:
    noise = np.random.default_rng(seed).standard_normal(len(samples)) * 10 ** (noise_db / 20)
    return np.clip(samples + noise, -1.0, 1.0).astype(np.float32)


def _run_espeak(word: str, voice: str, rate: int) -> np.ndarray:
    # "--" keeps a word starting with "-" from being read as an option.
    command = ["espeak-ng", "-v", voice, "-s", str(rate), "--stdout", "--", word]
    wav = subprocess.run(command, check=True, capture_output=True).stdout
    return decode_audio(wav, SAMPLE_RATE)


def _trim_silence(samples: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(samples) > TRIM_THRESHOLD * np.abs(samples).max(initial=0.0))
    if len(loud) == 0:
        raise ValueError("espeak-ng produced silence")
    return np.ascontiguousarray(samples[loud[0] : loud[-1] + 1], dtype=np.float32)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vllm-whisper-align" / "espeak"


def _cache_key(word: str, voice: str, rate: int) -> str:
    return hashlib.sha256(repr((CACHE_VERSION, word, voice, rate)).encode()).hexdigest()[:32]


def _save_atomically(path: Path, samples: np.ndarray, **more: np.ndarray) -> None:
    # Parallel test workers may synthesize the same word; never expose a half-written file.
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=path.suffix + ".tmp", delete=False) as temporary:
        if more:
            np.savez(temporary, samples=samples, **more)
        else:
            np.save(temporary, samples)
    os.replace(temporary.name, path)


def start_errors(clip: SpokenClip, words: Sequence) -> np.ndarray:
    """|heard start - true start| per spoken word, inf for words the transcript lacks, NaN for words
    whose true start is unknown (see :func:`synthesize_sentence`).

    Spoken and heard words (lowercased, punctuation stripped) are paired by a minimum edit-distance
    alignment, so repeated phrases and repeated words pair with the right occurrence (the nearest in
    time where the counts differ).
    """
    return _paired_errors(clip, words, clip.starts, "start")


def end_errors(clip: SpokenClip, words: Sequence) -> np.ndarray:
    """|heard end - true end| per spoken word, paired as :func:`start_errors` pairs them (inf: not
    heard; NaN: true end unknown)."""
    return _paired_errors(clip, words, clip.ends, "end")


def _paired_errors(clip: SpokenClip, words: Sequence, truth: Sequence[float], key: str) -> np.ndarray:
    spoken = [_plain(w) for w in clip.words]
    heard = [_plain(_field(w, "word")) for w in words]
    errors = np.full(len(spoken), np.inf)
    for i, j in align_words(spoken, heard, clip.starts, [_field(w, "start") for w in words]):
        errors[i] = abs(_field(words[j], key) - truth[i])
    return errors


def _field(word, name: str):
    """A word's field: words are the HTTP answers' dicts or the Python API's ``Word`` objects."""
    return word[name] if isinstance(word, dict) else getattr(word, name)


def _plain(word: str) -> str:
    return word.strip(" .,!?;:\"'").lower()


def word_errors(reference: list[str], heard: list[str]) -> int:
    """Substitutions, deletions and insertions turning ``reference`` into ``heard``."""
    row = list(range(len(heard) + 1))
    for i, ref in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, word in enumerate(heard, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ref != word))
    return row[-1]


def align_words(
    spoken: Sequence[str],
    heard: Sequence[str],
    spoken_starts: Sequence[float] | None = None,
    heard_starts: Sequence[float] | None = None,
) -> list[tuple[int, int]]:
    """Index pairs of equal words on a minimum edit-distance (Levenshtein) path.

    Given both sides' start times, where several paths are as short (a word said four times and
    written three times), the one whose paired words lie nearest in time wins, as sclite's
    time-mediated alignment pairs them; without times, the last occurrences pair."""
    n, m = len(spoken), len(heard)
    apart = _apart(spoken_starts, heard_starts, n, m)
    edits = np.zeros((n + 1, m + 1), dtype=np.int32)
    edits[:, 0] = np.arange(n + 1)
    edits[0, :] = np.arange(m + 1)
    drift = np.zeros((n + 1, m + 1))

    def steps(i: int, j: int) -> list[tuple[int, float]]:
        same = spoken[i - 1] == heard[j - 1]
        return [
            (edits[i - 1, j - 1] + (not same), drift[i - 1, j - 1] + (apart[i - 1, j - 1] if same else 0.0)),
            (edits[i - 1, j] + 1, drift[i - 1, j]),
            (edits[i, j - 1] + 1, drift[i, j - 1]),
        ]

    for i in range(1, n + 1):
        for j in range(1, m + 1):
            edits[i, j], drift[i, j] = min(steps(i, j))
    pairs, i, j = [], n, m
    while i > 0 and j > 0:
        best = steps(i, j).index((edits[i, j], drift[i, j]))
        if best == 0 and spoken[i - 1] == heard[j - 1]:
            pairs.append((i - 1, j - 1))
        i, j = (i - 1, j - 1) if best == 0 else (i - 1, j) if best == 1 else (i, j - 1)
    return pairs[::-1]


def _apart(spoken_starts, heard_starts, n: int, m: int) -> np.ndarray:
    """|heard start - spoken start| of every pair, 0 where either is unknown (or no times given)."""
    if spoken_starts is None or heard_starts is None:
        return np.zeros((n, m))
    a = np.asarray(spoken_starts, dtype=float)[:, None] - np.asarray(heard_starts, dtype=float)[None, :]
    return np.nan_to_num(np.abs(a), nan=0.0)
