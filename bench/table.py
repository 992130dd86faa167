"""The one table ``python -m bench`` prints: a row per comparison, with its goal and whether it was met.

Every number is a float or None (not measured: a peer missing, a run too short); NaN and infinity
become None so the JSON is plain JSON that any reader parses.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

_OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge, "==": operator.eq}


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass
class Row:
    """One comparison. ``goal`` is ``(op, bound)`` on ``ratio`` (ours / theirs unless the note says otherwise)
    when there is one and not ``on_ours``, else on ``ours``; None: measured, no goal."""

    name: str
    unit: str
    ours: float | None
    theirs: float | None = None
    ratio: float | None = None
    goal: tuple[str, float] | None = None
    note: str = ""
    on_ours: bool = False

    def __post_init__(self) -> None:
        self.ours, self.theirs, self.ratio = _num(self.ours), _num(self.theirs), _num(self.ratio)

    @property
    def judged(self) -> float | None:
        return self.ours if self.on_ours or self.ratio is None else self.ratio

    @property
    def met(self) -> bool | None:
        value = self.judged
        if self.goal is None or value is None:
            return None
        op, bound = self.goal
        return _OPS[op](value, bound)

    def goal_text(self) -> str:
        if self.goal is None:
            return "-"
        op, bound = self.goal
        suffix = f" {self.unit}" if self.on_ours or self.ratio is None else "x"
        return f"{op} {bound:g}{suffix}"

    def as_json(self) -> dict[str, object]:
        out = asdict(self)
        out["goal"] = self.goal_text() if self.goal else None
        out["met"] = self.met
        return out


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0 or abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) < 1 else f"{x:.2f}"


def render(rows: list[Row]) -> str:
    """The table as Markdown (pastes into a README or a report as is), then the rows' notes."""
    lines = ["| row | unit | ours | theirs | ratio | goal | met? |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{_fmt(r.ratio)}x"
        met = {True: "yes", False: "**NO**", None: "-"}[r.met]
        lines.append(f"| {r.name} | {r.unit} | {_fmt(r.ours)} | {_fmt(r.theirs)} | {ratio} | {r.goal_text()} | {met} |")
    notes = [f"- {r.name}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + (["", *notes] if notes else []))


def write_json(path: Path, rows: list[Row], meta: dict[str, object]) -> None:
    path.write_text(json.dumps({"meta": meta, "rows": [r.as_json() for r in rows]}, indent=2) + "\n")
