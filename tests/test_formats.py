import json
import re
from dataclasses import dataclass

import numpy as np
import pytest

from vllm_whisper_align.formats.responses import (
    EXTENSIONS,
    SubtitleOptions,
    format_timestamp,
    to_json,
    to_srt,
    to_text,
    to_verbose_json,
    to_vtt,
    words_to_cues,
    write_result,
)

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


WORDS = [
    ("The", 0.50, 0.71),
    ("quick", 0.91, 1.20),
    ("brown", 1.40, 1.75),
    ("fox", 2.10, 2.40),
    ("jumps", 2.60, 3.00),
    ("over", 3.20, 3.45),
    ("the", 3.60, 3.70),
    ("lazy", 3.90, 4.30),
    ("dog.", 4.50, 4.95),
]


def make_result(with_segments=True, with_words=True, offset=0.0):
    words = [
        {"word": word, "start": start + offset, "end": end + offset, "probability": 0.9}
        for word, start, end in WORDS
    ]
    segments = [
        _segment(0, "The quick brown fox", 0.5 + offset, 2.4 + offset),
        _segment(1, "jumps over the lazy dog.", 2.6 + offset, 4.95 + offset),
    ]
    return {
        "text": " The quick brown fox jumps over the lazy dog.",
        "language": "english",
        "duration": 5.5 + offset,
        "segments": segments if with_segments else [],
        "words": words if with_words else None,
    }


def _segment(index, text, start, end):
    return {
        "id": index,
        "seek": 0,
        "start": start,
        "end": end,
        "text": " " + text,
        "tokens": [50364, 440, 50400],
        "temperature": 0.0,
        "avg_logprob": -0.2,
        "compression_ratio": 1.1,
        "no_speech_prob": 0.01,
    }


@pytest.mark.parametrize(
    "seconds, hours, marker, expected",
    [
        (0.0, False, ".", "00:00.000"),
        (0.0, True, ",", "00:00:00,000"),
        (61.5, False, ".", "01:01.500"),
        (3725.5, False, ",", "01:02:05,500"),  # hours appear when needed
        (3725.5, True, ".", "01:02:05.500"),
        (59.9996, True, ",", "00:01:00,000"),  # rounding carries into minutes
        (36000 + 0.001, True, ",", "10:00:00,001"),
        (np.float32(1.25), True, ",", "00:00:01,250"),
    ],
)
def test_format_timestamp(seconds, hours, marker, expected):
    assert format_timestamp(seconds, always_include_hours=hours, decimal_marker=marker) == expected


def test_format_timestamp_rejects_negative():
    with pytest.raises(ValueError):
        format_timestamp(-1.0)


@pytest.mark.parametrize("writer, parser", [(to_srt, parse_srt), (to_vtt, parse_vtt)])
def test_segment_cues(writer, parser):
    cues = parser(writer(make_result(), "segment"))
    assert cues == [(0.5, 2.4, "The quick brown fox"), (2.6, 4.95, "jumps over the lazy dog.")]


@pytest.mark.parametrize("writer, parser", [(to_srt, parse_srt), (to_vtt, parse_vtt)])
def test_word_cues_one_per_word(writer, parser):
    cues = parser(writer(make_result(), "word"))
    assert cues == [(start, end, word) for word, start, end in WORDS]


def test_srt_hours():
    cues = parse_srt(to_srt(make_result(offset=3723.0), "segment"))
    assert to_srt(make_result(offset=3723.0)).split("\n")[1] == "01:02:03,500 --> 01:02:05,400"
    assert cues[0][0] == pytest.approx(3723.5)


def test_vtt_layout():
    vtt = to_vtt(make_result(), "segment")
    assert vtt.startswith("WEBVTT\n\n00:00:00.500 --> 00:00:02.400\nThe quick brown fox\n\n")
    assert vtt.endswith("\n") and not vtt.endswith("\n\n\n")


@pytest.mark.parametrize("writer, parser", [(to_srt, parse_srt), (to_vtt, parse_vtt)])
def test_segment_granularity_without_segments_groups_words(writer, parser):
    cues = parser(writer(make_result(with_segments=False), "segment"))
    assert " ".join(text for _, _, text in cues) == "The quick brown fox jumps over the lazy dog."
    assert cues[0][0] == 0.5 and cues[-1][1] == 4.95


def test_word_granularity_without_words_falls_back_to_segments():
    assert len(parse_srt(to_srt(make_result(with_words=False), "word"))) == 2


def test_text_only_result_gives_one_cue():
    result = {"text": " Hello there.", "language": "en", "duration": 3.2, "segments": [], "words": None}
    assert parse_srt(to_srt(result)) == [(0.0, 3.2, "Hello there.")]


def test_empty_result():
    result = {"text": "", "language": "en", "duration": 1.0, "segments": [], "words": None}
    assert to_srt(result) == ""
    assert parse_vtt(to_vtt(result)) == []
    assert to_text(result) == "\n"


def test_words_to_cues_limits():
    words = [{"word": f"w{index:02d}", "start": index * 0.5, "end": index * 0.5 + 0.3} for index in range(60)]
    cues = words_to_cues(words)
    assert " ".join(cue.text for cue in cues).split() == [word["word"] for word in words]
    for cue in cues:
        assert len(cue.text) <= 42
        assert cue.end - cue.start <= 7.0


def test_words_to_cues_time_limit_and_long_word():
    words = [
        {"word": "slow", "start": 0.0, "end": 1.0},
        {"word": "words", "start": 6.5, "end": 7.5},  # would make the line 7.5 s
        {"word": "x" * 50, "start": 8.0, "end": 9.0},  # alone over 42 characters
        {"word": "end", "start": 9.5, "end": 9.8},
    ]
    assert [cue.text for cue in words_to_cues(words)] == ["slow", "words", "x" * 50, "end"]


def test_words_to_cues_keeps_whisper_leading_spaces():
    words = [
        {"word": " Hel", "start": 0.0, "end": 0.2},
        {"word": "lo", "start": 0.2, "end": 0.4},
        {"word": " world", "start": 0.5, "end": 0.9},
    ]
    assert [cue.text for cue in words_to_cues(words)] == ["Hello world"]


def test_cue_text_cannot_break_timing_line():
    result = make_result(with_words=False)
    result["segments"][0]["text"] = " a --> b\nsecond line"
    cues = parse_srt(to_srt(result))
    assert cues[0][2] == "a -> b second line"


def test_json_and_text():
    result = make_result()
    assert json.loads(to_json(result)) == {"text": "The quick brown fox jumps over the lazy dog."}
    assert to_text(result) == "The quick brown fox jumps over the lazy dog.\n"


def test_verbose_json():
    body = json.loads(to_verbose_json(make_result()))
    assert body["task"] == "transcribe"
    assert body["language"] == "english" and body["duration"] == 5.5
    assert len(body["segments"]) == 2
    assert set(body["segments"][0]) >= {"id", "seek", "tokens", "no_speech_prob"}
    assert [word["word"] for word in body["words"]][:2] == ["The", "quick"]
    assert "words" not in json.loads(to_verbose_json(make_result(with_words=False)))
    extra = make_result()
    extra["tokens"] = [{"token": "The", "start": 0.5, "end": 0.71}]
    assert json.loads(to_verbose_json(extra))["tokens"] == extra["tokens"]


def test_verbose_json_accepts_dataclasses_and_numpy():
    @dataclass
    class Word:
        word: str
        start: float
        end: float
        probability: float

    result = make_result(with_segments=False)
    result["words"] = [Word("Hi", np.float32(0.5), np.float64(0.75), np.float32(0.5))]
    result["duration"] = np.float64(1.0)
    body = json.loads(to_verbose_json(result))
    assert body["words"] == [{"word": "Hi", "start": 0.5, "end": 0.75, "probability": 0.5}]
    assert parse_srt(to_srt(result, "word")) == [(0.5, 0.75, "Hi")]


def test_write_result_dispatch():
    result = make_result()
    assert write_result(result, "srt", "word") == to_srt(result, "word")
    assert write_result(result, "vtt", "segment") == to_vtt(result, "segment")
    assert write_result(result, "json", "word") == to_json(result)
    assert write_result(result, "verbose_json") == to_verbose_json(result)
    assert write_result(result, "text") == to_text(result)
    assert set(EXTENSIONS) == {"json", "verbose_json", "srt", "vtt", "text"}
    assert EXTENSIONS["text"] == "txt"
    with pytest.raises(ValueError):
        write_result(result, "docx")
    with pytest.raises(ValueError):
        write_result(result, "srt", "sentence")


# ---------------------------------------------------------------------------- line controls


def _reference_srt(segments_with_words, **options) -> str:
    import io

    from whisper.utils import WriteSRT

    result = {
        "segments": [
            {
                "start": ws[0]["start"],
                "end": ws[-1]["end"],
                "text": "".join(w["word"] for w in ws),
                "words": ws,
            }
            for ws in segments_with_words
        ]
    }
    out = io.StringIO()
    WriteSRT(".").write_result(result, out, options)
    return out.getvalue()


def _spoken_segments(seed: int) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    vocabulary = ["a", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "extraordinarily,"]
    segments, t = [], 0.0
    for _ in range(rng.integers(1, 5)):
        words = []
        for _ in range(rng.integers(1, 14)):
            t += float(rng.choice([0.05, 0.2, 0.6, 3.5], p=[0.5, 0.3, 0.15, 0.05]))
            duration = float(rng.uniform(0.1, 0.6))
            words.append(
                {
                    "word": " " + str(rng.choice(vocabulary)),
                    "start": round(t, 2),
                    "end": round(t + duration, 2),
                    "probability": 0.9,
                }
            )
            t += duration
        segments.append(words)
    return segments


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(
    "options",
    [
        {"max_line_width": 16, "max_line_count": 2},
        {"max_line_width": 20},
        {"max_line_count": 1},
        {"max_words_per_line": 3},
        {"max_line_width": 24, "max_line_count": 2, "max_words_per_line": 4, "highlight_words": True},
        {"highlight_words": True},
    ],
)
def test_line_controls_lay_out_cues_as_openai_whisper(seed, options):
    """Our result shape (OpenAI's: words at the top level, segments without words) gives the cues
    openai-whisper's SRT writer gives for the same words in its shape."""
    segments = _spoken_segments(seed)
    ours_input = {
        "text": "",
        "segments": [{"start": ws[0]["start"], "end": ws[-1]["end"], "text": "x"} for ws in segments],
        "words": [dict(w, word=w["word"].strip()) for ws in segments for w in ws],  # OpenAI's unspaced words
    }
    ours = parse_srt(to_srt(ours_input, "segment", SubtitleOptions(**options)))
    reference = parse_srt(_reference_srt(segments, **options))
    assert ours == reference


def test_line_controls_validate():
    with pytest.raises(ValueError, match="max_line_width"):
        SubtitleOptions(max_line_width=0)
    with pytest.raises(ValueError, match="max_words_per_line"):
        SubtitleOptions(max_words_per_line="3")
    assert SubtitleOptions().is_default and not SubtitleOptions(highlight_words=True).is_default
