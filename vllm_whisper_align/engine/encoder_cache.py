"""Encoder outputs kept by the audio they came from, for the next request on the same window.

The same 30 s of audio often reaches the engine more than once: a window that fails openai-whisper's
thresholds is decoded again at the next temperature, and long-form alignment teacher-forces each
window's text on the windows it has just transcribed (``longform``). vLLM 0.32 runs the encoder once
per request and keeps its output only while that request runs (``EncoderDecoderCacheManager`` never
shares one), so each repeat paid the encoder again: 2.5 of the 3.2-4.0 s of long-form alignment's
second pass over a 5-minute recording.

The model looks its inputs up here before it runs the encoder, by the bytes of their log-mel
features: equal features give the same encoder output, whichever request or process sent them, and
no identifier has to travel with a request. Most recently used first, up to ``max_bytes``; cleared
when the engine goes idle (``plugin._return_idle_memory``), since nothing is repeated after that.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch


def features_key(features: torch.Tensor) -> bytes:
    """A digest of one input's features: the cache key. Features are 80 or 128 mel bins x 3000 frames,
    hashed in about a millisecond (the encoder takes a hundred times longer)."""
    data = features.detach().contiguous().cpu().view(torch.uint8).numpy()
    digest = hashlib.blake2b(data, digest_size=16)
    digest.update(str((tuple(features.shape), features.dtype)).encode())
    return digest.digest()


class EncoderOutputCache:
    """Encoder outputs by :func:`features_key`, least recently used dropped first beyond max_bytes."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.outputs: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.num_bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: bytes) -> torch.Tensor | None:
        output = self.outputs.get(key)
        if output is None:
            self.misses += 1
            return None
        self.hits += 1
        self.outputs.move_to_end(key)
        return output

    def put(self, key: bytes, output: torch.Tensor) -> None:
        # A copy: the encoder's output for one input is a view of its whole batch, which a view kept
        # here would keep alive.
        size = output.numel() * output.element_size()
        if size > self.max_bytes or key in self.outputs:
            return
        self.outputs[key] = output.detach().clone()
        self.num_bytes += size
        while self.num_bytes > self.max_bytes:
            _, dropped = self.outputs.popitem(last=False)
            self.num_bytes -= dropped.numel() * dropped.element_size()

    def clear(self) -> int:
        """Drops every output; returns how many bytes they held."""
        freed = self.num_bytes
        self.outputs.clear()
        self.num_bytes = 0
        return freed

    def stats(self) -> dict[str, int]:
        return {
            "encoder_cache_hits": self.hits,
            "encoder_cache_misses": self.misses,
            "encoder_cache_entries": len(self.outputs),
            "encoder_cache_bytes": self.num_bytes,
        }


def encode_with_cache(cache: EncoderOutputCache, inputs: list[torch.Tensor], encode) -> list[torch.Tensor]:
    """``encode(inputs)``'s outputs, one per input, running ``encode`` only on inputs not in the cache
    (and on each distinct one once)."""
    keys = [features_key(features) for features in inputs]
    outputs: list[torch.Tensor | None] = [cache.get(key) for key in keys]
    missing: dict[bytes, list[int]] = {}
    for index, (key, output) in enumerate(zip(keys, outputs, strict=True)):
        if output is None:
            missing.setdefault(key, []).append(index)
    if missing:
        computed = encode([inputs[indices[0]] for indices in missing.values()])
        for (key, indices), output in zip(missing.items(), computed, strict=True):
            cache.put(key, output)
            for index in indices:
                outputs[index] = output
    return outputs  # type: ignore[return-value]
