"""Reading SRT and WebVTT files into cues and writing them back, without an engine."""

from __future__ import annotations

import pytest

from vllm_whisper_align.formats.cues import Cue
from vllm_whisper_align.formats.subtitles import SRT, VTT, SubtitleError, read_subtitles, write_subtitles

SRT_FILE = """1
00:00:01,000 --> 00:00:02,500
<i>Hello</i> there,
how are you?

2
00:00:03,000 --> 00:00:04,250 X1:100 X2:200 Y1:10 Y2:20
♪

3
01:02:03,004 --> 01:02:05,000
Fine.
"""

VTT_FILE = """WEBVTT - a title
Kind: captions

STYLE
::cue { color: yellow }

NOTE a comment
over two lines

intro
00:01.000 --> 00:02.000 align:start line:0
<v Bob>Hi</v>
- Yes?

00:00:03.500 --> 00:00:04.000
&lt;quiet&gt;
"""


def test_srt_cues_keep_numbers_lines_and_settings():
    subtitles = read_subtitles(SRT_FILE)
    assert subtitles.format == SRT and subtitles.header == ()
    assert subtitles.cues == (
        Cue(1.0, 2.5, "<i>Hello</i> there,\nhow are you?", "1"),
        Cue(3.0, 4.25, "♪", "2", " X1:100 X2:200 Y1:10 Y2:20"),
        Cue(3723.004, 3725.0, "Fine.", "3"),
    )
    assert write_subtitles(subtitles) == SRT_FILE


def test_vtt_cues_identifiers_settings_and_header_blocks():
    subtitles = read_subtitles(VTT_FILE)
    assert subtitles.format == VTT
    assert subtitles.header == ("WEBVTT - a title\nKind: captions", "STYLE\n::cue { color: yellow }")
    assert subtitles.cues == (
        Cue(1.0, 2.0, "<v Bob>Hi</v>\n- Yes?", "intro", " align:start line:0"),
        Cue(3.5, 4.0, "&lt;quiet&gt;", None),
    )
    written = write_subtitles(subtitles)
    assert "NOTE" not in written  # comments are not cues
    assert read_subtitles(written) == subtitles


def test_crlf_bom_utf16_and_no_trailing_blank_line_read_the_same():
    expected = read_subtitles(SRT_FILE)
    crlf = SRT_FILE.replace("\n", "\r\n").rstrip("\r\n")
    assert read_subtitles("\ufeff" + crlf) == expected
    assert read_subtitles(("\ufeff" + crlf).encode("utf-8")) == expected
    assert read_subtitles(SRT_FILE.encode("utf-16")) == expected
    assert read_subtitles(SRT_FILE.replace("\n\n", "\n\n\n \n")) == expected  # extra blank lines
    assert read_subtitles(VTT_FILE.replace("\n", "\r")).cues == read_subtitles(VTT_FILE).cues


def test_tolerated_variants():
    # No cue number, a dot for a comma, one-digit hours, no spaces around the arrow, a cue without text.
    subtitles = read_subtitles("00:00:01.5-->0:00:02,000\nhi\n\n7\n00:00:03,000 --> 00:00:04,000\n")
    assert subtitles.cues == (Cue(1.5, 2.0, "hi", None), Cue(3.0, 4.0, "", "7"))
    assert write_subtitles(subtitles).startswith("1\n00:00:01,500 --> 00:00:02,000\nhi\n\n7\n")


def test_converting_between_formats_drops_foreign_settings():
    srt = read_subtitles(SRT_FILE)
    vtt = write_subtitles(srt, VTT)
    assert vtt.startswith("WEBVTT\n\n1\n00:00:01.000 --> 00:00:02.500\n<i>Hello</i> there,\nhow are you?\n")
    assert "X1:" not in vtt
    back = read_subtitles(vtt)
    assert [(c.index, c.start, c.end, c.text) for c in back.cues] == [
        (c.index, c.start, c.end, c.text) for c in srt.cues
    ]
    # A VTT identifier that is not a number gives way to the cue's position in SRT.
    as_srt = write_subtitles(read_subtitles(VTT_FILE), SRT)
    assert as_srt.startswith("1\n00:00:01,000 --> 00:00:02,000\n<v Bob>")


def test_with_times_changes_times_only():
    subtitles = read_subtitles(SRT_FILE)
    moved = subtitles.with_times([(0.5, 1.0), (1.0, 1.5), (2.0, 2.5)])
    assert [(c.start, c.end) for c in moved.cues] == [(0.5, 1.0), (1.0, 1.5), (2.0, 2.5)]
    assert [(c.index, c.text, c.settings) for c in moved.cues] == [
        (c.index, c.text, c.settings) for c in subtitles.cues
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("\ufeff \n\r\n\t", "empty"),
        ("WEBVTT\n\nNOTE only a comment\n", "no cues"),
        ("Hello there\nGeneral Kenobi\n", "line 1: expected a cue number"),
        ("1\n00:00:01,000 -> 00:00:02,000\nx\n", "line 2: expected a timing line"),
        (
            "1\n00:00:01,000 --> 00:00:02,000\nx\n\n2\n00:00:03,000 --> 00:61:00,000\ny\n",
            "line 6: bad timestamp",
        ),
        ("1\n00:00:01,000 --> 00:00:02,000\nx\n\ncontinued after a blank line\n", "line 5"),
        ("WEBVTT\n\nfoo\nbar\n", "line 3: expected a cue timing line"),
        (b"1\n00:00:01,000 --> 00:00:02,000\n\xff\xfe\n", "line 3: not UTF-8"),
    ],
)
def test_malformed_files_are_one_line_errors_naming_the_line(text, message):
    with pytest.raises(SubtitleError, match=message) as error:
        read_subtitles(text)
    assert "\n" not in str(error.value)
    assert isinstance(error.value, ValueError)
