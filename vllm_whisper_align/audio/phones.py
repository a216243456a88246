"""Word boundaries from an acoustic model of English phones.

Whisper's cross-attention says which words were spoken and roughly when; it was never trained to say
where a word's sound begins and ends, and the boundary rules (``align.boundaries``) read that from the
level and spectrum of the audio. An HMM trained on phones was: PocketSphinx's US English model (bundled
in its wheel, so it runs offline) forced to the words heard, as WhisperX forces wav2vec2 to them.

:func:`place_words` forces a window's words onto the window's audio, the whole window at once, and
moves each word to where PocketSphinx placed it; a window the search finds no path through within its
beam is searched again without one (:func:`align_utterance`), one it has no path through at all (more
words than its frames hold) is tried again in halves (:func:`halves`), and a word that cannot be
spelled in phones (:func:`spell`) keeps the time it came with. Between the words the search may put
silence, noise and the filled pauses Whisper does not write ("um", "uh": FILLED_PAUSE_FILLERS). Only
the audio and the words' text go in: the times the heads gave (which move by a frame with the engine's
batch) do not, but where a window is halved and where a word is moved further than
:func:`keep_far_moves` allows. English only: no other language has a model here.
"""

from __future__ import annotations

import contextvars
import os
import pickle
import re
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from vllm_whisper_align.audio import denoise as noise_floor
from vllm_whisper_align.audio.dereverb import DEFAULT_MODE, Mode, dereverberated
from vllm_whisper_align.constants import SAMPLE_RATE

# Languages whose words the acoustic model can place.
PHONE_LANGUAGES = frozenset({"en"})
# PocketSphinx's search beams, wider than its defaults (1e-48), at which 25 s of spontaneous speech with
# a cold and long pauses had no path. Where these find none, the search runs again without a beam
# (:func:`align_utterance`).
BEAM = 1e-80
# Noise added to the samples (PCM16 steps, either way): digital silence (exact zeros, as synthesized
# or gated audio has) is log(0) to the model's features, and words were pulled into it.
DITHER_LSB = 4
# See decoder().
FILLER_PROB = 0.1
# Filled pauses the search may put between any two words, as fillers (beside the model's own silence,
# [NOISE] and [SPEECH]): Whisper writes no "um" or "uh", and with [SPEECH] alone the words around one
# took its sound (a word stretched back over an "uh" before it, then moved back to the heads' times by
# keep_far_moves, sometimes as a word of no length). Not where the text writes a filled pause itself
# (FILLED_PAUSES): a filler then took the written word's sound and squeezed the word after it.
FILLED_PAUSE_FILLERS = {"++UM++": "AH M", "++UH++": "AH"}
# Words of a text that are filled pauses (a verbatim transcript's).
FILLED_PAUSES = frozenset({"um", "umm", "uhm", "uh", "er", "erm", "ah", "eh", "hm", "hmm", "mm", "mhm"})
# Silence laid before and after the audio PocketSphinx is given (seconds; 10 frames, an even number, so
# that the frames whose Gaussians are scored (ds=2) stay the audio's own): its model was trained on
# utterances with silence around them, and short clips that start or end on a word (all speech to its
# cepstral mean) had their words placed further from the truth without it.
EDGE_SILENCE_S = 0.1
# Worker processes (:class:`Workers`), each about 40 MB: as many as the CPUs, up to 4.
WORKERS = max(1, min(4, os.cpu_count() or 1))
# Set where a call waits on a client (a short request, a live round): it takes the next free worker
# before calls that do not (Workers). runners.fair_threads sets it for urgent requests' work.
URGENT: contextvars.ContextVar[bool] = contextvars.ContextVar("phones_urgent", default=False)
# The workers' NumPy (audio.dereverb's matrix products) on one thread: a worker is one core's work at a
# lower priority, and OpenBLAS's threads, spinning for one another while the engine held the cores, took
# a 30 s window's 0.3 s to 18 s.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# How much lower the workers' CPU priority is than their parent's (nice): the engine's forward runs a
# thread on every core and waits for the slowest, so a core a search takes holds back every request in
# the batch, where a search that waits holds back one window's words.
NICENESS = 10
# How far the model may move a word's start or end from the times it came with (:func:`keep_far_moves`);
# the heads' and rules' times were over 0.5 s off for at most 5 of the real sets' 322 words.
MAX_MOVE_S = 0.5
# How many times a window without a path is cut in two (at most 2 ** SPLITS pieces) before its words
# keep the times they came with.
SPLITS = 3
# PocketSphinx's frames.
FRAME_S = 0.01
# The band the model's features read (its feat.params: -lowerf 130 -upperf 6800).
MODEL_BAND_HZ = (130.0, 6800.0)
# Audio shorter than this holds no word to place (a window's half cut at its very edge).
MIN_SAMPLES = SAMPLE_RATE // 10
# What a word of Whisper's text may carry around it that is not spoken.
PUNCTUATION = '.,!?;:"“”()[]{}…-–—'
# Not words: what PocketSphinx's segmentation adds between and around them.
NOT_WORDS = re.compile(r"^(<.*>|\[.*\]|\+.*\+)$")


# An utterance to align: its audio (16 kHz PCM16), Whisper's words in it, whether the room's late
# reverberation is taken out of the audio first (audio.dereverb.Mode), and whether a steady noise floor
# is (audio.denoise, where no reverberation was).
Utterance = tuple[bytes, Sequence[str], Mode, bool]
# Each word's (start, end) in seconds into its utterance (None for punctuation alone); None for the
# utterance where it could not be aligned.
WordSpans = list[tuple[float, float] | None] | None


class TimedWord(Protocol):
    start: float
    end: float
    word: str


# ---------------------------------------------------------------------------- spelling in phones


ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
# Letters and letter groups to phones (ARPAbet, the dictionary's), longest first: a rough reading of a
# word the dictionary lacks (a name, a coinage) is enough to align it; no reading loses its whole window.
LETTER_PHONES = {
    "tch": "CH", "sch": "S K", "th": "TH", "sh": "SH", "ch": "CH", "ph": "F", "wh": "W", "ck": "K",
    "ng": "NG", "qu": "K W", "gh": "", "ee": "IY", "ea": "IY", "oo": "UW", "ou": "AW", "ow": "OW",
    "ai": "EY", "ay": "EY", "oa": "OW", "oi": "OY", "oy": "OY", "au": "AO", "aw": "AO", "ie": "IY",
    "a": "AE", "b": "B", "c": "K", "d": "D", "e": "EH", "f": "F", "g": "G", "h": "HH", "i": "IH",
    "j": "JH", "k": "K", "l": "L", "m": "M", "n": "N", "o": "AA", "p": "P", "q": "K", "r": "R",
    "s": "S", "t": "T", "u": "AH", "v": "V", "w": "W", "x": "K S", "y": "IY", "z": "Z",
}  # fmt: skip
LETTER_GROUPS = re.compile("|".join(sorted(LETTER_PHONES, key=len, reverse=True)))


def number_words(number: int) -> list[str]:
    """An integer below a million in words ("twenty one"), as it is read."""
    if number < 20:
        return [ONES[number]]
    if number < 100:
        return [TENS[number // 10]] + ([ONES[number % 10]] if number % 10 else [])
    if number < 1000:
        return [ONES[number // 100], "hundred"] + (number_words(number % 100) if number % 100 else [])
    return (
        number_words(number // 1000) + ["thousand"] + (number_words(number % 1000) if number % 1000 else [])
    )


def read_number(text: str) -> list[str] | None:
    """Digits as they are read: years in pairs ("nineteen ninety"), decimals with "point", others as a
    number; None for what is not a plain number (or a million or more)."""
    if re.fullmatch(r"\d{4}", text) and (1100 <= int(text) <= 1999 or 2010 <= int(text) <= 2099):
        tail = int(text[2:])
        return number_words(int(text[:2])) + (
            number_words(tail) if tail >= 10 else ["oh", ONES[tail]] if tail else ["hundred"]
        )
    whole, _, fraction = text.replace(",", "").partition(".")
    if not whole.isdigit() or int(whole) >= 10**6 or (fraction and not fraction.isdigit()):
        return None
    return number_words(int(whole)) + (["point"] + [ONES[int(d)] for d in fraction] if fraction else [])


def letter_phones(word: str) -> str | None:
    """A rough reading of a word of letters the dictionary lacks; None where it has other characters."""
    if not re.fullmatch(r"[a-z']+", word):
        return None
    letters = re.sub(r"(.)\1", r"\1", word.replace("'", ""))  # a doubled letter is one sound
    if len(letters) > 2 and letters.endswith("e") and not letters.endswith("ee"):
        letters = letters[:-1]  # a silent final e
    phones = " ".join(LETTER_PHONES[group] for group in LETTER_GROUPS.findall(letters)).split()
    return " ".join(phones) or None


class Dictionary(Protocol):
    def lookup_word(self, word: str) -> str | None: ...


def spell(word: str, dictionary: Dictionary) -> list[tuple[str, str | None]] | None:
    """What a word of Whisper's text is in the dictionary's words: a list of (word, phones), phones None
    where the dictionary has the word and a rough reading where it does not; [] for punctuation alone;
    None where it cannot be read (a symbol, a number too large)."""
    text = word.strip().lower().replace("’", "'")
    if dictionary.lookup_word(text) is not None:  # "mr.", "e.g.", "u.s."
        return [(text, None)]
    text = text.strip(PUNCTUATION)
    if not text:
        return []
    if dictionary.lookup_word(text) is not None:
        return [(text, None)]
    if any(c.isdigit() for c in text):
        spoken = read_number(text)
        return [(w, None) for w in spoken] if spoken is not None else None
    parts = [part for part in re.split(r"[-–—/]", text) if part]
    if len(parts) > 1:
        spelled = [spell(part, dictionary) for part in parts]
        return None if any(s is None for s in spelled) else [x for s in spelled for x in s or []]
    phones = letter_phones(text)
    return [(text, phones)] if phones is not None else None


# ---------------------------------------------------------------------------- the aligner

# The decoders, in the worker process (:class:`Worker`): with and without FILLED_PAUSE_FILLERS.
_decoders: dict[bool, Any] = {}


def decoder(filled_pauses: bool = True) -> Any:
    """This process's PocketSphinx decoder, with FILLED_PAUSE_FILLERS among its fillers or without; each
    loads the model (about 0.3 s and 30 MB) once, when first used."""
    if filled_pauses not in _decoders:
        _decoders[filled_pauses] = new_decoder(filled_pauses)
    return _decoders[filled_pauses]


def new_decoder(filled_pauses: bool) -> Any:
    from pocketsphinx import Config, Decoder  # the import and the model are paid on first use only

    with tempfile.TemporaryDirectory() as folder:
        # The model's own noise dictionary, and the filled pauses: read when the decoder is made.
        fillers = Path(folder, "noisedict")
        added = "".join(f"{word} {phones}\n" for word, phones in FILLED_PAUSE_FILLERS.items())
        fillers.write_text(
            Path(Config(lm=None)["hmm"], "noisedict").read_text() + (added if filled_pauses else "")
        )
        return Decoder(
            samprate=SAMPLE_RATE,
            bestpath=False,
            loglevel="FATAL",
            # Its noise tracker carries over from one utterance to the next: answers would depend on
            # the requests before.
            remove_noise=False,
            # Gaussians scored every other frame (boundaries stay on 10 ms frames): 7 ms of CPU a second
            # of audio against 11, and as many starts within 20 ms on the real sets.
            ds=2,
            # Fillers between words ([NOISE], [SPEECH], the filled pauses) as likely as this: at
            # PocketSphinx's 1e-8 the word after an "um" took its sound.
            fillprob=FILLER_PROB,
            fdict=str(fillers),
            lm=None,  # alignment reads the dictionary only: the language model would be 60 MB more
        )


def writes_filled_pauses(texts: Sequence[str]) -> bool:
    """Whether any of Whisper's words in ``texts`` is a filled pause ("Um," "uh")."""
    return any(text.strip().lower().strip(PUNCTUATION) in FILLED_PAUSES for text in texts)


def dithered(pcm: bytes) -> bytes:
    """``pcm`` with DITHER_LSB of noise added, the same noise for the same length: the same audio
    always gets the same answer."""
    noise = np.random.default_rng(0).integers(-DITHER_LSB, DITHER_LSB + 1, len(pcm) // 2)
    return np.clip(np.frombuffer(pcm, dtype=np.int16) + noise, -32768, 32767).astype(np.int16).tobytes()


def align_utterance(
    pcm: bytes, texts: Sequence[str], dereverberate: Mode = False, denoise: bool = False
) -> WordSpans:
    """(start, end) in seconds into ``pcm`` (16 kHz PCM16) of each of Whisper's words in ``texts``
    (None for punctuation alone), or None where a word cannot be read or PocketSphinx finds no path.
    Searched within BEAM, and where that finds no path, again without a beam (0: every path kept; about
    3 times the CPU): in noise the best path falls out of any beam over a long window (25 s of speech
    with white noise 10 dB under it had no path at 1e-300), and the window was cut in pieces instead."""
    if len(pcm) // 2 < MIN_SAMPLES:  # PCM16: two bytes a sample
        return None
    sphinx = decoder(filled_pauses=not writes_filled_pauses(texts))
    spelled = [spell(text, sphinx) for text in texts]
    if any(pieces is None for pieces in spelled) or not any(spelled):
        return None
    for pieces in spelled:
        for text, phones in pieces or []:
            if phones is not None and sphinx.lookup_word(text) is None:
                sphinx.add_word(text, phones, True)
    words = [text for pieces in spelled for text, _ in pieces or []]
    pcm = cleaned(pcm, dereverberate, denoise)
    segments = search(sphinx, pcm, words, BEAM) or search(sphinx, pcm, words, 0.0)
    if segments is None:
        return None
    times: list[tuple[float, float] | None] = []
    i = 0
    for pieces in spelled:
        if not pieces:
            times.append(None)
            continue
        first, last = segments[i], segments[i + len(pieces) - 1]
        times.append((into(pcm, first.start_frame), into(pcm, last.end_frame + 1)))
        i += len(pieces)
    return times


def cleaned(pcm: bytes, dereverberate: Mode, denoise: bool) -> bytes:
    """``pcm`` (PCM16) as the model reads it, in its band: the room's late reverberation taken out
    (:mod:`audio.dereverb`; a word's end otherwise ran on through the room's tail), where ``dereverberate``
    says (always, or where its gate finds a tail); else, with ``denoise``, a steady noise floor near
    enough to the speech to matter (:mod:`audio.denoise`). One or the other: in a room, the tail read as
    a noise floor, and the noise filter took some of the words. ``pcm`` itself where nothing was."""
    if dereverberate is False and not denoise:
        return pcm
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768
    out = samples
    if dereverberate is not False:
        out = dereverberated(samples, MODEL_BAND_HZ, SAMPLE_RATE, always=dereverberate is True)
    if denoise and out is samples:
        out = noise_floor.denoised(samples, MODEL_BAND_HZ, SAMPLE_RATE)
    return pcm if out is samples else pcm16(out).tobytes()


def pcm16(samples: np.ndarray) -> np.ndarray:
    """Float samples (-1..1, clipped) as the 16-bit PCM PocketSphinx reads."""
    return (np.clip(samples, -1.0, 1.0) * 32767).astype(np.int16)


def search(sphinx: Any, pcm: bytes, words: Sequence[str], beam: float) -> list | None:
    """PocketSphinx's segments of ``words`` (fillers left out) forced onto ``pcm`` within ``beam`` of the
    best path, or None where it finds no path."""
    # The alignment search is made anew for each text, with the beams the decoder's configuration has.
    for name in ("beam", "wbeam", "pbeam"):
        sphinx.config[name] = beam
    try:
        sphinx.set_align_text(" ".join(words))
        # Its features start afresh (the cepstral mean it starts from, the pre-emphasis filter's last
        # sample): they keep the last utterance's otherwise, and the same audio was placed 10 ms apart.
        sphinx.reinit_feat()
        sphinx.start_utt()
        # The same samples at every utterance's edges: with Gaussians scored every other frame, the
        # Gaussians it picks carry over from the frames before, the last utterance's included, and
        # after other windows the same window came back with a word 60 ms apart. The same frames
        # first make that state the same for most windows, not all (docs/boundaries.md#silence-around-
        # each-window-2026-12-06).
        edge = dithered(bytes(2 * round(EDGE_SILENCE_S * SAMPLE_RATE)))
        # At once: its cepstral mean is its own.
        sphinx.process_raw(edge + dithered(pcm) + edge, full_utt=True)
        sphinx.end_utt()
        segments = [s for s in sphinx.seg() or [] if not NOT_WORDS.match(s.word)]
    except RuntimeError:  # no path through it, or a word it would not take
        return None
    if [re.sub(r"\(\d+\)$", "", s.word) for s in segments] != list(words):  # "the(2)": a variant
        return None  # no path through it
    return segments


def into(pcm: bytes, frame: int) -> float:
    """Seconds into ``pcm`` of PocketSphinx's ``frame`` (counted from the edge's silence before it),
    kept within the audio's whole frames: a time rounded to 10 ms then stays within it too."""
    whole_frames = len(pcm) // 2 // round(FRAME_S * SAMPLE_RATE)
    return FRAME_S * min(max(frame - round(EDGE_SILENCE_S / FRAME_S), 0), whole_frames)


def align_utterances(utterances: Sequence[Utterance]) -> list[WordSpans]:
    """:func:`align_utterance` of each: what the worker process runs for one call."""
    return [align_utterance(*utterance) for utterance in utterances]


class Worker:
    """PocketSphinx in a process of its own, spoken to over its stdin and stdout (pickles), one list
    of utterances at a time. Its search holds the GIL for as long as it runs (about 7 ms a second of audio),
    which in the API process would stall every other thread, the server's event loop among them; fed
    to it in short blocks instead, its answers depended on the utterances before. A plain subprocess,
    not multiprocessing's: spawning re-imports the caller's main module, which a user's script without
    a ``__main__`` guard cannot survive. It exits when its stdin closes (its parent gone)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None

    def align(self, utterances: list[Utterance]) -> list[WordSpans]:
        """:func:`align_utterances` in the worker; None for each where it died (started again for the
        next call)."""
        with self._lock:
            try:
                process = self._started()
                pickle.dump(utterances, process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                process.stdin.flush()
                return pickle.load(process.stdout)
            except (OSError, EOFError, pickle.UnpicklingError):
                self.close()
        # vLLM's logger, imported here: the worker process imports this module and not vLLM.
        from vllm_whisper_align.log import get_logger

        get_logger(__name__).warning("the phone aligner's process died; these words keep their times")
        return [None] * len(utterances)

    def start(self) -> None:
        """Starts the process now, not at the first call: it loads the model as it starts."""
        with self._lock:
            self._started()

    def _started(self) -> Any:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**os.environ, **ONE_THREAD},
            )
        return self._process

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


class Workers:
    """WORKERS worker processes, each window to one that is free; the most recently freed first, so a
    second process starts only once two windows are aligned at the same time. One was the bottleneck at
    the end of a burst of requests: every window the engine had just answered waited for it.

    Calls wait for a worker in order of arrival, urgent ones (made where :data:`URGENT` is set: a short
    request's or a live round's windows) before the others: where the workers cannot keep up with the
    engine, a live round waited behind every window of the files finished before it."""

    def __init__(self, count: int) -> None:
        self.dereverberate: Mode = DEFAULT_MODE  # see configure()
        self.denoise = noise_floor.DEFAULT_ON  # see configure()
        self._idle = [Worker() for _ in range(count)]  # the most recently freed last
        self._changed = threading.Condition()
        self._lines: dict[bool, deque[object]] = {True: deque(), False: deque()}  # urgent or not

    def start(self) -> None:
        """Starts the worker the first call takes."""
        with self._changed:
            first = self._idle[-1]
        first.start()

    def align(self, utterances: list[Utterance]) -> list[WordSpans]:
        worker = self._take(URGENT.get())
        try:
            return worker.align(utterances)
        finally:
            with self._changed:
                self._idle.append(worker)
                self._changed.notify_all()

    def _take(self, urgent: bool) -> Worker:
        """A free worker, once the calls before this one in its line, and every urgent call for one that
        is not, have theirs."""
        line, ticket = self._lines[urgent], object()
        with self._changed:
            line.append(ticket)
            self._changed.wait_for(
                lambda: bool(self._idle) and line[0] is ticket and (urgent or not self._lines[True])
            )
            line.popleft()
            worker = self._idle.pop()
            self._changed.notify_all()  # the next in line, where a worker is still free
            return worker


_workers = Workers(WORKERS)


def configure(dereverberate: Mode, denoise: bool) -> None:
    """This process's phone aligner: whether it takes a room's late reverberation out of a window before
    the model reads it (``whisper_align.dereverberate``: always, never, or where the window has a tail;
    :mod:`audio.dereverb`), and a steady noise floor where it found none (``whisper_align.denoise``;
    :mod:`audio.denoise`). One setting a process, as its workers are: the engine's runner sets it as it
    starts."""
    _workers.dereverberate = dereverberate
    _workers.denoise = denoise


def start() -> None:
    """Starts this process's first worker now, where it would start at the first window's words: its
    cold start (a Python process, PocketSphinx and its model, at nice NICENESS, beside whatever the
    engine runs then) is paid before a request waits on it, not by the first one."""
    _workers.start()


def serve() -> None:
    """The worker's loop: a list of utterances in, their words' times out, until stdin closes."""
    channel_in, channel_out = sys.stdin.buffer, sys.stdout.buffer
    os.nice(NICENESS)
    sys.stdout = sys.stderr  # nothing but answers on the channel
    try:  # the model most windows read (no filled pause written), loaded before the first comes
        decoder()
    except Exception:  # answered as any call's failure is, below
        pass
    while True:
        try:
            utterances = pickle.load(channel_in)
        except EOFError:
            return
        try:
            answers = align_utterances(utterances)
        except Exception:  # anything PocketSphinx raises: these go unplaced, the worker lives on
            answers = [None] * len(utterances)
        pickle.dump(answers, channel_out, protocol=pickle.HIGHEST_PROTOCOL)
        channel_out.flush()


def place_words(words: Sequence[TimedWord], samples: np.ndarray, offset: float, language: str) -> int:
    """Moves ``words`` (absolute times; ``samples``, their window's audio, start at ``offset`` seconds) to
    where the acoustic model places them in the window; returns how many it placed. The answer depends
    on the audio and the words' text alone, not on the times they came with, except where the window
    has no path (:func:`halves`) and where a word moved further than MAX_MOVE_S (:func:`keep_far_moves`).
    Words that cannot be placed keep their times."""
    if language not in PHONE_LANGUAGES or not words:
        return 0
    pcm = pcm16(samples)
    before = [(word.start, word.end) for word in words]
    placed = place_span(words, pcm, offset, 0, len(words), SPLITS)
    return placed - keep_far_moves(words, before) if placed else 0


def keep_far_moves(words: Sequence[TimedWord], before: list[tuple[float, float]]) -> int:
    """Words the model moved an edge more than MAX_MOVE_S go back to the times they came with, and a
    placed neighbour that overlaps one is cut at its edge; returns how many went back. Where the text is
    not what the audio holds (speech the text leaves out, noise and tones, a window's audio cut
    mid-word), the model forces the words somewhere all the same: a word stretched over 20 s of noise."""
    back = {
        i
        for i, (word, (start, end)) in enumerate(zip(words, before, strict=True))
        if abs(word.start - start) > MAX_MOVE_S or abs(word.end - end) > MAX_MOVE_S
    }
    for i in back:
        words[i].start, words[i].end = before[i]
    for i in range(1, len(words)):
        previous, word = words[i - 1], words[i]
        if previous.end > word.start and (i - 1 in back) != (i in back):
            if i in back:
                previous.end = max(previous.start, word.start)
            else:
                word.start = min(word.end, previous.end)
    return len(back)


def place_span(
    words: Sequence[TimedWord], pcm: np.ndarray, offset: float, first: int, stop: int, splits: int
) -> int:
    """:func:`place_words` of ``words[first:stop]`` over ``pcm`` (starting at ``offset``); where the
    search finds no path, each of :func:`halves` on its own, ``splits`` times at most."""
    [times] = _workers.align(
        [(pcm.tobytes(), [word.word for word in words[first:stop]], _workers.dereverberate, _workers.denoise)]
    )
    if times is not None:
        for word, span in zip(words[first:stop], times, strict=True):
            if span is not None:
                word.start, word.end = offset + span[0], offset + span[1]
        return sum(span is not None for span in times)
    if splits == 0 or stop - first < 2:
        return 0
    cut, at = halves(words, first, stop, offset)
    sample = min(max(int(round((at - offset) * SAMPLE_RATE)), 0), len(pcm))
    return place_span(words, pcm[:sample], offset, first, cut, splits - 1) + place_span(
        words, pcm[sample:], offset + sample / SAMPLE_RATE, cut, stop, splits - 1
    )


def halves(words: Sequence[TimedWord], first: int, stop: int, offset: float) -> tuple[int, float]:
    """Where a span without a path is cut in two: before the word after the widest pause between
    ``words[first:stop]`` (their times so far; the middlemost of equals), at the pause's middle. A
    window whose text holds more words than its audio has frames for has no path even unpruned; where
    those words crowd one part of it (a long-form window's text holding a few of the next window's
    words), the other half has one."""
    middle = (first + stop) / 2
    # The widest pause (to 10 ms), the one nearest the middle among equals: continuous speech halves.
    cut = max(
        range(first + 1, stop), key=lambda i: (round(words[i].start - words[i - 1].end, 2), -abs(i - middle))
    )
    return cut, max(offset, (words[cut - 1].end + words[cut].start) / 2)


if __name__ == "__main__":
    serve()
