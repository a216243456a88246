"""Window features kept by their audio in the front end (engine.window_features): a repeat of the same
audio gets the features computed for it, anything else computes its own."""

from __future__ import annotations

import numpy as np
import torch
from transformers import BatchFeature

from vllm_whisper_align.engine.window_features import WindowFeatures

KWARGS = {"sampling_rate": 16000, "truncation": True}


class Extractor:
    """Features that say which audio they came from, and how many times it was called."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, hf_data, hf_kwargs) -> BatchFeature:
        self.calls += 1
        audio = hf_data["audio"][0]
        return BatchFeature({"input_features": torch.full((1, 80, 3000), float(audio[0]))})


def data(value: float, text: str = "<|startoftranscript|>") -> dict:
    return {"text": text, "audio": [np.full(32000, value, np.float32)]}


def test_the_same_audio_again_gets_its_features_without_computing_them():
    cache, extract = WindowFeatures(), Extractor()
    first = cache.computed(data(0.5), KWARGS, extract)
    again = cache.computed(data(0.5), KWARGS, extract)
    assert extract.calls == 1
    assert torch.equal(again["input_features"], first["input_features"])
    # a mapping of its own: vLLM adds its passthrough entries to the one it gets
    again["added"] = 1
    assert "added" not in cache.computed(data(0.5), KWARGS, extract)
    assert cache.stats()["window_features_reused"] == 2


def test_other_audio_text_or_arguments_compute_their_own():
    cache, extract = WindowFeatures(), Extractor()
    cache.computed(data(0.5), KWARGS, extract)
    other = cache.computed(data(0.25), KWARGS, extract)
    assert float(other["input_features"][0, 0, 0]) == 0.25
    cache.computed(data(0.5, text="<|startofprev|>"), KWARGS, extract)
    cache.computed(data(0.5), {**KWARGS, "truncation": False}, extract)
    longer = {"text": "<|startoftranscript|>", "audio": [np.full(32001, 0.5, np.float32)]}
    cache.computed(longer, KWARGS, extract)
    assert extract.calls == 5
    # not one audio array: computed every time, never kept
    two = {"text": "x", "audio": [np.zeros(10, np.float32)] * 2}
    cache.computed(two, KWARGS, extract)
    cache.computed(two, KWARGS, extract)
    assert extract.calls == 7 and cache.stats()["window_features_entries"] == 5


def test_the_least_recently_used_go_first_and_clear_drops_all():
    window_bytes = 80 * 3000 * 4
    cache, extract = WindowFeatures(max_bytes=2 * window_bytes), Extractor()
    for value in (1.0, 2.0, 1.0, 3.0):  # 1.0 used again, so 2.0 goes when 3.0 comes
        cache.computed(data(value), KWARGS, extract)
    assert extract.calls == 3 and cache.num_bytes == 2 * window_bytes
    cache.computed(data(1.0), KWARGS, extract)
    assert extract.calls == 3
    cache.computed(data(2.0), KWARGS, extract)
    assert extract.calls == 4
    assert cache.clear() == 2 * window_bytes
    assert cache.stats()["window_features_entries"] == cache.stats()["window_features_bytes"] == 0
    cache.computed(data(1.0), KWARGS, extract)
    assert extract.calls == 5
