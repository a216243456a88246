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


# The per-request selection pool (upper-half heads) is captured whole while it is at most this many
# times the tuned heads (tiny/base: 12-24 heads against 8). Beyond that (small … large-v3, whose upper
# half has 72-320 heads) the pool is bounded to the tuned heads plus as many again from their layers,
# so capture memory stays at most twice the tuned heads'.
MAX_POOL_FACTOR = 4


@dataclass(frozen=True)
class CapturedHeads:
    """The heads the worker captures, in capture order (by layer, then head), and which of them each
    way of aligning reads: ``tuned`` (the fixed alignment heads) and ``candidates`` (the pool that
    per-request head selection chooses from; see ``timing.select_heads``)."""

    heads: tuple[tuple[int, int], ...]
    tuned: tuple[int, ...]
    candidates: tuple[int, ...]

    def by_layer(self) -> dict[int, list[int]]:
        layers: dict[int, list[int]] = {}
        for layer, head in self.heads:
            layers.setdefault(layer, []).append(head)
        return layers


def captured_heads(tuned: AlignmentHeads, num_layers: int, num_heads: int) -> CapturedHeads:
    """The tuned heads plus the selection pool: the upper half of the decoder (openai-whisper's own
    fallback set), or, where that is over ``MAX_POOL_FACTOR`` times the tuned heads, the tuned heads
    plus as many more from the upper-half heads of the tuned heads' layers, top layer first."""
    upper = upper_half_heads(num_layers, num_heads)
    if len(upper) <= MAX_POOL_FACTOR * len(tuned.heads):
        pool = upper
    else:
        tuned_layers = {layer for layer, _ in tuned.heads}
        extra = [pair for pair in reversed(upper) if pair[0] in tuned_layers and pair not in tuned.heads]
        pool = list(tuned.heads) + extra[: len(tuned.heads)]
    heads = tuple(sorted(set(pool) | set(tuned.heads)))
    index = {pair: i for i, pair in enumerate(heads)}
    return CapturedHeads(
        heads, tuple(index[pair] for pair in tuned.heads), tuple(sorted(index[pair] for pair in pool))
    )
