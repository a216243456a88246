"""From per-token times to words: grouping, punctuation merging and duration rules.

Mirrors the text half of openai-whisper (``Tokenizer.split_to_word_tokens`` and the tails of
``find_alignment`` / ``add_word_timestamps`` in ``whisper/timing.py``) without its tokenizer:
every function takes ``decode``, a callable turning token ids into text *with* special tokens
spelled out (like ``Tokenizer.decode_with_timestamps``), and the ``eot`` id, above which (and at
which) ids are special.
"""

from __future__ import annotations

import string
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Decode = Callable[[list[int]], str]

PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"

# languages written without spaces: words are cut wherever the text decodes to whole characters
UNSPACED_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}


@dataclass
class Word:
    """A timed word (faster-whisper's shape; openai-whisper's ``Word`` in its word rules)."""

    start: float
    end: float
    word: str
    probability: float
    tokens: list[int] = field(default_factory=list)
    # Forced alignment: False for given text that is not in the audio (longform), placed at a zero-length
    # span where the aligned words around it leave off.
    aligned: bool = True
    # How likely its start is within 100 ms of where it is spoken (align.confidence); None where no
    # alignment was read (a window too short to align).
    confidence: float | None = None

    def to_dict(self, with_aligned: bool = False) -> dict[str, Any]:
        """OpenAI's word object (and ``aligned``, for a forced alignment's words; ``confidence`` where
        there is one)."""
        body: dict[str, Any] = {
            "word": self.word,
            "start": self.start,
            "end": self.end,
            "probability": self.probability,
        }
        if self.confidence is not None:
            body["confidence"] = self.confidence
        if with_aligned:
            body["aligned"] = self.aligned
        return body


def tokens_of(words: Sequence[Word]) -> list[int]:
    """The words' tokens, in order."""
    return [token for word in words for token in word.tokens]


def round_time(seconds: float) -> float:
    # The reference rounds numpy float64 seconds, whose round() scales by 100 and rounds half to
    # even there; Python's float round() is correctly rounded and differs on rare values.
    return float(np.round(np.float64(seconds), 2))


# ---------------------------------------------------------------------------- tokens -> words


def split_tokens_on_unicode(tokens: Sequence[int], decode: Decode) -> tuple[list[str], list[list[int]]]:
    """Cut wherever the tokens so far decode to whole characters.

    ``Tokenizer.split_tokens_on_unicode``.
    """
    decoded_full = decode(list(tokens))
    replacement_char = "\ufffd"

    words = []
    word_tokens = []
    current_tokens = []
    unicode_offset = 0

    for token in tokens:
        current_tokens.append(token)
        decoded = decode(current_tokens)

        # a U+FFFD that is also in the full text is a real one, not a character cut in half
        if (
            replacement_char not in decoded
            or decoded_full[unicode_offset + decoded.index(replacement_char)] == replacement_char
        ):
            words.append(decoded)
            word_tokens.append(current_tokens)
            current_tokens = []
            unicode_offset += len(decoded)

    return words, word_tokens


def split_tokens_on_spaces(
    tokens: Sequence[int], decode: Decode, eot: int, at_punctuation: bool = True
) -> tuple[list[str], list[list[int]]]:
    """Words start at a space, a punctuation mark or a special token.

    ``Tokenizer.split_tokens_on_spaces``: the unicode pieces, each glued to the previous word
    unless it starts one. Without ``at_punctuation`` a punctuation mark does not start a word: text
    forced one character per token, where the apostrophe of "it's" is a token of its own and would
    make "'s" a word of its own (a token of text does not hold a mark alone inside a word).
    """
    subwords, subword_tokens_list = split_tokens_on_unicode(tokens, decode)
    words: list[str] = []
    word_tokens: list[list[int]] = []

    for subword, subword_tokens in zip(subwords, subword_tokens_list, strict=True):
        special = subword_tokens[0] >= eot
        with_space = subword.startswith(" ")
        punctuation = at_punctuation and subword.strip() in string.punctuation
        if special or with_space or punctuation or len(words) == 0:
            words.append(subword)
            word_tokens.append(subword_tokens)
        else:
            words[-1] = words[-1] + subword
            word_tokens[-1].extend(subword_tokens)

    return words, word_tokens


def split_to_word_tokens(
    tokens: Sequence[int], decode: Decode, eot: int, language: str | None, at_punctuation: bool = True
) -> tuple[list[str], list[list[int]]]:
    """Words and the tokens of each, as ``Tokenizer.split_to_word_tokens`` for ``language``
    (``at_punctuation``: :func:`split_tokens_on_spaces`)."""
    if language in UNSPACED_LANGUAGES:
        return split_tokens_on_unicode(tokens, decode)
    return split_tokens_on_spaces(tokens, decode, eot, at_punctuation)


def word_timings(
    text_tokens: Sequence[int],
    jump_times: np.ndarray,
    token_probs: Sequence[float] | np.ndarray,
    decode: Decode,
    eot: int,
    language: str | None,
    at_punctuation: bool = True,
) -> list[Word]:
    """Words of ``text_tokens`` with the start/end of each and its mean token probability.

    The tail of the reference ``find_alignment`` (from ``split_to_word_tokens(text_tokens +
    [eot])`` on). ``jump_times``: ``timing.jump_times`` of the reference's
    ``matrix[len(sot_sequence):-1]``, i.e. one time per decoder position that *predicts* a text
    token or eot (the no-timestamps position predicts the first text token), so entry k belongs
    to token k of ``text_tokens + [eot]``. A word spans from its first token's time to the next
    word's. ``token_probs``: probability of each text token. Times are relative to the aligned
    audio; an empty list when there is no text word. ``at_punctuation``: as
    :func:`split_tokens_on_spaces` (False for text forced one character per token).
    """
    words, word_tokens = split_to_word_tokens(
        list(text_tokens) + [eot], decode, eot, language, at_punctuation
    )
    if len(word_tokens) <= 1:  # eot alone
        return []
    word_boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))

    jump_times = np.asarray(jump_times)
    start_times = jump_times[word_boundaries[:-1]]
    end_times = jump_times[word_boundaries[1:]]
    token_probs = [float(p) for p in token_probs]  # the reference averages Python floats
    word_probabilities = [
        np.mean(token_probs[i:j]) for i, j in zip(word_boundaries[:-1], word_boundaries[1:], strict=False)
    ]

    # zip stops at the shortest: the eot group has a word but no end time, so it is left out
    return [
        Word(float(start), float(end), word, float(probability), tokens)
        for word, tokens, start, end, probability in zip(
            words, word_tokens, start_times, end_times, word_probabilities, strict=False
        )
    ]


def normalise(word: str) -> str:
    """A word as two readings of it compare: case-folded, without punctuation or spaces ("Mat." and
    " mat" are one word)."""
    folded = unicodedata.normalize("NFKC", word).casefold()
    return "".join(ch for ch in folded if unicodedata.category(ch)[0] not in "PZ")


# ---------------------------------------------------------------------------- word rules


def merge_punctuations(
    alignment: list[Word], prepended: str = PREPEND_PUNCTUATIONS, appended: str = APPEND_PUNCTUATIONS
) -> None:
    """Glue opening punctuation to the next word and closing punctuation to the previous one.

    In place, as the reference ``merge_punctuations`` (same loops, so chains like ``" (“`` or
    ``".”`` merge the same way; the merged word keeps its own times). The words emptied by a
    merge are then removed, which is what ``add_word_timestamps`` does when it skips them.
    """
    # merge prepended punctuations
    i = len(alignment) - 2
    j = len(alignment) - 1
    while i >= 0:
        previous = alignment[i]
        following = alignment[j]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word = ""
            previous.tokens = []
        else:
            j = i
        i -= 1

    # merge appended punctuations
    i = 0
    j = 1
    while j < len(alignment):
        previous = alignment[i]
        following = alignment[j]
        if not previous.word.endswith(" ") and following.word in appended:
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word = ""
            following.tokens = []
        else:
            i = j
        j += 1

    alignment[:] = [timing for timing in alignment if timing.word]


def adjust_word_durations(alignment: list[Word]) -> tuple[float, float]:
    """Cap words at sentence boundaries; returns ``(median_duration, max_duration)``.

    The first block of the reference ``add_word_timestamps``, on the whole alignment before
    punctuation merging: the median of the non-zero word durations, capped at 0.7 s, and twice
    that as the longest allowed word. A too-long word that is a sentence-end mark is cut at its
    end; a too-long word right after one is cut at its start. In place.
    """
    word_durations = np.array([t.end - t.start for t in alignment])
    word_durations = word_durations[word_durations.nonzero()]
    median_duration = np.median(word_durations) if len(word_durations) > 0 else 0.0
    median_duration = min(0.7, float(median_duration))
    max_duration = median_duration * 2

    # the reference's "hack" until a VAD-based segmentation replaces it
    if len(word_durations) > 0:
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > max_duration:
                if alignment[i].word in SENTENCE_END_MARKS:
                    alignment[i].end = alignment[i].start + max_duration
                elif alignment[i - 1].word in SENTENCE_END_MARKS:
                    alignment[i].start = alignment[i].end - max_duration

    return median_duration, max_duration


def split_into_segments(
    alignment: list[Word], text_token_counts: Sequence[int], time_offset: float
) -> list[list[Word]]:
    """Hand the words back to the segments whose text tokens they came from.

    The reference ``add_word_timestamps`` loop: each segment takes words until it has its count
    of text tokens (a word merged across a boundary goes to the earlier segment), empty words
    are skipped, and times become absolute (``time_offset`` + time, rounded to centiseconds).
    New ``Word`` objects; ``alignment`` is left as it is.
    """
    segments = []
    word_index = 0
    for token_count in text_token_counts:
        saved_tokens = 0
        words = []
        while word_index < len(alignment) and saved_tokens < token_count:
            timing = alignment[word_index]
            if timing.word:
                words.append(
                    Word(
                        word=timing.word,
                        tokens=list(timing.tokens),
                        start=round_time(time_offset + timing.start),
                        end=round_time(time_offset + timing.end),
                        probability=timing.probability,
                    )
                )
            saved_tokens += len(timing.tokens)
            word_index += 1
        segments.append(words)
    return segments


def apply_segment_rules(
    words: list[Word],
    segment_start: float,
    segment_end: float,
    median_duration: float,
    max_duration: float,
    last_speech_timestamp: float,
) -> tuple[float, float, float]:
    """Reconcile one segment's words with its start/end; returns the new
    ``(segment_start, segment_end, last_speech_timestamp)``.

    The per-segment block of the reference ``add_word_timestamps``, in its order, on absolute
    times: (1) the first word after a pause longer than 4 median durations is cut to
    ``max_duration`` (sharing a boundary with a too-long second word); (2) a first word starting
    over 0.5 s before the segment starts at the segment start, else the segment starts at the
    word; (3) likewise at the end. Words in place; nothing changes for an empty segment.
    """
    if len(words) == 0:
        return segment_start, segment_end, last_speech_timestamp

    first, last = words[0], words[-1]
    if first.end - last_speech_timestamp > median_duration * 4 and (
        first.end - first.start > max_duration
        or (len(words) > 1 and words[1].end - first.start > max_duration * 2)
    ):
        if len(words) > 1 and words[1].end - words[1].start > max_duration:
            boundary = max(words[1].end / 2, words[1].end - max_duration)
            first.end = words[1].start = boundary
        first.start = max(0.0, first.end - max_duration)

    # prefer the segment-level start timestamp if the first word is too long
    if segment_start < first.end and segment_start - 0.5 > first.start:
        first.start = max(0.0, min(first.end - median_duration, segment_start))
    else:
        segment_start = first.start

    # prefer the segment-level end timestamp if the last word is too long
    if segment_end > last.start and segment_end + 0.5 < last.end:
        last.end = max(last.start + median_duration, segment_end)
    else:
        segment_end = last.end

    return segment_start, segment_end, segment_end


def add_word_timestamps(
    segments: list[dict],
    alignment: list[Word],
    *,
    eot: int,
    time_offset: float,
    last_speech_timestamp: float,
    prepend_punctuations: str = PREPEND_PUNCTUATIONS,
    append_punctuations: str = APPEND_PUNCTUATIONS,
) -> float:
    """The reference ``add_word_timestamps`` after its ``find_alignment`` call.

    ``segments``: dicts with ``"tokens"`` (ids, timestamps and eot included), ``"start"`` and
    ``"end"`` (absolute seconds); ``alignment``: ``word_timings`` of all their text tokens (ids
    below ``eot``), in order; ``time_offset``: seconds of the window start (the reference's
    ``seek * HOP_LENGTH / SAMPLE_RATE``). Sets each segment's ``"words"`` (``Word`` list),
    updates its ``"start"``/``"end"`` and returns the new ``last_speech_timestamp``.
    Consumes ``alignment``.
    """
    if len(segments) == 0:
        return last_speech_timestamp

    median_duration, max_duration = adjust_word_durations(alignment)
    merge_punctuations(alignment, prepend_punctuations, append_punctuations)
    text_token_counts = [sum(1 for t in segment["tokens"] if t < eot) for segment in segments]
    words_per_segment = split_into_segments(alignment, text_token_counts, time_offset)

    for segment, words in zip(segments, words_per_segment, strict=True):
        segment["start"], segment["end"], last_speech_timestamp = apply_segment_rules(
            words, segment["start"], segment["end"], median_duration, max_duration, last_speech_timestamp
        )
        segment["words"] = words
    return last_speech_timestamp
