"""agent.app.workpool: at most ``slots`` pieces of work admitted (the next is refused at once with BusyError and
its Retry-After), run on the pool's own threads, never on the loop's default executor."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent.app.workpool import WorkPool
from agent.errors import BusyError


@pytest.mark.parametrize("slots", [1, 2, 4])
async def test_work_past_the_slots_is_refused_not_queued(slots: int) -> None:
    """``slots`` blocked pieces of work hold every slot: one more is refused at once; a freed slot admits again."""
    pool = WorkPool("reports", slots=slots, retry_after_s=7)
    release = threading.Event()

    async def hold() -> str:
        with pool.admit():
            return await pool.run(lambda: threading.current_thread().name if release.wait(10) else "timed out")

    try:
        tasks = [asyncio.create_task(hold()) for _ in range(slots)]
        for _ in range(200):  # every task has taken its slot
            if pool.busy == slots:
                break
            await asyncio.sleep(0.01)
        assert pool.busy == slots
        with pytest.raises(BusyError, match=f"{slots} reports are being built already; retry in 7s") as exc:
            await hold()
        assert exc.value.retry_after_s == 7 and pool.refused == 1
        release.set()
        names = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert all(n.startswith("reports") for n in names)  # the pool's threads, not asyncio's default ones
        assert pool.busy == 0
        assert (await hold()).startswith("reports")  # slots come back
    finally:
        release.set()
        pool.close()


def test_a_pool_needs_a_slot() -> None:
    """Zero slots would refuse everything: a configuration error at construction."""
    with pytest.raises(ValueError, match="at least one slot"):
        WorkPool("reports", slots=0)


async def test_a_cancelled_caller_keeps_its_slot_until_the_thread_is_done() -> None:
    """A client that goes away does not free a slot whose thread still works: no work queues behind it."""
    pool = WorkPool("reports", slots=1)
    release = threading.Event()

    async def hold() -> bool:
        with pool.admit():
            return await pool.run(release.wait, 10)

    try:
        task = asyncio.create_task(hold())
        for _ in range(200):
            if pool.busy:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=0.2)  # it must not end while its thread works
        assert not done and pool.busy == 1
        with pytest.raises(BusyError):
            await hold()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        assert pool.busy == 0
    finally:
        release.set()
        pool.close()
