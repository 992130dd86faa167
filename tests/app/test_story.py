"""agent.app.story: the demo's steps, taken from alert events, the incident log and the fleet."""

from __future__ import annotations

from typing import Any

from agent.app.story import STEPS, Story
from agent.rules.manager import Alert, AlertEvent, AlertState

START_MS = 1_700_000_000_000


def event(kind: str, alertname: str, at_s: float, value: float = 900.0) -> AlertEvent:
    state = {"pending": AlertState.PENDING, "firing": AlertState.FIRING}.get(kind, AlertState.INACTIVE)
    alert = Alert(labels=(("alertname", alertname), ("job", "vllm")), annotations={}, value=value, state=state,
                  active_at_ms=START_MS)
    return AlertEvent(kind=kind, group="vllm", rule=alertname, alert=alert, at_ms=START_MS + int(at_s * 1000))


def incident(alertname: str, *events: tuple[float, str, dict[str, Any]]) -> dict[str, Any]:
    return {"alertname": alertname, "labels": {"instance": "127.0.0.1:8001"},
            "events": [{"at_ms": START_MS + int(at * 1000), "kind": kind, "detail": detail}
                       for at, kind, detail in events]}


def replica(name: str, running: int, waiting: int = 0, status: str = "up") -> dict[str, Any]:
    return {"name": name, "kind": "vllm", "status": status, "running": running, "waiting": waiting}


def test_the_story_in_order_with_model_times_from_the_records() -> None:
    story = Story(surge_at_s=60.0, surge=1.6, initial_replicas=2)
    three = [replica("vllm-0", 90, 400), replica("vllm-1", 90, 380)]
    assert [s.key for s in story.update(wall_s=10, model_s=50, start_model_ms=START_MS, events=[],
                                        replicas=three, incidents=[])] == []
    events = [event("pending", "VLLMScaleOutNeeded", 180.0)]
    got = story.update(wall_s=40, model_s=200, start_model_ms=START_MS, events=events, replicas=three, incidents=[])
    assert [s.key for s in got] == ["surge", "pending"]
    assert got[1].model_s == 180.0 and "waiting 900" in got[1].detail
    events.append(event("firing", "VLLMScaleOutNeeded", 480.0))
    scaled = incident("VLLMScaleOutNeeded", (481.0, "action", {"service": "vllm", "from_replicas": 2,
                                                                "to_replicas": 4, "dry_run": False}))
    grown = [*three, replica("vllm-2", 40), replica("vllm-3", 0)]
    got = story.update(wall_s=100, model_s=490, start_model_ms=START_MS, events=events, replicas=grown,
                       incidents=[scaled])
    assert [s.key for s in got] == ["firing", "scaled", "spread"]
    assert got[1].detail == "vllm 2 -> 4 replicas" and got[2].detail.startswith("vllm-2 40 running")
    assert got[2].model_s == 490 and got[2].wall_s == 100
    events.append(event("resolved", "VLLMScaleOutNeeded", 540.0))
    kv = incident("VLLMKVCacheSaturated", (700.0, "fired", {}),
                  (701.0, "finding", {"kind": "kv-cache-capacity", "summary": "the KV cache is full",
                                      "setting": "--max-num-seqs", "suggested_value": "64",
                                      "runbook_url": "https://example/r.md"}))
    oom = incident("gpu-oom-runtime", (800.0, "finding", {"kind": "gpu-oom-runtime", "summary": "CUDA OOM",
                                                          "setting": "--gpu-memory-utilization",
                                                          "suggested_value": "0.85"}))
    got = story.update(wall_s=170, model_s=810, start_model_ms=START_MS, events=events, replicas=grown,
                       incidents=[scaled, kv, oom])
    assert [s.key for s in got] == ["resolved", "kv", "oom"]
    assert "set --max-num-seqs 64" in got[1].detail and "https://example/r.md" in got[1].detail
    assert "--gpu-memory-utilization 0.85" in got[2].detail
    assert story.done and [s.key for s in story.reached.values()] == [k for k, _ in STEPS]
    assert story.update(wall_s=171, model_s=815, start_model_ms=START_MS, events=events, replicas=grown,
                        incidents=[scaled, kv, oom]) == []  # each step once


def test_nothing_is_claimed_out_of_order() -> None:
    """A resolve without a firing, a dry-run scale or an unscaled fleet are not steps of the story; a
    KV alert without its finding is not the planner's advice."""
    story = Story(surge_at_s=None, surge=1.0, initial_replicas=1)
    dry = incident("VLLMScaleOutNeeded", (10.0, "action", {"dry_run": True}))
    bare = incident("VLLMKVCacheSaturated", (20.0, "fired", {}))
    got = story.update(wall_s=5, model_s=30, start_model_ms=START_MS,
                       events=[event("resolved", "VLLMScaleOutNeeded", 5.0)],
                       replicas=[replica("vllm-0", 10), replica("vllm-1", 10)], incidents=[dry, bare])
    assert got == [] and not story.done
