"""The server's threads for Compute work, taken in turn by the requests waiting (runners.fair_threads):
real threads, functions that block until the test lets them go."""

from __future__ import annotations

import asyncio
import threading

import pytest

from vllm_whisper_align.runners.fair_threads import FairThreads

WAIT_S = 10.0


class Gate:
    """Functions that record their start and block until released, one by one or all."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}

    def function(self, name: str, result=None, error: Exception | None = None):
        event = self._events.setdefault(name, threading.Event())

        def call():
            with self._lock:
                self.started.append(name)
            if not event.wait(WAIT_S):
                raise TimeoutError(name)
            if error is not None:
                raise error
            return result

        return call

    def release(self, name: str) -> None:
        self._events[name].set()

    async def until_started(self, *names: str) -> None:
        for _ in range(int(WAIT_S / 0.01)):
            with self._lock:
                if all(name in self.started for name in names):
                    return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{names} not started; started: {self.started}")


async def settle() -> None:
    """Long enough for a function handed a thread to have started in it."""
    await asyncio.sleep(0.2)


def test_a_request_that_comes_later_is_served_before_the_rest_of_a_long_one():
    async def scenario():
        gate, threads = Gate(), FairThreads(threads=1, per_owner=1)
        long = asyncio.create_task(threads.run("long", [gate.function(f"long{i}", i) for i in range(5)]))
        await gate.until_started("long0")
        short = asyncio.create_task(threads.run("short", [gate.function("short", "s")]))
        await settle()
        gate.release("long0")
        await gate.until_started("short")
        for name in ["short"] + [f"long{i}" for i in range(1, 5)]:
            gate.release(name)
        assert await short == ["s"]
        assert await long == [0, 1, 2, 3, 4]
        return gate.started

    started = asyncio.run(scenario())
    # Without turns the short function would start after every one of the long request's.
    assert started == ["long0", "short", "long1", "long2", "long3", "long4"]


def test_a_request_holds_at_most_its_share_and_another_takes_a_free_thread_at_once():
    async def scenario():
        gate, threads = Gate(), FairThreads(threads=4, per_owner=2)
        long = asyncio.create_task(threads.run("long", [gate.function(f"long{i}") for i in range(6)]))
        await gate.until_started("long0", "long1")
        await settle()
        assert sorted(gate.started) == ["long0", "long1"]  # its share, though 4 threads are free
        short = asyncio.create_task(threads.run("short", [gate.function("short", "s")]))
        # A free thread goes to the short request while the long one's wait (none of them has ended).
        await gate.until_started("short")
        gate.release("short")
        assert await short == ["s"]
        for i in range(6):
            gate.release(f"long{i}")
        await long
        assert threads.waiting() == 0

    asyncio.run(scenario())


def test_round_robin_between_requests_waiting_together():
    async def scenario():
        gate, threads = Gate(), FairThreads(threads=1, per_owner=1)
        first = asyncio.create_task(threads.run("blocker", [gate.function("blocker")]))
        await gate.until_started("blocker")
        a = asyncio.create_task(threads.run("a", [gate.function(f"a{i}") for i in range(3)]))
        await settle()
        b = asyncio.create_task(threads.run("b", [gate.function(f"b{i}") for i in range(3)]))
        await settle()
        for name in ["blocker", "a0", "a1", "a2", "b0", "b1", "b2"]:
            gate.release(name)
        await asyncio.gather(first, a, b)
        return gate.started

    assert asyncio.run(scenario()) == ["blocker", "a0", "b0", "a1", "b1", "a2", "b2"]


def test_cancelled_waiters_never_run_and_a_running_function_keeps_its_thread_until_it_returns():
    async def scenario():
        gate, threads = Gate(), FairThreads(threads=1, per_owner=1)
        gone = asyncio.create_task(threads.run("gone", [gate.function(f"gone{i}") for i in range(3)]))
        await gate.until_started("gone0")
        other = asyncio.create_task(threads.run("other", [gate.function("other", "o")]))
        await settle()
        gone.cancel()  # its client went away: gone0 runs on, gone1 and gone2 wait
        with pytest.raises(asyncio.CancelledError):
            await gone
        await settle()
        assert gate.started == ["gone0"]  # the one thread is still gone0's
        gate.release("gone0")
        await gate.until_started("other")
        gate.release("other")
        assert await other == ["o"]
        await settle()
        assert gate.started == ["gone0", "other"]
        assert threads.waiting() == 0

    asyncio.run(scenario())


def test_an_error_reaches_its_caller_and_frees_the_thread():
    async def scenario():
        gate, threads = Gate(), FairThreads(threads=1, per_owner=1)
        failing = asyncio.create_task(threads.run("failing", [gate.function("bad", error=ValueError("no"))]))
        gate.release("bad")
        with pytest.raises(ValueError, match="no"):
            await failing
        after = asyncio.create_task(threads.run("after", [gate.function("after", "fine")]))
        gate.release("after")
        assert await after == ["fine"]

    asyncio.run(scenario())


def test_an_urgent_request_is_served_before_those_that_waited_longer_and_takes_the_next_phone_worker():
    """A short request or a live round (urgent) takes the next free thread before requests that have
    waited longer and were served less recently, and its functions run with ``audio.phones.URGENT``
    set (the phone aligner's next free worker is theirs); the others' without it."""
    from vllm_whisper_align.audio.phones import URGENT

    async def scenario():
        gate, threads = Gate(), FairThreads(threads=1, per_owner=1)
        urgency: dict[str, bool] = {}

        def noting(name: str):
            call = gate.function(name)

            def noted():
                urgency[name] = URGENT.get()
                return call()

            return noted

        first = asyncio.create_task(threads.run("first", [noting("first0"), noting("first1")]))
        await gate.until_started("first0")
        waiting = asyncio.create_task(threads.run("waiting", [noting("waiting")]))
        await settle()
        urgent = asyncio.create_task(threads.run("live", [noting("live")], urgent=True))
        await settle()
        for name in ["first0", "live", "waiting", "first1"]:
            gate.release(name)
            await settle()
        await asyncio.gather(first, waiting, urgent)
        return gate.started, urgency

    started, urgency = asyncio.run(scenario())
    # In turn alone, the request waiting since before the urgent one would have gone first.
    assert started == ["first0", "live", "waiting", "first1"]
    assert urgency == {"first0": False, "live": True, "waiting": False, "first1": False}
