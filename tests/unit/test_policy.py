"""openai-whisper's per-window policy (runners/decoding.py) against its transcribe, without an engine."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from transformers import AutoTokenizer
from whisper.transcribe import transcribe as reference_transcribe

from tests.support.plans import every_window_planned
from vllm_whisper_align.align.results import WindowOutput
from vllm_whisper_align.errors import AlignmentInputError, OptionError
from vllm_whisper_align.longform.steps import check_method
from vllm_whisper_align.options import FallbackOptions, TranscriptionOptions, temperature_schedule
from vllm_whisper_align.runners import decoding
from vllm_whisper_align.runners.decoding import fall_back, is_silent, needs_fallback
from vllm_whisper_align.tokens import WhisperTokens


@pytest.fixture(scope="module")
def tokens(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return WhisperTokens.from_tokenizer(tokenizer, 51864)


def test_defaults_are_the_references():
    defaults = inspect.signature(reference_transcribe).parameters
    options = FallbackOptions()
    assert options.temperatures == defaults["temperature"].default
    for name in ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold"):
        assert getattr(options, name) == defaults[name].default, name


@pytest.mark.parametrize("start", [0.0, 0.1, 0.5, 1.0])
def test_schedule_is_the_reference_clis(start):
    """openai-whisper's CLI: np.arange(temperature, 1.0 + 1e-6, temperature_increment_on_fallback)."""
    assert temperature_schedule(start) == pytest.approx(tuple(np.arange(start, 1.0 + 1e-6, 0.2)))
    assert temperature_schedule(1.5) == (1.5,)


@pytest.mark.parametrize("ratio", [1.0, 3.0])
@pytest.mark.parametrize("logprob", [-0.5, -1.5])
@pytest.mark.parametrize("no_speech", [0.1, 0.9])
def test_fallback_and_silence_rules_are_the_references(ratio, logprob, no_speech):
    """The conditions of openai-whisper's decode_with_fallback and its no-voice-activity skip."""
    output = WindowOutput(
        [1], [logprob], avg_logprob=logprob, compression_ratio=ratio, no_speech_prob=no_speech
    )
    reference_fallback = (ratio > 2.4 or logprob < -1.0) and not (no_speech > 0.6 and logprob < -1.0)
    reference_skip = no_speech > 0.6 and not logprob > -1.0
    assert needs_fallback(output, FallbackOptions()) == reference_fallback
    assert is_silent(output, FallbackOptions()) == reference_skip
    assert not is_silent(output, FallbackOptions(no_speech_threshold=None))


def test_fall_back_replaces_only_failing_windows_with_fresh_keys(tokens):
    samples = np.zeros(16000 * 65, dtype=np.float32)
    plan = every_window_planned(samples, tokens, language="en")
    first = list(plan.windows)
    good = WindowOutput([1], [-0.1], avg_logprob=-0.1, compression_ratio=1.0)
    bad = WindowOutput([1], [-2.0], avg_logprob=-2.0, compression_ratio=1.0)
    outputs = [good, bad, good]
    retried, superseded = fall_back(plan, outputs, [0, 1, 2])
    assert retried == [1] and superseded == []  # the failed attempt is kept until a better one passes
    assert plan.windows[0] is first[0] and plan.windows[2] is first[2]
    again = plan.windows[1]
    assert again.temperature == pytest.approx(0.2) and again.attempt == 1
    assert not set(again.capture_keys()) & set(first[1].capture_keys())
    assert again.no_speech.row == first[1].no_speech.row == 0 and again.no_speech.token == tokens.no_speech
    tried = [again]
    for _ in range(10):  # at most the schedule's length
        retried, _ = fall_back(plan, outputs, retried)
        tried += [plan.windows[1]] if retried else []
    assert retried == [] and [w.temperature for w in tried] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert plan.windows[1] is first[1]  # every attempt as unlikely: the first stays


def test_when_every_temperature_fails_the_most_likely_attempt_stays(tokens):
    """faster-whisper's rule, not openai-whisper's (which keeps the last, at temperature 1.0): the least
    repetitive attempt, then the most probable; the others' captures go. One that passes wins outright."""
    samples = np.zeros(16000 * 20, dtype=np.float32)
    plan = every_window_planned(samples, tokens, language="en")
    figures = [(-1.6, 1.0), (-1.2, 3.0), (-1.4, 1.5), (-3.0, 1.0), (-4.0, 1.2), (-5.2, 1.1)]  # T 0 .. 1
    attempts, discarded, pending = [], [], [0]
    for avg_logprob, ratio in figures:
        attempts.append(plan.windows[0])
        outputs = [WindowOutput([1], [avg_logprob], avg_logprob=avg_logprob, compression_ratio=ratio)]
        pending, superseded = fall_back(plan, outputs, pending)
        discarded += superseded
    assert pending == [] and plan.windows[0] is attempts[2] and outputs[0].avg_logprob == -1.4
    kept = set(attempts[2].capture_keys())
    assert not kept & set(discarded)
    assert set(discarded) == {k for a in attempts for k in a.capture_keys()} - kept  # nothing left parked

    plan = every_window_planned(samples, tokens, language="en")
    first = plan.windows[0]
    fall_back(plan, [WindowOutput([1], [-1.5], avg_logprob=-1.5, compression_ratio=1.0)], [0])
    passing = [WindowOutput([1], [-0.5], avg_logprob=-0.5, compression_ratio=1.0)]
    pending, superseded = fall_back(plan, passing, [0])
    assert pending == [] and plan.windows[0].attempt == 1 and superseded == first.capture_keys()


@pytest.mark.parametrize("best_of", [1, 5])
def test_sampled_attempts_run_best_of_candidates_with_their_own_seeds_and_keys(tokens, best_of):
    samples = np.zeros(16000 * 20, dtype=np.float32)
    options = TranscriptionOptions(best_of=best_of)
    plan = every_window_planned(samples, tokens, language="en", options=options)
    assert plan.windows[0].candidates() == (plan.windows[0],)  # greedy: one
    fall_back(plan, [WindowOutput([1], [-2.0], avg_logprob=-2.0, compression_ratio=1.0)], [0])
    candidates = plan.windows[0].candidates()
    assert len(candidates) == best_of
    assert len({c.sampling_params.seed for c in candidates}) == best_of
    assert len({c.alignment.key for c in candidates}) == best_of
    assert [c.temperature for c in candidates] == pytest.approx([0.2] * best_of)
    # no_speech_prob is read once, at the step every candidate shares.
    assert [c.no_speech is not None for c in candidates] == [True] + [False] * (best_of - 1)
    assert set(plan.windows[0].capture_keys()) >= {c.alignment.key for c in candidates}


def test_keep_best_ranks_as_the_references_maximum_likelihood_ranker(tokens):
    import torch
    from whisper.decoding import MaximumLikelihoodRanker

    samples = np.zeros(16000 * 20, dtype=np.float32)
    options = TranscriptionOptions(best_of=3)
    plan = every_window_planned(samples, tokens, language="en", options=options)
    fall_back(plan, [WindowOutput([1], [-2.0], avg_logprob=-2.0, compression_ratio=1.0)], [0])
    window = plan.windows[0]
    # (text token logprobs, eot logprob): a short confident text, a long one, a short improbable one.
    drafts = [([-0.5, -0.5], -0.1), ([-0.3] * 10, -0.2), ([-2.0], -0.5)]
    outputs = [
        WindowOutput(
            list(range(len(lps))),
            lps,
            avg_logprob=(sum(lps) + eot) / (len(lps) + 1),
            no_speech_prob=0.3 if i == 0 else 0.0,
        )
        for i, (lps, eot) in enumerate(drafts)
    ]
    ranked = MaximumLikelihoodRanker(None).rank(
        [[torch.zeros(len(lps)) for lps, _ in drafts]], [[sum(lps) + eot for lps, eot in drafts]]
    )[0]
    kept, kept_outputs, dropped = decoding.keep_best([window], outputs)
    best = window.candidates()[ranked]
    assert kept[0].alignment.key == best.alignment.key and kept[0].siblings == ()
    assert kept_outputs[0].token_logprobs == outputs[ranked].token_logprobs
    assert kept_outputs[0].no_speech_prob == 0.3  # the primary's reading
    assert set(dropped) == {c.alignment.key for c in window.candidates()} - {best.alignment.key}


def test_best_of_is_checked():
    for best_of in (0, 21, 2.5):
        with pytest.raises(OptionError, match="best_of"):
            TranscriptionOptions.of(best_of=best_of)


def test_no_speech_row_is_after_the_previous_text(tokens):
    plan = every_window_planned(np.zeros(16000, np.float32), tokens, language="en", prompt="hello there")
    window = plan.windows[0]
    assert window.prompt_token_ids[window.no_speech.row] == tokens.sot
    assert window.alignment.sot_row == window.no_speech.row


def test_bad_options_are_refused(tokens):
    for name, value in (
        ("no_speech_threshold", 1.5),
        ("logprob_threshold", float("nan")),
        ("compression_ratio_threshold", -1),
        ("temperature", -0.2),
    ):
        with pytest.raises(OptionError, match=name):
            TranscriptionOptions.of(**{name: value})


def test_characters_force_one_token_per_character(tokens):
    samples = np.zeros(3 * 16000, dtype=np.float32)
    plan = decoding.plan_alignment(samples, tokens, text="Cat sat, warm.", alignment_method="characters")
    [window] = plan.windows
    pieces = [tokens.decode([t]) for t in window.forced_tokens]
    assert pieces == [" C", "a", "t", " s", "a", "t", ",", " w", "a", "r", "m", "."]
    assert tokens.decode(window.forced_tokens) == " Cat sat, warm."
    assert window.alignment.alignment_method == "characters"
    by_ids = decoding.plan_alignment(
        samples, tokens, token_ids=tokens.encode(" Cat sat, warm."), alignment_method="characters"
    )
    assert by_ids.windows[0].forced_tokens == window.forced_tokens


def test_characters_are_for_forced_alignment_of_one_window(tokens):
    with pytest.raises(OptionError, match="forced alignment"):
        every_window_planned(
            np.zeros(16000, dtype=np.float32),
            tokens,
            language="en",
            options=TranscriptionOptions(alignment_method="characters"),
        )
    with pytest.raises(OptionError, match="at most one window"):
        check_method("characters")
    check_method("auto")
    too_long = "word " * 300  # 1500 characters: over the decoder's 448 tokens
    with pytest.raises(AlignmentInputError, match="characters; at most"):
        decoding.plan_alignment(
            np.zeros(16000 * 20, dtype=np.float32), tokens, text=too_long, alignment_method="characters"
        )
