"""The in-engine capture through a real vLLM engine: parity, accuracy, batching, cleanup."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import whisper
from whisper.timing import find_alignment

from tests.support.plans import every_window_planned
from vllm_whisper_align.engine.settings import CPU_ENCODER_WINDOWS_PER_STEP
from vllm_whisper_align.errors import AlignmentInputError
from vllm_whisper_align.options import FallbackOptions, TranscriptionOptions
from vllm_whisper_align.runners import driver
from vllm_whisper_align.runners.decoding import plan_transcription

# The capture's tests decode greedily (no temperature fallback): their subject is where the words
# are, and the same text alone and in any batch. The fallback has tests of its own below.
GREEDY = {"compression_ratio_threshold": None, "logprob_threshold": None}


def word_starts(result) -> np.ndarray:
    return np.array([w.start for w in result.words])


def word_ends(result) -> np.ndarray:
    return np.array([w.end for w in result.words])


def reference_words(reference, samples, text_tokens):
    """openai-whisper's find_alignment on the same audio and tokens (float32, CPU)."""
    model, tokenizer = reference
    mel = whisper.log_mel_spectrogram(
        torch.from_numpy(samples), model.dims.n_mels, padding=whisper.audio.N_SAMPLES
    )
    num_frames = len(samples) // whisper.audio.HOP_LENGTH
    mel = mel[:, : whisper.audio.N_FRAMES]
    return find_alignment(model, tokenizer, text_tokens, mel, num_frames)


def test_forced_alignment_matches_openai_whisper(aligner, clips, reference):
    """Same text tokens, the fixed heads (the reference's way): word starts and ends within 0.02 s of
    the reference for >= 99% of words."""
    tokens_per_clip = [aligner.tokens.encode(" " + clip.text) for clip in clips]
    ours = aligner.align([c.samples for c in clips], token_ids=tokens_per_clip, alignment_method="fixed")
    diffs = []
    for clip, text_tokens, result in zip(clips, tokens_per_clip, ours, strict=True):
        ref = [w for w in reference_words(reference, clip.samples, text_tokens)]
        ref_times = [(w.start, w.end) for w in ref]
        # Compare before punctuation merging and duration rules: the reference's raw words.
        ours_raw = _raw_word_times(result, aligner)
        assert len(ours_raw) == len(ref_times)
        diffs += [
            abs(a - b)
            for pair_a, pair_b in zip(ours_raw, ref_times, strict=True)
            for a, b in zip(pair_a, pair_b, strict=True)
        ]
    diffs = np.array(diffs)
    assert (diffs <= 0.02 + 1e-6).mean() >= 0.99, f"max diff {diffs.max():.3f}s"


def _raw_word_times(result, aligner):
    """Group our token times into the reference's raw words (split on spaces, eot closes)."""
    from vllm_whisper_align.align.words import split_to_word_tokens

    ids = [t.id for t in result.tokens]
    _, groups = split_to_word_tokens(
        ids + [aligner.tokens.eot], aligner.tokens.decode_with_special, aligner.tokens.eot, "en"
    )
    times, index = [], 0
    for group in groups[:-1]:
        first, last = result.tokens[index], result.tokens[index + len(group) - 1]
        times.append((first.start, last.end))
        index += len(group)
    return times


def test_transcription_word_starts_near_truth(aligner, clips):
    """>= 75% of word starts within 200 ms of where espeak-ng really spoke them."""
    from tests.support.speech import start_errors

    results = aligner.transcribe([c.samples for c in clips], word_timestamps=True, **GREEDY)
    errors = np.concatenate(
        [start_errors(clip, result.words) for clip, result in zip(clips, results, strict=True)]
    )
    assert (errors <= 0.2).mean() >= 0.75, f"within 200 ms: {(errors <= 0.2).mean():.2%}"


def test_transcription_timings_agree_with_forced_alignment(aligner, clips):
    """Transcription lacks the reference's eot row in the normalisation; measure what that costs (each
    clip in its own window, as the forced pass runs it)."""
    transcribed = aligner.transcribe(
        [c.samples for c in clips], word_timestamps=True, packing=False, **GREEDY
    )
    token_ids = [[t.id for t in r.tokens] for r in transcribed]
    forced = aligner.align([c.samples for c in clips], token_ids=token_ids)
    diffs = np.concatenate(
        [
            np.abs([t.start for t in a.tokens] - np.array([t.start for t in b.tokens]))
            for a, b in zip(transcribed, forced, strict=True)
        ]
    )
    within = (diffs <= 0.02 + 1e-6).mean()
    assert within >= 0.9, f"token starts within 20 ms: {within:.2%}"


# A prompt unrelated to the clips (openai-whisper's initial_prompt), long enough to span many rows.
PROMPT = "Notes from the reading group. Everyone read a few short sentences aloud, one after another."


def test_a_prompt_leaves_the_words_where_they_were_spoken(aligner, clips):
    """A prompt's rows come before the transcript's: word starts with a prompt are as near the truth
    as without one (within 50 ms: at most 5 points fewer)."""
    from tests.support.speech import start_errors

    def within_50ms(results):
        errors = np.concatenate([start_errors(c, r.words) for c, r in zip(clips, results, strict=True)])
        return (errors <= 0.05).mean()

    # A prompted input is never packed: the plain ones are not either, so that only the prompt differs.
    plain = within_50ms(aligner.transcribe([c.samples for c in clips], packing=False, **GREEDY))
    prompted = within_50ms(aligner.transcribe([c.samples for c in clips], prompt=PROMPT, **GREEDY))
    assert prompted >= plain - 0.05, f"within 50 ms: {prompted:.2%} with the prompt, {plain:.2%} without"


def test_a_prompt_is_read_as_openai_whisper_reads_it(aligner, clips, reference):
    """The decoder sees ``<|startofprev|>`` prompt ``<|startoftranscript|>`` …, as openai-whisper's
    ``DecodingOptions.prompt``: greedy text with the prompt is the reference's, clip for clip."""
    model, _ = reference
    ours = aligner.transcribe([c.samples for c in clips], prompt=PROMPT, word_timestamps=False, **GREEDY)
    options = whisper.DecodingOptions(language="en", prompt=PROMPT, without_timestamps=True, fp16=False)
    theirs = []
    for clip in clips:
        mel = whisper.log_mel_spectrogram(
            torch.from_numpy(clip.samples), model.dims.n_mels, padding=whisper.audio.N_SAMPLES
        )
        theirs.append(whisper.decode(model, mel[:, : whisper.audio.N_FRAMES], options).text)
    same = sum(a.text.strip() == b.strip() for a, b in zip(ours, theirs, strict=True))
    assert same >= len(clips) - 1, list(zip([r.text for r in ours], theirs, strict=True))


def test_batched_requests_match_each_alone(aligner, clips):
    """N different clips in one continuous batch, word timestamps on for some and off for others.
    On CPU a step starts CPU_ENCODER_WINDOWS_PER_STEP windows' encoders (vLLM alone would start one):
    each clip's keys are captured from its own rows of that step."""
    samples = [c.samples for c in clips]
    assert len(samples) >= CPU_ENCODER_WINDOWS_PER_STEP
    alone = [aligner.transcribe([s], word_timestamps=True, **GREEDY)[0] for s in samples[:4]]
    # each its own engine request (packed, a clip's decoder would read its neighbours' text)
    batch = aligner.transcribe(samples, word_timestamps=True, packing=False, **GREEDY)
    assert aligner.capture_stats()["most_encoder_inputs_per_step"] == CPU_ENCODER_WINDOWS_PER_STEP
    plain = aligner.transcribe(samples, word_timestamps=False, **GREEDY)
    for single, together in zip(alone, batch[:4], strict=True):
        assert single.text == together.text
        np.testing.assert_allclose(word_starts(single), word_starts(together), atol=0.02 + 1e-6)
        np.testing.assert_allclose(word_ends(single), word_ends(together), atol=0.02 + 1e-6)
    for without, with_words in zip(plain, batch, strict=True):
        assert without.words is None
        assert without.text == with_words.text


def test_mixed_alignment_in_one_generate_call(aligner, clips):
    """One generate() call where half the requests ask for alignment and half do not."""
    plans = [
        plan_transcription(
            c.samples,
            aligner.tokens,
            language="en",
            word_timestamps=i % 2 == 0,
            suppress_tokens=aligner.suppress_tokens,
            options=TranscriptionOptions(**GREEDY),
        )
        for i, c in enumerate(clips)
    ]
    results = aligner.run_plans(plans, use_tqdm=False)
    alone = aligner.transcribe([clips[0].samples, clips[2].samples], word_timestamps=True, **GREEDY)
    for result, single in zip([results[0], results[2]], alone, strict=True):
        np.testing.assert_allclose(word_starts(result), word_starts(single), atol=0.02 + 1e-6)
    assert all(r.words is None for r in results[1::2])
    assert aligner.capture_stats()["tracked"] == 0


def test_more_requests_than_max_num_seqs(aligner, clips):
    """Several times max_num_seqs aligned requests in one call: once the batch is full, a step
    admits a new request while the one it replaces is only reported finished in that same step,
    so more requests than max_num_seqs hold capture state at once. Every one gets its words."""
    max_num_seqs = aligner.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs
    repeats = -(-3 * max_num_seqs // len(clips))
    samples = [c.samples for c in clips] * repeats
    results = aligner.transcribe(samples, word_timestamps=True, **GREEDY)
    assert len(samples) > 2 * max_num_seqs
    for i, result in enumerate(results):
        first = results[i % len(clips)]
        assert result.text == first.text and result.words, i
        np.testing.assert_allclose(word_starts(result), word_starts(first), atol=0.02 + 1e-6)
    stats = aligner.capture_stats()
    assert stats["tracked"] == 0 and stats["parked"] == 0, stats
    assert stats["slots"] <= 2 * max_num_seqs, stats


def test_long_audio_has_absolute_monotonic_times(aligner):
    from tests.support.speech import long_clip, start_errors

    clip = long_clip(65.0)
    result = aligner.transcribe([clip.samples], word_timestamps=True, **GREEDY)[0]
    starts = word_starts(result)
    assert result.duration > 60
    assert starts[-1] > 55, "words after the first window carry absolute times"
    assert np.all(np.diff(starts) >= 0)
    errors = start_errors(clip, result.words)
    # No word lost or doubled at the joins: nearly every spoken word is heard once, no extras.
    assert np.isfinite(errors).mean() >= 0.85 and len(result.words) <= len(clip.words) + 3
    assert (errors <= 0.2).mean() >= 0.75


def test_store_is_empty_after_requests_and_aborts(aligner, clips):
    """Aborted requests free their slots; unfetched results wait until discarded; fetched ones are gone.
    (Expiry after the TTL is covered without an engine in tests/test_capture.py.)"""
    engine = aligner.llm.llm_engine
    keys, no_speech_keys = [], []
    for i, clip in enumerate(clips * 2):
        plan = plan_transcription(clip.samples, aligner.tokens, language="en")
        window = plan.windows[0]
        keys.append(window.alignment.key)
        no_speech_keys.append(window.no_speech.key)
        engine.add_request(f"abort-{i}", window.engine_prompt(), window.sampling_params)
    for _ in range(3):
        engine.step()
    engine.abort_request([f"abort-{i}" for i in range(0, len(keys), 2)])
    while engine.has_unfinished_requests():
        engine.step()
    stats = aligner.capture_stats()
    assert stats["tracked"] == 0 and stats["free_slots"] == stats["slots"], stats
    # Every finished request waits for its fetch; so do aborted ones the worker had started.
    assert len(keys) // 2 <= stats["parked"] <= len(keys), stats
    # The no-speech probabilities of the requests that got that far wait too.
    assert aligner.discard(keys + no_speech_keys) == stats["parked"] + stats["no_speech_parked"]
    stats = aligner.capture_stats()
    assert stats["parked"] == 0 and stats["parked_bytes"] == 0, stats
    # And after a normal round everything fetched is freed at once.
    aligner.transcribe([c.samples for c in clips], word_timestamps=True)
    assert aligner.capture_stats()["parked"] == 0


def test_forced_alignment_rejects_what_does_not_fit(aligner, clips):
    with pytest.raises(AlignmentInputError, match="448"):
        aligner.align([clips[0].samples], ["word " * 500])
    # Over one window there is no 30 s refusal: text too short to tell is forced on both sides
    # of the cut (longform; a window's share over the context is refused in tests/test_longform.py).
    over_one_window = aligner.align([np.zeros(31 * 16000, dtype=np.float32)], ["hello"])[0]
    assert [w.word for w in over_one_window.words] == [" hello"]
    assert 0 <= over_one_window.words[0].start <= over_one_window.words[0].end <= 31
    with pytest.raises(AlignmentInputError, match="token ids"):
        aligner.align([clips[0].samples], token_ids=[[aligner.tokens.eot + 5]])


SILENCE_60S = np.zeros(16000 * 60, dtype=np.float32)
NOISE_60S = np.random.default_rng(0).normal(0.0, 0.1, 16000 * 60).astype(np.float32)


def test_silence_and_noise_give_no_words(aligner):
    """openai-whisper's transcribe defaults give 2 words for 60 s of digital silence and none for
    60 s of white noise on these weights; nothing stays kept in the worker afterwards."""
    silence, noise = aligner.transcribe([SILENCE_60S, NOISE_60S], word_timestamps=True)
    assert len(silence.words) <= 2, silence.text
    assert noise.words == [] and noise.text == "", noise.text
    assert silence.duration == pytest.approx(60.0)
    stats = aligner.capture_stats()
    assert stats["tracked"] == stats["parked"] == stats["no_speech_parked"] == 0, stats


def test_a_text_forced_onto_noise_is_not_searched_by_the_acoustic_model(aligner, clips, monkeypatch):
    """A window without a frame of speech gives the acoustic model of phones nothing to place words on,
    and on noise its search is its costliest (every path kept: 1-3 s a window): the words keep the
    heads' times, inside the audio. The same text on its speech is searched (the control)."""
    from vllm_whisper_align.audio import phones

    searched = []
    real_align = phones._workers.align
    monkeypatch.setattr(phones._workers, "align", lambda u: searched.append(len(u)) or real_align(u))
    clip = clips[1]
    noise = NOISE_60S[: 30 * 16000]
    [result] = aligner.align([noise], [clip.text], language="en", alignment_method="auto")
    assert [w.word.strip(" .,").lower() for w in result.words] == [w.lower() for w in clip.words]
    assert all(0 <= w.start <= w.end <= 30.0 for w in result.words)
    assert searched == []
    aligner.align([clip.samples], [clip.text], language="en", alignment_method="auto")
    assert searched


def test_no_more_words_in_a_silent_tail_than_the_reference(aligner, clips, reference):
    """Speech, then 60 s of silence: the speech is still heard, and the silence gets no more words
    than openai-whisper's transcribe (its defaults) hears in it on the same weights."""
    clip = clips[1]
    samples = np.concatenate([clip.samples, np.zeros(16000 * 60, dtype=np.float32)])
    result = aligner.transcribe([samples], word_timestamps=True)[0]
    spoken = [w.lower().strip(".,") for w in clip.words]
    heard = [w.word.lower().strip(" .,") for w in result.words]
    assert len(set(spoken) & set(heard)) >= 0.75 * len(set(spoken)), result.text
    model, _ = reference
    theirs = whisper.transcribe(model, samples, word_timestamps=True, language="en", fp16=False)
    their_tail = [w for s in theirs["segments"] for w in s["words"] if w["start"] > clip.duration + 0.5]
    our_tail = [w for w in result.words if w.start > clip.duration + 0.5]
    # One word of slack: our windows are cut at pauses, the reference seeks by its timestamp tokens.
    assert len(our_tail) <= max(len(their_tail), 1), (our_tail, their_tail)


def test_no_speech_prob_is_high_on_silence_and_low_on_speech(aligner, clips):
    """openai-whisper's probability of the no-speech token at <|startoftranscript|>, per window."""
    plans = [
        every_window_planned(samples, aligner.tokens, language="en", word_timestamps=False)
        for samples in (SILENCE_60S[: 16000 * 30], clips[1].samples)
    ]
    windows = [plan.windows[0] for plan in plans]
    aligner.llm.generate([w.engine_prompt() for w in windows], [w.sampling_params for w in windows])
    silent, speech = aligner.no_speech_probs(windows)
    assert silent > 0.6 and speech < 0.3, (silent, speech)
    assert aligner.capture_stats()["no_speech_parked"] == 0


def test_fallback_resubmits_only_the_failing_windows(aligner, clips, monkeypatch):
    """One generate call a round: the plan whose windows always fail (any text compresses worse than
    0.01) is decoded at every temperature of the schedule, the other only at 0. The failing window
    keeps its most likely attempt (all are "too repetitive" here, so the one of highest avg_logprob),
    only that attempt is aligned, and the captures of the others are freed."""
    from vllm_whisper_align.options import temperature_schedule
    from vllm_whisper_align.runners import decoding

    failing = TranscriptionOptions(compression_ratio_threshold=0.01)
    plans = [
        plan_transcription(clips[0].samples, aligner.tokens, language="en", options=failing),
        plan_transcription(clips[1].samples, aligner.tokens, language="en"),
    ]
    attempts = {0: [], 1: []}  # per plan: (temperature, avg_logprob) of every attempt run
    fall_back = decoding.fall_back

    def recorded(plan, outputs, just_run):
        for index in just_run:
            which = next(k for k, candidate in enumerate(plans) if candidate is plan)
            attempts[which].append((plan.windows[index].temperature, outputs[index].avg_logprob))
        return fall_back(plan, outputs, just_run)

    monkeypatch.setattr(decoding, "fall_back", recorded)
    retried, kept = aligner.run_plans(plans, use_tqdm=False)
    assert [t for t, _ in attempts[0]] == pytest.approx(list(temperature_schedule()))
    assert [t for t, _ in attempts[1]] == [0.0]
    likeliest = max(attempts[0], key=lambda attempt: attempt[1])[0]
    assert retried.words and {s.temperature for s in retried.segments} == {likeliest}, retried
    assert kept.words and {s.temperature for s in kept.segments} == {0.0}, kept
    stats = aligner.capture_stats()
    assert stats["tracked"] == stats["parked"] == stats["no_speech_parked"] == 0, stats


def test_temperatures_at_once_keep_what_the_schedule_one_at_a_time_keeps(aligner, clips, monkeypatch):
    """A window that fails its first temperature decodes every later one in one round more
    (``FallbackOptions.at_once``, the server's choice for short requests): the attempt kept, its text
    and word times are those of the schedule run a round at a time, whether a later temperature passes
    or none does, in 2 engine rounds instead of up to 6. A window that passes at once runs one round.
    The captures of the attempts not kept are freed."""
    from vllm_whisper_align.options import temperature_schedule
    from vllm_whisper_align.runners import decoding

    logprobs = []  # avg_logprob of every attempt of clips[0], every temperature failing
    fall_back = decoding.fall_back

    def recorded(plan, outputs, just_run):
        logprobs.extend(outputs[i].avg_logprob for i in just_run)
        return fall_back(plan, outputs, just_run)

    def planned(clip, at_once, **thresholds):
        plan = plan_transcription(
            clip.samples, aligner.tokens, language="en", suppress_tokens=aligner.suppress_tokens
        )
        plan.fallback = FallbackOptions(at_once=at_once, **thresholds)
        return plan

    generates = []
    answer = aligner._answer

    def counted(command, use_tqdm):
        generates.extend([command] if isinstance(command, driver.Generate) else [])
        return answer(command, use_tqdm)

    none_pass = {"compression_ratio_threshold": 0.01, "logprob_threshold": None}
    monkeypatch.setattr(decoding, "fall_back", recorded)
    aligner.run_plans([planned(clips[0], False, **none_pass)])
    monkeypatch.setattr(decoding, "fall_back", fall_back)
    assert len(logprobs) == len(temperature_schedule())
    # A threshold the first attempt fails and a later one passes.
    later = sorted(logprobs[1:])
    assert logprobs[0] < later[-1], logprobs
    some_pass = {
        "compression_ratio_threshold": None,
        "logprob_threshold": (max(logprobs[0], later[0]) + later[-1]) / 2,
    }
    monkeypatch.setattr(aligner, "_answer", counted)
    for thresholds in (none_pass, some_pass):
        generates.clear()
        [in_turn] = aligner.run_plans([planned(clips[0], False, **thresholds)])
        rounds_in_turn = len(generates)
        generates.clear()
        [at_once] = aligner.run_plans([planned(clips[0], True, **thresholds)])
        assert len(generates) == 2 <= rounds_in_turn, thresholds
        assert thresholds is some_pass or rounds_in_turn == len(temperature_schedule())
        assert at_once.text == in_turn.text and at_once.text, thresholds
        assert [s.temperature for s in at_once.segments] == [s.temperature for s in in_turn.segments]
        assert [w.start for w in at_once.words] == pytest.approx([w.start for w in in_turn.words], abs=0.021)
    generates.clear()
    [passing] = aligner.run_plans([planned(clips[1], True)])
    assert len(generates) == 1 and {s.temperature for s in passing.segments} == {0.0}
    stats = aligner.capture_stats()
    assert stats["tracked"] == stats["parked"] == stats["no_speech_parked"] == 0, stats


def test_sampled_window_keeps_the_likeliest_of_best_of_candidates(aligner, clips):
    """At a temperature above 0 a window runs as best_of seeded candidates; the one kept is the
    candidate openai-whisper's ranker prefers, each candidate run here on its own through
    LLM.generate with the same seed. The others' captures are freed."""
    from vllm_whisper_align.runners import decoding

    plan = plan_transcription(
        clips[2].samples,
        aligner.tokens,
        language="en",
        options=TranscriptionOptions(temperature=1.0, best_of=5),
        suppress_tokens=aligner.suppress_tokens,
    )
    candidates = plan.windows[0].candidates()
    alone = aligner.llm.generate(
        [c.engine_prompt() for c in candidates], [c.sampling_params for c in candidates]
    )
    outputs = [decoding.window_output(c, o, aligner.tokens) for c, o in zip(candidates, alone, strict=True)]
    texts = [aligner.tokens.decode(o.token_ids).strip() for o in outputs]
    assert len(set(texts)) > 1, texts  # otherwise the choice would not be tested
    best = max(range(len(outputs)), key=lambda i: decoding.sum_logprob_score(outputs[i]))
    aligner.discard([key for c in candidates for key in c.capture_keys()])

    result = aligner.transcribe(
        [clips[2].samples],
        language="en",
        temperature=1.0,
        best_of=5,
        logprob_threshold=None,
        compression_ratio_threshold=None,
    )[0]
    assert result.text.strip() == texts[best], (texts, best)
    stats = aligner.capture_stats()
    assert stats["tracked"] == stats["parked"] == stats["no_speech_parked"] == 0, stats


def test_a_fallback_retry_takes_its_encoder_output_from_the_cache(aligner, clips, monkeypatch):
    """A window decoded again at the next temperature does not run the encoder again: the retry hits
    the encoder cache, and samples exactly what the same attempt samples on a cold cache. The cache
    is empty again after a call of the offline API."""
    from vllm_whisper_align.protocol import RPC_CLEAR_ENCODER_CACHE
    from vllm_whisper_align.runners import decoding

    attempts = []  # (temperature, token ids, avg_logprob) of every attempt run
    fall_back = decoding.fall_back

    def recorded(plan, outputs, just_run):
        attempts.extend(
            (plan.windows[i].temperature, outputs[i].token_ids, outputs[i].avg_logprob) for i in just_run
        )
        return fall_back(plan, outputs, just_run)

    def plan(temperatures, compression_ratio_threshold):
        planned = plan_transcription(
            clips[3].samples,
            aligner.tokens,
            language="en",
            options=TranscriptionOptions(temperature=temperatures[0], sampling={"seed": 7}),
            suppress_tokens=aligner.suppress_tokens,
        )
        # A schedule of the test's own (the options' always runs on to 1.0).
        planned.fallback = FallbackOptions(
            temperatures=temperatures,
            logprob_threshold=None,
            compression_ratio_threshold=compression_ratio_threshold,
        )
        return planned

    def cache_counts(before, after):
        return tuple(after[k] - before[k] for k in ("encoder_cache_misses", "encoder_cache_hits"))

    monkeypatch.setattr(decoding, "fall_back", recorded)
    aligner.llm.collective_rpc(RPC_CLEAR_ENCODER_CACHE)
    before = aligner.capture_stats()
    aligner.run_plans([plan((0.5,), None)], use_tqdm=False)  # the attempt alone, on a cold cache
    middle = aligner.capture_stats()
    aligner.llm.collective_rpc(RPC_CLEAR_ENCODER_CACHE)
    aligner.run_plans([plan((0.0, 0.5), 0.01)], use_tqdm=False)  # greedy fails (any text > 0.01), then 0.5
    after = aligner.capture_stats()
    assert cache_counts(before, middle) == (1, 0) and cache_counts(middle, after) == (1, 1)
    (cold_t, cold_tokens, cold_logprob), (greedy_t, _, _), (retry_t, retry_tokens, retry_logprob) = attempts
    assert (cold_t, greedy_t, retry_t) == (0.5, 0.0, 0.5) and cold_tokens
    assert retry_tokens == cold_tokens and retry_logprob == pytest.approx(cold_logprob, abs=1e-5)

    aligner.transcribe([clips[3].samples], language="en")
    assert aligner.capture_stats()["encoder_cache_entries"] == 0


def test_a_decode_given_its_first_words_reads_them_there_and_goes_on_as_a_free_decode(aligner, clips):
    """A live stream's decode is given the confirmed words its buffer begins with (forced after the
    start tokens): they come back first, and the words after them are read and timed as a decode
    without them reads them (greedy: the forced tokens are those it would have written)."""
    from dataclasses import replace

    from vllm_whisper_align.live.buffer import Decode
    from vllm_whisper_align.runners.live import decode_work

    def words(prefix):
        decode = Decode(clips[0].samples, 0.0, None, tuple(prefix))
        work = decode_work(decode, aligner.facts, "en", None, TranscriptionOptions())
        return aligner.run(work).words

    free = words(())
    given = words(free[:3])
    assert [w.word for w in given] == [w.word for w in free]
    np.testing.assert_allclose([w.start for w in given], [w.start for w in free], atol=0.021)
    # A prefix the audio does not hold is still what the decode begins with: the words are forced.
    other = replace(free[0], word=" Yesterday", tokens=aligner.tokens.encode(" Yesterday"))
    assert words([other])[0].word.startswith(" Yesterday")  # a comma may follow it: "Yesterday,"
