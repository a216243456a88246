"""Re-timing subtitle cues from aligned words, without an engine: the words are grouped by the real
tokenizer exactly as the alignment groups them, and given made-up times."""

from __future__ import annotations

import json

import pytest

from tests.support.tokens import whisper_tokens
from vllm_whisper_align.align.results import Transcript
from vllm_whisper_align.align.words import Word
from vllm_whisper_align.formats import retiming
from vllm_whisper_align.formats.subtitles import read_subtitles, write_subtitles
from vllm_whisper_align.longform.words import text_words

# Cues with tags, line breaks, dialogue dashes, punctuation that the alignment glues to the previous
# cue's last word ("...and"), and two cues without words (a symbol, only tags).
SRT_FILE = (
    "\ufeff1\r\n00:00:10,000 --> 00:00:12,000\r\n<i>Hello</i> there,\r\nhow are you?\r\n\r\n"
    "2\r\n00:00:13,000 --> 00:00:14,000\r\n♪\r\n\r\n"
    "3\r\n00:00:15,000 --> 00:00:17,000\r\n{\\an8}- I am <b>fine</b>.\r\n- Good...\r\n\r\n"
    "4\r\n00:00:18,000 --> 00:00:19,000\r\n<u></u>\r\n\r\n"
    "5\r\n00:00:20,000 --> 00:00:22,000\r\n...and then we &amp; they left.\r\n"
)
# Spoken words per cue (None: no words), as the alignment text holds them.
SPOKEN = [
    ["Hello", "there,", "how", "are", "you?"],
    None,
    ["-", "I", "am", "fine.", "-", "Good..."],
    None,
    ["...and", "then", "we", "&", "they", "left."],
]
DURATION = 20.0


@pytest.fixture(scope="module")
def tokens(model_dir):
    return whisper_tokens(model_dir)


def aligned_result(text: str, tokens, unaligned=(), step: float = 1.0, offset: float = 0.5) -> Transcript:
    """The alignment of ``text`` had word k been spoken from offset + k*step for step/2 s; the words
    numbered in ``unaligned`` flagged as longform flags text not in the audio."""
    words = text_words(tokens.encode(" " + text), tokens, "en")
    timed = [
        Word(
            round(offset + k * step, 2),
            round(offset + k * step + step / 2, 2),
            w.text,
            0.9,
            aligned=k not in unaligned,
        )
        for k, w in enumerate(words)
    ]
    return Transcript("align", "en", DURATION, text, [], timed, [])


def test_spoken_text_drops_tags_and_line_breaks():
    cues = read_subtitles(SRT_FILE).cues
    assert [retiming.spoken_text(cue.text) for cue in cues] == [
        " ".join(words) if words else "" for words in SPOKEN
    ]
    assert retiming.alignment_text(cues) == " ".join(w for words in SPOKEN if words for w in words)
    with pytest.raises(ValueError, match="no cue"):
        retiming.alignment_text(read_subtitles("1\n00:00:01,000 --> 00:00:02,000\n♪ <i>♪</i>\n").cues)


def test_words_go_back_to_their_cues(tokens):
    cues = read_subtitles(SRT_FILE).cues
    result = aligned_result(retiming.alignment_text(cues), tokens)
    spoken = [retiming.spoken_text(c.text) for c in cues]
    owners = retiming.word_owners(spoken, [w.word for w in result.words])
    # The tokenizer's grouping: "- I" is one word; "...and" belongs to cue 5, not to cue 3 before it.
    assert [w.word for w in result.words][5:] == [
        " - I",
        " am",
        " fine.",
        " - Good...",
        " ...and",
        " then",
        " we",
        " &",
        " they",
        " left.",
    ]
    assert owners == [0] * 5 + [2] * 4 + [4] * 6
    # An opening quote at a cue's end is glued to the next cue's first word: that word is the next cue's.
    split_quote = ['She said "', 'Stop!" and ran.']
    words = text_words(tokens.encode(' She said " Stop!" and ran.'), tokens, "en")
    assert [w.text for w in words] == [" She", " said", ' " Stop', '!"', " and", " ran."]
    assert retiming.word_owners(split_quote, [w.text for w in words]) == [0, 0, 1, 1, 1, 1]


def test_every_cue_keeps_number_and_text_and_gets_its_words_times(tokens):
    subtitles = read_subtitles(SRT_FILE)
    result = aligned_result(retiming.alignment_text(subtitles.cues), tokens)
    retimed = retiming.retime(subtitles, result)
    cues = retimed.subtitles.cues
    assert [(c.index, c.text) for c in cues] == [(c.index, c.text) for c in subtitles.cues]
    assert retimed.aligned == (True, False, True, False, True)
    # Words 0-4 in cue 1, 5-8 in cue 3, 9-14 in cue 5 (word k from 0.5 + k to 1.0 + k).
    assert (cues[0].start, cues[0].end) == (0.5, 5.0)
    assert (cues[2].start, cues[2].end) == (5.5, 9.0)
    assert (cues[4].start, cues[4].end) == (9.5, 15.0)
    written = write_subtitles(retimed.subtitles)
    assert written.startswith("1\n00:00:00,500 --> 00:00:05,000\n<i>Hello</i> there,\nhow are you?\n\n2\n")
    assert "{\\an8}- I am <b>fine</b>.\n- Good..." in written and "we &amp; they" in written


def test_cues_without_words_sit_between_their_neighbours(tokens):
    """Cue 2 was 1 s into the old 3 s gap between cues 1 and 3 and lasted 1 s: the same third of the
    new gap (5.0 to 5.5). Cue 4 filled the middle third of the old gap between cues 3 and 5 (9.0 to 9.5)."""
    subtitles = read_subtitles(SRT_FILE)
    retimed = retiming.retime(subtitles, aligned_result(retiming.alignment_text(subtitles.cues), tokens))
    cues = retimed.subtitles.cues
    assert (cues[1].start, cues[1].end) == pytest.approx((5.0 + 0.5 / 3, 5.0 + 1.0 / 3), abs=1e-3)
    assert (cues[3].start, cues[3].end) == pytest.approx((9.0 + 0.5 / 3, 9.0 + 1.0 / 3), abs=1e-3)


def test_a_cue_not_in_the_audio_is_kept_and_placed(tokens):
    """Cue 3's words all flagged aligned=false (longform: text not in the audio): kept, in its old
    place relative to cues 1 and 5; cue 5's glued "...and" does not make cue 3 aligned."""
    subtitles = read_subtitles(SRT_FILE)
    text = retiming.alignment_text(subtitles.cues)
    retimed = retiming.retime(subtitles, aligned_result(text, tokens, unaligned=range(5, 9)))
    cues = retimed.subtitles.cues
    assert retimed.aligned == (True, False, False, False, True)
    assert len(cues) == 5 and [c.text for c in cues] == [c.text for c in subtitles.cues]
    # The old gap from 12 s to 20 s maps onto the new one from 5.0 s to 9.5 s.
    scale = (9.5 - 5.0) / (20 - 12)
    assert (cues[2].start, cues[2].end) == pytest.approx((5.0 + 3 * scale, 5.0 + 5 * scale), abs=1e-3)
    assert (cues[4].start, cues[4].end) == (9.5, 15.0)


def test_partly_aligned_cue_spans_its_aligned_words_only(tokens):
    subtitles = read_subtitles(SRT_FILE)
    text = retiming.alignment_text(subtitles.cues)
    cues = retiming.retime(subtitles, aligned_result(text, tokens, unaligned=(5, 8))).subtitles.cues
    assert (cues[2].start, cues[2].end) == (6.5, 8.0)  # words 6 and 7


def test_edges_move_with_the_nearest_retimed_cue_inside_the_audio(tokens):
    """Unaligned first and last cues move as far as their neighbour moved, never below 0 or past the end."""
    subtitles = read_subtitles(SRT_FILE)
    text = retiming.alignment_text(subtitles.cues)
    retimed = retiming.retime(subtitles, aligned_result(text, tokens, unaligned=(*range(5), *range(9, 15))))
    cues = retimed.subtitles.cues
    assert retimed.aligned == (False, False, True, False, False)
    assert (cues[2].start, cues[2].end) == (5.5, 9.0)  # moved 9.5 s earlier at its start, 8 s at its end
    assert [(c.start, c.end) for c in cues[:2]] == [(0.5, 2.5), (3.5, 4.5)]  # moved as cue 3's start did
    assert [(c.start, c.end) for c in cues[3:]] == [(10.0, 11.0), (12.0, 14.0)]  # as cue 3's end did
    late = retiming.retime(subtitles, aligned_result(text, tokens, unaligned=range(9, 15), offset=9.0))
    assert (late.subtitles.cues[-1].start, late.subtitles.cues[-1].end) == (DURATION, DURATION)


def test_times_never_overlap_go_negative_or_backwards(tokens):
    # Old times out of order and overlapping, words aligned in bunches.
    subtitles = read_subtitles(
        "1\n00:00:05,000 --> 00:00:09,000\nOne two.\n\n2\n00:00:04,000 --> 00:00:06,000\n♪\n\n"
        "3\n00:00:01,000 --> 00:00:02,000\nThree four.\n\n4\n00:00:30,000 --> 00:00:31,000\n♪\n"
    )
    text = retiming.alignment_text(subtitles.cues)
    retimed = retiming.retime(subtitles, aligned_result(text, tokens, step=0.2, offset=0.0))
    times = [(c.start, c.end) for c in retimed.subtitles.cues]
    assert all(0 <= start <= end <= DURATION for start, end in times)
    assert all(end <= following[0] for (_, end), following in zip(times[:-1], times[1:], strict=True))
    # Nothing aligned at all: the old times, put in order.
    nothing = retiming.retime(subtitles, aligned_result(text, tokens, unaligned=range(4)))
    assert [(c.start, c.end) for c in nothing.subtitles.cues] == [(5, 9), (9, 9), (9, 9), (20, 20)]


def test_json_bodies_report_unaligned_cues(tokens):
    subtitles = read_subtitles(SRT_FILE)
    result = aligned_result(retiming.alignment_text(subtitles.cues), tokens)
    retimed = retiming.retime(subtitles, result)
    body = json.loads(retiming.render(retimed, result, "json"))
    assert set(body) == {"text", "cues"}
    assert [(c["index"], c["aligned"]) for c in body["cues"]] == [
        ("1", True),
        ("2", False),
        ("3", True),
        ("4", False),
        ("5", True),
    ]
    assert body["cues"][0] == {
        "index": "1",
        "start": 0.5,
        "end": 5.0,
        "text": subtitles.cues[0].text,
        "aligned": True,
    }
    verbose = json.loads(retiming.render(retimed, result, "verbose_json"))
    assert verbose["words"] == result.to_dict()["words"] and verbose["cues"] == body["cues"]
    assert retiming.render(retimed, result, "vtt").startswith("WEBVTT\n\n1\n00:00:00.500 --> 00:00:05.000\n")
    with pytest.raises(ValueError, match="text"):
        retiming.render(retimed, result, "text")


# ---------------------------------------------------------------------------- for the engine tests
