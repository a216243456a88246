"""Which decoder cross-attention heads to read word times from (the *alignment heads*)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_whisper_align.log import get_logger

logger = get_logger(__name__)


@dataclass(frozen=True)
class AlignmentHeads:
    """(decoder layer, head) pairs whose cross-attention follows the audio monotonically."""

    heads: tuple[tuple[int, int], ...]
    source: str

    def by_layer(self) -> dict[int, list[int]]:
        layers: dict[int, list[int]] = {}
        for layer, head in self.heads:
            layers.setdefault(layer, []).append(head)
        return layers


def upper_half_heads(num_layers: int, num_heads: int) -> list[tuple[int, int]]:
    """openai-whisper's fallback for models it has no tuned heads for: every head of the upper half
    of the decoder layers."""
    return [(layer, head) for layer in range(num_layers // 2, num_layers) for head in range(num_heads)]


def resolve_alignment_heads(
    config_heads, generation_heads, num_layers: int, num_heads: int
) -> AlignmentHeads:
    """Heads from ``hf_overrides``/config first, then generation_config, then the upper-half fallback,
    which works, but worse than tuned heads, hence the warning."""
    for heads, source in ((config_heads, "config"), (generation_heads, "generation_config")):
        if heads:
            pairs = tuple(sorted({(int(layer), int(head)) for layer, head in heads}))
            for layer, head in pairs:
                if not (0 <= layer < num_layers and 0 <= head < num_heads):
                    raise ValueError(
                        f"alignment head ({layer}, {head}) from {source} is outside the decoder "
                        f"({num_layers} layers x {num_heads} heads)"
                    )
            return AlignmentHeads(pairs, source)
    logger.warning(
        "No alignment_heads in this model's config or generation_config: using all heads of the "
        "upper half of the decoder layers; word timings will be less precise. Set them with "
        "--hf-overrides '{\"alignment_heads\": [[layer, head], ...]}'."
    )
    return AlignmentHeads(tuple(upper_half_heads(num_layers, num_heads)), "upper-half fallback")
