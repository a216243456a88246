"""Engine settings sized to the model and the machine, for the offline API and ``serve`` alike.

Decided here and nowhere else, each only when the user did not set it:

- dtype: on CPU, float32 unless the CPU has native bf16 (then bfloat16). The bundled tiny.en carries
  ``torch_dtype: float16``, and on a CPU without native half precision float16 ran at a sixth of
  float32's speed. On GPU the model's own dtype stays. ``--dtype auto`` (vLLM's default, written out)
  asks for this default too (:func:`user_choices`).
- KV cache: on CPU, vLLM reserves a fixed amount up front. It is sized from the model's decoder
  (layers, width), its contexts (448 decoder tokens, 1500 encoder rows) and ``max_num_seqs``; an
  idle server hands its pages back until the next request (memory.py).
- the token budget of a step (``max_num_batched_tokens``): on CPU, one encoder output (1500 rows)
  rounded up to whole KV blocks, 1536. vLLM's CPU default, 2048, still ran one 30 s window's encoder
  a step (two need 3000), but vLLM sizes each request's cross-attention by this budget in its
  accounting, and the capture buffers by whole windows within it: 2048 cost a quarter more KV cache
  and twice the capture buffers for nothing.
- the encoders one step may start, on CPU: CPU_ENCODER_WINDOWS_PER_STEP windows, on the scheduler
  alone (``vllm_internals.admit_encoder_rows_per_step``), not through that budget.
- eager execution (``enforce_eager``), on CPU: vLLM's CPU build traces the model with Dynamo but
  compiles nothing with Inductor here, and served no faster for it (32 clients, 12.0-12.6 s a burst
  of 32 clips either way) while it took 12 s longer to start and 55 MiB more in the engine core.
- the scheduling policy: ``priority``, so that requests of one window, live decodes and a streamed
  answer's first window go before the waiting windows of longer files begun less than a head start
  before them (``runners.service.engine_priority``); windows are otherwise taken first come, first
  served as under ``fcfs``. Under ``fcfs`` a live stream's decodes waited behind every window of the
  files posted before them.
- thread binding (environment only; see :func:`engine_environment`).
- the served model id: a name, never a filesystem path.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_whisper_align.log import get_logger

logger = get_logger(__name__)

DEFAULT_MAX_NUM_SEQS = 32
# On CPU, --gpu-memory-utilization is the share of one NUMA node's memory the worker may ask for.
CPU_MEMORY_UTILIZATION = 0.5
# Parallelism within one engine: several workers per engine, each wanting its own core list.
WORKER_PARALLEL_SIZE_ARGS = ("tensor_parallel_size", "pipeline_parallel_size")
# Up to this many cores, the model's threads get every core (see engine_environment).
ALL_CORES_UP_TO = 4

# x86 flags in /proc/cpuinfo of CPUs that compute bf16 natively (AVX512-BF16 dot products, AMX tiles).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# vLLM's CPU backend stores the KV cache in blocks of this many tokens (vllm/platforms/cpu.py).
CPU_KV_BLOCK_SIZE = 128
# Used when the model's config cannot be read here (vLLM will then report why): vLLM's old default.
FALLBACK_KV_CACHE_BYTES = 2 * 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# vLLM's default --dtype: the model's own (float16 for tiny.en), kept as is on an x86 CPU.
VLLM_DEFAULT_DTYPE = "auto"


# ---- dtype ---------------------------------------------------------------------------------------


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags (empty where /proc/cpuinfo has none)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def user_choices(given: Mapping[str, Any]) -> dict[str, Any]:
    """The engine arguments of ``given`` the user chose: all but those None, and but a dtype "auto".

    "auto" is vLLM's default dtype; a user who writes it out asks for the default, not for the
    model's float16, which vLLM's "auto" keeps on an x86 CPU (the dtype note at the top).
    """
    return {
        name: value
        for name, value in given.items()
        if value is not None and (name, value) != ("dtype", VLLM_DEFAULT_DTYPE)
    }


def fast_dtype(on_cpu: bool, flags: frozenset[str]) -> str | None:
    """The dtype to run when the user gives none; None keeps the model's own (GPU)."""
    if not on_cpu:
        return None
    return "bfloat16" if flags & NATIVE_BF16_FLAGS else "float32"


# ---- KV cache ------------------------------------------------------------------------------------


def kv_cache_bytes(hf_config: Any, dtype: str, max_num_seqs: int, block_size: int = CPU_KV_BLOCK_SIZE) -> int:
    """KV cache for ``max_num_seqs`` Whisper requests at full length, with headroom.

    Each request holds, in every decoder layer, K and V for up to ``max_target_positions`` (448)
    decoder tokens and for the ``max_source_positions`` (1500) encoder rows of its cross-attention,
    each rounded up to whole blocks. Whisper's attention has as many KV heads as heads, so one
    token's K or V is ``d_model`` values.
    """
    blocks = math.ceil(hf_config.max_target_positions / block_size)
    blocks += math.ceil(hf_config.max_source_positions / block_size)
    per_token = 2 * hf_config.d_model * DTYPE_BYTES[dtype]
    per_request = blocks * block_size * per_token * hf_config.decoder_layers
    return per_request * max_num_seqs


# On CPU, the new requests whose encoders one engine step may start. vLLM 0.32 sets its scheduler's
# encoder budget from max_num_batched_tokens, one window here (encoder_token_budget), so each step
# admitted one new request, however many were waiting: the second pass of a long alignment (prefill
# only, its encoder outputs cached) ran at one window a step. Raising max_num_batched_tokens instead
# would make vLLM count every request's cross-attention at that many rows (its start-up "Maximum
# concurrency" line: 9.85x instead of 32x for the same cache). Measured through serve (bf16, 6144
# tokens, which admits the same 4 windows): a 30-minute recording aligned in 27.6 s against 34.9 s
# and transcribed in 34.8 s against 39.8 s (medians of 3); the encoder of a step then runs 4 windows
# at once.
CPU_ENCODER_WINDOWS_PER_STEP = 4


def encoder_rows_per_step(vllm_config: Any) -> int:
    """Encoder rows whose computation one engine step may start: vLLM's budget, and on CPU at least
    CPU_ENCODER_WINDOWS_PER_STEP windows. The scheduler admits by it (``vllm_internals``) and the
    capture sizes its per-step key buffer by it (``model``)."""
    budget = vllm_config.scheduler_config.max_num_encoder_input_tokens
    if vllm_config.device_config.device_type != "cpu":
        return budget
    return max(budget, CPU_ENCODER_WINDOWS_PER_STEP * vllm_config.model_config.hf_config.max_source_positions)


def encoder_token_budget(hf_config: Any, block_size: int = CPU_KV_BLOCK_SIZE) -> int:
    """``max_num_batched_tokens`` for one window's encoder output, in whole KV blocks (1536 for 1500 rows).

    vLLM allocates a request's cross-attention by the rows its encoder gives (12 blocks), but counts
    it by this budget when it reports how many requests its KV cache holds; rounded to blocks, the
    two agree, and vLLM's "Maximum concurrency for 448 tokens per request" line reads what
    :func:`kv_cache_bytes` sized (tests/test_server.py checks 32.00x).
    """
    return math.ceil(hf_config.max_source_positions / block_size) * block_size


def _model_dtype(hf_config: Any) -> str:
    dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or "float32"
    return str(dtype).removeprefix("torch.")


def _load_config(model: str) -> Any | None:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as error:
        logger.warning("whisper-align: cannot read %s's config to size the KV cache (%s)", model, error)
        return None


# ---- the settings --------------------------------------------------------------------------------


def engine_settings(model: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """Engine arguments for ``model`` that the user has not set in ``given`` (engine argument names)."""
    from vllm.platforms import current_platform

    given = user_choices(given)

    settings: dict[str, Any] = {
        "limit_mm_per_prompt": {"audio": 1},
        "max_num_seqs": DEFAULT_MAX_NUM_SEQS,
        "scheduling_policy": "priority",
    }
    on_cpu = current_platform.is_cpu()
    dtype = fast_dtype(on_cpu, cpu_flags())
    if dtype is not None:
        settings["dtype"] = dtype
    if on_cpu:
        settings["gpu_memory_utilization"] = CPU_MEMORY_UTILIZATION
        settings["enforce_eager"] = True
        hf_config = _load_config(model)
        if hf_config is not None:
            settings["max_num_batched_tokens"] = encoder_token_budget(
                hf_config, given.get("block_size") or CPU_KV_BLOCK_SIZE
            )
        # vLLM lets this variable override the engine argument (a legacy setting), so it wins here too.
        if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            merged = {**settings, **given}
            settings["kv_cache_memory_bytes"] = _cpu_kv_cache_bytes(hf_config, merged)
    chosen = {name: value for name, value in settings.items() if given.get(name) is None}
    _log_choices(chosen, on_cpu)
    return chosen


def _cpu_kv_cache_bytes(hf_config: Any | None, args: Mapping[str, Any]) -> int:
    if hf_config is None:
        return FALLBACK_KV_CACHE_BYTES
    dtype = args.get("dtype") or VLLM_DEFAULT_DTYPE
    if dtype == VLLM_DEFAULT_DTYPE:
        dtype = _model_dtype(hf_config)
    block_size = args.get("block_size") or CPU_KV_BLOCK_SIZE
    # A dtype not listed (an fp8 KV cache, say) is sized as float32: more than it needs.
    return kv_cache_bytes(
        hf_config, dtype if dtype in DTYPE_BYTES else "float32", args["max_num_seqs"], block_size
    )


def _log_choices(chosen: Mapping[str, Any], on_cpu: bool) -> None:
    parts = []
    if "dtype" in chosen:
        reason = "CPU with native bf16" if chosen["dtype"] == "bfloat16" else "CPU without native bf16/fp16"
        parts.append(f"dtype {chosen['dtype']} ({reason}; --dtype overrides)")
    if "kv_cache_memory_bytes" in chosen:
        parts.append(
            f"KV cache {chosen['kv_cache_memory_bytes'] / 2**20:.0f} MiB "
            f"(sized to the model; --kv-cache-memory-bytes overrides)"
        )
    if "max_num_seqs" in chosen:
        parts.append(f"max_num_seqs {chosen['max_num_seqs']}")
    if "max_num_batched_tokens" in chosen:
        parts.append(f"max_num_batched_tokens {chosen['max_num_batched_tokens']} (a window's encoder output)")
    if chosen.get("enforce_eager"):
        parts.append("eager (no graph compilation; --no-enforce-eager overrides)")
    if parts:
        logger.info("whisper-align defaults for this %s: %s", "CPU" if on_cpu else "GPU", ", ".join(parts))


# ---- environment ---------------------------------------------------------------------------------


def engine_environment(given: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Variables the engine's processes must inherit, minus those already set (the user's win).

    Thread binding has no engine argument: vLLM's CPU worker reads VLLM_CPU_OMP_THREADS_BIND from its
    environment, which it inherits from the process that starts the engine. So the caller applies
    what this returns to that environment: ``WhisperAligner`` to ``os.environ`` before it builds the
    engine, ``serve`` to the environment of the server it execs.

    vLLM binds the model's OpenMP threads to all cores but one, which it leaves to its scheduler and
    API processes. Those mostly wait on the model, so on a small machine the reserved core is lost:
    on 2 cores, binding both took offline throughput from 9.4 to 15.1 audio-s per wall-s
    (docs/tuning.md). With data parallelism the cores are shared out (:func:`thread_binding`).
    Workers start with spawn: forking a process that holds CUDA or OpenMP state breaks them.
    """
    from vllm.platforms import current_platform

    wanted = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    binding = thread_binding(given, sorted(os.sched_getaffinity(0)))
    if current_platform.is_cpu() and binding is not None:
        wanted["VLLM_CPU_OMP_THREADS_BIND"] = binding
    return {name: value for name, value in wanted.items() if name not in environ}


def thread_binding(given: Mapping[str, Any], cores: list[int]) -> str | None:
    """VLLM_CPU_OMP_THREADS_BIND giving this host's engines all of ``cores``, or None (vLLM decides).

    With data parallelism each engine is a process with its own worker, and vLLM takes one core
    list per local engine, ``|``-separated, in local-rank order (vllm/utils/ompmultiprocessing.py).
    Its automatic binding shares NUMA nodes out between the workers of one engine only, so every
    engine on a one-node host takes the same cores (on 2 cores: all on core 0, core 1 reserved for
    the API). Here the cores are split evenly between the engines this host runs
    (``--data-parallel-size-local``, else ``--data-parallel-size``): on 2 cores, data parallel 2 is
    ``0|1``. Left to vLLM: tensor or pipeline parallelism (a list per worker within an engine), more
    than ALL_CORES_UP_TO cores (its reserved core matters less there), more engines than cores.
    """
    if any(given.get(name) not in (None, 1) for name in WORKER_PARALLEL_SIZE_ARGS):
        return None
    engines = given.get("data_parallel_size_local") or given.get("data_parallel_size") or 1
    if len(cores) > ALL_CORES_UP_TO or engines > len(cores):
        return None
    share, extra = divmod(len(cores), engines)
    lists, start = [], 0
    for engine in range(engines):
        end = start + share + (engine < extra)
        lists.append(",".join(map(str, cores[start:end])))
        start = end
    return "|".join(lists)


# ---- served name ---------------------------------------------------------------------------------


def served_model_name(model_arg: str | None) -> str:
    """The id clients see in /v1/models for what the user asked for (``serve``'s MODEL argument).

    A bundled model's name (``whisper-tiny.en``, ``whisper-base``); an existing directory's basename;
    otherwise the argument itself (a Hugging Face id such as ``openai/whisper-large-v3``).
    """
    from vllm_whisper_align.checkpoints.bundled import BUNDLED_MODEL_NAMES, DEFAULT_BUNDLED_MODEL

    model_arg = model_arg or DEFAULT_BUNDLED_MODEL
    if model_arg in BUNDLED_MODEL_NAMES:
        return BUNDLED_MODEL_NAMES[model_arg]
    path = Path(model_arg).expanduser()
    if path.is_dir():
        return path.resolve().name
    return model_arg
