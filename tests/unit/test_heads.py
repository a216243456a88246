"""Which heads the worker captures, and how a window picks the ones it aligns with."""

import numpy as np
import pytest

from vllm_whisper_align.align import results, timing
from vllm_whisper_align.engine.heads import AlignmentHeads, captured_heads, upper_half_heads
from vllm_whisper_align.protocol import AlignmentParams

TINY_EN = ((1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4))
BASE = ((3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6))
LARGE_V3 = ((7, 0), (10, 17), (12, 18), (13, 12), (16, 1), (17, 14), (19, 11), (21, 4), (24, 1), (25, 6))


def test_small_models_capture_the_whole_upper_half_and_their_tuned_heads():
    captured = captured_heads(AlignmentHeads(TINY_EN, "generation_config"), 4, 6)
    assert len(captured.heads) == 13  # 12 upper-half heads + (1, 0)
    assert [captured.heads[i] for i in captured.tuned] == list(TINY_EN)
    assert [captured.heads[i] for i in captured.candidates] == upper_half_heads(4, 6)
    base = captured_heads(AlignmentHeads(BASE, "generation_config"), 6, 8)
    assert len(base.heads) == 24 and len(base.candidates) == 24


def test_large_models_capture_at_most_twice_their_tuned_heads():
    captured = captured_heads(AlignmentHeads(LARGE_V3, "generation_config"), 32, 20)
    assert len(captured.heads) <= 2 * len(LARGE_V3)
    assert [captured.heads[i] for i in captured.tuned] == list(LARGE_V3)
    assert set(LARGE_V3) <= {captured.heads[i] for i in captured.candidates}
    # the extra heads come from upper-half layers that already hold tuned heads
    extra = set(captured.heads) - set(LARGE_V3)
    assert extra and all(layer >= 16 and layer in {lay for lay, _ in LARGE_V3} for layer, _ in extra)


def test_capture_order_is_by_layer_then_head():
    captured = captured_heads(AlignmentHeads(TINY_EN, "config"), 4, 6)
    assert list(captured.heads) == sorted(captured.heads)
    flattened = [(layer, head) for layer, heads in captured.by_layer().items() for head in heads]
    assert flattened == list(captured.heads)


def _attention_logits(num_rows: int, num_frames: int, sharpness: float, seed: int) -> np.ndarray:
    """Logits of a head that attends along the diagonal, more sharply for larger ``sharpness``."""
    rng = np.random.default_rng(seed)
    centres = np.linspace(2, num_frames - 3, num_rows)
    frames = np.arange(num_frames)
    logits = -sharpness * (frames[None, :] - centres[:, None]) ** 2 / num_frames
    return (logits + rng.normal(0, 0.5, logits.shape)).astype(np.float32)


def test_head_scores_rank_sharp_attention_above_diffuse_attention():
    rows, frames = 12, 200
    qk = np.stack(
        [
            _attention_logits(rows, frames, sharpness, seed)
            for seed, sharpness in enumerate((0.0, 50.0, 5.0, 500.0))
        ]
    )
    scores = timing.head_scores(qk, num_frames=2 * frames)
    assert list(np.argsort(-scores)) == [3, 1, 2, 0]


def test_head_scores_ignore_padding_frames():
    sharp = _attention_logits(8, 100, 500.0, 0)
    padded = np.concatenate([sharp, np.full((8, 1400), 50.0, dtype=np.float32)], axis=1)  # loud padding
    assert timing.head_scores(padded[None], num_frames=200) == pytest.approx(
        timing.head_scores(sharp[None], num_frames=200)
    )


def test_select_heads_keeps_the_better_half_of_the_candidates():
    scores = np.array([9.0, 1.0, 8.0, 2.0, 7.0, 3.0, 100.0])
    assert timing.select_heads(scores, candidates=[0, 1, 2, 3, 4, 5]) == [0, 2, 4]  # index 6 is no candidate
    assert timing.select_heads(scores, candidates=[1]) == [1]


def test_select_heads_takes_no_more_than_the_tuned_heads_number():
    scores = np.arange(24, dtype=np.float64)  # head i scores i
    assert timing.select_heads(scores, range(24), at_most=8) == list(range(16, 24))  # base: 8 of 24
    assert timing.select_heads(scores, range(12), at_most=8) == list(range(6, 12))  # tiny.en: half, 6
    assert timing.select_heads(scores, range(24), at_most=0) == [23]


def test_alignment_heads_of_a_selecting_method_are_at_most_the_tuned_heads_number():
    qk = np.stack([_attention_logits(8, 100, 500.0 - 10 * head, 0) for head in range(24)])
    fetched = {"candidate_heads": list(range(24)), "tuned_heads": [3, 9, 10, 11, 13, 14, 20, 22]}
    heads = results.alignment_heads(qk, 200, AlignmentParams(num_frames=200), fetched)
    assert len(heads) == 8
