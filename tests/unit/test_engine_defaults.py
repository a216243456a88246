"""Engine settings decided from the model and the machine, without starting an engine."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from vllm_whisper_align import cli
from vllm_whisper_align.engine import settings
from vllm_whisper_align.engine.settings import (
    cpu_flags,
    encoder_token_budget,
    engine_environment,
    fast_dtype,
    kv_cache_bytes,
    served_model_name,
    thread_binding,
)
from vllm_whisper_align.runners.offline import default_engine_args

ZEN3_FLAGS = frozenset("fpu sse sse2 avx avx2 fma f16c".split())
TINY = SimpleNamespace(d_model=384, decoder_layers=4, max_target_positions=448, max_source_positions=1500)


def test_dtype_follows_native_bf16():
    assert fast_dtype(True, ZEN3_FLAGS) == "float32"  # f16c converts, it does not compute
    assert fast_dtype(True, ZEN3_FLAGS | {"avx512f", "avx512_bf16"}) == "bfloat16"
    assert fast_dtype(True, ZEN3_FLAGS | {"amx_bf16", "amx_tile"}) == "bfloat16"
    assert fast_dtype(True, frozenset()) == "float32"
    assert fast_dtype(False, ZEN3_FLAGS) is None  # GPU: the model's own dtype


def test_cpu_flags_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_kv_cache_fits_max_num_seqs_full_length_requests():
    # tiny.en: 4 + 12 blocks of 128 tokens (448 decoder tokens, 1500 encoder rows), in 4 decoder
    # layers, K and V of 384 values: 24 MiB per request in float32, 12 MiB in bfloat16.
    assert kv_cache_bytes(TINY, "float32", 32) == 24 * 2**20 * 32
    assert kv_cache_bytes(TINY, "bfloat16", 32) == 12 * 2**20 * 32
    assert kv_cache_bytes(TINY, "float32", 1, block_size=16) == (28 + 94) * 16 * 2 * 384 * 4 * 4


def test_step_budget_is_one_encoder_output_in_whole_blocks():
    # vLLM counts a request's cross-attention by this budget: 12 blocks, as many as 1500 rows take.
    assert encoder_token_budget(TINY) == 1536
    assert encoder_token_budget(TINY, block_size=16) == 1504


def test_served_name_is_a_name(tmp_path):
    assert served_model_name(None) == "whisper-tiny.en"
    assert served_model_name("tiny.en") == "whisper-tiny.en"
    assert served_model_name("base") == "whisper-base"
    assert served_model_name("openai/whisper-large-v3") == "openai/whisper-large-v3"
    model_dir = tmp_path / "models" / "my-whisper"
    model_dir.mkdir(parents=True)
    assert served_model_name(str(model_dir)) == "my-whisper"
    assert served_model_name(f"{model_dir}/") == "my-whisper"


def test_environment_is_returned_not_applied(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    before = dict(os.environ)
    cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    wanted = engine_environment({})
    if len(cores.split(",")) <= settings.ALL_CORES_UP_TO:
        assert wanted["VLLM_CPU_OMP_THREADS_BIND"] == cores
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_environment({"tensor_parallel_size": 2})
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_environment({}, {"VLLM_CPU_OMP_THREADS_BIND": "0"})
    assert dict(os.environ) == before


def test_thread_binding_shares_the_cores_between_this_hosts_engines():
    """vLLM takes one core list per local data-parallel engine, `|`-separated, in local-rank order."""
    assert thread_binding({}, [0, 1]) == "0,1"
    assert thread_binding({"data_parallel_size": 2}, [0, 1]) == "0|1"
    assert thread_binding({"data_parallel_size": 2}, [0, 1, 2]) == "0,1|2"
    assert thread_binding({"data_parallel_size": 3}, [4, 5, 6, 7]) == "4,5|6|7"
    # The second "host" of a two-host layout runs one engine here: all of this host's cores.
    assert thread_binding({"data_parallel_size": 2, "data_parallel_size_local": 1}, [0, 1]) == "0,1"
    assert thread_binding({"data_parallel_size": 4}, [0, 1]) is None  # more engines than cores
    assert thread_binding({"data_parallel_size": 2, "tensor_parallel_size": 2}, [0, 1, 2, 3]) is None
    assert thread_binding({}, list(range(settings.ALL_CORES_UP_TO + 1))) is None


def test_default_engine_args_sized_to_model_without_side_effects(model_dir, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    before = dict(os.environ)
    args = default_engine_args(str(model_dir))
    assert dict(os.environ) == before
    dtype = fast_dtype(True, cpu_flags())
    assert args["dtype"] == dtype
    assert args["kv_cache_memory_bytes"] == kv_cache_bytes(TINY, dtype, args["max_num_seqs"])
    given = default_engine_args(str(model_dir), dtype="float16", kv_cache_memory_bytes=10**9, max_num_seqs=4)
    assert (given["dtype"], given["kv_cache_memory_bytes"], given["max_num_seqs"]) == ("float16", 10**9, 4)
    # "auto", vLLM's default written out, asks for the default: not the model's float16.
    assert default_engine_args(str(model_dir), dtype="auto")["dtype"] == dtype
    # vLLM 0.32 turns its multimodal processor cache off for encoder-decoder models whatever it is told.
    assert "mm_processor_cache_gb" not in args
    assert args["max_num_batched_tokens"] == 1536
    assert default_engine_args(str(model_dir), max_num_batched_tokens=4096)["max_num_batched_tokens"] == 4096
    # Live decodes go before waiting file windows (runners.service.engine_priority); a policy given stays.
    assert args["scheduling_policy"] == "priority"
    assert default_engine_args(str(model_dir), scheduling_policy="fcfs")["scheduling_policy"] == "fcfs"


def test_user_kv_space_variable_wins(model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    assert "kv_cache_memory_bytes" not in default_engine_args(str(model_dir))


USER_SERVE_ARGV = [
    "--port",
    "8000",
    "--dtype=float16",
    "--served-model-name",
    "mine",
    "-tp",
    "1",
    "--no-enforce-eager",
]


@pytest.mark.parametrize("argv", [[], USER_SERVE_ARGV])
def test_serve_passes_only_what_the_user_did_not(model_dir, argv, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # the user's KV setting would win
    flags, user_flags, env = cli._serve_defaults(None, str(model_dir), argv)
    assert user_flags == argv
    options = vars(cli._engine_parser().parse_args(flags))  # the flags parse as vLLM's own
    if argv:
        assert not {"--dtype", "--served-model-name", "--enforce-eager", "--no-enforce-eager"} & set(flags)
    else:
        assert options["dtype"] == fast_dtype(True, cpu_flags())
        assert options["served_model_name"] == ["whisper-tiny.en"]
        assert options["enforce_eager"] is True
    assert options["kv_cache_memory_bytes"] > 0
    assert options["max_num_batched_tokens"] == 1536
    assert env.get("VLLM_WORKER_MULTIPROC_METHOD", os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")) == "spawn"


@pytest.mark.parametrize("auto", [["--dtype=auto"], ["--dtype", "auto"]])
def test_serve_reads_dtype_auto_as_its_default(model_dir, auto):
    """`--dtype auto` is vLLM's default written out: serve gives its CPU pick, not the model's float16."""
    argv = ["--port", "8000", *auto, "--max-num-seqs", "4"]
    flags, user_flags, _ = cli._serve_defaults(None, str(model_dir), argv)
    assert user_flags == ["--port", "8000", "--max-num-seqs", "4"]
    options = vars(cli._engine_parser().parse_known_args(flags + user_flags)[0])  # as serve passes them
    assert options["dtype"] == fast_dtype(True, cpu_flags())
    assert options["max_num_seqs"] == 4


@pytest.mark.parametrize(("given", "backend"), [({}, "uni"), ({"distributed_executor_backend": "mp"}, "mp")])
def test_one_cpu_worker_runs_in_the_engine_core_unless_the_user_asks(model_dir, given, backend):
    """vLLM's CPU platform would move a single worker into a process of its own (a third copy of
    torch and vLLM: 560 MiB PSS); the plugin keeps vLLM's "uni" choice, and the user's "mp" stays."""
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(**default_engine_args(str(model_dir), **given)).create_engine_config()
    assert config.parallel_config.distributed_executor_backend == backend


@pytest.mark.parametrize(("binding", "threads"), [("0,1", "2"), ("0", "1"), ("nobind", "1")])
def test_engine_core_gets_the_workers_openmp_threads(model_dir, monkeypatch, binding, threads):
    """vLLM's "mp" executor sets OMP_NUM_THREADS to the bound cores around spawning its worker; with the
    worker in the engine core, the engine core must inherit that instead of whatever was set (Ray sets 1
    in its actors: the model then ran on one of two cores). "nobind": vLLM sets nothing, nor do we."""
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", binding)
    EngineArgs(**default_engine_args(str(model_dir))).create_engine_config()
    assert os.environ["OMP_NUM_THREADS"] == threads


def test_engine_processes_import_neither_numba_nor_the_api_side():
    """What runs inside vLLM's processes (``engine/``) must not pull in numba (its LLVM costs every
    engine process memory; the DTW kernels run on the API side) nor any API-side package."""
    code = (
        "import importlib, pkgutil, sys, vllm_whisper_align.engine as engine\n"
        "for module in pkgutil.iter_modules(engine.__path__):\n"
        "    importlib.import_module(f'vllm_whisper_align.engine.{module.name}')\n"
        "api = ('align', 'runners', 'server', 'formats', 'longform', 'batch', 'cli')\n"
        "loaded = sorted(n for n in sys.modules if n == 'numba' or n.split('.')[1:2] and n.split('.')[0] == "
        "'vllm_whisper_align' and n.split('.')[1] in api)\n"
        "print(loaded)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_serve_keeps_idle_connections_unless_the_user_says_otherwise():
    from vllm_whisper_align.server.limits import KEEP_ALIVE_ENV, KEEP_ALIVE_S, http_environment

    assert http_environment({}) == {KEEP_ALIVE_ENV: str(KEEP_ALIVE_S)}
    assert http_environment({KEEP_ALIVE_ENV: "5"}) == {}


def test_the_live_stream_limit_comes_from_the_environment_and_a_bad_one_is_named(monkeypatch):
    from vllm_whisper_align.server.limits import MAX_LIVE_STREAMS_ENV, ServerLimits

    monkeypatch.delenv(MAX_LIVE_STREAMS_ENV, raising=False)
    assert ServerLimits.from_env().max_live_streams is None  # the engines' own batch (runners.live)
    monkeypatch.setenv(MAX_LIVE_STREAMS_ENV, "4")
    assert ServerLimits.from_env().max_live_streams == 4
    for bad in ("0", "-1", "two", "2.5"):
        monkeypatch.setenv(MAX_LIVE_STREAMS_ENV, bad)
        with pytest.raises(ValueError, match=MAX_LIVE_STREAMS_ENV):
            ServerLimits.from_env()


def test_urgent_requests_go_before_a_file_for_the_head_start_and_no_longer(monkeypatch):
    """Priorities as vLLM compares them (lower first): a file begun at 0, head start 120 s."""
    from vllm_whisper_align.runners import service

    now = [1_800_000_000.0]
    began = now[0]
    monkeypatch.setattr(service.time, "time", lambda: now[0])

    def file_window() -> int:
        return service.engine_priority(False, began, 120)

    def urgent() -> int:
        return service.engine_priority(True, 0.0, 120)

    first = file_window()
    now[0] += 100
    assert urgent() < first  # a short request sent 100 s after the file goes first
    assert file_window() == first  # a window sent later (a fallback) keeps its file's date
    now[0] += 30
    assert urgent() > first  # 130 s after: the file's waiting windows go first
    later = file_window()
    # A long file's later windows: beside urgent ones, which vLLM then takes in order of arrival.
    assert later > first and later == urgent()


# A process named as vLLM names its engine core, with a cycle of garbage whose finalizer writes a line
# when the cycle is collected; ``skip`` says whether it calls lifetime.skip_the_collection_at_exit.
ENGINE_CORE_EXIT = """
import multiprocessing, sys

class Cycle:
    def __del__(self):
        with open(sys.argv[1], "a") as out:
            out.write("collected\\n")

def engine_core(skip):
    from vllm_whisper_align.engine import lifetime
    if skip:
        lifetime.skip_the_collection_at_exit()
    cycle = Cycle()
    cycle.me = cycle
    del cycle

if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=engine_core, args=(sys.argv[2] == "skip",), name="EngineCore")
    process.start()
    process.join()
    sys.exit(process.exitcode)
"""


@pytest.mark.parametrize("skip", [True, False])
def test_an_engine_core_exits_without_collecting_its_heap_again(tmp_path, skip):
    """An engine core freezes its heap as it exits (engine.lifetime): a cycle still uncollected then is
    left to the process's end, as the rest of the heap is (traversing it took about 3 s of every
    engine's stop); without it, Python's last collection finalizes the cycle."""
    script, out = tmp_path / "core.py", tmp_path / "collected.txt"
    script.write_text(ENGINE_CORE_EXIT)
    args = [sys.executable, str(script), str(out), "skip" if skip else "collect"]
    subprocess.run(args, check=True, timeout=120)
    assert out.exists() != skip
