"""The int8 encoder kernel against float linear layers (no engine)."""

from __future__ import annotations

import pytest
import torch

from vllm_whisper_align.engine.int8 import (
    WEIGHT_QMAX,
    Int8DynamicLinear,
    encoder_int8_supported,
    quantize_weight_per_channel,
)

pytestmark = pytest.mark.skipif(not encoder_int8_supported()[0], reason=encoder_int8_supported()[1])


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out - ref).abs().max() / ref.abs().max()).item()


def test_weights_use_seven_bits_per_channel():
    weight = torch.randn(8, 16) * torch.arange(1, 9)[:, None]  # rows of very different ranges
    quantized, scale = quantize_weight_per_channel(weight)
    assert quantized.dtype == torch.int8 and scale.shape == (8,)
    assert quantized.abs().max().item() == WEIGHT_QMAX
    assert (quantized.abs().amax(dim=1) == WEIGHT_QMAX).all()  # every row uses its full range
    torch.testing.assert_close(quantized.float() * scale[:, None], weight, atol=scale.max().item(), rtol=0)


@pytest.mark.parametrize("shape", [(1500, 384), (2, 1500, 384), (7, 384)])
def test_int8_linear_matches_float_linear(shape):
    """Encoder shapes: one or two 30 s windows; and a ragged row count."""
    torch.manual_seed(0)
    weight, bias = torch.randn(1152, 384) * 0.05, torch.randn(1152) * 0.1
    layer = Int8DynamicLinear(weight, torch.float32)
    x = torch.randn(*shape)
    out = layer.apply(None, x, bias)
    ref = torch.nn.functional.linear(x, weight, bias)
    assert out.shape == ref.shape
    # Rounding alone (7-bit weights, 8-bit per-token activations) gives ~2%; saturation of the
    # int16 pair sums on AVX2 gave ~15% with 8-bit weights.
    assert relative_error(out, ref) < 0.03
    assert relative_error(layer.apply(None, x), torch.nn.functional.linear(x, weight)) < 0.03
