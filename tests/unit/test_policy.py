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


# ---------------------------------------------------------------------------- later temperatures at once


def _final(tokens, text: str, avg_logprob: float):
    """vLLM's final output of a decode of ``text`` whose every token (and eot) has ``avg_logprob``."""
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    ids = [*tokens.encode(text), tokens.eot]
    logprobs = [{token: Logprob(avg_logprob)} for token in ids]
    completion = CompletionOutput(0, text, ids, None, logprobs, finish_reason="stop")
    return RequestOutput("r", None, [], None, [completion], True)


def _fall_back_scripted(tokens, figures, silent=(), order=None, best_of=1, at_once=True):
    """One window of placeholder audio through the driver's fallback, each engine request answered from
    ``figures`` (its temperature's avg_logprob), ``silent`` temperatures' no-speech probability 0.9
    (others 0.1). ``order``: positions of the at-once round's requests as they finish, each finish
    followed by the command's ``unneeded`` (as the server's runner does); None: every request answered,
    as the offline runner's lockstep round does. Returns the kept output, the round's positions cut
    short, and every capture key discarded."""
    from vllm_whisper_align.runners import driver

    options = TranscriptionOptions(best_of=best_of, temperatures_at_once=at_once)
    samples = np.zeros(16000 * 20, dtype=np.float32)
    plan = every_window_planned(samples, tokens, language="en", options=options)
    outputs: list = [None]
    work = driver.decode_windows(plan, outputs, [0], tokens)
    silent_keys, cut, discarded, reply = set(), set(), [], None
    while True:
        try:
            command = work.send(reply)
        except StopIteration:
            return outputs[0], cut, discarded, plan
        if isinstance(command, driver.Generate):
            temperatures = [round(r.sampling_params.temperature, 1) for r in command.requests]
            for request, temperature in zip(command.requests, temperatures, strict=True):
                silent_keys |= set(request.capture_keys) if temperature in silent else set()
            reply = [None] * len(command.requests)
            for j in order if order is not None and len(reply) > 1 else range(len(reply)):
                if j in cut:
                    continue
                reply[j] = _final(tokens, "the cat sat", figures[temperatures[j]])
                if order is not None and command.unneeded is not None:
                    cut |= set(command.unneeded(reply))
        elif isinstance(command, driver.NoSpeech):
            reply = [{"key": k, "no_speech_prob": 0.9 if k in silent_keys else 0.1} for k in command.keys]
        else:
            assert isinstance(command, driver.Discard), command
            discarded += command.keys
            reply = None


@pytest.mark.parametrize("best_of", [1, 2])
def test_later_temperatures_at_once_cut_what_follows_an_outright_pass_and_keep_what_in_turn_keeps(
    tokens, best_of
):
    """The server decodes a short window's later temperatures at once; once one has finished and passes
    openai-whisper's test outright (whatever its no-speech probability), the unfinished attempts after it
    are cut short (``Generate.unneeded``): read in order, the window stops there or before. The attempt
    kept is the one the schedule run in turn keeps, however the attempts finish; every other capture is
    discarded, the cut ones' too."""
    figures = {0.0: -2.0, 0.2: -1.5, 0.4: -0.5, 0.6: -0.4, 0.8: -3.0, 1.0: -0.3}
    in_turn, _, _, _ = _fall_back_scripted(tokens, figures, best_of=best_of, at_once=False)
    assert in_turn.temperature == pytest.approx(0.4)
    candidates = [range(k * best_of, (k + 1) * best_of) for k in range(5)]  # T 0.2 .. 1.0
    # 0.6 finishes first and passes: 0.8 and 1.0 are cut; then 0.4 passes, and is kept.
    order = [*candidates[2], *candidates[1], *candidates[0], *candidates[3], *candidates[4]]
    kept, cut, discarded, plan = _fall_back_scripted(tokens, figures, order=order, best_of=best_of)
    assert kept.temperature == pytest.approx(0.4) and kept.avg_logprob == pytest.approx(in_turn.avg_logprob)
    assert cut == {*candidates[3], *candidates[4]}
    kept_keys = set(plan.windows[0].capture_keys())
    assert kept_keys and not kept_keys & set(discarded)
    # Every attempt's captures but the kept one's are discarded: greedy's, 0.2's, 0.6's, the cut ones'.
    assert len(discarded) == len(set(discarded)) == 5 * (best_of + 1) + 1 - len(kept_keys) + 1
    # In order of the schedule, nothing is cut after 0.4 until it has finished.
    kept, cut, _, _ = _fall_back_scripted(tokens, figures, order=range(5 * best_of), best_of=best_of)
    assert kept.temperature == pytest.approx(0.4) and cut == {j for k in (2, 3, 4) for j in candidates[k]}
    # A runner that answers the whole round (the offline API's) keeps the same.
    kept, cut, _, _ = _fall_back_scripted(tokens, figures, best_of=best_of)
    assert kept.temperature == pytest.approx(0.4) and cut == set()


def test_an_attempt_that_passes_only_as_silence_cuts_nothing(tokens):
    """An attempt too improbable but silent passes only once the workers give its no-speech probability,
    which comes after the round: nothing is cut on it, and it is kept as in turn."""
    figures = {0.0: -2.0, 0.2: -1.5, 0.4: -3.0, 0.6: -0.4, 0.8: -3.0, 1.0: -0.3}
    in_turn, _, _, _ = _fall_back_scripted(tokens, figures, silent={0.2}, at_once=False)
    kept, cut, _, _ = _fall_back_scripted(tokens, figures, silent={0.2}, order=[0, 1, 3, 2, 4])
    assert in_turn.temperature == kept.temperature == pytest.approx(0.2)
    assert cut == {4}  # 0.6 passes outright once finished: only what follows it goes
