"""The demo's story, followed step by step from what the agent itself recorded.

``sre-agent demo`` promises a new user one incident told from start to end: a surge, the
queue alert going pending then firing, the scale-out, the new replicas taking load, the
queue draining and the alert resolving, KV-cache pressure with the planner's advice, a
replica dying of a CUDA OOM with its diagnosis, and a summary. :class:`Story` notes when
each step first happened, in model time (the clock the agent runs on) and in wall time, from
the agent's own alert events and incident log and the simulator's replica list: nothing is
scripted, so a step that does not happen is shown as not reached.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.rules.manager import AlertEvent
from agent.series import labels_get

__all__ = ["STEPS", "Reached", "Story"]

#: (key, title) in story order.
STEPS = (
    ("surge", "traffic surge"),
    ("pending", "queue alert pending"),
    ("firing", "queue alert firing"),
    ("scaled", "scale-out webhook"),
    ("spread", "new replicas take the load"),
    ("resolved", "queue drained, alert resolved"),
    ("kv", "KV-cache pressure, with the planner's advice"),
    ("oom", "CUDA OOM diagnosed"),
)


@dataclass(frozen=True, slots=True)
class Reached:
    """One step: when it happened in model time and when the demo saw it in wall time (seconds
    since the demo started; the view polls, so the wall time is at most a poll late)."""

    key: str
    title: str
    wall_s: float
    model_s: float
    detail: str

    def line(self) -> str:
        return (f"[wall {_mmss(self.wall_s)} | model {_mmss(self.model_s)}] {self.title}"
                + (f": {self.detail}" if self.detail else ""))


def _mmss(seconds: float) -> str:
    s = max(int(seconds), 0)
    return f"{s // 60:2d}:{s % 60:02d}"


class Story:
    """Which steps have happened. ``queue_alert`` is the scale-out rule, ``kv_alert`` the KV-cache
    saturation rule; ``initial_replicas`` tells new replicas from the first ones."""

    def __init__(self, *, surge_at_s: float | None, surge: float, initial_replicas: int,
                 queue_alert: str = "VLLMScaleOutNeeded", kv_alert: str = "VLLMKVCacheSaturated") -> None:
        self.surge_at_s, self.surge = surge_at_s, surge
        self.initial_replicas = initial_replicas
        self.queue_alert, self.kv_alert = queue_alert, kv_alert
        self.reached: dict[str, Reached] = {}
        self._seen_events = 0

    @property
    def done(self) -> bool:
        return all(key in self.reached for key, _ in STEPS)

    def update(self, *, wall_s: float, model_s: float, start_model_ms: int, events: Sequence[AlertEvent],
               replicas: Iterable[Mapping[str, Any]], incidents: Iterable[Mapping[str, Any]]) -> list[Reached]:
        """Note what has happened by now; returns the steps reached for the first time, in story order.
        ``events`` is the agent's alert-event log (oldest first), ``replicas`` the simulator's
        ``/state`` and ``incidents`` the agent's ``/api/v1/incidents``."""
        found: dict[str, tuple[float, str]] = {}
        if self.surge_at_s is not None and model_s >= self.surge_at_s:
            found["surge"] = (self.surge_at_s, f"demand x{self.surge:g}")
        for e in events[self._seen_events:] if len(events) >= self._seen_events else events:
            self._event(e, (e.at_ms - start_model_ms) / 1000, found)
        self._seen_events = len(events)
        for inc in incidents:
            self._incident(inc, start_model_ms, found)
        self._spread(model_s, list(replicas), found)  # after the incidents: it needs the scale-out
        new = []
        for key, title in STEPS:
            if key in found and key not in self.reached and self._in_order(key):
                at, detail = found[key]
                self.reached[key] = Reached(key, title, wall_s, at, detail)
                new.append(self.reached[key])
        return new

    def _in_order(self, key: str) -> bool:
        """A step counts once the steps it depends on have happened (a resolve needs a firing)."""
        needs = {"firing": "pending", "scaled": "firing", "spread": "scaled", "resolved": "firing"}
        return key not in needs or needs[key] in self.reached

    def _event(self, e: AlertEvent, at: float, found: dict[str, tuple[float, str]]) -> None:
        name = labels_get(e.alert.labels, "alertname")
        if name == self.queue_alert and e.kind in ("pending", "firing", "resolved"):
            if e.kind == "resolved" and "firing" not in self.reached:
                return
            detail = "" if e.kind == "resolved" else f"waiting {e.alert.value:.0f} > 2 x running ({name})"
            found.setdefault(e.kind, (at, detail))

    def _spread(self, model_s: float, replicas: list[Mapping[str, Any]], found: dict[str, tuple[float, str]]) -> None:
        vllm = [r for r in replicas if r.get("kind") == "vllm"]
        fresh = [r for r in vllm[self.initial_replicas:] if r.get("status") == "up" and int(r.get("running", 0)) > 0]
        if fresh and ("scaled" in self.reached or "scaled" in found):
            running = ", ".join(f"{r['name']} {int(r.get('running', 0))} running" for r in fresh)
            longest = max((int(r.get("waiting", 0)) for r in vllm if r.get("status") == "up"), default=0)
            found["spread"] = (model_s, f"{running}; longest queue now {longest}")

    def _incident(self, inc: Mapping[str, Any], start_ms: int, found: dict[str, tuple[float, str]]) -> None:
        for ev in inc.get("events", []):
            at, detail = (int(ev["at_ms"]) - start_ms) / 1000, ev.get("detail") or {}
            if ev.get("kind") == "action" and inc.get("alertname") == self.queue_alert and not detail.get("dry_run"):
                found.setdefault("scaled", (at, f"{detail.get('service', '')} {detail.get('from_replicas')} -> "
                                               f"{detail.get('to_replicas')} replicas"))
            if ev.get("kind") != "finding":
                continue
            kind = str(detail.get("kind", ""))
            if inc.get("alertname") == self.kv_alert:
                found.setdefault("kv", (at, _finding_text(detail, inc)))
            elif kind.startswith("gpu-oom"):
                found.setdefault("oom", (at, _finding_text(detail, inc)))


def _finding_text(detail: Mapping[str, Any], inc: Mapping[str, Any]) -> str:
    where = (inc.get("labels") or {}).get("instance", "")
    change = f"set {detail['setting']} {detail.get('suggested_value', '')}".strip() if detail.get("setting") else ""
    parts = [p for p in (where, str(detail.get("summary", "")), change, str(detail.get("runbook_url", ""))) if p]
    return " | ".join(parts)
