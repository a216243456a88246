"""Int8 encoder on CPU: dynamic per-token int8 activations times per-channel int8 weights (oneDNN).

On CPU the encoder is most of the work (one 30 s window is ~37 GFLOP for tiny, the decoder step a few
MFLOP per request), and half of the encoder is its linear layers. This swaps those layers' GEMM for
vLLM's oneDNN int8 kernel; attention, convolutions and the whole decoder stay in the model's dtype,
so the cross-attention that word timings come from is computed in full precision from slightly
perturbed encoder states.

Weights use 7 bits (±63), not 8: without VNNI (AVX2), x86 int8 GEMMs multiply u8 activations by s8
weights with ``vpmaddubsw``, which saturates at int16 when two products of 255 x 127 are summed. On
this project's AVX2 machine full-range weights gave 15% relative error, ±63 gave the error of the
rounding alone (1.7% max relative, 4e-7 away from an exact emulation). PyTorch's fbgemm dynamic
quantization uses ``reduce_range`` for the same reason.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import LinearBase
from vllm.platforms import current_platform

from vllm_whisper_align.engine.vllm_internals import onednn_ops

WEIGHT_QMAX = 63


def quantize_weight_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float weight -> ([N, K] int8 in ±WEIGHT_QMAX, [N] float32 scales)."""
    weight = weight.float()
    scale = weight.abs().amax(dim=1).clamp(min=1e-8) / WEIGHT_QMAX
    quantized = torch.round(weight / scale[:, None]).clamp(-WEIGHT_QMAX, WEIGHT_QMAX).to(torch.int8)
    return quantized, scale


class Int8DynamicLinear:
    """Stands in for a linear layer's ``quant_method``: ``layer.forward`` calls ``apply``."""

    def __init__(self, weight: torch.Tensor, output_dtype: torch.dtype):
        quantized, scale = quantize_weight_per_channel(weight)
        self.out_features = quantized.shape[0]
        # The handler reads the scales through a pointer when it runs: keep them alive here.
        self.weight_scale = scale
        self.ops = onednn_ops()
        # oneDNN wants [K, N] with N contiguous: the transpose view of the [N, K] tensor.
        self.handler = self.ops.create_onednn_scaled_mm(quantized.t(), scale, output_dtype, True, False, 32)
        self.output_dtype = output_dtype

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        x_q, x_scale, _ = self.ops.onednn_scaled_int8_quant(x, None, None, True)
        out = torch.empty((x.shape[0], self.out_features), dtype=self.output_dtype)
        self.ops.onednn_scaled_mm(self.handler, x_q, out, x_scale, None, None, bias)
        return out.reshape(*shape[:-1], self.out_features)


def encoder_int8_supported() -> tuple[bool, str]:
    if not current_platform.is_cpu():
        return False, "the int8 encoder uses vLLM's oneDNN CPU kernels; this is not a CPU platform"
    if onednn_ops() is None:
        return False, "this vLLM build has no oneDNN kernels"
    return True, ""


def quantize_encoder_linears(encoder: torch.nn.Module) -> int:
    """Swap every linear layer of ``encoder`` to int8; call after its weights are loaded.

    Returns the number of layers swapped. The float weight is freed: the handler holds a packed copy.
    """
    swapped = 0
    for module in encoder.modules():
        if not isinstance(module, LinearBase):
            continue
        module.quant_method = Int8DynamicLinear(module.weight.data, module.weight.dtype)
        module.weight = torch.nn.Parameter(torch.empty(0, dtype=module.weight.dtype), requires_grad=False)
        swapped += 1
    return swapped
