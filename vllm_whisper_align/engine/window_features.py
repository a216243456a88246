"""Each window's log-mel features kept by its audio, in the process that sends requests to the engines,
for the next request on the same audio.

vLLM's processor computes a request's features in the front end (the API server, or the offline
API's process) for every request: transformers' ``WhisperFeatureExtractor``, an STFT of the window
padded to 30 s. vLLM 0.32 turns its own cache of processed inputs off for
encoder-decoder models, whatever ``--mm-processor-cache-gb`` says. The same audio often goes to the
engine again: a fallback's later temperatures, long-form alignment's second pass over the windows its
first pass transcribed, a packed input run alone after its window. The engines' encoder cache
(``encoder_cache``) already spares those the encoder; this spares them the features.

Kept by a digest of the audio and of everything else the extractor is given; most recently used
first, up to ``MAX_BYTES``; emptied when the server goes idle, and at the end of each offline call, as
the encoder cache is. Read and filled from vLLM's processing threads.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

# About 70 windows' features in bfloat16 (80 mel bins x 3000 frames), 35 in float32: the repeats of 32
# concurrent requests come while the others' first requests are sent.
MAX_BYTES = 64 * 2**20


def audio_key(hf_data: Mapping[str, object], hf_kwargs: Mapping[str, object]) -> bytes | None:
    """A digest of what the feature extractor is given for one audio: its samples, the text beside
    them and the extractor's arguments; None for anything else (not kept)."""
    audios = hf_data.get("audio")
    if not isinstance(audios, list | tuple) or len(audios) != 1 or not isinstance(audios[0], np.ndarray):
        return None
    audio = np.ascontiguousarray(audios[0])
    digest = hashlib.blake2b(audio.view(np.uint8).reshape(-1), digest_size=16)
    rest = (audio.shape, str(audio.dtype), hf_data.get("text"), sorted(map(repr, hf_kwargs.items())))
    digest.update(repr(rest).encode())
    return digest.digest()


def _size(features: Mapping[str, Any]) -> int:
    return sum(value.numel() * value.element_size() for value in features.values() if hasattr(value, "numel"))


class WindowFeatures:
    """Processed features by :func:`audio_key`, least recently used dropped first beyond max_bytes."""

    def __init__(self, max_bytes: int = MAX_BYTES):
        self.max_bytes = max_bytes
        self.kept: OrderedDict[bytes, Any] = OrderedDict()
        self.num_bytes = 0
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def computed(
        self, hf_data: Mapping[str, object], hf_kwargs: Mapping[str, object], compute: Callable
    ) -> Any:
        """``compute(hf_data, hf_kwargs)`` (a ``BatchFeature``), or a copy of the one kept for the same
        input. A copy of the mapping, its tensors shared: vLLM adds entries to the one it is given."""
        key = audio_key(hf_data, hf_kwargs)
        if key is None:
            return compute(hf_data, hf_kwargs)
        with self._lock:
            kept = self.kept.get(key)
            if kept is not None:
                self.hits += 1
                self.kept.move_to_end(key)
                return type(kept)(dict(kept))
            self.misses += 1
        features = compute(hf_data, hf_kwargs)
        self._put(key, type(features)(dict(features)))
        return features

    def _put(self, key: bytes, features: Any) -> None:
        size = _size(features)
        with self._lock:
            if size > self.max_bytes or key in self.kept:
                return
            self.kept[key] = features
            self.num_bytes += size
            while self.num_bytes > self.max_bytes:
                _, dropped = self.kept.popitem(last=False)
                self.num_bytes -= _size(dropped)

    def clear(self) -> int:
        """Drops every window's features; returns how many bytes they held."""
        with self._lock:
            freed, self.num_bytes = self.num_bytes, 0
            self.kept.clear()
        return freed

    def stats(self) -> dict[str, int]:
        return {
            "window_features_reused": self.hits,
            "window_features_computed": self.misses,
            "window_features_entries": len(self.kept),
            "window_features_bytes": self.num_bytes,
        }


# The one cache of this process: vLLM's processor (``vllm_internals``) fills it, the service and the
# offline API empty it.
FEATURES = WindowFeatures()
