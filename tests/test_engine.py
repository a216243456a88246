"""The in-engine capture through a real vLLM engine: parity, accuracy, batching, cleanup."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import whisper
from whisper.timing import find_alignment

from vllm_whisper_align.decoding import AlignmentInputError, plan_transcription


def word_starts(result) -> np.ndarray:
    return np.array([w["start"] for w in result["words"]])


def word_ends(result) -> np.ndarray:
    return np.array([w["end"] for w in result["words"]])


def reference_words(reference, samples, text_tokens):
    """openai-whisper's find_alignment on the same audio and tokens (float32, CPU)."""
    model, tokenizer = reference
    mel = whisper.log_mel_spectrogram(torch.from_numpy(samples), model.dims.n_mels, padding=whisper.audio.N_SAMPLES)
    num_frames = len(samples) // whisper.audio.HOP_LENGTH
    mel = mel[:, :whisper.audio.N_FRAMES]
    return find_alignment(model, tokenizer, text_tokens, mel, num_frames)


def test_forced_alignment_matches_openai_whisper(aligner, clips, reference):
    """Same text tokens: word starts and ends within 0.02 s of the reference for >= 99% of words."""
    tokens_per_clip = [aligner.tokens.encode(" " + clip.text) for clip in clips]
    ours = aligner.align([c.samples for c in clips], token_ids=tokens_per_clip)
    diffs = []
    for clip, text_tokens, result in zip(clips, tokens_per_clip, ours):
        ref = [w for w in reference_words(reference, clip.samples, text_tokens)]
        ref_times = [(w.start, w.end) for w in ref]
        # Compare before punctuation merging and duration rules: the reference's raw words.
        ours_raw = [(t["start"], t["end"]) for t in _raw_word_times(result, aligner)]
        assert len(ours_raw) == len(ref_times)
        diffs += [abs(a - b) for pair_a, pair_b in zip(ours_raw, ref_times) for a, b in zip(pair_a, pair_b)]
    diffs = np.array(diffs)
    assert (diffs <= 0.02 + 1e-6).mean() >= 0.99, f"max diff {diffs.max():.3f}s"


def _raw_word_times(result, aligner):
    """Group our token times into the reference's raw words (split on spaces, eot closes)."""
    from vllm_whisper_align.word_timing import split_to_word_tokens

    ids = [t["id"] for t in result["tokens"]]
    _, groups = split_to_word_tokens(ids + [aligner.tokens.eot], aligner.tokens.decode_with_special, aligner.tokens.eot, "en")
    times, index = [], 0
    for group in groups[:-1]:
        first, last = result["tokens"][index], result["tokens"][index + len(group) - 1]
        times.append({"start": first["start"], "end": last["end"]})
        index += len(group)
    return times


def test_transcription_word_starts_near_truth(aligner, clips):
    """>= 75% of word starts within 200 ms of where espeak-ng really spoke them."""
    from speech import start_errors

    results = aligner.transcribe([c.samples for c in clips], word_timestamps=True)
    errors = np.concatenate([start_errors(clip, result["words"]) for clip, result in zip(clips, results)])
    assert (errors <= 0.2).mean() >= 0.75, f"within 200 ms: {(errors <= 0.2).mean():.2%}"


def test_transcription_timings_agree_with_forced_alignment(aligner, clips):
    """Transcription lacks the reference's eot row in the normalisation; measure what that costs."""
    transcribed = aligner.transcribe([c.samples for c in clips], word_timestamps=True)
    token_ids = [[t["id"] for t in r["tokens"]] for r in transcribed]
    forced = aligner.align([c.samples for c in clips], token_ids=token_ids)
    diffs = np.concatenate([
        np.abs([t["start"] for t in a["tokens"]] - np.array([t["start"] for t in b["tokens"]]))
        for a, b in zip(transcribed, forced)
    ])
    assert (diffs <= 0.02 + 1e-6).mean() >= 0.9, f"token starts within 20 ms: {(diffs <= 0.02 + 1e-6).mean():.2%}"


def test_batched_requests_match_each_alone(aligner, clips):
    """N different clips in one continuous batch, word timestamps on for some and off for others."""
    samples = [c.samples for c in clips]
    alone = [aligner.transcribe([s], word_timestamps=True)[0] for s in samples[:4]]
    batch = aligner.transcribe(samples, word_timestamps=True)
    plain = aligner.transcribe(samples, word_timestamps=False)
    for single, together in zip(alone, batch[:4]):
        assert single["text"] == together["text"]
        np.testing.assert_allclose(word_starts(single), word_starts(together), atol=0.02 + 1e-6)
        np.testing.assert_allclose(word_ends(single), word_ends(together), atol=0.02 + 1e-6)
    for without, with_words in zip(plain, batch):
        assert "words" not in without
        assert without["text"] == with_words["text"]


def test_mixed_alignment_in_one_generate_call(aligner, clips):
    """One generate() call where half the requests ask for alignment and half do not."""
    plans = [
        plan_transcription(c.samples, aligner.tokens, language="en", word_timestamps=i % 2 == 0)
        for i, c in enumerate(clips)
    ]
    results = aligner._run(plans, use_tqdm=False)
    alone = aligner.transcribe([clips[0].samples, clips[2].samples], word_timestamps=True)
    for result, single in zip([results[0], results[2]], alone):
        np.testing.assert_allclose(word_starts(result), word_starts(single), atol=0.02 + 1e-6)
    assert all("words" not in r for r in results[1::2])
    assert aligner.capture_stats()["tracked"] == 0


def test_more_requests_than_max_num_seqs(aligner, clips):
    """Several times max_num_seqs aligned requests in one call: once the batch is full, a step
    admits a new request while the one it replaces is only reported finished in that same step,
    so more requests than max_num_seqs hold capture state at once. Every one gets its words."""
    max_num_seqs = aligner.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs
    repeats = -(-3 * max_num_seqs // len(clips))
    samples = [c.samples for c in clips] * repeats
    results = aligner.transcribe(samples, word_timestamps=True)
    assert len(samples) > 2 * max_num_seqs
    for i, result in enumerate(results):
        first = results[i % len(clips)]
        assert result["text"] == first["text"] and result["words"], i
        np.testing.assert_allclose(word_starts(result), word_starts(first), atol=0.02 + 1e-6)
    stats = aligner.capture_stats()
    assert stats["tracked"] == 0 and stats["parked"] == 0, stats
    assert stats["slots"] <= 2 * max_num_seqs, stats


def test_long_audio_has_absolute_monotonic_times(aligner):
    from speech import long_clip, start_errors

    clip = long_clip(65.0)
    result = aligner.transcribe([clip.samples], word_timestamps=True)[0]
    starts = word_starts(result)
    assert result["duration"] > 60
    assert starts[-1] > 55, "words after the first window carry absolute times"
    assert np.all(np.diff(starts) >= 0)
    errors = start_errors(clip, result["words"])
    # No word lost or doubled at the joins: nearly every spoken word is heard once, no extras.
    assert np.isfinite(errors).mean() >= 0.85 and len(result["words"]) <= len(clip.words) + 3
    assert (errors <= 0.2).mean() >= 0.75


def test_store_is_empty_after_requests_and_aborts(aligner, clips):
    """Aborted requests free their slots; unfetched results wait until discarded; fetched ones are gone.
    (Expiry after the TTL is covered without an engine in tests/test_capture.py.)"""
    engine = aligner.llm.llm_engine
    keys = []
    for i, clip in enumerate(clips * 2):
        plan = plan_transcription(clip.samples, aligner.tokens, language="en")
        window = plan.windows[0]
        keys.append(window.alignment.key)
        engine.add_request(f"abort-{i}", window.engine_prompt(), window.sampling_params)
    for _ in range(3):
        engine.step()
    engine.abort_request([f"abort-{i}" for i in range(0, len(keys), 2)])
    while engine.has_unfinished_requests():
        engine.step()
    stats = aligner.capture_stats()
    assert stats["tracked"] == 0 and stats["free_slots"] == stats["slots"], stats
    assert stats["parked"] == len(keys), stats  # finished and aborted alike wait for a fetch
    assert aligner.discard(keys) == len(keys)
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
    assert [w["word"] for w in over_one_window["words"]] == [" hello"]
    assert 0 <= over_one_window["words"][0]["start"] <= over_one_window["words"][0]["end"] <= 31
    with pytest.raises(AlignmentInputError, match="token ids"):
        aligner.align([clips[0].samples], token_ids=[[aligner.tokens.eot + 5]])


def test_silence_gives_no_words(aligner):
    result = aligner.transcribe([np.zeros(16000 * 2, dtype=np.float32)], word_timestamps=True)[0]
    assert isinstance(result["words"], list)
    assert result["duration"] == pytest.approx(2.0)
