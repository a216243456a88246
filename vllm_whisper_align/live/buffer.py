"""The rolling buffer of a live stream: the audio not yet settled, at most one window, decoded again each
time ``STEP_S`` more has come, its words confirmed by :class:`~.agreement.Agreement`.

What comes is appended; :meth:`RollingBuffer.wants_decode` says whether a decode is due (``STEP_S`` of
new audio, or the end of the audio with something left to settle); :meth:`RollingBuffer.next_decode`
moves the new audio into the buffer (at most ``MAX_STEP_S`` at a time, so that a client ahead of real
time still has each decode hear more than the last) and says what to decode: the buffer, where it lies
in the stream, and the confirmed text before it as the prompt (openai-whisper's ``initial_prompt``, as
ufal/whisper_streaming: its last ``PROMPT_CHARS`` characters). :meth:`RollingBuffer.take` reads the
decode's words, confirms what two decodes agree on and trims the buffer: once it is over
``TRIM_AFTER_S``, at the end of its last confirmed sentence (or segment: a pause ends one too); when
the next step might not fit in the window, at a word's end, the words before it confirmed as the
latest decode heard them (:meth:`RollingBuffer._make_room`).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from vllm_whisper_align.align.results import SEGMENT_PAUSE_S
from vllm_whisper_align.align.words import SENTENCE_END_MARKS, Word, round_time
from vllm_whisper_align.audio.features import speech_frames, speech_share
from vllm_whisper_align.audio.pcm import pcm16_to_float
from vllm_whisper_align.constants import CHUNK_SECONDS, SAMPLE_RATE
from vllm_whisper_align.live.agreement import Agreement

# A decode is due once this much audio has come since the last (ufal/whisper_streaming's min-chunk-size):
# decodes follow one another as fast as the engine answers, each hearing at least this much more than
# the one before (two decodes of the same audio agree on anything, a cut-off last word too). A word is
# confirmed by the second decode that hears it whole, so the step is most of a word's delay.
STEP_S = 0.5
# The most new audio one decode takes in, for a client sending faster than real time.
MAX_STEP_S = 5.0
# The most audio a stream holds that no decode has taken in yet, by default. Past it the source is not
# read (the CLI stops reading its pipe) until decodes have taken some in: a source far ahead of real
# time, a file sent at once, then waits at the engine's pace, with a few decodes' worth of audio in
# memory rather than all it sent, and is never refused for sending fast. The server's streams hold up
# to its longest audio instead (``runners.live.LiveStreams``): a WebSocket's keepalive pong comes in
# behind the audio the client sent before it, and a socket the server stops reading loses its
# connection (uvicorn closes it with 1011 once a pong is 20 s late).
MAX_WAITING_S = 30.0
# How many chunks a source's reader (a pipe, a file played) may be ahead of what its stream has taken.
READ_AHEAD_CHUNKS = 16
# The buffer holds at most one window.
WINDOW_S = float(CHUNK_SECONDS)
# Over this long, the buffer is trimmed at its last confirmed sentence end.
TRIM_AFTER_S = 10.0
# How much confirmed text before the buffer is the decoder's prompt.
PROMPT_CHARS = 200

# A decode is given the confirmed words of its buffer as its prefix (forced, not decoded again: a
# decode's time grows with the text it writes) but the last few, which it reads again: forced to its
# end, a decode goes on from where an earlier, shorter decode stopped writing, and Whisper then ended
# after a forced "was." with speech still to come, or read the next words otherwise (docs/streaming.md).
PREFIX_REREAD_WORDS = 2
# A word the latest decode did not write, past its text's end, stays unconfirmed for the next decode
# where at least this share of its span is speech (``Agreement._unanswered``).
UNANSWERED_MIN_SPEECH_SHARE = 0.5


@dataclass(frozen=True)
class Decode:
    """One decode a stream asks for: ``samples`` (the buffer), which start ``offset`` seconds into the
    stream; ``prompt``: the confirmed text before them; ``prefix``: confirmed words the buffer begins
    with, which the decode is given rather than decodes again (their tokens forced after the start
    tokens: one prefill step instead of a decode step a token; their times kept: the acoustic model
    places only the words after them)."""

    samples: np.ndarray
    offset: float
    prompt: str | None
    prefix: tuple[Word, ...] = ()

    @property
    def prefix_in_samples(self) -> tuple[Word, ...]:
        """The prefix with its times in ``samples`` rather than the stream."""
        return tuple(_shifted(word, -self.offset) for word in self.prefix)


@dataclass(frozen=True)
class Update:
    """What a decode settled: words confirmed now, and the unconfirmed rest it heard (stream times)."""

    confirmed: list[Word]
    partial: list[Word]


@dataclass
class RollingBuffer:
    """One stream's audio not yet settled, and what is confirmed."""

    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    # Seconds of the stream at audio[0].
    offset: float = 0.0
    # What has come and is not in the buffer yet.
    arrived: Arrived = field(default_factory=lambda: Arrived())
    agreement: Agreement = field(default_factory=Agreement)
    confirmed: list[Word] = field(default_factory=list)
    ended: bool = False
    # ``has_room`` while less than this has come and waits for a decode.
    max_waiting_s: float = MAX_WAITING_S

    # ---- audio in

    def append(self, samples: np.ndarray) -> None:
        """Samples that have come: float (-1..1), or PCM16 (kept so until a decode takes them in)."""
        if self.ended:
            raise ValueError("the audio has ended")
        self.arrived.put(samples)

    def end(self) -> None:
        """No more audio will come: what is left is decoded, and the last decode's words confirmed."""
        self.ended = True

    @property
    def new_seconds(self) -> float:
        return len(self.arrived) / SAMPLE_RATE

    @property
    def has_room(self) -> bool:
        """More audio may be read in: less than ``max_waiting_s`` waits for a decode to take it."""
        return self.new_seconds < self.max_waiting_s

    @property
    def seconds(self) -> float:
        """How much audio the buffer holds."""
        return len(self.audio) / SAMPLE_RATE

    @property
    def stream_seconds(self) -> float:
        """Seconds of the stream that have come (the buffer's end and what waits)."""
        return self.offset + self.seconds + self.new_seconds

    # ---- decodes

    def wants_decode(self) -> bool:
        """A decode is due: ``STEP_S`` of new audio, or the audio has ended with new audio left."""
        new = self.new_seconds
        return new >= STEP_S or (self.ended and new > 0)

    def next_decode(self) -> Decode:
        """Moves up to MAX_STEP_S of new audio into the buffer (trimming first what the window cannot
        hold) and says what to decode."""
        step = min(self.new_seconds, MAX_STEP_S)
        overflow = self.seconds + step - WINDOW_S
        if overflow > 0:  # take() leaves room for MAX_STEP_S; never more than a window all the same
            self._trim_at(self.offset + overflow)
        self._take_in(int(round(step * SAMPLE_RATE)))
        return Decode(self.audio, self.offset, self._prompt(), self._prefix())

    def take(self, decode: Decode, words: Sequence[Word] | None) -> Update:
        """A decode's words (times within ``decode.samples``): those two decodes agree on confirmed; the
        buffer trimmed at its last confirmed sentence end once it is long. ``words`` None: the decode
        is not believed (it looped), confirms nothing, and the next is compared with the one before."""
        confirmed = []
        if words is not None:
            # A prefixed decode's first words are its prefix's: confirmed words said again, which
            # confirm() drops as it does any decode's.
            heard = [_shifted(word, decode.offset) for word in words]
            heard_until = decode.offset + len(decode.samples) / SAMPLE_RATE
            confirmed = self.agreement.confirm(heard, heard_until, _spoken_in(decode))
        if self.seconds > TRIM_AFTER_S:
            cut = self._sentence_cut()
            if cut is not None:
                self._trim_at(cut)
        room = self.seconds - (WINDOW_S - MAX_STEP_S)
        if room > 0:
            confirmed += self._make_room(self.offset + room)
        self.confirmed += confirmed
        return Update(confirmed, list(self.agreement.tail))

    def finish(self) -> Update:
        """The audio has ended and the last decode heard all of it: its unconfirmed words confirmed."""
        confirmed = self.agreement.confirm_tail()
        self.confirmed += confirmed
        return Update(confirmed, [])

    def following(self) -> RollingBuffer:
        """A new buffer for the audio after this one's end, on the same clock."""
        return RollingBuffer(offset=self.stream_seconds, max_waiting_s=self.max_waiting_s)

    # ---- trimming

    def _sentence_cut(self) -> float | None:
        """Where the last confirmed sentence in the buffer ends (a segment's end: a sentence mark, or a
        pause of SEGMENT_PAUSE_S before the next word), never past the next word's start."""
        words = [*self.agreement.in_buffer, *self.agreement.tail[:1]]
        confirmed = len(self.agreement.in_buffer)
        ends = [
            i
            for i in range(confirmed)
            if words[i].word.rstrip()[-1:] in SENTENCE_END_MARKS
            or (i + 1 < len(words) and words[i + 1].start - words[i].end >= SEGMENT_PAUSE_S)
        ]
        if not ends:
            return None
        last = ends[-1]
        cut = words[last].end
        if last + 1 < len(words):
            cut = min(cut, words[last + 1].start)
        return cut if cut > self.offset else None

    def _make_room(self, at_least: float) -> list[Word]:
        """The buffer cut at the first word end at or after ``at_least`` (else there), so that the next
        step fits in the window. The unconfirmed words before the cut have been in the buffer for
        nearly a window, decoded every step, without two decodes agreeing from the tail's start on (one
        word that flips, "The" and "A", holds up all behind it): they are confirmed as the latest
        decode heard them, rather than lost with their audio."""
        words = [*self.agreement.in_buffer, *self.agreement.tail]
        ends = [word.end for word in words if word.end >= at_least]
        cut = min(ends) if ends else at_least
        confirmed = self.agreement.confirm_before(cut)
        self._trim_at(cut)
        return confirmed

    def _trim_at(self, seconds: float) -> None:
        cut = min(max(int(round((seconds - self.offset) * SAMPLE_RATE)), 0), len(self.audio))
        self.audio = self.audio[cut:]
        self.offset += cut / SAMPLE_RATE
        self.agreement.forget_before(self.offset)

    def _take_in(self, num_samples: int) -> None:
        self.audio = np.concatenate([self.audio, self.arrived.take(num_samples)])

    def _prefix(self) -> tuple[Word, ...]:
        """The confirmed words in the buffer but the last PREFIX_REREAD_WORDS, as a decode's prefix;
        none if one of them has no tokens."""
        in_buffer = self.agreement.in_buffer
        words = tuple(in_buffer[: max(len(in_buffer) - PREFIX_REREAD_WORDS, 0)])
        return words if all(word.tokens for word in words) else ()

    def _prompt(self) -> str | None:
        """The confirmed text before the buffer, its last PROMPT_CHARS characters."""
        before = [word.word for word in self.confirmed if word.end <= self.offset]
        text = "".join(before).strip()[-PROMPT_CHARS:]
        return text or None


class Arrived:
    """Audio that has come and no decode has taken in yet: the chunks as they came, first in first out.
    PCM16 stays PCM16 until taken (half the memory of float32, for a client far ahead of real time),
    and taking the first seconds costs what they hold, not all that waits."""

    def __init__(self) -> None:
        self.chunks: deque[np.ndarray] = deque()
        self.samples = 0

    def __len__(self) -> int:
        return self.samples

    def put(self, samples: np.ndarray) -> None:
        if len(samples):
            self.chunks.append(samples if samples.dtype == np.int16 else np.asarray(samples, np.float32))
            self.samples += len(samples)

    def take(self, num_samples: int) -> np.ndarray:
        """The first ``num_samples`` (or all there are), as float32."""
        taken = []
        while num_samples > 0 and self.chunks:
            chunk = self.chunks.popleft()
            if len(chunk) > num_samples:
                self.chunks.appendleft(chunk[num_samples:])
                chunk = chunk[:num_samples]
            taken.append(pcm16_to_float(chunk) if chunk.dtype == np.int16 else chunk)
            num_samples -= len(chunk)
            self.samples -= len(chunk)
        return np.concatenate(taken) if taken else np.zeros(0, dtype=np.float32)


def _spoken_in(decode: Decode) -> Callable[[Word], bool]:
    """Whether ``decode``'s audio holds speech over half a word or more (stream times); the speech mask is
    computed once, on the first question (most decodes ask none)."""
    speech = functools.cache(lambda: speech_frames(decode.samples))

    def spoken(word: Word) -> bool:
        share = speech_share(speech(), word.start - decode.offset, word.end - decode.offset)
        return share >= UNANSWERED_MIN_SPEECH_SHARE

    return spoken


def _shifted(word: Word, seconds: float) -> Word:
    return replace(word, start=round_time(word.start + seconds), end=round_time(word.end + seconds))
