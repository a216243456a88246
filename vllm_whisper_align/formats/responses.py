"""Transcripts (``align.results.Transcript``) written in the OpenAI audio API's response formats:
json, verbose_json, text, srt and vtt, with openai-whisper's subtitle line controls.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from vllm_whisper_align.align.results import Segment, Transcript
from vllm_whisper_align.align.words import Word
from vllm_whisper_align.formats.cues import Cue, srt_timestamp, vtt_timestamp
from vllm_whisper_align.options import SubtitleOptions

# OpenAI's audio response formats, and the file extension of each.
EXTENSIONS = {"json": "json", "text": "txt", "srt": "srt", "verbose_json": "json", "vtt": "vtt"}
RESPONSE_FORMATS = tuple(EXTENSIONS)
# Forced alignment always has words: plain text would drop them.
ALIGNMENT_FORMATS = ("json", "verbose_json", "srt", "vtt")
GRANULARITIES = ("segment", "word")

# A word starting this long after the previous one starts a new cue when lines are re-flowed.
LONG_PAUSE_S = 3.0
# Word and segment times are rounded to centiseconds independently.
TIME_TOLERANCE = 0.011
# Subtitle lines built from words: common readability limits for one caption line.
MAX_CUE_CHARS = 42
MAX_CUE_SECONDS = 7.0


def to_text(result: Transcript) -> str:
    return result.text.strip() + "\n"


def to_json(result: Transcript) -> str:
    return _dumps({"text": result.text.strip()})


def to_verbose_json(result: Transcript) -> str:
    return _dumps(result.to_dict())


def to_srt(result: Transcript, granularity: str = "segment", options: SubtitleOptions | None = None) -> str:
    cues = result_cues(result, granularity, options)
    blocks = [
        f"{number}\n{srt_timestamp(cue.start)} --> {srt_timestamp(cue.end)}\n{cue.text}\n"
        for number, cue in enumerate(cues, start=1)
    ]
    return "\n".join(blocks)


def to_vtt(result: Transcript, granularity: str = "segment", options: SubtitleOptions | None = None) -> str:
    cues = result_cues(result, granularity, options)
    blocks = [f"{vtt_timestamp(cue.start)} --> {vtt_timestamp(cue.end)}\n{cue.text}\n" for cue in cues]
    return "\n".join(["WEBVTT\n", *blocks])


def write_result(
    result: Transcript, fmt: str, granularity: str = "segment", options: SubtitleOptions | None = None
) -> str:
    """Render `result` as `fmt` (a key of EXTENSIONS); granularity and options apply to srt/vtt."""
    if fmt == "srt":
        return to_srt(result, granularity, options)
    if fmt == "vtt":
        return to_vtt(result, granularity, options)
    writers = {"json": to_json, "verbose_json": to_verbose_json, "text": to_text}
    if fmt not in writers:
        raise ValueError(f"unknown response format {fmt!r}; expected one of {sorted(EXTENSIONS)}")
    return writers[fmt](result)


def result_cues(
    result: Transcript, granularity: str = "segment", options: SubtitleOptions | None = None
) -> list[Cue]:
    """Subtitle cues for ``result``, using whatever timing it has.

    With line controls or highlighting (``options``) and words, the cues are laid out as
    openai-whisper's subtitle writers lay them out. Otherwise word granularity wants words (a cue
    per word) and falls back to segments; segment granularity wants segments and falls back to
    lines built from words; with neither, the whole text becomes one cue over the audio's duration.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown timestamp granularity {granularity!r}; expected one of {GRANULARITIES}")
    words = result.words or []
    segments = result.segments or []

    if options is not None and not options.is_default and words:
        laid_out = laid_out_cues(segments_with_words(segments, words), options)
        return [cue for cue in (_clean_cue(c, keep_line_breaks=True) for c in laid_out) if cue.text]
    if granularity == "word" and words:
        cues = [Cue(word.start, word.end, word.word) for word in words]
    elif segments:
        cues = [Cue(segment.start, segment.end, segment.text) for segment in segments]
    elif words:
        cues = words_to_cues(words)
    else:
        cues = [Cue(0.0, result.duration or 0.0, result.text)]
    return [cue for cue in map(_clean_cue, cues) if cue.text]


def words_to_cues(
    words: list[Word], max_chars: int = MAX_CUE_CHARS, max_seconds: float = MAX_CUE_SECONDS
) -> list[Cue]:
    """Group timed words into subtitle lines of at most `max_chars` and `max_seconds`.

    A word that alone breaks a limit gets a line of its own.
    """
    separator = _word_separator(words)
    cues: list[Cue] = []
    line: list[Word] = []
    for word in words:
        candidate = line + [word]
        too_long = len(_join_words(candidate, separator)) > max_chars
        too_slow = word.end - candidate[0].start > max_seconds
        if line and (too_long or too_slow):
            cues.append(_line_cue(line, separator))
            candidate = [word]
        line = candidate
    if line:
        cues.append(_line_cue(line, separator))
    return cues


def _word_separator(words: list[Word]) -> str:
    # Whisper's words keep their leading space (" fox"); words without one ("fox", as OpenAI's API
    # writes them) need one added between them.
    return "" if any(word.word[:1].isspace() for word in words) else " "


def _join_words(words: list[Word], separator: str) -> str:
    return separator.join(word.word for word in words).strip()


def _line_cue(words: list[Word], separator: str) -> Cue:
    return Cue(words[0].start, words[-1].end, _join_words(words, separator))


def _clean_cue(cue: Cue, keep_line_breaks: bool = False) -> Cue:
    # "-->" inside text would end the cue's timing line early in players, and a blank line the cue;
    # line breaks stay only where the layout made them.
    lines = cue.text.replace("-->", "->").split("\n") if keep_line_breaks else [cue.text.replace("-->", "->")]
    text = "\n".join(filter(None, (" ".join(line.split()) for line in lines)))
    start = max(0.0, float(cue.start))
    return Cue(start, max(start, float(cue.end)), text)


# ---------------------------------------------------------------------------- line controls


def segments_with_words(segments: list[Segment], words: list[Word]) -> list[list[Word]]:
    """The top-level words handed back to the segments they were cut from (segments span their
    words' times), each with a leading space as openai-whisper's words have; words outside every
    segment get a group of their own."""
    spaced = [w if w.word[:1].isspace() else replace(w, word=" " + w.word) for w in words]
    groups: list[list[Word]] = [[] for _ in segments]
    loose: list[Word] = []
    index = 0
    for word in spaced:
        while index < len(segments) and word.start > segments[index].end + TIME_TOLERANCE:
            index += 1
        inside = index < len(segments) and word.start >= segments[index].start - TIME_TOLERANCE
        (groups[index] if inside else loose).append(word)
    return [group for group in groups if group] + ([loose] if loose else [])


def laid_out_cues(segments: list[list[Word]], options: SubtitleOptions) -> list[Cue]:
    """openai-whisper's ``SubtitlesWriter.iterate_result`` on segments of words."""
    cues = []
    for subtitle in _subtitles(segments, options):
        text = "".join(word.word for word in subtitle)
        if not options.highlight_words:
            cues.append(Cue(subtitle[0].start, subtitle[-1].end, text))
            continue
        last = subtitle[0].start
        for i, word in enumerate(subtitle):
            if _ms(last) != _ms(word.start):  # the reference compares formatted timestamps
                cues.append(Cue(last, word.start, text))
            underlined = [
                re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", w.word) if j == i else w.word
                for j, w in enumerate(subtitle)
            ]
            cues.append(Cue(word.start, word.end, "".join(underlined)))
            last = word.end
    return cues


def _subtitles(segments: list[list[Word]], options: SubtitleOptions):
    """Groups of words, one a cue, with "\n" before a word that starts a new line (the reference's
    ``iterate_subtitles``: lines fill up to ``max_line_width``; cues break at segment ends unless both
    width and count are set, and then at ``max_line_count`` lines or a pause over 3 s)."""
    preserve_segments = options.max_line_count is None or options.max_line_width is None
    max_line_width = options.max_line_width or 1000
    max_words_per_line = options.max_words_per_line or 1000
    line_len, line_count = 0, 1
    subtitle: list[Word] = []
    last = segments[0][0].start if segments and segments[0] else 0.0
    for words in segments:
        for chunk_index in range(0, len(words), max_words_per_line):
            for i, word in enumerate(words[chunk_index : chunk_index + max_words_per_line]):
                long_pause = not preserve_segments and word.start - last > LONG_PAUSE_S
                has_room = line_len + len(word.word) <= max_line_width
                seg_break = i == 0 and len(subtitle) > 0 and preserve_segments
                if line_len > 0 and has_room and not long_pause and not seg_break:
                    line_len += len(word.word)
                else:
                    word = replace(word, word=word.word.strip())
                    if (
                        subtitle
                        and options.max_line_count is not None
                        and (long_pause or line_count >= options.max_line_count)
                    ) or seg_break:
                        yield subtitle
                        subtitle, line_count = [], 1
                    elif line_len > 0:
                        line_count += 1
                        word = replace(word, word="\n" + word.word)
                    line_len = len(word.word.strip())
                subtitle.append(word)
                last = word.start
    if subtitle:
        yield subtitle


def _ms(seconds: float) -> int:
    return int(round(float(seconds) * 1000.0))


def _dumps(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False, default=_number)


def _number(value: Any) -> Any:
    """A NumPy number (times computed in float32 or float64) as Python's."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
