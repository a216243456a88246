"""Planning windows and turning answers into results without an engine: windows too short to align."""

from dataclasses import replace

import numpy as np
import pytest
from transformers import AutoConfig, AutoTokenizer

from tests.support.plans import every_window_planned
from vllm_whisper_align.align import results
from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.errors import AlignmentInputError
from vllm_whisper_align.runners import decoding
from vllm_whisper_align.tokens import WhisperTokens

TEXT = " Hello there."


@pytest.fixture(scope="module")
def tokens(model_dir):
    vocab_size = AutoConfig.from_pretrained(model_dir).vocab_size
    return WhisperTokens.from_tokenizer(AutoTokenizer.from_pretrained(model_dir), vocab_size)


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
