"""The general plugin: what vLLM calls in every process (API server, engine core, workers).

``register`` makes our Whisper class serve the ``WhisperForConditionalGeneration`` architecture and
gives vLLM's worker wrapper (the object every executor sends ``collective_rpc`` to) the per-step hook
and the RPC methods of the alignment store. vLLM may call it more than once per process.
"""

from __future__ import annotations

from typing import Any

from vllm_whisper_align.log import get_logger

logger = get_logger(__name__)

ARCHITECTURE = "WhisperForConditionalGeneration"
MODEL_CLASS = "vllm_whisper_align.model:WhisperAlignForConditionalGeneration"

# Names of the worker methods the API side calls through collective_rpc.
RPC_FETCH = "whisper_align_fetch"
RPC_DISCARD = "whisper_align_discard"
RPC_STATS = "whisper_align_stats"
NO_CAPTURE_MESSAGE = "this engine does not capture alignment heads (not a Whisper model, or TP > 1)"


def register() -> None:
    from vllm import ModelRegistry

    # A string keeps torch/model imports out of processes that never build the model.
    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
    _install_worker_methods()


def _install_worker_methods() -> None:
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    if getattr(WorkerWrapperBase, RPC_FETCH, None) is not None:
        return
    execute_model = WorkerWrapperBase.execute_model

    def execute_model_with_capture(self, scheduler_output, *args, **kwargs):
        output = execute_model(self, scheduler_output, *args, **kwargs)
        capture = alignment_capture_of(self)
        if capture is not None:
            try:
                capture.after_step(scheduler_output, _batch_req_ids(self.worker.model_runner))
            except Exception as error:  # a capture bug must cost word timings, not the engine
                logger.exception("Word-timestamp capture failed; dropping the requests in flight")
                capture.fail_all(f"capture failed: {error}")
        return output

    WorkerWrapperBase.execute_model = execute_model_with_capture
    setattr(WorkerWrapperBase, RPC_FETCH, _fetch)
    setattr(WorkerWrapperBase, RPC_DISCARD, _discard)
    setattr(WorkerWrapperBase, RPC_STATS, _stats)


def alignment_capture_of(worker_wrapper: Any):
    """The loaded model's AlignmentCapture, or None (another model, TP > 1, not loaded yet)."""
    worker = getattr(worker_wrapper, "worker", None)
    runner = getattr(worker, "model_runner", None)
    model = getattr(runner, "model", None)
    # CUDA-graph and compile wrappers keep the real module under .unwrap() / .module.
    for _ in range(3):
        if model is None or hasattr(model, "alignment_capture"):
            break
        model = model.unwrap() if hasattr(model, "unwrap") else getattr(model, "module", None)
    return getattr(model, "alignment_capture", None)


def _batch_req_ids(runner: Any) -> list[str]:
    """Request ids in the order of the step's flattened tokens."""
    state = getattr(runner, "execute_model_state", None)
    input_batch = getattr(state, "input_batch", None)  # model runner V2
    if input_batch is None:
        input_batch = runner.input_batch  # model runner V1 (CPU, and GPU when V2 is off)
    return list(input_batch.req_ids)


def _require_capture(worker_wrapper: Any):
    capture = alignment_capture_of(worker_wrapper)
    if capture is None:
        raise RuntimeError(NO_CAPTURE_MESSAGE)
    return capture


def _fetch(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from vllm_whisper_align.params import AlignmentRequest

    return _require_capture(self).fetch([AlignmentRequest(**r) for r in requests])


def _discard(self, keys: list[str]) -> int:
    return _require_capture(self).discard(list(keys))


def _stats(self) -> dict[str, int]:
    return _require_capture(self).stats()
