"""Planning windows and turning answers into results without an engine: windows too short to align."""

from dataclasses import replace

import numpy as np
import pytest

from tests.support.plans import every_window_planned
from tests.support.speech import synthesize_sentence
from tests.support.tokens import whisper_tokens
from vllm_whisper_align.align import results
from vllm_whisper_align.align.words import Word
from vllm_whisper_align.audio import phones
from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.errors import AlignmentInputError
from vllm_whisper_align.options import TranscriptionOptions
from vllm_whisper_align.runners import decoding
from vllm_whisper_align.tokens import WhisperTokens

TEXT = " Hello there."


@pytest.fixture(scope="module")
def tokens(model_dir):
    return whisper_tokens(model_dir)


def noise(num_samples: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(num_samples).standard_normal(num_samples)).astype(np.float32)


def answered(plan: decoding.Plan, tokens: WhisperTokens, cross_qk=None, text_ids=None) -> dict:
    """The result for `plan` had the engine said TEXT (or `text_ids`) in its one window (and the
    worker returned no attention, or `cross_qk` as its answer for the window)."""
    text_ids = tokens.encode(TEXT) if text_ids is None else text_ids
    output = results.WindowOutput(text_ids, [-0.1] * len(text_ids))
    fetched = []
    if cross_qk is not None:
        [window] = plan.windows
        fetched = [
            {
                "key": window.alignment.key,
                "cross_qk": cross_qk.tobytes(),
                "shape": list(cross_qk.shape),
                "tuned_heads": [0],
                "candidate_heads": [0],
            }
        ]
    return results.finish(plan.decoded([output]), fetched, tokens, plan.info).to_dict()


def all_times(result: dict) -> list[float]:
    return [t for item in result["words"] + result["tokens"] for t in (item["start"], item["end"])]


def test_alignment_needs_two_encoder_frames():
    assert decoding.MIN_ALIGNMENT_SECONDS == 0.04
    assert not decoding.can_align(639) and decoding.can_align(640)


@pytest.mark.parametrize("num_samples", [160, 319, 320, 479, 639])
def test_too_short_to_align_still_gives_words_inside_the_audio(tokens, num_samples):
    plan = every_window_planned(noise(num_samples), tokens, language="en")
    [window] = plan.windows
    assert window.alignment is None  # nothing captured that the worker would have to keep
    result = answered(plan, tokens)
    assert [w["word"] for w in result["words"]] == [" Hello", " there."]
    times = all_times(result)
    assert min(times) >= 0 and max(times) <= num_samples / SAMPLE_RATE
    word_times = [t for w in result["words"] for t in (w["start"], w["end"])]
    assert word_times == sorted(word_times)
    assert "alignment_errors" not in result


def test_under_one_mel_frame_is_nothing_to_hear(tokens):
    assert every_window_planned(noise(159), tokens, language="en").windows == []


@pytest.mark.parametrize("num_samples", [160, 639])
def test_forced_alignment_of_too_short_audio_is_refused(tokens, num_samples):
    with pytest.raises(AlignmentInputError, match="at least 0.04 s"):
        decoding.plan_alignment(noise(num_samples), tokens, text="hello")


def test_times_stay_inside_the_window_whatever_the_matrix(tokens):
    """A NaN matrix (the z-score of a single frame) sends DTW's path off the matrix's edge,
    which gave times of -0.02 s. Forced alignment, whose words are never dropped as instantaneous."""
    plan = decoding.plan_alignment(noise(2000), tokens, text=TEXT)
    [window] = plan.windows
    rows = window.alignment.rows_sent(len(tokens.encode(TEXT)))
    result = answered(plan, tokens, cross_qk=np.full((1, rows, 6), np.nan, dtype=np.float32))
    times = all_times(result)
    assert [w["word"] for w in result["words"]] == [" Hello", " there."]
    assert min(times) >= 0 and max(times) <= 2000 / SAMPLE_RATE


def test_an_instantaneous_transcribed_segment_is_dropped_as_the_reference_does(tokens):
    """openai-whisper's transcribe clears a segment whose words take no time (text DTW could only
    squeeze into one instant: typically invented at a window's end)."""
    plan = every_window_planned(noise(2000), tokens, language="en")
    [window] = plan.windows
    rows = window.alignment.rows_sent(len(tokens.encode(TEXT)))
    result = answered(plan, tokens, cross_qk=np.full((1, rows, 6), np.nan, dtype=np.float32))
    assert result["words"] == [] and result["segments"] == [] and result["text"] == ""


def counting(tokens: WhisperTokens) -> tuple[WhisperTokens, list[int]]:
    """``tokens``, with the length of every text it tokenizes recorded."""
    lengths: list[int] = []
    encode = tokens.encode_text
    assert encode is not None

    def recorded(text: str) -> list[int]:
        lengths.append(len(text))
        return encode(text)

    return replace(tokens, encode_text=recorded), lengths


def test_a_long_prompt_is_tokenized_from_its_tail_the_last_tokens_unchanged(tokens):
    """openai-whisper keeps a prompt's last 223 tokens: a megabyte of prompt used to be tokenized
    whole for every window (seconds on the event loop), where the tail that holds them is enough."""
    words = ["Hello", "there,", "general", "Kenobi.", "  You", "are", "a", "bold", "one!"]
    prompt = " ".join(words[k % len(words)] for k in range(60_000))
    counted, lengths = counting(tokens)
    kept = decoding.previous_text_tokens(prompt, counted)
    assert kept == [tokens.start_of_prev, *tokens.encode(" " + prompt)[-223:]]
    assert max(lengths) < len(prompt) / 4
    # A long run with no space and a few words after it: the tail is not cut at those words' spaces,
    # which would leave them alone (3 tokens kept of 223).
    unspaced = "短" * 70_000 + " hello there"
    kept = decoding.previous_text_tokens(unspaced, tokens)
    assert kept == [tokens.start_of_prev, *tokens.encode(" " + unspaced)[-223:]]


def test_an_alignment_text_longer_than_the_decoder_holds_is_refused_before_it_is_tokenized(tokens):
    counted, lengths = counting(tokens)
    audio = noise(5 * SAMPLE_RATE)
    room = tokens.alignment_room()  # 448 - the start tokens - eot - one token generated
    assert room == 448 - len(tokens.transcription_prompt(None)) - 2
    with pytest.raises(AlignmentInputError, match=f"characters, more than the {room} tokens"):
        decoding.plan_alignment(audio, counted, text="the " * 100_000)
    assert lengths == []
    with pytest.raises(AlignmentInputError, match=f"text is {room + 1} tokens; at most {room} fit"):
        decoding.plan_alignment(audio, counted, text="the " * (room + 1))
    assert len(decoding.plan_alignment(audio, counted, text="the " * room).windows[0].forced_tokens) == room


def test_a_text_with_more_characters_than_the_decoder_holds_is_refused_before_it_is_tokenized(tokens):
    """The characters method takes a token a character (or more): a text of more characters than the
    decoder's room is refused from its words' lengths, a megabyte of it without tokenizing it (a
    megabyte used to be tokenized on the event loop, about 0.6 s, before it was refused)."""
    counted, lengths = counting(tokens)
    audio = noise(5 * SAMPLE_RATE)
    room = tokens.alignment_room()
    for text in ("the cat " * 150_000, "x" * (room + 1)):
        with pytest.raises(AlignmentInputError, match=f"text is {len(text.replace(' ', ''))} characters; at"):
            decoding.plan_alignment(audio, counted, text=text, alignment_method="characters")
    assert lengths == []
    fits = decoding.plan_alignment(audio, counted, text="x" * room, alignment_method="characters")
    assert len(fits.windows[0].forced_tokens) == room


def test_text_forced_one_character_a_token_keeps_its_words(tokens):
    """``alignment_method="characters"`` forces "it's" as " i", "t", "'", "s": the apostrophe, a token
    alone, started a word of its own, so the answer had "'s" and "'m" as words the text does not hold
    (65 words for the 59 of a spontaneous recording)."""
    text = "I'm here, it's fine: well-known words."
    plan = decoding.plan_alignment(noise(32000), tokens, text=text, alignment_method="characters")
    [window] = plan.windows
    ids = tokens.encode_characters(" " + text)
    rows = window.alignment.rows_sent(len(ids))
    cross_qk = np.random.default_rng(0).standard_normal((1, rows, 100)).astype(np.float32)
    result = answered(plan, tokens, cross_qk=cross_qk, text_ids=ids)
    assert [w["word"] for w in result["words"]] == [" " + word for word in text.split()]


# ---------------------------------------------------------------------------- a window with a known prefix


def token_word(text: str, start: float, end: float, tokens: WhisperTokens) -> Word:
    return Word(start, end, text, 0.9, tokens=tokens.encode(text))


def test_a_windows_words_are_matched_to_its_prefix_by_their_tokens(tokens):
    prefix = [token_word(" the", 0.5, 0.6, tokens), token_word(" cat", 0.6, 0.9, tokens)]
    decoded = [replace(w, start=0.0, end=0.1) for w in prefix] + [token_word(" sat", 0.2, 0.3, tokens)]
    assert results.prefix_times(decoded, prefix) == [(0.5, 0.6), (0.6, 0.9)]
    assert results.prefix_times(decoded, []) == []
    # The decode wrote a comma after the prefix's last word: that word holds more than the prefix's.
    merged = [decoded[0], replace(decoded[1], word=" cat,", tokens=tokens.encode(" cat,")), decoded[2]]
    assert results.prefix_times(merged, prefix) == [(0.5, 0.6)]


@pytest.fixture(scope="module")
def sentence():
    return synthesize_sentence("the quick brown fox jumps over the lazy dog near the river bank")


def diagonal_answer(window, word_tokens: list[list[int]], starts: list[float]) -> dict:
    """The worker's answer for ``window`` had its one head attended to each token from its word's start
    (a word's later tokens 40 ms apart) to the next token's time (a plain diagonal), and eot to the
    0.4 s after the last word's start."""
    params = window.alignment
    num_text = sum(len(t) for t in word_tokens)
    frames = params.num_frames // 2
    # A little noise: a frame that every row attends to alike has no z-score.
    qk = 0.1 * np.random.default_rng(0).standard_normal(
        (1, params.rows_sent(num_text), frames), dtype=np.float32
    )
    times = [start + 0.04 * k for t, start in zip(word_tokens, starts, strict=True) for k in range(len(t))]
    first = params.text_rows(num_text).start
    frame_of = [min(int(time / 0.02), frames - 1) for time in [*times, starts[-1] + 0.4]]
    for row, (frame, following) in enumerate(zip(frame_of, [*frame_of[1:], frames], strict=True)):
        qk[:, first + row, frame : max(following, frame + 1)] = 10.0
    return {
        "key": params.key,
        "cross_qk": qk.tobytes(),
        "shape": list(qk.shape),
        "tuned_heads": [0],
        "candidate_heads": [0],
    }


def known_prefix_result(sentence, tokens, method: str, prefix_words: int) -> list[Word]:
    """The sentence's words as the results read them from a diagonal attention (starts 80 ms late:
    ``sentence``'s truth where espeak-ng gave one), with its first ``prefix_words`` words given as the
    window's prefix at their true times."""
    texts = [" " + word for word in sentence.words]
    starts = list(sentence.starts)
    truth_words = [
        token_word(text, start, end, tokens)
        for text, start, end in zip(texts, starts, [*starts[1:], sentence.ends[-1]], strict=True)
    ]
    plan = every_window_planned(
        sentence.samples,
        tokens,
        language="en",
        options=TranscriptionOptions(alignment_method=method),
        prefix=truth_words[:prefix_words],
    )
    [window] = plan.windows
    ids = [t for w in truth_words for t in w.tokens]
    output = results.WindowOutput(ids, [-0.1] * len(ids))
    fetched = [diagonal_answer(window, [w.tokens for w in truth_words], [s + 0.08 for s in starts])]
    return results.finish(plan.decoded([output]), fetched, tokens, plan.info).words


def test_a_windows_prefix_keeps_its_times_and_the_rest_is_placed_from_its_last_words_on(
    sentence, tokens, monkeypatch
):
    """A live stream's decode is given its confirmed words as the window's prefix: they keep the
    prefix's times, and the acoustic model places the words after them on the audio from the start of
    the prefix's last PREFIX_CONTEXT_WORDS words (it had placed every word of the buffer again at every
    decode), as the whole window's placing had them."""
    placed_all = known_prefix_result(sentence, tokens, "auto", 0)
    searched = []

    def place_words(words, samples, offset, language):
        searched.append(([w.word for w in words], offset, len(samples)))
        return phones.place_words(words, samples, offset, language)

    monkeypatch.setattr(results, "place_words", place_words)
    placed_after = known_prefix_result(sentence, tokens, "auto", 6)
    assert [w.word for w in placed_after] == [w.word for w in placed_all]
    context = 6 - results.PREFIX_CONTEXT_WORDS
    [(words, offset, num_samples)] = searched
    assert words == [w.word for w in placed_after[context:]]
    assert offset == pytest.approx(sentence.starts[context], abs=1 / SAMPLE_RATE)
    assert offset + num_samples / SAMPLE_RATE == pytest.approx(len(sentence.samples) / SAMPLE_RATE)
    times = lambda words: [(w.start, w.end) for w in words]  # noqa: E731
    truth = list(zip(sentence.starts, [*sentence.starts[1:], sentence.ends[-1]], strict=True))
    assert times(placed_after[:6]) == truth[:6] != times(placed_all[:6])
    np.testing.assert_allclose(
        [w.start for w in placed_after[6:]], [w.start for w in placed_all[6:]], atol=0.021
    )
