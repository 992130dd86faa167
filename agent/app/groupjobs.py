"""When each rule group is evaluated: on its own grid, the same in every process.

Why a module of its own: the instants matter beyond one process. Each group runs at a fixed
offset within its interval, derived from its file and name (:func:`agent.rules.timing.eval_offset_ms`),
so the two replicas of an HA pair evaluate at the same instants and their scale keys and alert
times agree (docs/ha.md). The grid is in the clock's time (model time in the demo); the scheduler
runs on the wall, ``wall`` wall seconds to one clock second.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from agent.rules.manager import Group
from agent.rules.timing import eval_offset_ms, eval_timestamp_ms, next_eval_ms

__all__ = ["add_group_jobs", "eval_at_ms"]

Job = Callable[..., Awaitable[None]]


def eval_at_ms(group: Group, now_ms: int) -> int:
    """The timestamp an evaluation of ``group`` starting at ``now_ms`` uses: its last grid point."""
    return eval_timestamp_ms(now_ms, int(group.interval_s * 1000), _offset_ms(group))


def add_group_jobs(sched: AsyncIOScheduler, groups: Sequence[Group], job: Job, *, first_eval: datetime,
                   first_model_ms: int, wall: float, remote: bool) -> None:
    """One interval job per group on its grid, from ``first_eval`` (when the first scrapes have landed,
    ``first_model_ms`` on the clock). The grid's first point can be up to an interval away: a group
    is also evaluated once right away, at its last grid point in Prometheus mode (``remote``: the
    server has the data), at now in embedded mode. ``job(group, aligned)`` evaluates."""
    for i, group in enumerate(groups):
        at_ms = next_eval_ms(first_model_ms, int(group.interval_s * 1000), _offset_ms(group))
        run_at = first_eval + timedelta(seconds=(at_ms - first_model_ms) / 1000 * wall)
        sched.add_job(job, "interval", args=[group], seconds=group.interval_s * wall, id=f"rules-{i}",
                      max_instances=1, coalesce=True, next_run_time=run_at)
        if at_ms > first_model_ms:
            sched.add_job(job, "date", args=[group, remote], id=f"rules-{i}-first", run_date=first_eval)


def _offset_ms(group: Group) -> int:
    """The group's place in its interval: the same in every process with the same rule files."""
    return eval_offset_ms(group.spec.file, group.spec.name, int(group.interval_s * 1000))
