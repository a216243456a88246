"""The encoder cache's bookkeeping; through a real engine in test_engine and test_longform_engine."""

from __future__ import annotations

import torch

from vllm_whisper_align.engine.encoder_cache import EncoderOutputCache, encode_with_cache, features_key

WINDOW_BYTES = 1500 * 8 * 4  # a toy encoder output: 1500 frames x 8 float32


def features(seed: int) -> torch.Tensor:
    return torch.randn((4, 3000), generator=torch.Generator().manual_seed(seed))


def encoder(calls: list[int]):
    """A stand-in encoder that records how many inputs each call got."""

    def encode(batch: list[torch.Tensor]) -> list[torch.Tensor]:
        calls.append(len(batch))
        outputs = torch.stack([f[:, :1500].sum(0, keepdim=True).T.repeat(1, 8) for f in batch])
        return list(outputs.unbind(0))  # views of one batch tensor, as vLLM's encoder returns

    return encode


def test_keys_follow_content_shape_and_dtype():
    a = features(0)
    assert features_key(a) == features_key(a.clone())
    assert features_key(a) != features_key(features(1))
    assert features_key(a) != features_key(a.to(torch.bfloat16))
    assert features_key(a) != features_key(a.reshape(3000, 4))
    changed = a.clone()
    changed[3, 2999] += 1e-3
    assert features_key(a) != features_key(changed)


def test_encoder_runs_once_per_distinct_input():
    cache, calls = EncoderOutputCache(10 * WINDOW_BYTES), []
    a, b = features(0), features(1)
    first = encode_with_cache(cache, [a, b, a.clone()], encoder(calls))
    assert calls == [2]  # a twice in one batch: encoded once
    assert torch.equal(first[0], first[2]) and not torch.equal(first[0], first[1])
    second = encode_with_cache(cache, [b, a], encoder(calls))
    assert calls == [2]  # both from the cache
    assert torch.equal(second[0], first[1]) and torch.equal(second[1], first[0])
    third = encode_with_cache(cache, [features(2), a], encoder(calls))
    assert calls == [2, 1]
    assert torch.equal(third[1], first[0])
    assert cache.stats() == {
        "encoder_cache_hits": 3,
        "encoder_cache_misses": 4,  # a, b, a, then 2
        "encoder_cache_entries": 3,
        "encoder_cache_bytes": 3 * WINDOW_BYTES,
    }


def test_outputs_are_copies_not_views_of_the_batch():
    cache = EncoderOutputCache(10 * WINDOW_BYTES)
    encode_with_cache(cache, [features(0), features(1)], encoder([]))
    for output in cache.outputs.values():
        assert output.untyped_storage().nbytes() == WINDOW_BYTES


def test_least_recently_used_goes_first_beyond_the_bound():
    cache = EncoderOutputCache(2 * WINDOW_BYTES)
    encode = encoder([])
    a, b, c = features(0), features(1), features(2)
    encode_with_cache(cache, [a], encode)
    encode_with_cache(cache, [b], encode)
    encode_with_cache(cache, [a], encode)  # a is now the most recently used
    encode_with_cache(cache, [c], encode)  # drops b
    assert set(cache.outputs) == {features_key(a), features_key(c)}
    assert cache.num_bytes == 2 * WINDOW_BYTES
    assert cache.clear() == 2 * WINDOW_BYTES
    assert not cache.outputs and cache.num_bytes == 0


def test_an_output_larger_than_the_bound_is_not_kept():
    cache, calls = EncoderOutputCache(WINDOW_BYTES - 1), []
    for _ in range(2):
        encode_with_cache(cache, [features(0)], encoder(calls))
    assert calls == [1, 1] and not cache.outputs
