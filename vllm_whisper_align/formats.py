"""Transcription results rendered in the OpenAI audio API's response formats.

A result is a dict (or dataclass) shaped like the OpenAI verbose_json body:
{"text", "language", "duration", "segments": [...] or [], "words": [...] or None}.
"""

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

# OpenAI's audio response formats, and the file extension of each.
EXTENSIONS = {"json": "json", "text": "txt", "srt": "srt", "verbose_json": "json", "vtt": "vtt"}
RESPONSE_FORMATS = tuple(EXTENSIONS)
# Forced alignment always has words: plain text would drop them.
ALIGNMENT_FORMATS = ("json", "verbose_json", "srt", "vtt")
GRANULARITIES = ("segment", "word")

# Subtitle lines built from words: common readability limits for one caption line.
MAX_CUE_CHARS = 42
MAX_CUE_SECONDS = 7.0


@dataclass
class Cue:
    start: float
    end: float
    text: str


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


def to_srt(result: Any, granularity: str = "segment") -> str:
    cues = result_cues(result, granularity)
    blocks = [
        f"{number}\n{_srt_time(cue.start)} --> {_srt_time(cue.end)}\n{cue.text}\n"
        for number, cue in enumerate(cues, start=1)
    ]
    return "\n".join(blocks)


def to_vtt(result: Any, granularity: str = "segment") -> str:
    cues = result_cues(result, granularity)
    blocks = [f"{_vtt_time(cue.start)} --> {_vtt_time(cue.end)}\n{cue.text}\n" for cue in cues]
    return "\n".join(["WEBVTT\n", *blocks])


def write_result(result: Any, fmt: str, granularity: str = "segment") -> str:
    """Render `result` as `fmt` (a key of EXTENSIONS); granularity applies to srt/vtt."""
    if fmt == "srt":
        return to_srt(result, granularity)
    if fmt == "vtt":
        return to_vtt(result, granularity)
    writers = {"json": to_json, "verbose_json": to_verbose_json, "text": to_text}
    if fmt not in writers:
        raise ValueError(f"unknown response format {fmt!r}; expected one of {sorted(EXTENSIONS)}")
    return writers[fmt](result)


def result_cues(result: Any, granularity: str = "segment") -> list[Cue]:
    """Subtitle cues for `result`, using whatever timing it has.

    Word granularity wants words and falls back to segments; segment granularity wants
    segments and falls back to lines built from words; with neither, the whole text
    becomes one cue over the audio's duration.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown timestamp granularity {granularity!r}; expected one of {GRANULARITIES}")
    result = _plain(result)
    words = result.get("words") or []
    segments = result.get("segments") or []

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


def _clean_cue(cue: Cue) -> Cue:
    # "-->" inside text would end the cue's timing line early in players.
    text = " ".join(cue.text.replace("-->", "->").split())
    start = max(0.0, float(cue.start))
    return Cue(start, max(start, float(cue.end)), text)


def _srt_time(seconds: float) -> str:
    return format_timestamp(seconds, always_include_hours=True, decimal_marker=",")


def _vtt_time(seconds: float) -> str:
    return format_timestamp(seconds, always_include_hours=True, decimal_marker=".")


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
