"""agent.rules.restore: alerts matched with ALERTS_FOR_STATE series give what comparing every alert with every
series gives (a series matches when it carries all of the alert's labels; the earliest finite value wins), in
time linear in alerts and series."""

from __future__ import annotations

import gc
import math
import random
import time

import pytest

from agent.rules.restore import earliest_active_at
from agent.series import Labels, labels_from


def _pairwise(keys: list[Labels], series: list[tuple[Labels, float]]) -> dict[Labels, float]:
    """The specification: every alert against every series (what the manager did before the index)."""
    out = {}
    for key in keys:
        earlier = [v for labels, v in series if set(key) <= set(labels) and math.isfinite(v)]
        if earlier:
            out[key] = min(earlier)
    return out


def _case(seed: int, n: int) -> tuple[list[Labels], list[tuple[Labels, float]]]:
    """Alerts with one or two label-name sets; series with the server's extra labels, missing labels, other
    values, duplicates of one alert (HA replicas) and NaN/inf values."""
    rng = random.Random(seed)
    keys = []
    for i in range(n):
        labels = {"alertname": "A", "instance": f"i{i % 7}", "model_name": f"m{i}"}
        if i % 3 == 0:
            labels["gpu"] = str(i % 4)
        keys.append(labels_from(None, labels))
    series: list[tuple[Labels, float]] = []
    for key in keys:
        for _ in range(rng.randint(0, 3)):
            labels = dict(key)
            choice = rng.random()
            if choice < 0.3:
                labels["replica"] = rng.choice("ab")
            elif choice < 0.4:
                labels.pop(rng.choice(sorted(labels)))
            elif choice < 0.5:
                labels["instance"] = "elsewhere"
            value = rng.choice([rng.uniform(1e9, 2e9), math.nan, math.inf, -math.inf, 0.0])
            series.append((labels_from(None, labels), value))
    rng.shuffle(series)
    return keys, series


@pytest.mark.parametrize(("seed", "n"), [(1, 5), (2, 40), (3, 200), (4, 1), (5, 0)])
def test_indexed_matching_equals_every_alert_against_every_series(seed: int, n: int) -> None:
    """Same alerts matched, same earliest value, for extra, missing and different labels and non-finite values."""
    keys, series = _case(seed, n)
    assert earliest_active_at(keys, series) == _pairwise(keys, series)


def test_a_series_with_extra_labels_matches_and_one_missing_a_label_does_not() -> None:
    """The server's replica label does not stop a match; a series without the alert's gpu label is another alert's."""
    key = labels_from(None, {"alertname": "A", "gpu": "1"})
    series = [(labels_from(None, {"alertname": "A", "gpu": "1", "replica": "b"}), 200.0),
              (labels_from(None, {"alertname": "A"}), 100.0)]
    assert earliest_active_at([key], series) == {key: 200.0}


def _seconds(n: int, runs: int) -> float:
    """The best of ``runs`` timings in this thread's CPU time (time other processes take does not count), the
    collector off."""
    keys = [labels_from(None, {"alertname": "A", "instance": f"i{i}", "job": "vllm"}) for i in range(n)]
    series = [(labels_from(None, {"alertname": "A", "instance": f"i{i}", "job": "vllm", "replica": "a"}), 1e9 + i)
              for i in range(n)]
    best = math.inf
    gc.disable()
    try:
        for _ in range(runs):
            t0 = time.thread_time()
            found = earliest_active_at(keys, series)
            best = min(best, time.thread_time() - t0)
    finally:
        gc.enable()
    assert len(found) == n
    return best


def test_matching_time_grows_linearly_with_alerts_and_series() -> None:
    """5,000 alerts x 5,000 series take about ten times 500 x 500 (pairwise would take a hundred times)."""
    small, large = _seconds(500, runs=20), _seconds(5000, runs=5)
    assert large / small < 40, (small, large)
