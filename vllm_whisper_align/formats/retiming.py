"""Re-timing a subtitle file to its audio (subtitles that drift): new times, the same cues.

The cues' texts, without formatting tags, are joined and force-aligned to the audio as one text
(``WhisperAligner.align`` / ``AlignmentService.align``, any length). Every aligned word is handed
back to the cue it came from, and a cue runs from its first aligned word's start to its last aligned
word's end. Numbers, texts and settings stay exactly as written.

A cue with no aligned word keeps its place among its neighbours instead (``aligned: false`` in the
JSON bodies). It has none when its text is not in the audio (longform flags such text), or when it
has no words to align at all: no letter or digit once its tags are gone ("♪", "<i></i>"). Such a cue
is placed by mapping its old times linearly from the old gap between the nearest re-timed cues
before and after it onto their new gap; before the first or after the last re-timed cue it moves by
the same amount as that cue. Times never go below zero nor past the audio's end, and never overlap:
each cue starts at or after the previous one's end.
"""

from __future__ import annotations

import bisect
import html
import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm_whisper_align.align.results import Transcript
from vllm_whisper_align.formats.cues import Cue
from vllm_whisper_align.formats.responses import ALIGNMENT_FORMATS
from vllm_whisper_align.formats.subtitles import SUBTITLE_FORMATS, SubtitleFile, write_subtitles

# Formatting that is not spoken: HTML-like tags (SRT's <i>, VTT's <v Name>, <c.yellow>, <00:01.000>)
# and the {\an8}-style override tags SRT files borrow from ASS.
FORMATTING_TAG = re.compile(r"<[^>]*>|\{\\[^}]*\}")
# Times given to cues placed between neighbours are rounded to the millisecond, as SRT writes them.
TIME_DECIMALS = 3


@dataclass(frozen=True)
class Retimed:
    subtitles: SubtitleFile  # the input's cues with their new times
    aligned: tuple[bool, ...]  # per cue: False when none of its words was aligned (placed between neighbours)


# ---------------------------------------------------------------------------- the text to align


def spoken_text(cue_text: str) -> str:
    """What is said in a cue: tags and line breaks gone, entities decoded; "" without a letter or digit."""
    text = " ".join(html.unescape(FORMATTING_TAG.sub("", cue_text)).split())
    return text if any(ch.isalnum() for ch in text) else ""


def alignment_text(cues: Sequence[Cue]) -> str:
    """The text to force-align: every cue's spoken text, in order."""
    text = " ".join(filter(None, (spoken_text(cue.text) for cue in cues)))
    if not text:
        raise ValueError("no cue of the subtitle file has words to align (only tags or symbols)")
    return text


# ---------------------------------------------------------------------------- re-timing


def retime(subtitles: SubtitleFile, result: Transcript) -> Retimed:
    """``subtitles`` with the times of ``result`` (the forced alignment of their ``alignment_text``)."""
    cues = subtitles.cues
    words = result.words or []
    owners = word_owners([spoken_text(cue.text) for cue in cues], [word.word for word in words])
    spans: list[tuple[float, float] | None] = [None] * len(cues)
    for word, owner in zip(words, owners, strict=True):
        if not word.aligned:
            continue
        span = spans[owner]
        spans[owner] = (word.start, word.end) if span is None else (span[0], word.end)
    times = placed_times(cues, spans, result.duration)
    return Retimed(subtitles.with_times(times), tuple(span is not None for span in spans))


def word_owners(cue_texts: Sequence[str], words: Sequence[str]) -> list[int]:
    """The cue each aligned word belongs to, given the cues' spoken texts.

    The aligned words, concatenated, spell the text that was aligned (the cues' texts joined by
    spaces), so walking both by characters finds each word's place. A word belongs to the cue of
    its first letter or digit: punctuation the alignment glued to it (an opening quote that ends a
    cue) may come from the cue before.
    """
    holders = [index for index, text in enumerate(cue_texts) if text]
    joined = " ".join(cue_texts[index] for index in holders)
    if not joined:
        return [0] * len(words)
    # Where each holder's text starts in `joined`.
    starts = list(itertools.accumulate((len(cue_texts[i]) + 1 for i in holders[:-1]), initial=0))
    owners, cursor = [], 0
    for word in words:
        while cursor < len(joined) and joined[cursor].isspace():
            cursor += 1
        start = min(cursor, len(joined) - 1)
        cursor += len(word.strip())
        letters = (k for k in range(start, min(cursor, len(joined))) if joined[k].isalnum())
        owners.append(holders[bisect.bisect_right(starts, next(letters, start)) - 1])
    return owners


def placed_times(
    cues: Sequence[Cue], spans: Sequence[tuple[float, float] | None], duration: float | None
) -> list[tuple[float, float]]:
    """Each cue's span where it has one; the others placed between their neighbours (module doc)."""
    anchors = [i for i, span in enumerate(spans) if span is not None]
    if not anchors:
        return _in_order([(cue.start, cue.end) for cue in cues], duration)  # nothing to go by
    times = []
    for index, (cue, span) in enumerate(zip(cues, spans, strict=True)):
        if span is not None:
            times.append(span)
            continue
        before = max((a for a in anchors if a < index), default=None)
        after = min((a for a in anchors if a > index), default=None)
        move = _between(cues, spans, before, after)
        times.append((round(move(cue.start), TIME_DECIMALS), round(move(cue.end), TIME_DECIMALS)))
    return _in_order(times, duration)


def _between(cues, spans, before: int | None, after: int | None):
    """How an old time between re-timed cues ``before`` and ``after`` (None: no such cue) moves."""
    if after is None:
        return lambda t: t + spans[before][1] - cues[before].end
    if before is None:
        return lambda t: t + spans[after][0] - cues[after].start
    old_from, old_to = cues[before].end, cues[after].start
    new_from, new_to = spans[before][1], spans[after][0]
    if old_to <= old_from:  # no old gap to map from: the cue sits where the gap is
        return lambda t: new_from
    scale = (new_to - new_from) / (old_to - old_from)
    return lambda t: new_from + (min(max(t, old_from), old_to) - old_from) * scale


def _in_order(times: list[tuple[float, float]], duration: float | None) -> list[tuple[float, float]]:
    """Times inside the audio, each cue starting at or after the previous one's end."""
    limit = float("inf") if duration is None else duration
    ordered, previous_end = [], 0.0
    for start, end in times:
        start = min(max(start, previous_end), limit)
        end = min(max(end, start), limit)
        ordered.append((start, end))
        previous_end = end
    return ordered


# ---------------------------------------------------------------------------- output


def retimed_body(retimed: Retimed, result: Transcript, verbose: bool) -> dict[str, Any]:
    """json: the aligned text and the cues; verbose_json: the alignment's whole body and the cues."""
    cues = [
        {"index": cue.index, "start": cue.start, "end": cue.end, "text": cue.text, "aligned": aligned}
        for cue, aligned in zip(retimed.subtitles.cues, retimed.aligned, strict=True)
    ]
    return {**result.to_dict(), "cues": cues} if verbose else {"text": result.text, "cues": cues}


def render(retimed: Retimed, result: Transcript, fmt: str) -> str:
    """The re-timed file as srt or vtt, or its JSON body as json or verbose_json."""
    if fmt in SUBTITLE_FORMATS:
        return write_subtitles(retimed.subtitles, fmt)
    if fmt not in ALIGNMENT_FORMATS:
        raise ValueError(f"re-timed subtitles are written as {', '.join(ALIGNMENT_FORMATS)}; not {fmt!r}")
    return json.dumps(retimed_body(retimed, result, fmt == "verbose_json"), ensure_ascii=False)
