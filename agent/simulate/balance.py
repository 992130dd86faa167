"""How the simulated load balancer shares the fleet's demand among its live replicas.

``even`` splits demand equally, as a round-robin balancer in front of identical replicas does
on average. ``least_request`` is Envoy's ``LEAST_REQUEST`` policy with equal weights (also
what Kubernetes Gateway/Istio default to for HTTP): each request picks two replicas at random
and goes to the one with fewer outstanding requests ("power of two choices"). In the fluid
limit, with replicas ranked by outstanding requests (rank 0 the fewest, ``n`` replicas,
two picks with replacement), the replica at rank ``i`` receives a share
``(2 (n - i) - 1) / n**2`` of arrivals; tied replicas share their ranks' total equally.
A freshly started replica therefore takes most new arrivals while the old ones drain their
queues, which is how a scale-out relieves queued load behind a real balancer.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.errors import SimulatorError

__all__ = ["BALANCERS", "shares"]

BALANCERS = ("even", "least_request")


def shares(policy: str, outstanding: Sequence[int]) -> list[float]:
    """Each replica's share of arrivals (summing to 1) given its outstanding requests
    (running + waiting), in the order given."""
    n = len(outstanding)
    if n == 0:
        return []
    if policy == "even":
        return [1.0 / n] * n
    if policy != "least_request":
        raise SimulatorError(f"unknown balancer {policy!r}; choose one of {', '.join(BALANCERS)}")
    order = sorted(range(n), key=lambda i: outstanding[i])
    out = [0.0] * n
    rank = 0
    while rank < n:
        tied = rank
        while tied + 1 < n and outstanding[order[tied + 1]] == outstanding[order[rank]]:
            tied += 1
        group = order[rank:tied + 1]
        total = sum(2 * (n - r) - 1 for r in range(rank, tied + 1)) / n**2
        for i in group:
            out[i] = total / len(group)
        rank = tied + 1
    return out
