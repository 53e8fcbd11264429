"""A loop on a thread of its own (the fleet's, the demo's, the tests' clients') ends as ``asyncio.run``
ends its loop: what is left on it is cancelled and runs its clean-up, and the loop is closed."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import AsyncIterator

from pipelines.loop_thread import LoopThread


def test_a_task_left_on_the_loop_is_cancelled_and_ends_before_the_loop_closes():
    thread = LoopThread("left-over")
    thread.start()
    ended: list[str] = []

    async def reconnect_under_way() -> None:  # as a device's reconnect waiting on a stalled broker
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        finally:
            ended.append("finally")

    async def leave_it() -> None:
        asyncio.get_running_loop().create_task(reconnect_under_way())
        await asyncio.sleep(0)  # it starts, and waits

    thread.run(leave_it())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread.close()
        gc.collect()
    assert ended == ["cancelled", "finally"]
    assert thread.loop.is_closed()
    assert not [w for w in caught if "destroyed" in str(w.message) or "never awaited" in str(w.message)]


def test_an_asynchronous_generator_left_open_is_closed():
    thread = LoopThread("generators")
    thread.start()
    closed: list[bool] = []

    async def readings() -> AsyncIterator[int]:
        try:
            while True:
                yield 1
        finally:
            closed.append(True)

    held: list[AsyncIterator[int]] = []

    async def take_one() -> int:
        generator = readings()
        held.append(generator)  # kept open past the loop's end
        return await generator.__anext__()

    assert thread.run(take_one()) == 1
    thread.close()
    assert closed == [True]
    assert thread.loop.is_closed()


def test_a_thread_never_started_closes_its_loop():
    thread = LoopThread("unused")
    thread.close()
    assert thread.loop.is_closed()
