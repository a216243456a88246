"""The general plugin: what vLLM calls in every process (API server, engine core, workers).

``register`` checks that this vLLM is one the plugin supports, makes our Whisper class serve the
``WhisperForConditionalGeneration`` architecture, and gives vLLM's workers the per-step capture
hook and the RPC methods of the alignment store (through :mod:`vllm_whisper_align.engine.vllm_internals`).
"""

from __future__ import annotations

import time
from typing import Any

from vllm_whisper_align import memory
from vllm_whisper_align.engine import lifetime, settings, vllm_internals
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.protocol import (
    NO_CAPTURE_MESSAGE,
    RPC_CLEAR_ENCODER_CACHE,
    RPC_DISCARD,
    RPC_FETCH,
    RPC_NO_SPEECH,
    RPC_RETURN_IDLE_MEMORY,
    RPC_STATS,
)

logger = get_logger(__name__)

ARCHITECTURE = "WhisperForConditionalGeneration"
MODEL_CLASS = "vllm_whisper_align.engine.model:WhisperAlignForConditionalGeneration"


def register() -> None:
    from vllm import ModelRegistry

    vllm_internals.check_vllm()
    lifetime.exit_with_parent()
    lifetime.skip_the_collection_at_exit()
    vllm_internals.guard_kernel_override_scan()
    vllm_internals.keep_single_cpu_worker_in_engine_core()
    vllm_internals.admit_encoder_rows_per_step(settings.encoder_rows_per_step, ARCHITECTURE)
    # A string keeps torch/model imports out of processes that never build the model.
    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
    vllm_internals.install_worker_methods(
        _after_step,
        {
            RPC_FETCH: _fetch,
            RPC_DISCARD: _discard,
            RPC_STATS: _stats,
            RPC_NO_SPEECH: _no_speech,
            RPC_RETURN_IDLE_MEMORY: _return_idle_memory,
            RPC_CLEAR_ENCODER_CACHE: _clear_encoder_cache,
        },
    )


def alignment_capture_of(worker_wrapper: Any):
    """The loaded model's AlignmentCapture, or None (another model, TP > 1, not loaded yet)."""
    return vllm_internals.model_attribute(worker_wrapper, "alignment_capture")


def encoder_cache_of(worker_wrapper: Any):
    """The loaded model's EncoderOutputCache, or None (off, not on CPU, another model)."""
    return vllm_internals.model_attribute(worker_wrapper, "encoder_cache")


def _after_step(worker_wrapper: Any, scheduler_output: Any) -> None:
    global _last_step_at
    _last_step_at = time.monotonic()
    capture = alignment_capture_of(worker_wrapper)
    if capture is None:
        return
    try:
        capture.after_step(scheduler_output, vllm_internals.batch_req_ids(worker_wrapper))
    except Exception as error:  # a capture bug must cost word timings, not the engine
        logger.exception("Word-timestamp capture failed; dropping the requests in flight")
        capture.fail_all(f"capture failed: {error}")


def _require_capture(worker_wrapper: Any):
    capture = alignment_capture_of(worker_wrapper)
    if capture is None:
        raise RuntimeError(NO_CAPTURE_MESSAGE)
    return capture


def _fetch(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from vllm_whisper_align.protocol import AlignmentRequest

    return _require_capture(self).fetch([AlignmentRequest(**r) for r in requests])


def _no_speech(self, keys: list[str]) -> list[dict[str, Any]]:
    return _require_capture(self).no_speech_probs(list(keys))


def _discard(self, keys: list[str]) -> int:
    return _require_capture(self).discard(list(keys))


def _stats(self) -> dict[str, int]:
    buffers = vllm_internals.kv_cache_buffers(self)
    encoder_cache = encoder_cache_of(self)
    return {
        **_require_capture(self).stats(),
        **(encoder_cache.stats() if encoder_cache is not None else {}),
        "heap_returns": _heap_returns,
        "kv_cache_releases": _kv_cache_releases,
        "kv_cache_bytes": sum(nbytes for _, nbytes in buffers),
        "kv_cache_resident_bytes": sum(memory.resident_bytes(*buffer) for buffer in buffers),
    }


def _clear_encoder_cache(self) -> int:
    """Empties the encoder cache (``WhisperAligner`` does at the end of each call); bytes freed."""
    encoder_cache = encoder_cache_of(self)
    return encoder_cache.clear() if encoder_cache is not None else 0


# Times this worker process handed freed heap, and its KV cache's pages, back to the OS (see _stats).
_heap_returns = 0
_kv_cache_releases = 0
# When this worker last ran a model step (monotonic seconds; None: never since start-up).
_last_step_at: float | None = None


def _return_idle_memory(self) -> bool:
    """Freed heap back to the OS and, if no step has run for a while, the pages of the KV cache and of
    the capture pool, and the encoder cache, too.

    The API server asks once it has had no request in flight for IDLE_BEFORE_RETURNING_MEMORY_S. The
    worker checks its own side: a request that holds KV blocks runs a step every scheduler loop, so
    none has run for that long only when no request is running (Whisper runs without prefix caching,
    so no finished request's blocks are read again). Steps and RPCs run one at a time in a worker.
    """
    global _heap_returns, _kv_cache_releases
    _heap_returns += 1
    idle = _last_step_at is None or time.monotonic() - _last_step_at >= memory.IDLE_BEFORE_RETURNING_MEMORY_S
    encoder_cache = encoder_cache_of(self)
    cleared = encoder_cache.clear() if idle and encoder_cache is not None else 0  # before the heap goes
    returned = memory.return_freed_heap() or cleared > 0
    if idle:
        released = sum(memory.release_pages(*buffer) for buffer in vllm_internals.kv_cache_buffers(self))
        _kv_cache_releases += released > 0
        capture = alignment_capture_of(self)
        if capture is not None:
            released += capture.release_slot_pages()
        returned = returned or released > 0
    return returned
