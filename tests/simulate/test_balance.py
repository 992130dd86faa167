"""The simulated load balancer: how demand is shared among live replicas."""

from __future__ import annotations

import random

import pytest

from agent.errors import SimulatorError
from agent.simulate.balance import shares


def p2c_by_sampling(outstanding: list[int], draws: int, seed: int = 1) -> list[float]:
    """Power of two choices done request by request: pick two replicas at random (with
    replacement), send to the one with fewer outstanding requests (the first on a tie)."""
    rng = random.Random(seed)
    got = [0] * len(outstanding)
    for _ in range(draws):
        a, b = rng.randrange(len(outstanding)), rng.randrange(len(outstanding))
        if outstanding[b] < outstanding[a] or (outstanding[b] == outstanding[a] and rng.random() < 0.5):
            a = b
        got[a] += 1
    return [g / draws for g in got]


@pytest.mark.parametrize("outstanding", [[0, 500], [300, 10, 600], [40, 40, 900, 0, 7], [5, 5, 5]])
def test_least_request_matches_two_random_choices_request_by_request(outstanding: list[int]) -> None:
    """The fluid formula gives what sampling the policy one request at a time gives."""
    want = p2c_by_sampling(outstanding, 200_000)
    got = shares("least_request", outstanding)
    assert sum(got) == pytest.approx(1.0)
    assert got == pytest.approx(want, abs=0.01)


def test_a_fresh_replica_takes_most_new_arrivals() -> None:
    """Behind least_request a new, empty replica gets three quarters of arrivals next to one busy
    replica; round robin would give it half."""
    assert shares("least_request", [800, 0]) == pytest.approx([0.25, 0.75])
    assert shares("even", [800, 0]) == [0.5, 0.5]


def test_no_replicas_and_unknown_policies() -> None:
    assert shares("least_request", []) == []
    with pytest.raises(SimulatorError, match="least_request"):
        shares("random", [1, 2])
