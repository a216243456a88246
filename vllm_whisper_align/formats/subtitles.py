"""SubRip (.srt) and WebVTT (.vtt) files read into cues, and written back as they were read.

A cue keeps what a file says about it besides its times exactly: its number (SRT) or identifier
(VTT), its text with its line breaks, and its settings (VTT's ``align:start line:0``, SRT's
``X1:… Y2:…`` coordinates). A WebVTT file's header, STYLE and REGION blocks are kept; NOTE blocks
(comments) are not. Malformed input is a :class:`SubtitleError` naming the line.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from vllm_whisper_align.formats.cues import Cue, srt_timestamp, vtt_timestamp

SRT, VTT = "srt", "vtt"
SUBTITLE_FORMATS = (SRT, VTT)

# "start --> end" (the spaces around the arrow optional) and whatever follows: the cue's settings.
TIMING_LINE = re.compile(r"^\s*([^\s-]+)\s*-->\s*(\S+)(.*)$")
# [hours:]minutes:seconds[,.]fraction; SRT writes a comma, VTT a dot, and files mix them up.
TIMESTAMP = re.compile(r"^(?:(\d+):)?([0-5]?\d):([0-5]\d)[,.](\d{1,3})$")
# A WebVTT file starts with this word, alone or followed by a space or tab and anything.
VTT_SIGNATURE = re.compile(r"^WEBVTT(?:[ \t].*)?$")
# WebVTT blocks that are not cues: comments (dropped), and styling kept in the header.
VTT_COMMENT = re.compile(r"^NOTE(?:[ \t].*)?$")
VTT_HEADER_BLOCK = re.compile(r"^(?:STYLE|REGION)[ \t]*$")
# Longest quotation of a file's line in an error message.
QUOTE_CHARS = 40


class SubtitleError(ValueError):
    """A subtitle file that cannot be read; the message is one line and names the line number."""


@dataclass(frozen=True)
class SubtitleFile:
    format: str  # SRT or VTT
    cues: tuple[Cue, ...]
    header: tuple[str, ...] = ()  # VTT: the WEBVTT block, then STYLE and REGION blocks, as written

    def with_times(self, times: Sequence[tuple[float, float]]) -> SubtitleFile:
        timed = zip(self.cues, times, strict=True)
        cues = tuple(replace(cue, start=start, end=end) for cue, (start, end) in timed)
        return replace(self, cues=cues)


# ---------------------------------------------------------------------------- reading


def read_subtitles(data: bytes | str) -> SubtitleFile:
    """An SRT or WebVTT file (told apart by VTT's ``WEBVTT`` first line) from its bytes or text."""
    text = _decoded(data) if isinstance(data, bytes) else data
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    blocks = list(_blocks(text.split("\n")))
    if not blocks:
        raise SubtitleError("the subtitle file is empty")
    first_line = blocks[0][0][1]
    subtitles = _read_vtt(blocks) if VTT_SIGNATURE.match(first_line) else _read_srt(blocks)
    if not subtitles.cues:
        raise SubtitleError("the subtitle file has no cues")
    return subtitles


def _decoded(data: bytes) -> str:
    # UTF-16 files (some Windows tools write them) say so with a byte-order mark; everything else
    # is taken as UTF-8, which covers ASCII.
    encoding = "utf-16" if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else "utf-8-sig"
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise SubtitleError(f"line {line}: not {encoding.removesuffix('-sig').upper()} text") from None


Block = list[tuple[int, str]]  # (line number from 1, line) for each line of a block


def _blocks(lines: list[str]) -> Iterator[Block]:
    """Runs of non-blank lines: the blocks of both formats."""
    block: Block = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            block.append((number, line))
        elif block:
            yield block
            block = []
    if block:
        yield block


def _read_srt(blocks: list[Block]) -> SubtitleFile:
    cues = []
    for block in blocks:
        number, first = block[0]
        # A missing cue number is tolerated (some tools leave it out); anything else before the
        # timing line is not SRT.
        if TIMING_LINE.match(first):
            index, rest = None, block
        elif first.strip().isdigit() and len(block) > 1:
            index, rest = first.strip(), block[1:]
        else:
            raise SubtitleError(f"line {number}: expected a cue number, got {_quote(first)}")
        cues.append(_cue(index, rest[0], rest[1:]))
    return SubtitleFile(SRT, tuple(cues))


def _read_vtt(blocks: list[Block]) -> SubtitleFile:
    header = ["\n".join(line for _, line in blocks[0])]
    cues = []
    for block in blocks[1:]:
        number, first = block[0]
        if VTT_COMMENT.match(first):
            continue
        if VTT_HEADER_BLOCK.match(first):
            header.append("\n".join(line for _, line in block))
        elif TIMING_LINE.match(first):
            cues.append(_cue(None, block[0], block[1:]))
        elif len(block) > 1 and TIMING_LINE.match(block[1][1]):
            cues.append(_cue(first, block[1], block[2:]))
        else:
            raise SubtitleError(f"line {number}: expected a cue timing line, got {_quote(first)}")
    return SubtitleFile(VTT, tuple(cues), tuple(header))


def _cue(index: str | None, timing: tuple[int, str], text: Block) -> Cue:
    number, line = timing
    match = TIMING_LINE.match(line)
    if match is None:
        raise SubtitleError(f"line {number}: expected a timing line 'start --> end', got {_quote(line)}")
    start, end, settings = match.groups()
    return Cue(_seconds(start, number), _seconds(end, number), "\n".join(t for _, t in text), index, settings)


def _seconds(stamp: str, number: int) -> float:
    match = TIMESTAMP.match(stamp)
    if match is None:
        raise SubtitleError(f"line {number}: bad timestamp {_quote(stamp)}; expected HH:MM:SS,mmm")
    hours, minutes, seconds, fraction = match.groups()
    return int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds) + float("0." + fraction)


def _quote(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 1] + "…")


# ---------------------------------------------------------------------------- writing


def write_subtitles(subtitles: SubtitleFile, fmt: str | None = None) -> str:
    """The file as ``fmt`` (default: its own format). Settings only carry over within a format:
    SRT's coordinates mean nothing to VTT, and VTT's settings nothing to SRT."""
    fmt = fmt or subtitles.format
    if fmt not in SUBTITLE_FORMATS:
        raise ValueError(f"unknown subtitle format {fmt!r}; expected one of {SUBTITLE_FORMATS}")
    keep_settings = fmt == subtitles.format
    if fmt == SRT:
        blocks = [_srt_block(position, cue, keep_settings) for position, cue in enumerate(subtitles.cues, 1)]
    else:
        header = list(subtitles.header) if subtitles.format == VTT else ["WEBVTT"]
        blocks = header + [_vtt_block(cue, keep_settings) for cue in subtitles.cues]
    return "\n\n".join(blocks) + "\n"


def _srt_block(position: int, cue: Cue, keep_settings: bool) -> str:
    # SRT numbers its cues: a VTT identifier that is not a number gives way to the cue's position.
    number = cue.index if cue.index is not None and cue.index.isdigit() else str(position)
    settings = cue.settings if keep_settings else ""
    timing = f"{srt_timestamp(cue.start)} --> {srt_timestamp(cue.end)}{settings}"
    return "\n".join([number, timing, *_lines(cue.text)])


def _vtt_block(cue: Cue, keep_settings: bool) -> str:
    settings = cue.settings if keep_settings else ""
    timing = f"{vtt_timestamp(cue.start)} --> {vtt_timestamp(cue.end)}{settings}"
    return "\n".join([*([cue.index] if cue.index is not None else []), timing, *_lines(cue.text)])


def _lines(text: str) -> list[str]:
    return text.split("\n") if text else []
