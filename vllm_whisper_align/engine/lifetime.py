"""An engine core outlives nothing that started it, and ends without a last collection of its heap.

vLLM's front end stops its engine core when it shuts down, but a front end that is killed (SIGKILL, the
OOM killer, a Ray task cancelled, a script's Python sent SIGTERM, on which ``LLM`` runs no cleanup)
leaves the engine running with no one to serve: its 800 MB or more held and its threads polling, until
someone kills it by hand. vLLM watches its workers' parent (the executor's death pipe) but not the
engine core's. So the engine core watches its own parent and, once it is gone, asks itself to shut down
the way its front end would (SIGTERM, which vLLM's engine core handles by leaving its busy loop).
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import threading
import time

from vllm_whisper_align.engine import vllm_internals
from vllm_whisper_align.log import get_logger

logger = get_logger(__name__)

# How often the engine looks for its parent. Not multiprocessing's parent sentinel: that pipe closes when
# the parent's Process object is finalized, which a live parent may do.
PARENT_POLL_S = 1.0
# After asking itself to stop, how long an engine waits before it exits hard (a shutdown that hangs).
SHUTDOWN_GRACE_S = 30.0


def exit_with_parent() -> None:
    """In an engine core process: start a daemon thread that shuts the engine down once the process
    that started it has exited, however it ended. Elsewhere: nothing."""
    if not vllm_internals.in_engine_core_process():
        return
    parent_pid = os.getppid()
    threading.Thread(target=_watch, args=(parent_pid,), name="vwa-parent-watch", daemon=True).start()


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:  # an orphan is handed to init (or a subreaper): another parent
        time.sleep(PARENT_POLL_S)
    logger.warning(
        "The process that started this engine (pid %s) is gone; shutting the engine down", parent_pid
    )
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(SHUTDOWN_GRACE_S)
    logger.error("The engine did not stop within %.0f s of its parent's exit; exiting", SHUTDOWN_GRACE_S)
    os._exit(1)


def skip_the_collection_at_exit() -> None:
    """In an engine core process: freeze the heap as the process exits, so that Python's collection at
    finalization skips it. After vLLM's own shutdown (which unfreezes the heap and collects it once),
    that second traversal of what torch, vLLM and pydantic leave took about 3 s of every engine's stop
    (py-spy: ``gc_collect_main`` after ``cleanup_dist_env_and_memory``), while its front end waited.
    vLLM 0.32 does the same itself on ROCm only (``EngineCoreProc.run_engine_core``): the process's
    exit gives everything back. Elsewhere: nothing (a program's own exit is its business)."""
    if vllm_internals.in_engine_core_process():
        atexit.register(gc.freeze)
