"""The one subtitle cue, and timestamps as SRT and WebVTT write them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cue:
    """A subtitle cue: one we write (a segment, a line of words) or one read from a file."""

    start: float
    end: float
    text: str  # the cue's lines, joined by "\n"
    # Read from a file: SRT's cue number or VTT's cue identifier, as written (None: a VTT cue without one).
    index: str | None = None
    settings: str = ""  # what follows the end time on the timing line, as written


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
