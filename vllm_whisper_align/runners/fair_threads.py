"""Threads for the requests' Compute work, taken in turn by the requests waiting for one.

A request's windows are finished (DTW, the boundary rules, the acoustic model's search) in threads: a
long-form alignment of an hour hands over 120 windows at once. Queued in arrival order, as a plain
executor queues them, a short request that came a moment later waited for all 120. Here each free
thread goes to the next request in turn among those waiting, so a request waits for a thread's current
window at most, whatever others have queued.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from vllm_whisper_align.audio.phones import URGENT as PHONES_URGENT
from vllm_whisper_align.audio.phones import WORKERS as PHONE_WORKERS

# As many as asyncio's default executor has, which ran this work before: a function waits on the phone
# aligner's pipe as well as computing, so more threads than cores keep the cores busy.
THREADS = min(32, (os.cpu_count() or 1) + 4)
# Threads one request may hold at once: as many as the phone aligner has workers, the scarcest of what
# its windows need (more of its windows in threads would only wait for a worker, ahead of others').
PER_OWNER = PHONE_WORKERS


class FairThreads:
    """``threads`` threads; :meth:`run` calls functions in them, a free thread going to the waiting
    request (``owner``) served least recently that holds fewer than ``per_owner`` (round robin), urgent
    owners (a client waits on them: short requests, live rounds) before the others, each owner's
    functions in the order given; an urgent owner's functions take the phone aligner's next free worker
    too (``audio.phones.URGENT``). Lives on one event loop."""

    def __init__(self, threads: int = THREADS, per_owner: int = PER_OWNER) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="compute")
        self._free, self._per_owner = threads, per_owner
        self._held: dict[Hashable, int] = {}  # threads each owner holds
        # Owners waiting for a thread (in order of arrival), each with its waiters in order.
        self._waiting: dict[Hashable, deque[asyncio.Future[None]]] = {}
        # When each owner waiting or holding a thread was last handed one (a count of hand-outs).
        self._served: dict[Hashable, int] = {}
        self._hand_outs = 0
        self._urgent: set[Hashable] = set()  # owners waiting or holding a thread that are urgent

    async def run(
        self, owner: Hashable, functions: Sequence[Callable[[], Any]], urgent: bool = False
    ) -> list[Any]:
        """Each of ``functions`` called in a thread as its turn comes; their results, in order."""
        return list(await asyncio.gather(*(self._call(owner, function, urgent) for function in functions)))

    def waiting(self) -> int:
        """Functions waiting for a thread."""
        return sum(len(waiters) for waiters in self._waiting.values())

    async def _call(self, owner: Hashable, function: Callable[[], Any], urgent: bool) -> Any:
        await self._turn(owner, urgent)
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # as to_thread does
        context.run(PHONES_URGENT.set, urgent)
        try:
            call = self._executor.submit(context.run, function)
        except BaseException:
            self._release(owner)
            raise
        # The thread is free when the function returns, not when its caller stops waiting (cancelled).
        call.add_done_callback(lambda _: loop.is_closed() or loop.call_soon_threadsafe(self._release, owner))
        return await asyncio.wrap_future(call)

    async def _turn(self, owner: Hashable, urgent: bool) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(owner, deque()).append(waiter)
        if urgent:
            self._urgent.add(owner)
        self._hand_out()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(owner)  # given a thread, then cancelled before it could use it
            else:
                self._forget(owner, waiter)
            raise

    def _forget(self, owner: Hashable, waiter: asyncio.Future[None]) -> None:
        waiters = self._waiting.get(owner)
        if waiters is not None and waiter in waiters:
            waiters.remove(waiter)
            if not waiters:
                del self._waiting[owner]
        self._hand_out()  # the owner's last waiter gone: forget when it was served

    def _release(self, owner: Hashable) -> None:
        self._free += 1
        self._held[owner] -= 1
        if not self._held[owner]:
            del self._held[owner]
        self._hand_out()

    def _hand_out(self) -> None:
        """Free threads to the waiting owners that may hold another, the least recently served first."""
        while self._free and (owner := self._next_owner()) is not None:
            waiters = self._waiting[owner]
            waiter = waiters.popleft()
            if not waiters:
                del self._waiting[owner]
            if not waiter.done():  # a cancelled waiter's turn passes
                self._free -= 1
                self._held[owner] = self._held.get(owner, 0) + 1
                self._hand_outs += 1
                self._served[owner] = self._hand_outs
                waiter.set_result(None)
        for owner in [o for o in self._served if o not in self._waiting and o not in self._held]:
            del self._served[owner]
        self._urgent &= self._waiting.keys() | self._held.keys()

    def _next_owner(self) -> Hashable | None:
        """The waiting owner, urgent first, served least recently (one never served first; in order of
        arrival among equals) that holds fewer threads than it may."""
        eligible = [o for o in self._waiting if self._held.get(o, 0) < self._per_owner]
        return min(eligible, key=lambda o: (o not in self._urgent, self._served.get(o, 0)), default=None)
