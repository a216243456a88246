"""Subtitle files for tests: a strict reader of what we write, and drifted files to re-time."""

from __future__ import annotations

import re

import numpy as np

from vllm_whisper_align.formats.cues import Cue
from vllm_whisper_align.formats.subtitles import VTT, SubtitleFile

SRT_TIME = r"(\d{2}):(\d{2}):(\d{2}),(\d{3})"


VTT_TIME = r"(?:(\d{2,}):)?(\d{2}):(\d{2})\.(\d{3})"


def _seconds(match_groups) -> float:
    hours, minutes, seconds, millis = (int(group or 0) for group in match_groups)
    return hours * 3600 + minutes * 60 + seconds + millis / 1000


def parse_srt(text: str) -> list[tuple[float, float, str]]:
    """Strict tiny SRT reader: numbered cues from 1, one timing line, non-empty text."""
    cues = []
    for number, block in enumerate(text.strip("\n").split("\n\n"), start=1):
        lines = block.split("\n")
        assert lines[0] == str(number), f"cue number {lines[0]!r}, expected {number}"
        timing = re.fullmatch(f"{SRT_TIME} --> {SRT_TIME}", lines[1])
        assert timing, f"bad timing line {lines[1]!r}"
        text_lines = lines[2:]
        assert text_lines and all(line.strip() for line in text_lines), f"empty cue text in {block!r}"
        cues.append((_seconds(timing.groups()[:4]), _seconds(timing.groups()[4:]), "\n".join(text_lines)))
    _check_times(cues)
    return cues


def parse_vtt(text: str) -> list[tuple[float, float, str]]:
    header, _, body = text.partition("\n")
    assert header == "WEBVTT"
    assert body == "" or body.startswith("\n"), "a blank line must follow the header"
    cues = []
    for block in filter(None, body.strip("\n").split("\n\n")):
        lines = block.split("\n")
        timing = re.fullmatch(f"{VTT_TIME} --> {VTT_TIME}", lines[0])
        assert timing, f"bad timing line {lines[0]!r}"
        assert lines[1:] and all(line.strip() for line in lines[1:]), f"empty cue text in {block!r}"
        cues.append((_seconds(timing.groups()[:4]), _seconds(timing.groups()[4:]), "\n".join(lines[1:])))
    _check_times(cues)
    return cues


def _check_times(cues):
    for start, end, _ in cues:
        assert 0 <= start <= end
    starts = [start for start, _, _ in cues]
    assert starts == sorted(starts), "cue start times must not go back"


# Subtitles that drift: every cue DRIFT_SHIFT_S late, and later still by DRIFT_RATE of its time.
DRIFT_SHIFT_S = 3.0


DRIFT_RATE = 0.05


# A re-timed cue starts this close to its first word's true start.
START_TOLERANCE_S = 0.2


# Sentences of tests/speech.py, in this order, whose first words tiny.en places within START_TOLERANCE_S
# (at most 0.14 s late) after the pause before them; 30.8 s, over one window. Other orders can do worse:
# after "...after lunch." it places "The train leaves..." 0.9 s late (the alignment's limit, not re-timing's).
CUE_SENTENCES = (0, 1, 4, 6, 5)


def drifted_subtitles(sentences, fmt: str) -> tuple[SubtitleFile, list[float | None]]:
    """A subtitle file for ``sentences`` (SpokenClips) spoken back to back as ``concatenate_clips``
    joins them: a cue per sentence (one in italics, one on two lines) and a "♪" cue in the pause after
    the first, all drifted; and the true start of each cue's first word (None: the cue has no words)."""
    offsets = np.cumsum([0.0] + [clip.duration for clip in sentences[:-1]])
    spans, texts = [], []
    for k, (clip, offset) in enumerate(zip(sentences, offsets, strict=True)):
        words = clip.text.split()
        two_lines = " ".join(words[:3]) + "\n" + " ".join(words[3:])
        text = {1: f"<i>{clip.text}</i>", 2: two_lines}.get(k, clip.text)
        spans.append((offset + clip.starts[0], offset + clip.ends[-1]))
        texts.append(text)
        if k == 0:
            spans.append((offset + clip.ends[-1] + 0.1, offset + clip.duration))
            texts.append("♪")
    cues = tuple(
        Cue(*(t * (1 + DRIFT_RATE) + DRIFT_SHIFT_S for t in span), text, str(number))
        for number, (span, text) in enumerate(zip(spans, texts, strict=True), start=1)
    )
    header = ("WEBVTT",) if fmt == VTT else ()
    true_starts = [None if text == "♪" else start for (start, _), text in zip(spans, texts, strict=True)]
    return SubtitleFile(fmt, cues, header), true_starts


def assert_retimed(retimed: SubtitleFile, sent: SubtitleFile, true_starts: list[float | None]) -> None:
    """Every cue kept, number and text; each starts near its first word; the cue without words in the
    pause it was in; times in order."""
    assert [(c.index, c.text) for c in retimed.cues] == [(c.index, c.text) for c in sent.cues]
    timed = zip(retimed.cues, true_starts, strict=True)
    errors = [abs(cue.start - true) for cue, true in timed if true is not None]
    assert max(errors) <= START_TOLERANCE_S, (errors, retimed.cues)
    music = true_starts.index(None)
    assert retimed.cues[music - 1].end <= retimed.cues[music].start <= retimed.cues[music + 1].start
    assert all(a.end <= b.start for a, b in zip(retimed.cues[:-1], retimed.cues[1:], strict=True))
