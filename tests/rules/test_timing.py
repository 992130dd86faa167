"""Aligned evaluation timestamps: the grid every process with the same rule group evaluates on."""

from __future__ import annotations

from agent.rules.timing import eval_offset_ms, eval_timestamp_ms, next_eval_ms


def test_offset_is_stable_spread_and_independent_of_the_directory() -> None:
    """FNV-1a over file name and group name: fixed values (not Python's seeded hash), within the interval,
    different for different groups, the same for the same file under another directory."""
    a = eval_offset_ms("/etc/sre-agent/rules/vllm.rules.yaml", "vllm", 15_000)
    assert a == eval_offset_ms("/opt/other/vllm.rules.yaml", "vllm", 15_000)
    assert 0 <= a < 15_000
    offsets = {eval_offset_ms("vllm.rules.yaml", f"group-{i}", 15_000) for i in range(20)}
    assert len(offsets) > 15  # spread, not all on one instant
    assert eval_offset_ms("x.yaml", "g", 0) == 0


def test_timestamp_is_the_grid_point_the_run_belongs_to() -> None:
    """Runs anywhere in a step map to its start; a wake-up up to 100 ms early counts as on time."""
    interval, offset = 1000, 250
    assert eval_timestamp_ms(10_250, interval, offset) == 10_250
    assert eval_timestamp_ms(10_999, interval, offset) == 10_250
    assert eval_timestamp_ms(11_200, interval, offset) == 11_250  # 50 ms early
    assert eval_timestamp_ms(11_100, interval, offset) == 10_250  # 150 ms early is the previous step
    # two processes waking 37 ms and 480 ms after the same grid point evaluate at the same timestamp
    assert eval_timestamp_ms(20_287, interval, offset) == eval_timestamp_ms(20_730, interval, offset) == 20_250
    # a short interval keeps its tolerance to a tenth of it
    assert eval_timestamp_ms(1_095, 200, 0) == 1_000


def test_next_grid_point() -> None:
    assert next_eval_ms(10_000, 1000, 250) == 10_250
    assert next_eval_ms(10_250, 1000, 250) == 10_250
    assert next_eval_ms(10_251, 1000, 250) == 11_250
    assert next_eval_ms(5, 0, 0) == 5
