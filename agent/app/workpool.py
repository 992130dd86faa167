"""A bounded pool of worker threads for optional, slow work (triage reports: range queries and drawing).

Why not :func:`asyncio.to_thread`: that is the loop's *default* executor, which the agent's own
jobs need (file_sd reading in every scrape cycle, NVML polls, aiohttp's DNS lookups). A report
in Prometheus mode waits on the user's server; when that server trickles its answers, a handful
of reports held every default worker and **scraping stopped**. Report work therefore runs here,
on threads of its own, and at most ``slots`` pieces of work are admitted at once: the next one
gets :class:`~agent.errors.BusyError` (the HTTP layer answers 503 with ``Retry-After``) instead
of a place in a queue that grows without bound. Each piece of work is itself bounded in time
(the range queries' deadlines), so a slot always comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from agent.errors import BusyError

__all__ = ["WorkPool"]

T = TypeVar("T")


class WorkPool:
    """``slots`` admissions and as many worker threads, named ``name``; create and use it on one event loop."""

    def __init__(self, name: str, *, slots: int = 4, retry_after_s: int = 5) -> None:
        if slots < 1:
            raise ValueError("a work pool needs at least one slot")
        self.name = name
        self.slots = slots
        self.retry_after_s = retry_after_s
        self.busy = 0  # admitted now
        self.refused = 0  # refused since start, for the agent's logs and tests
        self._executor: ThreadPoolExecutor | None = None

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Hold one slot for the ``with`` block; :class:`BusyError` at once when none is free."""
        if self.busy >= self.slots:
            self.refused += 1
            raise BusyError(f"{self.slots} {self.name} are being built already; retry in {self.retry_after_s}s",
                            retry_after_s=self.retry_after_s)
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on one of the pool's threads (never the default executor). Cancelled (a client that
        went away), it still waits for the thread's work to end before it lets the cancellation through, so the
        slot held around it stays taken while the thread is: slots count busy threads, never a queue."""
        if self._executor is None:  # threads start on first use: an agent nobody asks for a report has none
            self._executor = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix=self.name)
        work = asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # the work's own outcome no longer matters to anyone
                await work
            raise

    def close(self) -> None:
        """Stop taking work; threads still running finish their (deadline-bounded) work and exit."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
