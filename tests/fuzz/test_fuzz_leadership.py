"""Fuzz the HA follower's watermark (agent.act.leadership) over clock skews and lease timings: whatever the
two wall clocks say and however the leader's computations, lease writes and the follower's reads interleave,
the follower's copy of the watermark never claims more than the leader had delivered.

One real time line (ms). The leader's and the follower's wall clocks are offsets from it. The leader
computes its watermark ("delivered up to ``lag`` ago", never going back), writes the lease (the
write commits up to the write allowance later), the follower reads it (each read served some time
after it starts, the next starting after the last ended). The property: after every read, each
follower watermark, moved to real time, is at or below the best real-time watermark the leader had
computed by then.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from agent.act.leadership import Leadership
from tests.fuzz import budget

ALLOWANCE_MS = 2_000
T0_MS = 1_700_000_000_000
HOUR_MS = 3_600_000

skews = st.integers(-HOUR_MS, HOUR_MS) | st.sampled_from([0, 60_000, -60_000, HOUR_MS, -HOUR_MS])
#: ("compute", lag ms) | ("write", commit delay ms) | ("read", serve delay ms), each after a gap of real ms
steps = st.lists(st.tuples(st.integers(0, 3_000), st.one_of(
    st.tuples(st.just("compute"), st.integers(1, 30_000)),
    st.tuples(st.just("write"), st.integers(0, ALLOWANCE_MS)),
    st.tuples(st.just("read"), st.integers(0, 3_000)))), min_size=1, max_size=40)


@dataclass
class Commit:
    """A lease write as the API server holds it: visible from ``at`` (real ms)."""

    at: int
    version: int
    behind: dict[str, int] | None


@given(leader_off=skews, follower_off=skews, events=steps)
@budget(200)  # 100 misses a write allowance of 0 (checked by mutation); 200 finds it
def test_follower_watermark_never_passes_what_the_leader_delivered(
        leader_off: int, follower_off: int, events: list[tuple[int, tuple[str, int]]]) -> None:
    """For any skew and interleaving, follower watermark (real time) <= the leader's best (real time)."""
    real = T0_MS
    leader = Leadership("leader", renew_deadline_s=10, margin_s=0, queues=(),
                        clock=lambda: (real + leader_off) / 1000)
    follower = Leadership("follower", renew_deadline_s=10, margin_s=0, queues=(),
                          clock=lambda: (real + follower_off) / 1000, write_allowance_s=ALLOWANCE_MS / 1000)
    commits = [Commit(real, 0, None)]
    best_real: int | None = None  # the latest real time up to which the leader has delivered everything
    busy_until = real  # the follower's reads do not overlap
    for gap, (what, ms) in events:
        real += gap
        if what == "compute":
            w = real + leader_off - ms  # leader's clock
            prev = leader.to_publish().get("hook")
            if prev is not None:
                w = max(w, real + leader_off - prev)  # a watermark never goes back
            leader.publish({"hook": w})
            best_real = w - leader_off
        elif what == "write":
            real = max(real, commits[-1].at)  # the leader's writes are sequential: the last one has committed
            commits.append(Commit(real + ms, len(commits), leader.to_publish() or None))
        else:
            real = max(real, busy_until)
            started_ms = follower.now_ms()
            served = real + ms
            seen = max((c for c in commits if c.at <= served), key=lambda c: (c.at, c.version))
            follower.observed("leader", seen.behind, version=str(seen.version), read_started_ms=started_ms)
            busy_until = served
            mark = follower.watermarks().get("hook")
            if mark is not None:
                assert best_real is not None
                assert mark - follower_off <= best_real, (mark - follower_off, best_real)
