"""Parity of vllm_whisper_align.align.timing with openai-whisper's whisper/timing.py."""

import numpy as np
import pytest
import torch
import whisper.timing as reference
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_whisper_align.align import timing

# per test, not a global profile: other test modules keep their own hypothesis settings
examples = settings(deadline=None, max_examples=60)


def reference_dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Plain-Python port of ``dtw_cpu`` + ``backtrace`` (float32 costs, float64 sums)."""
    x = x.astype(np.float64)
    N, M = x.shape
    cost = np.full((N + 1, M + 1), np.inf, dtype=np.float32)
    trace = -np.ones((N + 1, M + 1), dtype=np.float32)
    cost[0, 0] = 0
    for j in range(1, M + 1):
        for i in range(1, N + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = np.float64(x[i - 1, j - 1]) + np.float64(c)
            trace[i, j] = t

    i, j = N, M
    trace[0, :] = 2
    trace[:, 0] = 1
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    path = np.array(path[::-1]).T
    return path[0], path[1]


def assert_same_path(actual, expected):
    np.testing.assert_array_equal(actual[0], expected[0])
    np.testing.assert_array_equal(actual[1], expected[1])
    assert actual[0].dtype == actual[1].dtype == np.int64


@st.composite
def matrices(draw, max_rows=12, max_cols=40):
    rows = draw(st.integers(1, max_rows))
    cols = draw(st.integers(1, max_cols))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["normal", "ties", "constant"]))
    if kind == "normal":
        x = rng.standard_normal((rows, cols)) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    elif kind == "ties":  # small integers: equal path costs everywhere
        x = rng.integers(-2, 3, (rows, cols))
    else:
        x = np.full((rows, cols), draw(st.sampled_from([0.0, 1.0, -0.5])))
    return x.astype(np.float32)


# ---------------------------------------------------------------------------- dtw


@examples
@given(matrices())
def test_dtw_equals_reference(x):
    expected = reference.dtw(torch.from_numpy(x))  # dtw_cpu(x.double())
    assert_same_path(timing.dtw(x), (expected[0], expected[1]))
    assert_same_path(timing.dtw(x), reference_dtw(x))


@examples
@given(matrices(max_rows=1, max_cols=30), st.booleans())
def test_dtw_single_row_or_column(x, transpose):
    x = np.ascontiguousarray(x.T) if transpose else x
    expected = reference.dtw_cpu(x.astype(np.float64))
    assert_same_path(timing.dtw(x), (expected[0], expected[1]))


@examples
@given(st.integers(0, 2**32 - 1))
def test_dtw_float64_input_equals_dtw_cpu(seed):
    # values not representable in float32: the float64 sum then float32 store must match
    x = np.random.default_rng(seed).standard_normal((7, 23)) / 3
    expected = reference.dtw_cpu(x.copy())
    assert_same_path(timing.dtw(x), (expected[0], expected[1]))


def test_dtw_integer_input_is_cast_like_double():
    x = np.array([[3, 1, 2], [0, 4, 1]])
    expected = reference.dtw_cpu(x.astype(np.float64))
    assert_same_path(timing.dtw(x), (expected[0], expected[1]))


def test_dtw_does_not_modify_input():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    timing.dtw(x)
    np.testing.assert_array_equal(x, np.arange(12, dtype=np.float32).reshape(3, 4))


@examples
@given(st.lists(matrices(max_rows=20, max_cols=60), min_size=0, max_size=6))
def test_dtw_batch_equals_dtw(xs):
    results = timing.dtw_batch(xs)
    assert len(results) == len(xs)
    for x, result in zip(xs, results, strict=True):
        assert_same_path(result, timing.dtw(x))


def test_dtw_batch_realistic_sizes():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((rng.integers(5, 120), 1500)).astype(np.float32) for _ in range(8)]
    for x, result in zip(xs, timing.dtw_batch(xs), strict=True):
        assert_same_path(result, reference.dtw_cpu(x.astype(np.float64)))


# ---------------------------------------------------------------------------- median filter


@st.composite
def filter_inputs(draw):
    ndim = draw(st.integers(1, 4))  # the reference handles up to 4-D
    shape = [draw(st.integers(1, 4)) for _ in range(ndim - 1)] + [draw(st.integers(1, 25))]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        x = rng.standard_normal(shape)
    else:
        x = rng.integers(-2, 3, shape)  # ties inside windows
    return x.astype(np.float32), draw(st.sampled_from([1, 3, 5, 7]))


@examples
@given(filter_inputs())
def test_median_filter_equals_reference(inputs):
    x, width = inputs
    expected = reference.median_filter(torch.from_numpy(x.copy()), width).numpy()
    actual = timing.median_filter(x, width)
    assert actual.dtype == np.float32 and actual.shape == x.shape
    np.testing.assert_array_equal(actual, expected)


def test_median_filter_short_rows_are_returned_unchanged():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert timing.median_filter(x, 7) is x
    # the reference returns before its odd-width assertion, so an even width passes here too
    assert timing.median_filter(x, 8) is x
    with pytest.raises(ValueError):
        timing.median_filter(np.zeros((2, 8), np.float32), 4)


def test_median_filter_orders_nan_last_like_torch_sort():
    x = np.array([[np.nan, 1.0, 2.0, np.nan, 3.0, 0.0, np.nan, 5.0, 4.0]], dtype=np.float32)
    for width in (3, 5, 7):
        expected = reference.median_filter(torch.from_numpy(x.copy()), width).numpy()
        np.testing.assert_array_equal(timing.median_filter(x, width), expected)


# ---------------------------------------------------------------------------- alignment matrix


def torch_alignment_matrix(qk, num_frames, medfilt_width, qk_scale):
    """The matrix steps of the reference ``find_alignment``, in torch."""
    weights = torch.from_numpy(qk)[:, :, : num_frames // 2]
    weights = (weights * qk_scale).softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = (weights - mean) / std
    weights = reference.median_filter(weights, medfilt_width)
    return weights.mean(axis=0).numpy()


@examples
@given(
    heads=st.integers(1, 6),
    # at least 4 rows left to normalise: with 2 the z-score is ±1 and ill-conditioned wherever
    # the two softmax values nearly tie, so an ulp of exp() difference shows up magnified
    tokens=st.integers(6, 12),
    frames=st.integers(2, 80),
    frame_fraction=st.floats(0.05, 1.0),
    medfilt_width=st.sampled_from([1, 3, 7]),
    qk_scale=st.sampled_from([1.0, 0.5, 1.7]),
    seed=st.integers(0, 2**32 - 1),
)
def test_alignment_matrix_equals_torch_reference(
    heads, tokens, frames, frame_fraction, medfilt_width, qk_scale, seed
):
    qk = np.random.default_rng(seed).standard_normal((heads, tokens, frames)) * 3
    qk = qk.astype(np.float32)
    num_frames = max(2, int(2 * frames * frame_fraction))
    expected = torch_alignment_matrix(qk, num_frames, medfilt_width, qk_scale)
    actual = timing.alignment_matrix(qk, num_frames, medfilt_width, qk_scale)
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


def test_alignment_matrix_default_uses_every_row():
    qk = np.random.default_rng(1).standard_normal((4, 9, 300)).astype(np.float32)
    expected = torch_alignment_matrix(qk, 500, 7, 1.0)
    actual = timing.alignment_matrix(qk, 500)
    assert actual.shape == (9, 250)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- jump times


def reference_jump_times(matrix):
    text_indices, time_indices = reference.dtw(torch.from_numpy(-matrix))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    return time_indices[jumps] / reference.TOKENS_PER_SECOND


@examples
@given(st.lists(matrices(max_rows=15, max_cols=60), min_size=1, max_size=4))
def test_jump_times_equal_reference(xs):
    for x, batched in zip(xs, timing.jump_times_batch(xs), strict=True):
        expected = reference_jump_times(x)
        single = timing.jump_times(x)
        assert single.shape == (x.shape[0],)
        np.testing.assert_array_equal(single, expected)
        np.testing.assert_array_equal(batched, expected)


def test_constants_match_reference():
    assert timing.TOKENS_PER_SECOND == reference.TOKENS_PER_SECOND == 50


def test_warmup_runs():
    timing.warmup()
