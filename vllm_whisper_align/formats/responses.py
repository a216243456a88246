"""Transcription results rendered in the OpenAI audio API's response formats.

A result is a dict (or dataclass) shaped like the OpenAI verbose_json body:
{"text", "language", "duration", "segments": [...] or [], "words": [...] or None}.
"""

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

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


@dataclass
class Cue:
    start: float
    end: float
    text: str


@dataclass(frozen=True)
class SubtitleOptions:
    """openai-whisper's subtitle line controls (its CLI's ``--max_line_width`` and friends).

    ``max_line_width`` and ``max_line_count`` together re-flow words across segments into cues of at
    most that many lines of that many characters; alone, each only wraps lines within a segment.
    ``highlight_words`` adds a cue per word with that word in ``<u>…</u>`` (karaoke style).
    """

    max_line_width: int | None = None
    max_line_count: int | None = None
    max_words_per_line: int | None = None
    highlight_words: bool = False

    def __post_init__(self) -> None:
        for name in ("max_line_width", "max_line_count", "max_words_per_line"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive whole number; got {value!r}")

    @property
    def is_default(self) -> bool:
        return self == SubtitleOptions()


def format_timestamp(seconds: float, always_include_hours: bool = False, decimal_marker: str = ".") -> str:
    """`[HH:]MM:SS.mmm`, rounded to the millisecond, as openai-whisper's utils."""
    if seconds < 0:
        raise ValueError(f"non-negative timestamp expected, got {seconds}")
    milliseconds = int(round(float(seconds) * 1000.0))
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    whole_seconds, milliseconds = divmod(milliseconds, 1_000)
    hours_marker = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_marker}{minutes:02d}:{whole_seconds:02d}{decimal_marker}{milliseconds:03d}"


def srt_timestamp(seconds: float) -> str:
    return format_timestamp(seconds, always_include_hours=True, decimal_marker=",")


def vtt_timestamp(seconds: float) -> str:
    return format_timestamp(seconds, always_include_hours=True, decimal_marker=".")


def to_text(result: Any) -> str:
    return _plain(result)["text"].strip() + "\n"


def to_json(result: Any) -> str:
    return _dumps({"text": _plain(result)["text"].strip()})


def to_verbose_json(result: Any) -> str:
    result = _plain(result)
    body = {
        "task": result.get("task", "transcribe"),
        "language": result.get("language"),
        "duration": result.get("duration"),
        "text": result["text"].strip(),
    }
    # Like the API, each timestamp list appears only when it was requested (not None);
    # extra fields the pipeline adds (e.g. token timings) pass through the same way.
    for key, value in result.items():
        if key not in body and value is not None:
            body[key] = value
    return _dumps(body)


def to_srt(result: Any, granularity: str = "segment", options: SubtitleOptions | None = None) -> str:
    cues = result_cues(result, granularity, options)
    blocks = [
        f"{number}\n{srt_timestamp(cue.start)} --> {srt_timestamp(cue.end)}\n{cue.text}\n"
        for number, cue in enumerate(cues, start=1)
    ]
    return "\n".join(blocks)


def to_vtt(result: Any, granularity: str = "segment", options: SubtitleOptions | None = None) -> str:
    cues = result_cues(result, granularity, options)
    blocks = [f"{vtt_timestamp(cue.start)} --> {vtt_timestamp(cue.end)}\n{cue.text}\n" for cue in cues]
    return "\n".join(["WEBVTT\n", *blocks])


def write_result(
    result: Any, fmt: str, granularity: str = "segment", options: SubtitleOptions | None = None
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
    result: Any, granularity: str = "segment", options: SubtitleOptions | None = None
) -> list[Cue]:
    """Subtitle cues for `result`, using whatever timing it has.

    With line controls or highlighting (``options``) and words, the cues are laid out as
    openai-whisper's subtitle writers lay them out. Otherwise word granularity wants words (a cue
    per word) and falls back to segments; segment granularity wants segments and falls back to
    lines built from words; with neither, the whole text becomes one cue over the audio's duration.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown timestamp granularity {granularity!r}; expected one of {GRANULARITIES}")
    result = _plain(result)
    words = result.get("words") or []
    segments = result.get("segments") or []

    if options is not None and not options.is_default and words:
        laid_out = laid_out_cues(segments_with_words(segments, words), options)
        return [cue for cue in (_clean_cue(c, keep_line_breaks=True) for c in laid_out) if cue.text]
    if granularity == "word" and words:
        cues = [Cue(word["start"], word["end"], word["word"]) for word in words]
    elif segments:
        cues = [Cue(segment["start"], segment["end"], segment["text"]) for segment in segments]
    elif words:
        cues = words_to_cues(words)
    else:
        cues = [Cue(0.0, result.get("duration") or 0.0, result.get("text", ""))]
    return [cue for cue in map(_clean_cue, cues) if cue.text]


def words_to_cues(
    words: list[dict], max_chars: int = MAX_CUE_CHARS, max_seconds: float = MAX_CUE_SECONDS
) -> list[Cue]:
    """Group timed words into subtitle lines of at most `max_chars` and `max_seconds`.

    A word that alone breaks a limit gets a line of its own.
    """
    separator = _word_separator(words)
    cues: list[Cue] = []
    line: list[dict] = []
    for word in words:
        candidate = line + [word]
        too_long = len(_join_words(candidate, separator)) > max_chars
        too_slow = word["end"] - candidate[0]["start"] > max_seconds
        if line and (too_long or too_slow):
            cues.append(_line_cue(line, separator))
            candidate = [word]
        line = candidate
    if line:
        cues.append(_line_cue(line, separator))
    return cues


def _word_separator(words: list[dict]) -> str:
    # openai-whisper's words keep their leading space (" fox"), OpenAI API words do not
    # ("fox"); only the latter need one added between them.
    return "" if any(word["word"][:1].isspace() for word in words) else " "


def _join_words(words: list[dict], separator: str) -> str:
    return separator.join(word["word"] for word in words).strip()


def _line_cue(words: list[dict], separator: str) -> Cue:
    return Cue(words[0]["start"], words[-1]["end"], _join_words(words, separator))


def _clean_cue(cue: Cue, keep_line_breaks: bool = False) -> Cue:
    # "-->" inside text would end the cue's timing line early in players, and a blank line the cue;
    # line breaks stay only where the layout made them.
    lines = cue.text.replace("-->", "->").split("\n") if keep_line_breaks else [cue.text.replace("-->", "->")]
    text = "\n".join(filter(None, (" ".join(line.split()) for line in lines)))
    start = max(0.0, float(cue.start))
    return Cue(start, max(start, float(cue.end)), text)


# ---------------------------------------------------------------------------- line controls


def segments_with_words(segments: list[dict], words: list[dict]) -> list[list[dict]]:
    """The top-level words handed back to the segments they were cut from (segments span their
    words' times), each with a leading space as openai-whisper's words have; words outside every
    segment get a group of their own."""
    spaced = [dict(w, word=w["word"] if w["word"][:1].isspace() else " " + w["word"]) for w in words]
    groups: list[list[dict]] = [[] for _ in segments]
    loose: list[dict] = []
    index = 0
    for word in spaced:
        while index < len(segments) and word["start"] > segments[index]["end"] + TIME_TOLERANCE:
            index += 1
        inside = index < len(segments) and word["start"] >= segments[index]["start"] - TIME_TOLERANCE
        (groups[index] if inside else loose).append(word)
    return [group for group in groups if group] + ([loose] if loose else [])


def laid_out_cues(segments: list[list[dict]], options: SubtitleOptions) -> list[Cue]:
    """openai-whisper's ``SubtitlesWriter.iterate_result`` on segments of words."""
    cues = []
    for subtitle in _subtitles(segments, options):
        text = "".join(word["word"] for word in subtitle)
        if not options.highlight_words:
            cues.append(Cue(subtitle[0]["start"], subtitle[-1]["end"], text))
            continue
        last = subtitle[0]["start"]
        for i, word in enumerate(subtitle):
            if _ms(last) != _ms(word["start"]):  # the reference compares formatted timestamps
                cues.append(Cue(last, word["start"], text))
            underlined = [
                re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", w["word"]) if j == i else w["word"]
                for j, w in enumerate(subtitle)
            ]
            cues.append(Cue(word["start"], word["end"], "".join(underlined)))
            last = word["end"]
    return cues


def _subtitles(segments: list[list[dict]], options: SubtitleOptions):
    """Groups of words, one a cue, with "\n" before a word that starts a new line (the reference's
    ``iterate_subtitles``: lines fill up to ``max_line_width``; cues break at segment ends unless both
    width and count are set, and then at ``max_line_count`` lines or a pause over 3 s)."""
    preserve_segments = options.max_line_count is None or options.max_line_width is None
    max_line_width = options.max_line_width or 1000
    max_words_per_line = options.max_words_per_line or 1000
    line_len, line_count, subtitle = 0, 1, []
    last = segments[0][0]["start"] if segments and segments[0] else 0.0
    for words in segments:
        for chunk_index in range(0, len(words), max_words_per_line):
            for i, original in enumerate(words[chunk_index : chunk_index + max_words_per_line]):
                word = dict(original)
                long_pause = not preserve_segments and word["start"] - last > LONG_PAUSE_S
                has_room = line_len + len(word["word"]) <= max_line_width
                seg_break = i == 0 and len(subtitle) > 0 and preserve_segments
                if line_len > 0 and has_room and not long_pause and not seg_break:
                    line_len += len(word["word"])
                else:
                    word["word"] = word["word"].strip()
                    if (
                        subtitle
                        and options.max_line_count is not None
                        and (long_pause or line_count >= options.max_line_count)
                    ) or seg_break:
                        yield subtitle
                        subtitle, line_count = [], 1
                    elif line_len > 0:
                        line_count += 1
                        word["word"] = "\n" + word["word"]
                    line_len = len(word["word"].strip())
                subtitle.append(word)
                last = word["start"]
    if subtitle:
        yield subtitle


def _ms(seconds: float) -> int:
    return int(round(float(seconds) * 1000.0))


def _plain(value: Any) -> Any:
    """Dataclasses, numpy scalars and arrays turned into JSON-ready dicts, lists and numbers."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "tolist"):  # numpy without importing it
        return value.tolist()
    return value


def _dumps(body: dict) -> str:
    return json.dumps(_plain(body), ensure_ascii=False)
