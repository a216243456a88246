"""Nothing of a corpus job outlives its driver: neither the processes it starts nor the files it writes.

A local Ray's gcs_server and raylet die with the driver (Ray starts them with PR_SET_PDEATHSIG), but not what
the raylet starts: its agents (RuntimeEnvAgent, DashboardAgent) first try to tell the dead GCS, for up to a
minute, and a replica's worker with its engine goes on until it notices its raylet is gone. So:

- the driver (:func:`reaped_with_this_process`) starts a reaper: a process of its own session (spared by a
  kill of the driver's process group) that reads a pipe from the driver and looks at the driver's
  descendants every REAPER_LOOK_S. The pipe closes when the driver ends, however it ends; the reaper then
  kills every descendant it saw that still runs (re-parented by then) and every process that carries the job's
  mark, and exits. The mark (``JOB_MARK_ENV``, set in the driver's environment before Ray starts, so every
  process of the job inherits it) covers what started since the last look; it cannot be all, as a process
  that sets its title (Ray's agents) may no longer show its environment;
- a replica (:class:`Lifeline`) asks before each step of a write whether the driver is still there, and a
  thread of its own ends it, its engine first, once the driver or its parent is gone.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# Inherited by every process a job starts: the reaper kills those that carry the job's value.
JOB_MARK_ENV = "VLLM_WHISPER_ALIGN_BATCH_JOB"
# How often a replica looks whether its driver and its parent are still there.
WATCH_INTERVAL_S = 0.25
# How often the reaper looks at the driver's descendants (one look: a few ms of CPU for a hundred processes).
REAPER_LOOK_S = 1.0
# The reaper kills until a sweep finds nothing to kill (or this long has passed), with a pause between sweeps
# for processes forked during one.
REAP_TIMEOUT_S = 30.0
REAP_PAUSE_S = 0.1


# ---- the driver, seen from a replica ---------------------------------------------------------------------


def pid_space() -> str | None:
    """The machine and pid namespace a pid means something in (None where /proc cannot tell): containers
    on one host share the boot id but not their pids."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


@dataclass(frozen=True)
class Driver:
    """The process a job works for: its pid, when it started (a reused pid is another process), and where."""

    pid: int
    started: float
    space: str | None

    @classmethod
    def of(cls, pid: int) -> Driver:
        import psutil

        return cls(pid, psutil.Process(pid).create_time(), pid_space())

    def gone(self) -> bool:
        """True once the driver has ended. On another node it cannot be seen: False (there, Ray ends a job's
        actors when its driver goes)."""
        import psutil

        if self.space is None or self.space != pid_space():
            return False
        try:
            process = psutil.Process(self.pid)
            with process.oneshot():
                return process.create_time() != self.started or process.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True


class Lifeline:
    """In a replica's process: whether the job it works for is still there (its driver, and the parent that
    started this process), and a daemon thread that ends this process, its children first, once it is not."""

    def __init__(self, driver: Driver, interval_s: float = WATCH_INTERVAL_S):
        self.driver = driver
        self.parent = os.getppid()
        self.interval_s = interval_s
        threading.Thread(target=self._watch, name="lifeline", daemon=True).start()

    def holds(self) -> bool:
        return os.getppid() == self.parent and not self.driver.gone()

    def _watch(self) -> None:
        while self.holds():
            time.sleep(self.interval_s)
        kill_children()
        os._exit(1)


def kill_children() -> None:
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass


# ---- the driver's side: the mark and the reaper ---------------------------------------------------------


@contextmanager
def reaped_with_this_process() -> Iterator[str]:
    """Every process started inside (Ray's, the engines', and what they start) is killed when this process
    ends, or when the block does; yields the job's mark."""
    mark = uuid.uuid4().hex
    reaper = _start_reaper(mark)
    os.environ[JOB_MARK_ENV] = mark
    try:
        yield mark
    finally:
        os.environ.pop(JOB_MARK_ENV, None)
        reaper.stdin.close()  # what the driver's death does: the reaper sweeps
        try:
            reaper.wait(REAP_TIMEOUT_S + 5)
        except subprocess.TimeoutExpired:
            pass  # it goes on alone


def _start_reaper(mark: str) -> subprocess.Popen:
    environment = {name: value for name, value in os.environ.items() if name != JOB_MARK_ENV}
    command = [sys.executable, "-m", __name__, mark, str(os.getpid())]
    return subprocess.Popen(command, stdin=subprocess.PIPE, env=environment, start_new_session=True)


def reap(mark: str, driver_pid: int) -> None:
    """The reaper: looks at the driver's descendants until the driver's end of the pipe closes, then kills
    those it saw (still running) and every process that carries ``mark``."""
    import psutil

    me = psutil.Process()
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:
        driver = None
    seen: dict[int, Any] = {}  # every look adds: one that races the driver's end cannot lose what was seen
    while driver is not None and not _closed(sys.stdin.fileno(), REAPER_LOOK_S):
        seen = {pid: process for pid, process in seen.items() if process.is_running()}
        seen.update((process.pid, process) for process in _job_descendants(me, driver))
    kill_all(lambda: [process for process in seen.values() if process.is_running()] + marked_processes(mark))


def _closed(fd: int, timeout_s: float) -> bool:
    """True once the pipe's writer is gone (the driver never writes: readable means closed)."""
    readable, _, _ = select.select([fd], [], [], timeout_s)
    return bool(readable) and not os.read(fd, 4096)


def _job_descendants(me, driver) -> list:
    """The driver's descendants started after ``me`` (the reaper starts before anything of the job)."""
    import psutil

    try:
        descendants = driver.children(recursive=True)
        started = me.create_time()
    except psutil.Error:
        return []
    found = []
    for process in descendants:
        try:
            if process.pid != me.pid and process.create_time() >= started:
                found.append(process)
        except psutil.Error:
            pass
    return found


def marked_processes(mark: str) -> list:
    """This user's processes whose environment carries ``mark`` (those of others cannot be read)."""
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(JOB_MARK_ENV) == mark:
                found.append(process)
        except psutil.Error:
            pass
    return found


def kill_all(targets: Callable[[], list], timeout_s: float = REAP_TIMEOUT_S) -> None:
    """SIGKILL every process ``targets()`` names, again until it names none."""
    deadline = time.monotonic() + timeout_s
    while (found := targets()) and time.monotonic() < deadline:
        for process in found:
            try:
                process.send_signal(signal.SIGKILL)  # psutil's: refused for a pid reused since
            except Exception:  # gone meanwhile (psutil.Error), or not ours to kill
                pass
        time.sleep(REAP_PAUSE_S)


if __name__ == "__main__":
    reap(sys.argv[1], int(sys.argv[2]))
