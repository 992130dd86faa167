"""``python -m bench --quick``: the one benchmark command runs end to end and reports every row.

The values depend on the machine (and a smoke run's are not the agent's), so they are not checked;
what is: every comparison the bench promises has its row, in the printed table and in the JSON, and
every number in it is a number.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The rows the bench promises (bench/README.md), by the start of their names, with how many of each.
EXPECTED = {
    "ingest: capture ": 2,
    "ingest: synthetic vLLM V1, 1 model": 1,
    "ingest: synthetic vLLM V1, 10 model": 1,
    "agent vs Prometheus: CPU per ": 1,
    "agent CPU per interval, share of one core": 1,
    "agent RSS": 1,
    "agent ticks late or missed": 1,
    "agent vs vmagent + victoria-metrics + vmalert": 1,
    "targets up at the window's end": 1,
    "rules: ": 1,
    "Prometheus mode: ": 1,
    "faults: ": 3,
    "outbox: ": 1,
}


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.mark.slow
def test_quick_run_reports_every_row_with_numbers(tmp_path: Path) -> None:
    missing = [b for b in ("prometheus", "victoria-metrics", "vmagent", "vmalert") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} on PATH (apt-get install prometheus victoria-metrics)")
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--json", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = report["rows"]
    names = [r["name"] for r in rows]
    for prefix, count in EXPECTED.items():
        assert sum(n.startswith(prefix) for n in names) == count, (prefix, names)
    assert len(rows) == sum(EXPECTED.values()), names
    for r in rows:
        assert _number(r["ours"]), r
        if r["theirs"] is not None:
            assert _number(r["theirs"]), r
        if r["ratio"] is not None:
            assert _number(r["ratio"]), r
        assert r["met"] in (True, False, None), r
        assert (r["met"] is None) == (r["goal"] is None), r
    # the printed table has the same rows, each with a value in the "ours" column that parses
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ") and not line.startswith("| row")]
    assert [line.split(" | ")[0][2:] for line in table] == names
    for line in table:
        float(line.split(" | ")[2].replace(",", ""))
    assert report["meta"]["quick"] is True
    assert len(report["meta"]["loadavg_start"]) == 3
