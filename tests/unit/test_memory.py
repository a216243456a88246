"""What keeps the processes we start lean (vllm_whisper_align.memory), each in a fresh interpreter:
hiding Triton changes the process for good."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from vllm_whisper_align import memory


def run_python(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.skipif(not memory.vllm_is_cpu_build(), reason="only vLLM's CPU build disables Triton")
def test_vllm_cpu_build_runs_without_loading_triton():
    """vLLM decides as it does with Triton loaded (disabled: no CPU backend); libtriton is never mapped."""
    out = run_python("""
        from vllm_whisper_align.memory import hide_triton_without_cpu_backend
        assert hide_triton_without_cpu_backend()
        import vllm.triton_utils.importing as importing
        from vllm.platforms import current_platform
        import torch.utils._triton
        maps = open("/proc/self/maps").read()
        print(importing.HAS_TRITON, current_platform.is_cpu(), torch.utils._triton.has_triton(),
              "libtriton" in maps)
    """)
    assert out.splitlines()[-1] == "False True False False"


def test_a_triton_with_a_cpu_backend_stays(tmp_path):
    """triton-cpu (a Triton with backends/cpu) is what vLLM's CPU build would use: it is not hidden."""
    package = tmp_path / "triton"
    (package / "backends" / "cpu").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    out = run_python(
        """
        import sys
        from vllm_whisper_align import memory
        memory.vllm_is_cpu_build = lambda: True
        hidden = memory.hide_triton_without_cpu_backend()
        print(memory.triton_has_cpu_backend(), hidden, sys.modules.get("triton", 0))
    """,
        PYTHONPATH=f"{tmp_path}:{':'.join(sys.path)}",
    )
    assert out == "True False 0"


def test_freed_heap_goes_back():
    """glibc's malloc_trim answers (1: pages went back) after a large heap block is freed."""
    out = run_python("""
        import ctypes
        from vllm_whisper_align.memory import return_freed_heap
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: keep the blocks below on the heap
        blocks = [libc.malloc(1 << 20) for _ in range(64)]
        for block in blocks[:-1]:
            libc.free(ctypes.c_void_p(block))
        print(return_freed_heap())
    """)
    assert out == "True"


def test_released_pages_leave_ram_and_read_as_zeros():
    """An idle engine's KV cache and capture pool go back page by page: out of RAM, zeros on the next read,
    and the partial pages at either edge (shared with neighbouring memory) untouched."""
    import mmap

    import numpy as np

    buffer = np.full(64 * mmap.PAGESIZE + 100, 7, dtype=np.uint8)
    address, nbytes = buffer.ctypes.data, buffer.nbytes
    assert memory.resident_bytes(address, nbytes) >= 63 * mmap.PAGESIZE
    released = memory.release_pages(address, nbytes)
    assert 63 * mmap.PAGESIZE <= released <= 64 * mmap.PAGESIZE
    assert memory.resident_bytes(address, nbytes) == 0
    first = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE - address  # first byte of a whole page
    assert (buffer[:first] == 7).all() and (buffer[first : first + released] == 0).all()
    assert (buffer[first + released :] == 7).all()
    assert memory.release_pages(address, mmap.PAGESIZE - 1) == 0  # no whole page: nothing
