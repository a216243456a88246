"""``python -m vllm_whisper_align.server.launch ARGS``: vLLM's ``serve`` with ARGS, in this process.

What ``vllm-whisper-align serve`` execs once it has added its defaults and environment; see
:func:`vllm_whisper_align.engine.vllm_internals.run_vllm_serve`. Guarded: vLLM's processes start with
spawn, which runs this module again in each child before anything else, so Triton is hidden here,
before vLLM is imported, in the API server and in every engine (:mod:`vllm_whisper_align.memory`).
Not a package ``__main__``: spawn does not run those again.
"""

import sys

from vllm_whisper_align.memory import hide_triton_without_cpu_backend

hide_triton_without_cpu_backend()

from vllm_whisper_align.engine.vllm_internals import run_vllm_serve  # noqa: E402  (after the hiding)

if __name__ == "__main__":
    run_vllm_serve(sys.argv[1:])
