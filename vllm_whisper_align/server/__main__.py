"""``python -m vllm_whisper_align.server ARGS``: vLLM's ``serve`` with ARGS, in this process.

What ``vllm-whisper-align serve`` execs once it has added its defaults and environment; see
:func:`vllm_whisper_align.vllm_adapter.run_vllm_serve`. Guarded: vLLM's processes start with
spawn, which imports this module again in each child.
"""

import sys

from vllm_whisper_align.vllm_adapter import run_vllm_serve

if __name__ == "__main__":
    run_vllm_serve(sys.argv[1:])
