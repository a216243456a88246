import json

import numpy as np
import pytest

from tests.support.subtitles import parse_srt, parse_vtt
from vllm_whisper_align.align.results import Segment, TokenTiming, Transcript
from vllm_whisper_align.align.words import Word
from vllm_whisper_align.formats.cues import format_timestamp
from vllm_whisper_align.formats.responses import (
    EXTENSIONS,
    to_json,
    to_srt,
    to_text,
    to_verbose_json,
    to_vtt,
    words_to_cues,
    write_result,
)
from vllm_whisper_align.options import SubtitleOptions

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


def make_result(with_segments=True, with_words=True, offset=0.0) -> Transcript:
    words = [Word(start + offset, end + offset, word, 0.9) for word, start, end in WORDS]
    segments = [
        _segment(0, "The quick brown fox", 0.5 + offset, 2.4 + offset),
        _segment(1, "jumps over the lazy dog.", 2.6 + offset, 4.95 + offset),
    ]
    return Transcript(
        "transcribe",
        "english",
        5.5 + offset,
        " The quick brown fox jumps over the lazy dog.",
        segments if with_segments else [],
        words if with_words else None,
    )


def _segment(index, text, start, end) -> Segment:
    return Segment(index, 0, start, end, " " + text, [50364, 440, 50400], 0.0, -0.2, 1.1, 0.01)


def _words(*triples) -> list[Word]:
    """Words from (text, start, end)."""
    return [Word(start, end, word, 0.9) for word, start, end in triples]


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
    result = Transcript("transcribe", "en", 3.2, " Hello there.", [])
    assert parse_srt(to_srt(result)) == [(0.0, 3.2, "Hello there.")]


def test_empty_result():
    result = Transcript("transcribe", "en", 1.0, "", [])
    assert to_srt(result) == ""
    assert parse_vtt(to_vtt(result)) == []
    assert to_text(result) == "\n"


def test_words_to_cues_limits():
    words = _words(*((f"w{index:02d}", index * 0.5, index * 0.5 + 0.3) for index in range(60)))
    cues = words_to_cues(words)
    assert " ".join(cue.text for cue in cues).split() == [word.word for word in words]
    for cue in cues:
        assert len(cue.text) <= 42
        assert cue.end - cue.start <= 7.0


def test_words_to_cues_time_limit_and_long_word():
    words = _words(
        ("slow", 0.0, 1.0),
        ("words", 6.5, 7.5),  # would make the line 7.5 s
        ("x" * 50, 8.0, 9.0),  # alone over 42 characters
        ("end", 9.5, 9.8),
    )
    assert [cue.text for cue in words_to_cues(words)] == ["slow", "words", "x" * 50, "end"]


def test_words_to_cues_keeps_whisper_leading_spaces():
    words = _words((" Hel", 0.0, 0.2), ("lo", 0.2, 0.4), (" world", 0.5, 0.9))
    assert [cue.text for cue in words_to_cues(words)] == ["Hello world"]


def test_cue_text_cannot_break_timing_line():
    result = make_result(with_words=False)
    result.segments[0].text = " a --> b\nsecond line"
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
    timed = make_result()
    timed.tokens = [TokenTiming(440, " The", 0.5, 0.71, 0.9)]
    assert json.loads(to_verbose_json(timed))["tokens"] == [
        {"id": 440, "text": " The", "start": 0.5, "end": 0.71, "probability": 0.9}
    ]


def test_verbose_json_takes_numpy_numbers():
    result = make_result(with_segments=False)
    result.words = [Word(np.float32(0.5), np.float64(0.75), "Hi", np.float32(0.5))]
    result.duration = np.float64(1.0)
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
    ours_input = Transcript(
        "transcribe",
        "en",
        0.0,
        "",
        [_segment(k, "x", ws[0]["start"], ws[-1]["end"]) for k, ws in enumerate(segments)],
        [Word(w["start"], w["end"], w["word"].strip(), 0.9) for ws in segments for w in ws],  # unspaced words
    )
    ours = parse_srt(to_srt(ours_input, "segment", SubtitleOptions(**options)))
    reference = parse_srt(_reference_srt(segments, **options))
    assert ours == reference


def test_line_controls_validate():
    with pytest.raises(ValueError, match="max_line_width"):
        SubtitleOptions(max_line_width=0)
    with pytest.raises(ValueError, match="max_words_per_line"):
        SubtitleOptions(max_words_per_line="3")
    assert SubtitleOptions().is_default and not SubtitleOptions(highlight_words=True).is_default
