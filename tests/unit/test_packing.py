"""Packing short inputs into one window: the layout, the split of the window's words back to its inputs,
and which inputs share a window (no engine: tests/engine/test_packing.py runs them)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.tokens import whisper_tokens
from vllm_whisper_align.align.packing import WordTokens, owners, token_ranges, word_rows
from vllm_whisper_align.audio import packing
from vllm_whisper_align.constants import N_SAMPLES, N_SAMPLES_PER_TOKEN, SAMPLE_RATE
from vllm_whisper_align.options import AlignmentOptions, TranscriptionOptions
from vllm_whisper_align.runners import packing as packing_runner
from vllm_whisper_align.runners.driver import EngineFacts, Generate
from vllm_whisper_align.runners.packing import ALONE, packed_token_cap, packed_window, packs_of


def test_inputs_start_on_encoder_frames_with_a_gap_of_silence_between():
    inputs = [np.full(n, k + 1, dtype=np.float32) for k, n in enumerate([16_001, 3 * SAMPLE_RATE, 700])]
    laid = packing.pack(inputs)
    assert laid.starts[0] == 0
    for k in range(1, len(inputs)):
        assert laid.starts[k] % N_SAMPLES_PER_TOKEN == 0
        assert laid.starts[k] - (laid.starts[k - 1] + len(inputs[k - 1])) >= packing.GAP_SAMPLES
        gap = laid.samples[laid.starts[k - 1] + len(inputs[k - 1]) : laid.starts[k]]
        assert not gap.any()
    for k, samples in enumerate(inputs):
        assert np.array_equal(laid.samples[laid.starts[k] : laid.starts[k] + len(samples)], samples)
        frames = laid.frames(k)
        assert frames.start * N_SAMPLES_PER_TOKEN == laid.starts[k]
        assert frames.stop - frames.start == len(samples) // N_SAMPLES_PER_TOKEN
    assert len(laid.samples) <= N_SAMPLES


def test_windows_fill_in_order_and_never_overflow():
    lengths = [8 * SAMPLE_RATE, 8 * SAMPLE_RATE, 8 * SAMPLE_RATE, 8 * SAMPLE_RATE, 2 * SAMPLE_RATE]
    windows = packs_of(lengths)
    assert windows == [[0, 1, 2], [3, 4]]
    for window in windows:
        assert packing.fits([lengths[i] for i in window])
    # 2 s clips: 3 s a clip with its gap, so ten to a window
    assert [len(w) for w in packs_of([2 * SAMPLE_RATE] * 25)] == [10, 10, 5]


def test_forced_texts_that_overflow_the_decoder_start_another_window():
    lengths = [2 * SAMPLE_RATE] * 4
    assert packs_of(lengths, [100, 100, 100, 100], 250) == [[0, 1], [2, 3]]
    assert packs_of(lengths, [100, 200, 100, 100], 250) == [[2, 3]]  # 0 and 1 each alone


def test_only_inputs_that_fit_twice_are_packable():
    half = (N_SAMPLES - packing.GAP_SAMPLES) // 2
    assert packing.packable_length(half)
    assert not packing.packable_length(half + N_SAMPLES_PER_TOKEN)
    assert not packing.packable_length(0)
    with pytest.raises(ValueError):
        packing.pack([np.zeros(half + N_SAMPLES_PER_TOKEN, np.float32)] * 2)


def test_only_packable_inputs_share_windows_and_never_alone():
    two = 2 * SAMPLE_RATE
    assert packs_of([two, None, two, two, None]) == [[0, 2, 3]]
    assert packs_of([two, None]) == []  # one packable input runs alone
    assert packs_of([14 * SAMPLE_RATE, 2 * SAMPLE_RATE, 14 * SAMPLE_RATE]) == [[0, 1]]


@pytest.fixture(scope="module")
def tokens(model_dir):
    return whisper_tokens(model_dir)


def test_a_packed_window_decodes_no_more_than_its_inputs_speech_can_hold(tokens):
    """Not the whole window's cap (sized for 30 s of fast speech): a decode that loops, or says a
    sentence again after the last input, stops near its inputs' own text."""
    inputs = [np.full(2 * SAMPLE_RATE, 0.1, np.float32)] * 9
    work = packed_window(
        inputs, EngineFacts(tokens), language="en", task="transcribe", options=TranscriptionOptions()
    )
    command = next(work)
    assert isinstance(command, Generate)
    [request] = command.requests
    cap = packed_token_cap([len(samples) for samples in inputs])
    assert cap == 9 * (4 + 12)
    # one more than the cap with word timings: the last token's decoder row (decoding.text_token_cap)
    assert request.sampling_params.max_tokens == cap + 1
    work.close()


def test_every_input_of_a_pack_gets_a_transcript_even_those_sent_alone(monkeypatch, tokens):
    """An input whose own text fails the fallback test (ALONE) runs alone at once; one the window did
    not split (None) is packed again with the others like it, then runs alone: each gets its own
    transcript back, in its place (the offline API once answered the first with the string "alone")."""
    inputs = [np.full(SAMPLE_RATE, float(k), np.float32) for k in range(5)]
    windows: list[list[float]] = []

    def window(samples, facts, **_):
        windows.append([float(s[0]) for s in samples])
        if len(windows) == 1:
            return [
                f"packed {s[0]:.0f}" if k in (0, 3) else (ALONE if k == 1 else None)
                for k, s in enumerate(samples)
            ]
        return [None] * len(samples)  # the second window splits nothing either
        yield  # a driver

    def alone(samples, facts, **_):
        return f"alone {samples[0]:.0f}"
        yield  # a driver

    monkeypatch.setattr(packing_runner, "packed_window", window)
    monkeypatch.setattr(packing_runner, "transcription", alone)
    work = packing_runner.packed_transcriptions(
        inputs, EngineFacts(tokens), language="en", task="transcribe", options=TranscriptionOptions()
    )
    with pytest.raises(StopIteration) as done:
        next(work)
    assert done.value.value == ["packed 0", "alone 1", "alone 2", "packed 3", "alone 4"]
    assert windows == [[0, 1, 2, 3, 4], [2, 4]]  # the one sent alone at once is not packed again


def _words(*counts: int) -> list[WordTokens]:
    groups, position = [], 0
    for count in counts:
        groups.append(WordTokens(list(range(position, position + count)), count))
        position += count
    return groups


def test_words_go_to_the_inputs_they_look_at_in_order():
    # 4 one-token words and eot's row; input 0 is looked at by words 0-1, input 1 by words 2-3, but word
    # 2's row alone leans to input 0: the row after it (word 3's) says where it is spoken.
    scores = np.array([[3.0, 0.0], [3.0, 0.0], [1.2, 1.0], [0.0, 3.0], [0.0, 3.0]])
    groups = _words(1, 1, 1, 1)
    assert [word_rows(g) for g in groups][2] == slice(2, 4)
    assert owners(scores, groups) == [0, 0, 1, 1]
    assert token_ranges(scores, groups, 2) == [(0, 2), (2, 4)]


def test_an_input_no_word_looks_at_runs_alone():
    scores = np.array([[3.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 3.0]])
    assert token_ranges(scores, _words(1, 1), 3) == [(0, 1), None, (1, 2)]


def test_a_word_whose_tokens_look_at_two_inputs_sends_both_alone():
    # word 1 has two spoken tokens, one looking at each input: Whisper ran it across the gap
    scores = np.array([[3.0, 0.0], [3.0, 0.0], [0.0, 3.0], [0.0, 3.0]])
    ranges = token_ranges(scores, _words(1, 2), 2)
    assert None in ranges


def test_punctuation_after_a_word_does_not_split_it():
    # "mat" then "." (a mark kept with it): the mark's row looks at the next input, the word does not
    scores = np.array([[3.0, 0.0], [4.0, 0.0], [0.0, 3.0], [0.0, 3.0], [0.0, 3.0]])
    groups = [WordTokens([0], 1), WordTokens([1, 2], 1), WordTokens([3], 1)]
    assert token_ranges(scores, groups, 2) == [(0, 3), (3, 4)]


def test_words_squeezed_into_no_time_or_speech_left_without_words_are_not_an_inputs_own():
    """A packed input's words are believed only where its audio holds them: the sample (espeak, a word
    every 0.4-0.9 s) with its own words, with a neighbour's words squeezed into its first 0.46 s (as
    DTW places words its audio does not have), and with all but its last two words missing."""
    from vllm_whisper_align.align.packing import holds_its_own_words
    from vllm_whisper_align.align.words import Word
    from vllm_whisper_align.audio.decode import decode_audio
    from vllm_whisper_align.checkpoints.bundled import sample_path

    sample = decode_audio(str(sample_path()))
    spans = [(0.5, 0.8), (0.98, 1.4), (1.68, 2.14), (2.56, 3.1), (3.32, 3.88), (4.22, 4.66), (4.84, 5.14)]
    spans += [(5.44, 5.9), (6.28, 6.7)]
    said = "The quick brown fox jumps over the lazy dog".split()
    own = [Word(a, b, f" {w}", 0.9) for w, (a, b) in zip(said, spans, strict=True)]
    assert holds_its_own_words(own, sample)
    squeezed = [Word(0.0, 0.46, " round", 0.4), *[Word(0.46, 0.46, f" {w}", 0.8) for w in said[3:]]]
    assert not holds_its_own_words(squeezed + own, sample)
    assert not holds_its_own_words(own[-2:], sample)
    assert holds_its_own_words(own[1:], sample)  # the first word missing: cut off, not taken


def test_a_multilingual_models_forced_text_is_read_before_its_language_is_known():
    """base's alignment room is the same for every language: a forced alignment without a language
    (English by default) was refused by the offline API and by packing ("a multilingual model needs a
    language") before its language was ever needed."""
    from vllm_whisper_align.checkpoints.bundled import base_model_path, default_model_path

    rooms = {}
    for path in (base_model_path(), default_model_path()):
        tokens = whisper_tokens(path)
        given = packing_runner.given_tokens(" Hello there.", None, tokens)
        assert given, path
        assert packing_runner.alignable(
            np.zeros(SAMPLE_RATE, dtype=np.float32), given, tokens, AlignmentOptions()
        )
        rooms[tokens.is_english_only] = tokens.alignment_room()
    assert rooms[False] == rooms[True] - 2  # [sot, language, task, no_timestamps], [sot, no_timestamps]
